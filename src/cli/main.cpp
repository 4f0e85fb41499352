// bin/memgate, the memgate command. It runs the subcommands that read files itself, with no LibTorch loaded (it
// starts in milliseconds), and hands the ones that measure, and a probe's ranks, to libexec/memgate/memgate-measure
// by exec: the same process, arguments, exit status and signals, as if it had run them.
#include "cli.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace {

using memgate::cli::AddSubcommand;

AddSubcommand reads_files(std::string_view name) {
  if (name == "summary") return memgate::cli::add_summary;
  if (name == "report") return memgate::cli::add_report;
  if (name == "compare") return memgate::cli::add_compare;
  if (name == "replay") return memgate::cli::add_replay;
  if (name == "bench-compare") return memgate::cli::add_bench_compare;
  if (name == "bench-merge") return memgate::cli::add_bench_merge;
  if (name == "bench-convert") return memgate::cli::add_bench_convert;
  return nullptr;
}

// A measuring subcommand, or a rank of a probe (memgate-measure starts ranks from itself; a program that runs no
// ranks of its own starts them through bin/memgate: launch/ranks.cpp).
bool measures(std::string_view first) {
  if (first == "--memgate-rank" || first == "--memgate-fork-server") return true;
  for (const auto& s : memgate::cli::kSubcommands) {
    if (s.measures && first == s.name) return true;
  }
  return false;
}

// <prefix>/libexec/memgate/memgate-measure, for <prefix>/bin/memgate (an install, a build tree, a Python
// environment).
std::filesystem::path measuring_program() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libexec/memgate/memgate-measure";
  return self.parent_path().parent_path() / "libexec" / "memgate" / "memgate-measure";
}

int hand_over(char** argv) {
  const auto program = measuring_program();
  ::execv(program.c_str(), argv);
  const int error = errno;
  fmt::print(stderr,
             "memgate: error: memgate {} runs {}, which cannot be started ({}): reinstall memgate, or build its "
             "memgate target again\n",
             argv[1], program.string(), std::strerror(error));
  return memgate::cli::kError;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && measures(argv[1])) return hand_over(argv);
  return memgate::cli::run_command_line(argc, argv, reads_files);
}
