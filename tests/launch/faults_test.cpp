// Faults in a probe's processes, as CI jobs meet them: a rank that hangs, fails, crashes or cannot start, and a
// memgate that is killed or cancelled mid-probe. Each must end in bounded time with exit 3 (or the signal's status),
// a message naming the rank and the cause, and no process or file left behind. The faults are real (a rank stops
// itself with SIGSTOP, crashes with SIGSEGV, ...), injected at a phase by MEMGATE_TEST_RANK_FAULT, which only the
// test-only program memgate-measure-faults reads (MEMGATE_CLI here; tests/launch/fault_injection.cpp).
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
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace memgate {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

std::string fixture(const std::string& name) { return testing::source_dir() + "/fixtures/models/" + name + ".yaml"; }

// The processes whose command line contains `text`.
std::vector<pid_t> processes_with(const std::string& text) {
  return testing::processes_where(
      [&](const auto&, const std::string& cmdline) { return cmdline.find(text) != std::string::npos; });
}

// py_resnet_tiny_torchvision over 2 DDP ranks, in `dir`: Python ranks, forked from memgate's fork server. (Torch
// makes its compile cache, torchinductor_<user>, in the temporary directory, to keep: inductor_cache_in(dir) puts it
// in `dir`.) A Python rank runs memgate's Python extension, which has no fault points (launch/fault_points.h): the
// fixture's own model injects MEMGATE_TEST_RANK_FAULT=<rank>:<fault>:<phase> (crash, exit, stop or slow, in its
// first forward in that phase, which the rank's heartbeat file names), as memgate-measure-faults does for a C++ rank;
// or one fault per batch size, <batch>=<rank>:<fault>:<phase>;... (each probe of a profile with its own).
std::string python_ddp_fixture(const testing::TempDir& dir) {
  const auto models = testing::source_dir() + "/fixtures/models/";
  auto text = testing::read_file(models + "py_resnet_tiny_torchvision.yaml");
  text.replace(text.find("  trainable: all\n"), 17,
               "  trainable: all\n  distributed:\n    strategy: ddp\n    world_size: 2\n");
  text.replace(text.find("entry: python/models.py"), 23, "entry: " + (dir / "faulty_models.py"));
  testing::write_file(dir / "py_ddp.yaml", text);
  // A rank's request (--request FILE, launch/request.h) names its rank; the probe of the parent has no store.
  testing::write_file(dir / "faulty_models.py", fmt::format(R"(import json, os, signal, sys, time
sys.path.insert(0, "{}python")
import models

def torchvision_resnet(**kwargs):
    model = models.torchvision_resnet(**kwargs)
    spec = os.environ.get("MEMGATE_TEST_RANK_FAULT", "")
    if not spec or "--request" not in sys.argv:
        return model
    with open(sys.argv[sys.argv.index("--request") + 1]) as f:
        request = json.load(f)
    faults = dict(one.split("=", 1) for one in spec.split(";")) if "=" in spec else {{}}
    spec = faults.get(str(request["batch_sizes"][0]), "") if faults else spec
    if not spec:
        return model
    rank, fault, phase = spec.split(":", 2)
    if not request.get("store") or request.get("rank") != int(rank):
        return model
    fired = [False]
    def inject(module, inputs):
        # Once, in the phase asked for, which the rank's heartbeat names (its thread writes a phase as it begins).
        if fired[0]:
            return
        deadline = time.monotonic() + 1
        while not fired[0]:
            try:
                with open(request["heartbeat"]) as f:
                    fired[0] = phase in f.read()
            except OSError:
                pass
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "exit":
            os._exit(7)
        if fault == "stop":
            time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGSTOP)
        if fault == "slow":
            time.sleep(60)
    model.register_forward_pre_hook(inject)
    return model
)",
                                                            models));
  return dir / "py_ddp.yaml";
}

std::string inductor_cache_in(const testing::TempDir& dir) { return "TORCHINDUCTOR_CACHE_DIR=" + (dir / "inductor"); }

// What is left of a probe after it ended: its rank processes (given a moment to go) and the files in its TMPDIR.
void expect_nothing_left(const testing::TempDir& tmp) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!testing::probe_processes(tmp.path().string()).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(testing::probe_processes(tmp.path().string()), ::testing::IsEmpty()) << "rank processes left running";
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp.path())) left.push_back(e.path().string());
  EXPECT_THAT(left, ::testing::IsEmpty()) << "files left in TMPDIR";
}

// The probes' --rank-timeout: short, yet long enough for two ranks to start and meet on a loaded CI machine.
constexpr int kTimeout = 5;

// `memgate profile` of `fixture_name` (one of fixtures/models, or a fixture's path) at batch 1, started.
std::unique_ptr<testing::Memgate> start_profile(const testing::TempDir& tmp, const testing::TempDir& out,
                                                const std::string& fixture_name, const std::vector<std::string>& env,
                                                int timeout_s = kTimeout) {
  auto all = env;
  all.push_back("TMPDIR=" + tmp.path().string());
  const auto path = fixture_name.ends_with(".yaml") ? fixture_name : fixture(fixture_name);
  return std::make_unique<testing::Memgate>(
      fmt::format("profile --config {} --batch-sizes 1 --device cpu --rank-timeout {}", path, timeout_s), all, out);
}

// ... and waited for.
testing::Outcome profile_with(const testing::TempDir& tmp, const testing::TempDir& out,
                              const std::string& fixture_name, const std::vector<std::string>& env,
                              int timeout_s = kTimeout) {
  return start_profile(tmp, out, fixture_name, env, timeout_s)->wait(std::chrono::seconds(timeout_s + 60));
}

TEST(RankFaultTest, AStoppedRankEndsTheProbeWithinTheTimeoutNamingItAndItsPhase) {
  testing::TempDir tmp, out;
  const auto o = profile_with(tmp, out, "vit_tiny_ddp", {"MEMGATE_TEST_RANK_FAULT=1:stop:measured step: forward"});
  EXPECT_EQ(testing::exit_code(o), 3) << o.output;
  EXPECT_THAT(o.output, HasSubstr("rank 1 of 2"));
  EXPECT_THAT(o.output, HasSubstr("stopped answering"));
  EXPECT_THAT(o.output, HasSubstr("measured step: forward"));
  EXPECT_LT(o.seconds, kTimeout + 15) << "the timeout plus a few seconds";
  expect_nothing_left(tmp);
}

TEST(RankFaultTest, ARankThatFailsIsNamedWithItsCauseNotItsStack) {
  struct Case {
    std::string fault, says;
  };
  for (const auto& [fault, says] : std::vector<Case>{
           {"1:error:measured step: backward", "memgate rank 1: a fault injected by MEMGATE_TEST_RANK_FAULT"},
           {"1:crash:warm-up", "rank 1 of 2 was killed by signal 11"},
           {"0:exit:joining", "rank 0 of 2 exited with status 7"}}) {
    SCOPED_TRACE(fault);
    testing::TempDir tmp, out;
    const auto o = profile_with(tmp, out, "vit_tiny_fsdp", {"MEMGATE_TEST_RANK_FAULT=" + fault});
    EXPECT_EQ(testing::exit_code(o), 3) << o.output;
    EXPECT_THAT(o.output, HasSubstr(says));
    EXPECT_THAT(o.output, HasSubstr("vit_tiny_fsdp.yaml at batch 1"));
    EXPECT_THAT(o.output, Not(HasSubstr("frame #")));
    expect_nothing_left(tmp);
  }
}

TEST(RankFaultTest, ARankThatCannotStartEndsTheOnesStartedBefore) {
  testing::TempDir tmp, out;
  // Rank 0 starts and would train a minute; rank 1 cannot start.
  const auto o = profile_with(tmp, out, "vit_tiny_ddp",
                              {"MEMGATE_TEST_FAIL_START=1", "MEMGATE_TEST_RANK_FAULT=0:slow:joining"});
  EXPECT_EQ(testing::exit_code(o), 3) << o.output;
  EXPECT_THAT(o.output, HasSubstr("cannot start rank 1 of 2"));
  EXPECT_LT(o.seconds, 20) << "rank 0 must not be waited for";
  expect_nothing_left(tmp);
}

// Kills memgate once its ranks are in their measured step (rank 1 there for a minute), as CI cancels a job. The
// ranks are forked from a fork server (launch/fork_server.h), which must be gone too; `python`: a Python fixture's.
void kill_mid_probe(int signal, bool group, bool python = false) {
  testing::TempDir tmp, out;
  const auto path = python ? python_ddp_fixture(out) : fixture("vit_tiny_ddp");
  testing::Memgate m(fmt::format("profile --config {} --batch-sizes 1 --device cpu", path),
                     {"TMPDIR=" + tmp.path().string(), "MEMGATE_TEST_RANK_FAULT=1:slow:measured step",
                      inductor_cache_in(out)},
                     out);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  auto in_step = [&] {
    for (const auto& e : std::filesystem::recursive_directory_iterator(tmp.path())) {
      if (e.path().filename() == "rank1.beat" && testing::read_file(e.path()).find("measured step") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  while (!in_step() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(in_step()) << "the ranks never reached their measured step";
  EXPECT_EQ(testing::probe_processes(tmp.path().string()).size(), 2U);
  // The server its ranks were forked from (they have its command line): Python's, or the rank program's own.
  const auto server = fmt::format("{0}{1}{2}{1}", python ? "memgate._forkserver" : "--memgate-fork-server", '\0',
                                  m.pid());
  EXPECT_EQ(processes_with(server).size(), 3U) << "the fork server and its two ranks";
  ASSERT_EQ(::kill(group ? -m.pid() : m.pid(), signal), 0);
  const auto o = m.wait(std::chrono::seconds(30));
  EXPECT_TRUE(WIFSIGNALED(o.status) && WTERMSIG(o.status) == signal) << "ended by the signal it got: " << o.status;
  EXPECT_LT(o.seconds, 30);
  expect_nothing_left(tmp);
  const auto gone_by = Clock::now() + std::chrono::seconds(5);
  while (!processes_with(server).empty() && Clock::now() < gone_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(processes_with(server), ::testing::IsEmpty()) << "the fork server left running";
}

TEST(RankFaultTest, KilledMemgateLeavesNoRankAndNoFile) { kill_mid_probe(SIGKILL, /*group=*/false); }
TEST(RankFaultTest, TerminatedMemgateEndsItsRanksAndRemovesItsFiles) { kill_mid_probe(SIGTERM, /*group=*/false); }
TEST(RankFaultTest, CtrlCToTheProcessGroupLeavesNothing) { kill_mid_probe(SIGINT, /*group=*/true); }
TEST(RankFaultTest, KilledMemgateLeavesNoForkedPythonRankNoForkServerAndNoFile) {
  kill_mid_probe(SIGKILL, /*group=*/false, /*python=*/true);
}
TEST(RankFaultTest, CtrlCLeavesNoForkedPythonRankAndNoForkServer) {
  kill_mid_probe(SIGINT, /*group=*/true, /*python=*/true);
}

// Python ranks forked from the fork server fail as ranks started directly do: named, with their cause. The three
// faults are the three probes of one profile, one a batch size, each forked from the one fork server (which a crashed,
// an exited and a stopped rank each leave able to fork the next probe's ranks): the stopped one mostly waits out its
// timeout.
TEST(RankFaultTest, AForkedPythonRankThatFailsIsNamedWithItsCause) {
  testing::TempDir fixture_dir, tmp, out;
  const auto path = python_ddp_fixture(fixture_dir);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"1=1:crash:warm-up", "rank 1 of 2 was killed by signal 11"},
      {"2=0:exit:warm-up", "rank 0 of 2 exited with status 7"},
      {"3=1:stop:measured step: forward", "rank 1 of 2 stopped answering"}};
  std::string faults;
  for (const auto& c : cases) faults += (faults.empty() ? "" : ";") + c.first;
  testing::Memgate m(fmt::format("profile --config {} --batch-sizes 1,2,3 --device cpu --rank-timeout {}", path,
                                 kTimeout),
                     {"TMPDIR=" + tmp.path().string(), "MEMGATE_TEST_RANK_FAULT=" + faults,
                      inductor_cache_in(fixture_dir)},
                     out);
  const auto o = m.wait(std::chrono::seconds(3 * (kTimeout + 60)));
  EXPECT_EQ(testing::exit_code(o), 3) << o.output;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    EXPECT_THAT(o.output, HasSubstr(fmt::format("py_ddp.yaml at batch {}: {}", i + 1, cases[i].second)));
  }
  expect_nothing_left(tmp);
}

TEST(RankFaultTest, TwoProbesInOneTemporaryDirectoryMeetNeitherEachOtherNorItsFiles) {
  testing::TempDir tmp, out1, out2;
  // What a probe of another container could have there, under the names memgate once used.
  const auto theirs = tmp / "memgate-ranks-1-0/store";
  testing::write_file(theirs, "another probe's store");
  std::vector<std::string> env{"TMPDIR=" + tmp.path().string()};
  const auto args = fmt::format("profile --config {} --batch-sizes 1 --device cpu", fixture("vit_tiny_ddp"));
  testing::Memgate a(args, env, out1), b(args, env, out2);
  const auto oa = a.wait(std::chrono::seconds(120)), ob = b.wait(std::chrono::seconds(120));
  EXPECT_EQ(testing::exit_code(oa), 0) << oa.output;
  EXPECT_EQ(testing::exit_code(ob), 0) << ob.output;
  EXPECT_EQ(testing::read_file(theirs), "another probe's store");
  memgate::remove_tree(tmp / "memgate-ranks-1-0");
  expect_nothing_left(tmp);
}

// Many short probes, each with a fault drawn at random (seeded) at a random phase of a random rank: none may hang,
// each ends with 0 (no fault fired) or 3, and nothing is left behind.
TEST(RankFaultTest, RandomFaultsInManyProbesNeverHangOrLeaveAnything) {
  const std::vector<std::string> faults{"error", "exit", "crash", "stop", "none"};
  const std::vector<std::string> phases{"joining", "building the model", "warm-up step: forward",
                                        "warm-up step: backward", "measured step: forward", "measured step: backward",
                                        "measured step: optimizer", "eval"};
  const std::vector<std::string> fixtures{"vit_tiny_ddp", "vit_tiny_fsdp"};
  struct Probe {
    std::string fault, phase;
    unsigned rank;
    std::string fixture;
  };
  std::mt19937 random(20261125);
  std::vector<Probe> drawn;
  for (int i = 0; i < 10; ++i) {
    Probe p;
    p.fault = faults[random() % faults.size()];
    p.phase = phases[random() % phases.size()];
    p.rank = random() % 2;
    p.fixture = fixtures[random() % fixtures.size()];
    drawn.push_back(std::move(p));
  }
  // Up to five probes at a time, as several CI jobs on one runner would run them, the next started as soon as one
  // ends: a stopped rank's probe mostly waits out its timeout (two at a time, in turn, the test took 22 s with 6 s
  // of CPU).
  constexpr std::size_t kAtATime = 5;
  struct Running {
    std::size_t index;
    std::unique_ptr<testing::TempDir> tmp, out;
    std::unique_ptr<testing::Memgate> memgate;
  };
  std::vector<Running> running;
  std::size_t next = 0;
  while (next < drawn.size() || !running.empty()) {
    while (next < drawn.size() && running.size() < kAtATime) {
      const auto& p = drawn[next];
      std::vector<std::string> env;
      if (p.fault != "none") env.push_back(fmt::format("MEMGATE_TEST_RANK_FAULT={}:{}:{}", p.rank, p.fault, p.phase));
      Running r{next++, std::make_unique<testing::TempDir>(), std::make_unique<testing::TempDir>(), nullptr};
      r.memgate = start_profile(*r.tmp, *r.out, p.fixture, env);
      running.push_back(std::move(r));
    }
    bool ended = false;
    for (auto it = running.begin(); it != running.end();) {
      const auto o = it->memgate->poll(std::chrono::seconds(kTimeout + 60));
      if (!o) {
        ++it;
        continue;
      }
      const auto& p = drawn[it->index];
      SCOPED_TRACE(fmt::format("probe {}: {} rank {} {} at '{}'", it->index, p.fixture, p.rank, p.fault, p.phase));
      const int rc = testing::exit_code(*o);
      EXPECT_TRUE(rc == 0 || (rc == 3 && p.fault != "none")) << o->output;
      if (rc == 3) {
        EXPECT_THAT(o->output, HasSubstr(fmt::format("rank {} of 2", p.rank))) << o->output;
      }
      EXPECT_LT(o->seconds, kTimeout + 30);
      expect_nothing_left(*it->tmp);
      it = running.erase(it);
      ended = true;
    }
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace
}  // namespace memgate
