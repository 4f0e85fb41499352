// The subcommands memgate-measure runs: their table, apart from its main() (measure_main.cpp), so that a test program
// can link memgate-measure's objects and call what its main() calls.
#include "measure_cli.h"

#include <string_view>

namespace memgate::cli {

AddSubcommand measures(std::string_view name) {
  if (name == "profile") return add_profile;
  if (name == "estimate") return add_estimate;
  if (name == "advise") return add_advise;
  if (name == "check") return add_check;
  if (name == "plan") return add_plan;
  return nullptr;
}

}  // namespace memgate::cli
