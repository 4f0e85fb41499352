// The watchdog on a probe's progress (issue 56): a probe process whose work stops moving is ended after the probe's
// timeout, however alive it looks (its heartbeat thread beats whatever the work does), together with the processes
// its model's code started, and a probe that exits with 0 without its result is said to have done so. One test per
// kind of hang, each through the CLI with --rank-timeout 3: a Python forward that sleeps, one that spins holding the
// GIL, a builder that sleeps (having started a child process that would outlive it), a rank hung in its step while
// its peer waits in a collective, a stopped rank, and a probe that exits with 0 (os._exit in forward, and a local
// memgate.py shadowing memgate's package). Each must end within the timeout plus its start, exit 3, name the probe,
// its phase, how long and the timeout, and leave no process (the model's child processes included) and no file.
#include "spawn_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace memgate {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::exit_code;
using testing::Memgate;
using testing::Outcome;
using testing::processes_where;

// The probes' timeout here: short, so that each test ends in seconds.
constexpr int kTimeout = 3;

// Whether `pid` is a live process (a zombie that nobody reaps in a container counts as gone).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// One case: its folders (a private TMPDIR, the fixture's and memgate's output), and memgate once started.
struct Probe {
  testing::TempDir tmp, out;
  std::unique_ptr<Memgate> memgate;
  pid_t memgate_pid = -1;
};

// What is left of a probe after it ended: its processes (given a moment to go), the child processes its model's
// code started (their pids in `pids`, one a line), its fork server, and the files in its TMPDIR.
void expect_nothing_left(const Probe& p, const std::string& pids = {}) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  // The fork servers of that memgate (Python's, or the rank program's): their command lines end with its pid.
  const std::vector<std::string> servers{fmt::format("memgate._forkserver{}{}{}", '\0', p.memgate_pid, '\0'),
                                         fmt::format("--memgate-fork-server{}{}{}", '\0', p.memgate_pid, '\0')};
  const auto left = [&] {
    std::vector<std::string> what;
    for (const auto pid : testing::probe_processes(p.tmp.path().string())) what.push_back(fmt::format("probe {}", pid));
    const auto is_server = [&](const auto&, const std::string& cmdline) {
      return std::any_of(servers.begin(), servers.end(),
                         [&](const auto& s) { return cmdline.find(s) != std::string::npos; });
    };
    for (const auto pid : processes_where(is_server)) what.push_back(fmt::format("fork server {}", pid));
    std::istringstream lines(pids.empty() ? std::string() : testing::read_file(pids));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && alive(std::stoi(line))) what.push_back("the model's child process " + line);
    }
    return what;
  };
  while (!left().empty() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_THAT(left(), ::testing::IsEmpty()) << "processes left running";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(p.tmp.path())) files.push_back(e.path().string());
  EXPECT_THAT(files, ::testing::IsEmpty()) << "files left in TMPDIR (a memgate-probe-* run folder)";
}

// memgate profile of `config` at batch 1 on the CPU with --rank-timeout kTimeout, its TMPDIR private.
void start(Probe& p, const std::string& config, std::vector<std::string> env = {}, const std::string& cwd = ".") {
  env.push_back("TMPDIR=" + p.tmp.path().string());
  env.push_back("TORCHINDUCTOR_CACHE_DIR=" + (p.out / "inductor"));
  p.memgate = std::make_unique<Memgate>(
      fmt::format("profile --config {} --batch-sizes 1 --device cpu --rank-timeout {}", config, kTimeout), env, p.out,
      cwd);
  p.memgate_pid = p.memgate->pid();
}

// The longest any case may take: the timeout, the start of a Python that imports torch on a busy 2-core machine,
// the grace the others get. A case that ran for ever (the bug) is killed at 60 s.
constexpr double kBound = kTimeout + 25;

Outcome finish(Probe& p, const std::string& name) {
  auto o = p.memgate->wait(std::chrono::seconds(60));
  std::cout << "[ watchdog ] " << name << ": ended in " << fmt::format("{:.1f}", o.seconds) << " s, exit "
            << exit_code(o) << ":\n" << o.output << std::endl;
  return o;
}

#ifdef MEMGATE_WATCHDOG_PYTHON

// The model's code: each builder starts a child process that would outlive its probe (`sleep 1000`) and notes its
// pid, then builds a module whose forward hangs as asked, or hangs itself.
constexpr const char* kModels = R"(import os
import subprocess
import time

import torch


def _child(pids):
    child = subprocess.Popen(["sleep", "1000"])
    with open(pids, "a") as f:
        f.write(f"{child.pid}\n")


class Model(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        if self.how == "sleep":
            time.sleep(1000)
        elif self.how == "spin":
            while True:  # holds the GIL
                pass
        elif self.how == "exit":
            os._exit(0)
        return self.lin(x)


def build(pids, how):
    _child(pids)
    if how == "build":
        time.sleep(1000)
    return Model(how)
)";

// A Python fixture whose model hangs as `how` says, in `p`'s output folder; the pids of its child processes go to
// pids.txt there.
std::string python_fixture(const Probe& p, const std::string& how) {
  testing::write_file(p.out / "models.py", kModels);
  testing::write_file(p.out / "f.yaml", fmt::format("model:\n  arch: python\n  entry: models.py:build\n"
                                                    "  args: {{pids: '{}', how: {}}}\n"
                                                    "  inputs:\n    - {{shape: [B, 4], dtype: float32}}\n"
                                                    "  task: sum\nbatch_sizes: [1]\n",
                                                    p.out / "pids.txt", how));
  return p.out / "f.yaml";
}

struct PythonHang {
  std::string how;
  std::vector<std::string> says;
};

// The hung Python probes, run two at a time (each mostly waits out its timeout).
void expect_python_hangs_ended(const std::vector<PythonHang>& cases) {
  std::vector<std::unique_ptr<Probe>> probes;
  for (const auto& c : cases) {
    probes.push_back(std::make_unique<Probe>());
    start(*probes.back(), python_fixture(*probes.back(), c.how));
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].how);
    auto& p = *probes[i];
    const auto o = finish(p, cases[i].how);
    EXPECT_EQ(exit_code(o), 3) << o.output;
    EXPECT_THAT(o.output, HasSubstr("f.yaml at batch 1"));
    EXPECT_THAT(o.output, HasSubstr(fmt::format("(the timeout is {} s: --rank-timeout or MEMGATE_RANK_TIMEOUT)",
                                                kTimeout)));
    for (const auto& s : cases[i].says) EXPECT_THAT(o.output, HasSubstr(s));
    EXPECT_LT(o.seconds, kBound);
    EXPECT_FALSE(testing::read_file(p.out / "pids.txt").empty()) << "the builder started no child";
    expect_nothing_left(p, p.out / "pids.txt");
  }
}

TEST(WatchdogTest, ASleepingPythonForwardIsEndedWithTheChildItsBuilderStarted) {
  expect_python_hangs_ended({{"sleep",
                              {"its Python probe is stuck: no progress for 3.", "at: eval forward, in the model's Python "
                               "forward (models.py:build)", "it is alive, but its work does not move"}}});
}

TEST(WatchdogTest, APythonForwardSpinningWithTheGilHeldIsEnded) {
  expect_python_hangs_ended({{"spin", {"its Python probe is stuck: no progress for 3.",
                                       "at: eval forward, in the model's Python forward (models.py:build)"}}});
}

TEST(WatchdogTest, AHangingBuilderIsEndedWithTheChildItStarted) {
  expect_python_hangs_ended({{"build", {"its Python probe is stuck: no progress for 3.",
                                        "at: counting the model's parameters (building it on the Meta device), in the "
                                        "model's Python build callable (models.py:build)"}}});
}

TEST(WatchdogTest, AProbeThatExitsWithZeroWithoutAResultIsSaidToHaveDoneSo) {
  Probe p;
  start(p, python_fixture(p, "exit"));
  const auto o = finish(p, "os._exit(0) in forward");
  EXPECT_EQ(exit_code(o), 3) << o.output;
  EXPECT_THAT(o.output, HasSubstr("f.yaml at batch 1"));
  EXPECT_THAT(o.output, HasSubstr("its Python probe exited with status 0 but wrote no result (did the model call "
                                  "os._exit or sys.exit? is a local memgate.py shadowing the package?)"));
  EXPECT_THAT(o.output, Not(HasSubstr("a probe's result file")));
  EXPECT_THAT(o.output, Not(HasSubstr("shadows memgate's Python package"))) << "no memgate.py here";
  EXPECT_LT(o.seconds, kBound);
  expect_nothing_left(p, p.out / "pids.txt");
}

TEST(WatchdogTest, ALocalMemgatePyShadowingThePackageIsNamed) {
  Probe p;
  const auto config = python_fixture(p, "none");
  testing::TempDir cwd;
  testing::write_file(cwd / "memgate.py", "print('my own memgate, not the package')\n");
  start(p, config, {}, cwd.path().string());
  const auto o = finish(p, "a local memgate.py");
  EXPECT_EQ(exit_code(o), 3) << o.output;
  EXPECT_THAT(o.output, HasSubstr("its Python probe exited with status 0 but wrote no result"));
  EXPECT_THAT(o.output, HasSubstr(fmt::format("{} shadows memgate's Python package", cwd / "memgate.py")));
  EXPECT_THAT(o.output, HasSubstr("my own memgate, not the package")) << "the end of its log";
  expect_nothing_left(p);
}

#endif  // MEMGATE_WATCHDOG_PYTHON

// A rank whose work stops while its heartbeat goes on (a wedged call) and one that is stopped (SIGSTOP): each ends
// the probe after the timeout, named with its phase, before its peer's collective (waiting on it) times out.
TEST(WatchdogTest, AHungRankAndAStoppedRankEndTheProbeNamingTheRankAndItsPhase) {
  const auto fixture = testing::source_dir() + "/fixtures/models/vit_tiny_ddp.yaml";
  struct Case {
    std::string fault;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {"1:hang:measured step: forward",
       {"rank 1 of 2 is stuck: no progress for 3.", "at: measured step: forward (the timeout is 3 s"}},
      {"1:stop:warm-up step: backward",
       {"rank 1 of 2 stopped answering: no progress and no heartbeat for 3.", "at: warm-up step: backward"}}};
  std::vector<std::unique_ptr<Probe>> probes;
  for (const auto& c : cases) {
    probes.push_back(std::make_unique<Probe>());
    start(*probes.back(), fixture, {"MEMGATE_TEST_RANK_FAULT=" + c.fault});
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].fault);
    const auto o = finish(*probes[i], cases[i].fault);
    EXPECT_EQ(exit_code(o), 3) << o.output;
    EXPECT_THAT(o.output, HasSubstr("vit_tiny_ddp.yaml at batch 1"));
    for (const auto& s : cases[i].says) EXPECT_THAT(o.output, HasSubstr(s));
    EXPECT_THAT(o.output, Not(HasSubstr("rank 0 of 2 exited"))) << "the stuck rank is named, not its waiting peer";
    EXPECT_LT(o.seconds, kTimeout + 15);
    expect_nothing_left(*probes[i]);
  }
}

}  // namespace
}  // namespace memgate
