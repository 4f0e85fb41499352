// `memgate <args>` run for a test case in a process of its own, forked from the test program (which has LibTorch
// started already) instead of a new memgate-measure that starts it again: ~0.29 CPU-s a case, most of what a case
// that reads one bad file costs. The child does what memgate-measure's main() does for a measuring subcommand
// (run_command_line with its table, then exit_fast), in the case's folder, with the case's environment, its stdout and
// stderr into one file; the parent gets its exit status and output as testing::run gives them.
//
// A case runs the real program (testing::run of `cd <dir> && <env> memgate <args>`, as before) when the fork would
// not be the same run: a subcommand bin/memgate runs itself (summary, report, compare, ...: milliseconds to start),
// words a shell would do more with than split and unquote ($, globs, redirections, ...), a variable that must reach
// the program's start-up (anything but MEMGATE_* and the few read as memgate runs; MEMGATE_RANK_EXECUTABLE, a rank
// wrapper of the case's own), a test program with threads besides its main one (fork copies only the one that
// forks), or the caller's `real`. MEMGATE_TEST_FORK_CLI=0 runs every case as the real program;
// MEMGATE_TEST_CLI_RECORD=<folder> writes each case's exit code and output into <folder>/<Suite.Test>.<n>.txt, with
// whether it was forked: tests/cli/compare_cli_runs.py compares a run of each (the two must not differ).
//
// What the child sees differs from memgate-measure's in one way: /proc/self/exe is the test program. memgate reads it
// for a probe's rank program (launch/start.cpp rank_executable): the child is not a rank host (it never calls
// is_rank_command), so ranks and their fork server run as bin/memgate beside tests/ (build/<preset>/bin/memgate),
// which hands them to memgate-measure, the program the real run uses. The Python package (build/<preset>/python) and
// the data folder are found the same from tests/ as from libexec/memgate/. A child ends as memgate-measure does
// (exit_fast), which ends the fork servers it knows: a test program that runs probes in its own process (and so has
// fork servers of its own, launch/fork_server.h) must run its cases as the real program (`real`), unless it lends its
// Python fork server to them (lend_python_fork_server, `lend_python_server`): then each child ends with _exit and
// leaves this program's servers running.
#pragma once

#include "test_util.h"

#include "fixture_util.h"
#include "measure_cli.h"  // src/cli: memgate::cli::measures, run_command_line

#include "memgate/base/process.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/run.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memgate::testing {

/// `text` split into words as /bin/sh splits a command's words and removes their quotes ('...', "...", \x), or
/// nothing where the shell would do more: expansions ($, `, ~ first, globs), operators (| & ; < > ( )), a comment.
inline std::optional<std::vector<std::string>> plain_shell_words(std::string_view text) {
  constexpr auto npos = std::string_view::npos;
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::exchange(word, {}));
      in_word = false;
      continue;
    }
    if (!in_word && (c == '~' || c == '#')) return std::nullopt;
    in_word = true;
    if (c == '\'') {
      const auto end = text.find('\'', i + 1);
      if (end == npos) return std::nullopt;
      word.append(text.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= text.size()) return std::nullopt;
        const char d = text[i];
        if (d == '"') break;
        if (d == '$' || d == '`') return std::nullopt;
        if (d == '\\' && i + 1 < text.size() && std::string_view("$`\"\\\n").find(text[i + 1]) != npos) {
          if (text[++i] != '\n') word += text[i];
          continue;
        }
        word += d;
      }
    } else if (c == '\\') {
      if (i + 1 >= text.size()) return std::nullopt;
      if (text[++i] != '\n') word += text[i];
    } else if (std::string_view("|&;<>()$`*?[").find(c) != npos) {
      return std::nullopt;
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

/// Whether a variable set for a case may be set in a forked child rather than before a program starts: memgate's own
/// (read as it runs), and the few others it reads as it runs.
inline bool read_as_memgate_runs(std::string_view name) {
  if (name == "MEMGATE_RANK_EXECUTABLE") return false;  // a rank program of the case's own: the real one
  if (name.starts_with("MEMGATE_")) return true;
  for (const std::string_view n : {"CI", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "TMPDIR", "PATH", "PYTHONPATH"}) {
    if (name == n) return true;
  }
  return false;
}

/// Whether this process has no thread besides the one running (fork copies only that one).
inline bool has_one_thread() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec); !ec && it != decltype(it)(); ++it) ++n;
  return !ec && n == 1;
}

/// How a case's memgate ended.
struct CliRun {
  int exit_code = -1;  ///< as testing::run gives it (-1: it could not start, or a signal ended it)
  std::string output;  ///< stdout and stderr together
  bool forked = false;  ///< forked from the test program (else the real program ran)
};

/// This process's environment without the variables `names` while it lives; each is set back as it was after.
class WithoutVariables {
 public:
  explicit WithoutVariables(const std::vector<std::string>& names) {
    for (const auto& name : names) {
      if (const char* value = std::getenv(name.c_str()); value != nullptr) saved_.emplace_back(name, value);
      ::unsetenv(name.c_str());
    }
  }
  ~WithoutVariables() {
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  WithoutVariables(const WithoutVariables&) = delete;
  WithoutVariables& operator=(const WithoutVariables&) = delete;

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

#ifdef MEMGATE_CLI
namespace detail {

// The environments, by the variables their runs unset, for which this process lends its Python fork server
// (lend_python_fork_server).
inline std::set<std::vector<std::string>>& lent_python_fork_servers() {
  static std::set<std::vector<std::string>> lent;
  return lent;
}

// The case's memgate forked from this process; nothing where it could not fork. The child of a process that lends
// its Python fork server ends with _exit, not as memgate-measure does (exit_fast), whose handler would end the fork
// servers it inherited: this process's, lent to the next runs too (a server the child started ends with it all the
// same, PR_SET_PDEATHSIG).
inline std::optional<CliRun> fork_memgate(const std::string& dir, const std::vector<std::string>& unset,
                                          const std::vector<std::string>& env, const std::vector<std::string>& args) {
  const bool keep_fork_servers = !lent_python_fork_servers().empty();
  TempDir scratch;
  const auto out_path = scratch / "output";
  std::vector<std::string> argv_text{MEMGATE_CLI};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);  // nothing of this process's buffers printed twice
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    for (const auto& name : unset) ::unsetenv(name.c_str());
    for (const auto& e : env) {
      const auto eq = e.find('=');
      ::setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
    }
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(127);
    ::close(fd);
    // As a new program's: stdout fully buffered (into a file), stderr unbuffered.
    std::setvbuf(stdout, nullptr, _IOFBF, BUFSIZ);
    std::setvbuf(stderr, nullptr, _IONBF, 0);
    const int code =
        memgate::cli::run_command_line(static_cast<int>(argv.size()) - 1, argv.data(), memgate::cli::measures);
    if (!keep_fork_servers) memgate::exit_fast(code);
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    ::_exit(code);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  CliRun run;
  run.forked = true;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.output = read_file(out_path);
  return run;
}

// The n-th run of a test into <folder>/<Suite.Test>.<n>.txt.
inline void record(const CliRun& run) {
  const char* folder = std::getenv("MEMGATE_TEST_CLI_RECORD");
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (folder == nullptr || *folder == '\0' || test == nullptr) return;
  std::string name = std::string(test->test_suite_name()) + "." + test->name();
  for (auto& c : name) c = c == '/' ? '_' : c;
  static std::map<std::string, int> runs;
  write_file(std::string(folder) + "/" + name + "." + std::to_string(runs[name]++) + ".txt",
             std::to_string(run.exit_code) + (run.forked ? " forked\n" : " real\n") + run.output);
}

}  // namespace detail

/// Whether this process lends its Python fork server (launch/fork_server.h: one per Python and environment, started on
/// a process's first Python probe) to forked runs that unset `unset`, started now by one probe of a plain Python
/// fixture (a Linear of torch alone; `unset` unset meanwhile) where it has none yet and has one thread (fork copies
/// that one only), unless MEMGATE_TEST_FORK_CLI=0. A forked run (run_memgate, run_cli with lend_python_server) whose
/// probes' Python and environment are that server's finds it among what it inherited and forks them from it, as a
/// memgate process forks each of its probes from its own: it pays no Python start and no import of torch (~1.5 CPU-s).
inline bool lend_python_fork_server(const std::vector<std::string>& unset = {}) {
  auto& lent = detail::lent_python_fork_servers();
  if (lent.contains(unset)) return true;
  const char* fork_cli = std::getenv("MEMGATE_TEST_FORK_CLI");
  if (!has_one_thread() || (fork_cli != nullptr && std::string_view(fork_cli) == "0")) return false;
  lent.insert(unset);
  TempDir plain;
  write_file(plain / "f.yaml", "model:\n  arch: python\n  entry: models.py:build\n  inputs:\n"
                               "    - {shape: [B, 4], dtype: float32}\n  task: sum\nbatch_sizes: [1]\n");
  write_file(plain / "models.py", "import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n");
  const auto probe = [&] {
    const WithoutVariables without(unset);
    return run_probe(load_fixture(plain / "f.yaml"), 1, kCpu);
  }();
  EXPECT_TRUE(probe.measured()) << probe.error;
  return true;
}

namespace detail {

// The case forked, where that is the same run (above); nothing where the real program must run it. `prefix`: what
// comes before memgate, variables to set (VAR=value ...), or `env`, then -u VAR and VAR=value words.
// `lend_python_server`: a run that sets no variable has its Python probes forked from this process's Python fork
// server for runs that unset what it unsets (lend_python_fork_server); one that sets some has an environment of its
// own, and starts a server of its own as memgate does.
inline std::optional<CliRun> forked(const std::string& dir, const std::string& prefix, const std::string& args,
                                   bool lend_python_server = false) {
  const char* fork_cli = std::getenv("MEMGATE_TEST_FORK_CLI");
  if (fork_cli != nullptr && std::string_view(fork_cli) == "0") return std::nullopt;
  auto env_words = plain_shell_words(prefix);
  const auto arg_words = plain_shell_words(args);
  if (!env_words || !arg_words || arg_words->empty() || memgate::cli::measures(arg_words->front()) == nullptr) {
    return std::nullopt;
  }
  std::vector<std::string> unset, set;
  const bool env_program = !env_words->empty() && env_words->front() == "env";
  for (std::size_t i = env_program ? 1 : 0; i < env_words->size(); ++i) {
    const auto& e = (*env_words)[i];
    if (env_program && set.empty() && e == "-u" && i + 1 < env_words->size()) {
      unset.push_back((*env_words)[++i]);
      if (!read_as_memgate_runs(unset.back())) return std::nullopt;
      continue;
    }
    constexpr std::string_view kNameChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_";
    const auto name = std::string_view(e).substr(0, std::min(e.find('='), e.size()));
    if (name.size() == e.size() || name.empty() || name.find_first_not_of(kNameChars) != std::string_view::npos ||
        !read_as_memgate_runs(name)) {
      return std::nullopt;
    }
    set.push_back(e);
  }
  if (!has_one_thread()) return std::nullopt;
  if (lend_python_server && set.empty()) (void)lend_python_fork_server(unset);
  return fork_memgate(dir, unset, set, *arg_words);
}

}  // namespace detail

/// `cd <dir> && <env> memgate <args>` (env: VAR=value words, args: a shell's words, as the tests write them): forked
/// from this process where that is the same run (above), else (or with `real`) the real program through /bin/sh.
/// `lend_python_server`: its Python probes from this process's Python fork server (detail::forked).
inline CliRun run_memgate(const std::string& dir, const std::string& env, const std::string& args, bool real = false,
                          bool lend_python_server = false) {
  std::optional<CliRun> run;
  if (!real) run = detail::forked(dir, env, args, lend_python_server);
  if (!run) {
    run.emplace();
    run->exit_code = testing::run("cd " + dir + " && " + env + " " + MEMGATE_CLI + " " + args, &run->output);
  }
  detail::record(*run);
  return *run;
}

/// testing::run for a command that runs memgate: `[VAR=value ...] <MEMGATE_CLI> <args>` or `env [-u VAR ...]
/// [VAR=value ...] <MEMGATE_CLI> <args>` (nothing after but its arguments) forked as run_memgate forks it, in this
/// process's folder; any other command as testing::run runs it. `lend_python_server`: as run_memgate's.
inline int run_cli(const std::string& command, std::string* output = nullptr, bool lend_python_server = false) {
  const std::string cli = MEMGATE_CLI;
  std::optional<CliRun> run;
  if (const auto at = command.find(cli + " "); at != std::string::npos && (at == 0 || command[at - 1] == ' ')) {
    run = detail::forked(std::filesystem::current_path().string(), command.substr(0, at),
                         command.substr(at + cli.size() + 1), lend_python_server);
  }
  if (!run) {
    run.emplace();
    run->exit_code = testing::run(command, &run->output);
  }
  detail::record(*run);
  if (output != nullptr) *output = std::move(run->output);
  return run->exit_code;
}

/// run_cli of a developer's run as the Python tests write it (`env -u CI -u MEMGATE_STRICT memgate ...`: not in CI, not
/// strict), its Python probes from this process's Python fork server for such runs (lend_python_server).
inline int run_dev(const std::string& command, std::string* output) {
  return run_cli(command, output, /*lend_python_server=*/true);
}
#endif

}  // namespace memgate::testing
