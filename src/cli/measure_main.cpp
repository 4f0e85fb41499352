// libexec/memgate/memgate-measure: the subcommands of the memgate command that measure (LibTorch), and the ranks
// of a probe. bin/memgate hands them over by exec; the arguments are the memgate command's own.
#include "measure_cli.h"

#include "memgate/base/process.h"
#include "memgate/child/rank.h"

// Without LibTorch's static destructors (base/process.h): a third of what `memgate profile` of a bad fixture costs.
int main(int argc, char** argv) {
  if (memgate::is_rank_command(argc, argv)) memgate::exit_fast(memgate::rank_main(argc, argv));
  memgate::exit_fast(memgate::cli::run_command_line(argc, argv, memgate::cli::measures));
}
