// Memory snapshot pickles read as plain data: what Python's pickle writes (protocols 2, 4, 5) reads back as Python
// reads it; anything that would run code, a truncated file, a cycle, an exponential memo expansion or an integer
// beyond 64 bits is an error naming the file, never a crash and never run.
#include "memgate/allocator/snapshot_pickle.h"

#include "memgate/base/error.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace memgate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Runs `code` in Python with `out` (a path) as sys.argv[1]; the code writes a pickle there.
void python_writes(const std::string& code, const std::string& out) {
  testing::TempDir dir;
  const auto script = dir / "make.py";
  testing::write_file(script, code);
  std::string log;
  ASSERT_EQ(testing::run(std::string(MEMGATE_TEST_PYTHON) + " " + script + " " + out, &log), 0) << log;
}

// What Python's own json makes of a pickle (tuples as lists, int keys as text): the reference.
nlohmann::json python_reads(const std::string& pickle) {
  testing::TempDir dir;
  const auto script = dir / "read.py";
  const auto out = dir / "out.json";
  testing::write_file(script,
                      "import json, pickle, sys\n"
                      "with open(sys.argv[1], 'rb') as f: v = pickle.load(f)\n"
                      "with open(sys.argv[2], 'w') as f: json.dump(v, f)\n");
  std::string log;
  EXPECT_EQ(testing::run(std::string(MEMGATE_TEST_PYTHON) + " " + script + " " + pickle + " " + out, &log), 0) << log;
  return nlohmann::json::parse(testing::read_file(out));
}

// A snapshot as torch.cuda.memory._snapshot() makes it: segments with blocks, one trace per device, settings.
const std::string kSnapshot = R"(import pickle, sys
frames = [{'filename': 'train.py', 'line': 12, 'name': 'forward'}]
trace = []
for i in range(300):
    trace.append({'action': 'segment_alloc', 'addr': 139637976727552 + i * 2097152, 'size': 2097152, 'stream': 0,
                  'time_us': 1700000000000000 + i, 'frames': frames})
    trace.append({'action': 'alloc', 'addr': 139637976727552 + i * 2097152, 'size': 512 * (i + 1), 'stream': 0,
                  'time_us': 1700000000000000 + i, 'frames': frames})
trace.append({'action': 'oom', 'addr': 0, 'size': 85899345920, 'stream': 7, 'device_free': 100, 'frames': frames})
s = {'segments': [{'device': 0, 'address': 139637976727552, 'total_size': 2097152, 'allocated_size': 512,
                   'active_size': 512, 'requested_size': 500, 'stream': 0, 'segment_type': 'small',
                   'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': frames,
                   'blocks': [{'address': 139637976727552, 'size': 512, 'requested_size': 500, 'state': 'active_allocated',
                               'frames': frames}, {'address': 139637976728064, 'size': 2096640, 'state': 'inactive'}]}],
     'device_traces': [trace, []],
     'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1, 'garbage_collection_threshold': 0.0,
                            'expandable_segments': False, 'roundup_power2_divisions': {1: 0, 2048: 4},
                            'pinned_num_register_threads': 1, 'release_lock_on_cudamalloc': False},
     'numbers': [0, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**31, 2**63 - 1, -2**63, 0.5, -1e300, None, True],
     'text': 'caf\u00e9 \u2603 \U0001f600'}
with open(sys.argv[1], 'wb') as f:
    pickle.dump(s, f, protocol=PROTO)
)";

TEST(SnapshotPickleTest, ReadsWhatPythonWritesAsPythonReadsIt) {
  testing::TempDir dir;
  for (const int protocol : {2, 3, 4, 5}) {
    const auto file = dir / ("s" + std::to_string(protocol) + ".pickle");
    auto code = kSnapshot;
    code.replace(code.find("PROTO"), 5, std::to_string(protocol));
    python_writes(code, file);
    const auto read = load_plain_pickle(file);
    EXPECT_EQ(read, python_reads(file)) << "protocol " << protocol;
    EXPECT_EQ(read["device_traces"][0].size(), 601U);
    EXPECT_EQ(read["device_traces"][0][600]["size"], 85899345920LL);
    EXPECT_EQ(read["segments"][0]["segment_pool_id"], nlohmann::json::array({0, 0})) << "a tuple reads as a list";
    EXPECT_EQ(read["allocator_settings"]["roundup_power2_divisions"]["2048"], 4) << "an int key reads as its text";
  }
}

// Python memoizes a container once and refers to it again (the snapshot's frames are shared by many events); a
// memoized dict is filled after it is memoized, so each reference must see it filled.
TEST(SnapshotPickleTest, SharedContainersReadFilledAtEveryReference) {
  testing::TempDir dir;
  const auto file = dir / "shared.pickle";
  python_writes("import pickle, sys\nframe = {'name': 'f', 'line': 1}\nstack = [frame, frame]\n"
                "v = {'a': stack, 'b': stack, 'c': [stack] * 3}\n"
                "pickle.dump(v, open(sys.argv[1], 'wb'), protocol=4)\n",
                file);
  const auto read = load_plain_pickle(file);
  EXPECT_EQ(read, python_reads(file));
  EXPECT_EQ(read["c"][2][1]["line"], 1);
}

TEST(SnapshotPickleTest, RefusesWhatWouldRunCodeNamingTheFileAndTheOpcode) {
  testing::TempDir dir;
  const auto marker = dir / "ran";
  const auto file = dir / "hostile.pickle";
  python_writes("import os, pickle, sys\n"
                "class Run:\n"
                "    def __reduce__(self): return (os.system, ('touch " + marker + "',))\n"
                "pickle.dump({'segments': [Run()]}, open(sys.argv[1], 'wb'), protocol=4)\n",
                file);
  try {
    (void)load_plain_pickle(file);
    FAIL() << "a pickle that calls os.system was read";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(file));
    EXPECT_THAT(e.what(), HasSubstr("STACK_GLOBAL"));
    EXPECT_THAT(e.what(), HasSubstr("does not run it"));
  }
  EXPECT_FALSE(fs::exists(marker)) << "the file ran";
  for (const int protocol : {0, 1, 2}) {  // GLOBAL in older protocols; protocols 0 and 1 are refused at the header
    python_writes("import os, pickle, sys\nclass Run:\n    def __reduce__(self): return (os.getcwd, ())\n"
                  "pickle.dump([Run()], open(sys.argv[1], 'wb'), protocol=" + std::to_string(protocol) + ")\n",
                  file);
    EXPECT_THROW((void)load_plain_pickle(file), Error) << "protocol " << protocol;
  }
}

TEST(SnapshotPickleTest, EveryTruncationIsAnErrorNamingTheFile) {
  testing::TempDir dir;
  const auto file = dir / "s.pickle";
  auto code = kSnapshot;
  code.replace(code.find("PROTO"), 5, "4");
  python_writes(code, file);
  const auto whole = testing::read_file(file);
  for (std::size_t n = 0; n < whole.size(); n += (n < 4096 ? 1 : 997)) {
    try {
      (void)read_plain_pickle(std::string_view(whole).substr(0, n), "cut.pickle");
      FAIL() << "a pickle cut at byte " << n << " was read";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cut.pickle")) << n;
    }
  }
  EXPECT_NO_THROW((void)read_plain_pickle(whole, "whole.pickle"));
  EXPECT_THROW((void)read_plain_pickle(whole + "x", "trailing.pickle"), Error) << "bytes after STOP";
}

TEST(SnapshotPickleTest, RefusesCyclesExpansionsAndIntegersBeyond64Bits) {
  testing::TempDir dir;
  const auto file = dir / "v.pickle";
  auto refused = [&](const std::string& value, const std::string& says) {
    python_writes("import pickle, sys\n" + value + "\npickle.dump(v, open(sys.argv[1], 'wb'), protocol=4)\n", file);
    try {
      (void)load_plain_pickle(file);
      ADD_FAILURE() << value << " was read";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(says)) << value;
    }
  };
  refused("v = []\nv.append(v)", "contains itself");
  refused("v = {}\nv['self'] = [v]", "contains itself");
  // 2^40 leaves from 40 memo references: a few hundred bytes that would expand without end.
  refused("v = [0]\nfor _ in range(40): v = [v, v]", "more than");
  // Nesting past the limit that no single path of the file shows: a 300-deep chain, met again under another
  // 300-deep chain through a memo reference, nests 600 deep once read.
  refused("a = [0]\nfor _ in range(300): a = [a]\nb = a\nfor _ in range(300): b = [b]\nv = [a, b]",
          "nested deeper than 512");
  refused("sys.setrecursionlimit(10000)\nv = [0]\nfor _ in range(600): v = [v]", "nested deeper than 512");
  refused("v = [2**64]", "beyond 64 bits");
  refused("v = [-2**64]", "beyond 64 bits");
  refused("v = [-2**63 - 1]", "beyond 64 bits");
  refused("v = {1.5: 'a'}", "neither a string nor an integer");
  refused("v = {1, 2}", "opcode");  // a set: not in a snapshot
  // 400 deep, through the same memo reference twice, is within the limit.
  python_writes("import pickle, sys\na = [0]\nfor _ in range(200): a = [a]\nb = a\nfor _ in range(199): b = [b]\n"
                "pickle.dump([a, b], open(sys.argv[1], 'wb'), protocol=4)\n",
                file);
  EXPECT_EQ(load_plain_pickle(file), python_reads(file));
  // Snapshots hold unsigned 64-bit values too (2^64 - 1 for "none").
  python_writes("import pickle, sys\npickle.dump([2**63 - 1, -2**63, 2**62, -1, 0, 2**63, 2**64 - 1], "
                "open(sys.argv[1], 'wb'), protocol=4)\n",
                file);
  EXPECT_EQ(load_plain_pickle(file), nlohmann::json::parse("[9223372036854775807, -9223372036854775808, "
                                                           "4611686018427387904, -1, 0, 9223372036854775808, "
                                                           "18446744073709551615]"));
}

TEST(SnapshotPickleTest, NotAPickleSaysSo) {
  EXPECT_THROW((void)read_plain_pickle("", "empty.pickle"), Error);
  try {
    (void)read_plain_pickle("{\"segments\": []}", "snapshot.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("snapshot.json"));
    EXPECT_THAT(e.what(), HasSubstr("protocol header"));
  }
  EXPECT_THROW((void)load_plain_pickle("/no/such/snapshot.pickle"), Error);
}

// Real snapshots recorded on GPUs: the ones committed with their licences (tests/data/snapshots/NOTICE.md), and
// those of a folder MEMGATE_REAL_SNAPSHOTS names: each reads exactly as Python's pickle reads it.
TEST(SnapshotPickleTest, RealSnapshotsReadAsPythonReadsThem) {
  std::vector<fs::path> folders{fs::path(MEMGATE_TEST_SOURCE_DIR) / "tests" / "data" / "snapshots"};
  if (const char* folder = std::getenv("MEMGATE_REAL_SNAPSHOTS"); folder != nullptr && *folder != '\0') {
    folders.emplace_back(folder);
  }
  for (const auto& folder : folders) {
    int read = 0;
    for (const auto& entry : fs::directory_iterator(folder)) {
      const auto ext = entry.path().extension();
      if (ext != ".pickle" && ext != ".pkl") continue;
      EXPECT_EQ(load_plain_pickle(entry.path().string()), python_reads(entry.path().string())) << entry.path();
      ++read;
    }
    EXPECT_GT(read, 0) << folder;
    std::cout << "[ SNAPSHOT ] " << folder.string() << ": " << read << " real snapshots read\n";
  }
}

}  // namespace
}  // namespace memgate
