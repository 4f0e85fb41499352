// Memory snapshot pickles read as plain data: what Python's pickle writes (protocols 2, 4, 5) reads back as Python
// reads it; anything that would run code, a truncated file, a cycle, an exponential memo expansion or an integer
// beyond 64 bits is an error naming the file, never a crash and never run; memory follows the file's size; text
// that is not UTF-8 is carried escaped.
#include "memgate/allocator/snapshot_pickle.h"

#include "memgate/base/error.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>

// Every allocation of this test program goes through here, so that a test can meter what a read allocates: while
// metering, the bytes asked for are added up (frees not subtracted: an upper bound of the peak), and a request past
// the budget throws std::bad_alloc rather than taking the machine's memory.
namespace {
std::atomic<bool> g_metering{false};
std::atomic<std::int64_t> g_metered{0};
std::atomic<std::int64_t> g_budget{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_metering.load(std::memory_order_relaxed)) {
    const auto total = g_metered.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
    if (total > g_budget.load()) throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace memgate {
namespace {

// The bytes `read` allocates in all; past `budget` it fails (std::bad_alloc, reported as a failure).
template <typename Read>
std::int64_t bytes_allocated_by(Read&& read, std::int64_t budget) {
  g_metered = 0;
  g_budget = budget;
  g_metering = true;
  try {
    read();
  } catch (const std::bad_alloc&) {
    g_metering = false;
    ADD_FAILURE() << "allocated more than the budget of " << budget << " bytes";
    return g_metered;
  } catch (...) {
    g_metering = false;
    throw;
  }
  g_metering = false;
  return g_metered;
}

// Little-endian bytes of `v`, `n` of them, as pickle's fixed-size arguments.
std::string le(std::uint64_t v, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

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
                      "with open(sys.argv[2], 'w') as f: f.write(json.dumps(v))\n");
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

// A memo index is any 32-bit number (LONG_BINPUT): a file of 2.5 KB that stores at 500 indices, 2^20 apart and up
// to 4e9, must cost a few times its size, not a memo as long as its largest index (gigabytes).
TEST(SnapshotPickleTest, SparseMemoIndicesCostNoMoreThanTheFile) {
  std::string p = "\x80\x04]";  // PROTO 4, an empty list
  for (std::uint64_t k = 1; k <= 500; ++k) p += "r" + le(k << 20, 4);  // LONG_BINPUT k * 2^20
  p += "r" + le(std::uint64_t{1} << 31, 4) + "r" + le(4'000'000'000, 4) + "q" + le(200, 1);
  p += "\x94";                                      // MEMOIZE: at the memo's length (503), as Python does
  p += "j" + le(4'000'000'000, 4) + "h" + le(200, 1) + "j" + le(503, 4) + "j" + le(500 << 20, 4);
  p += "\x86\x86\x86\x86.";                         // the list and the four references, as nested pairs; STOP
  ASSERT_GT(p.size(), 2500u);
  nlohmann::json read;
  const auto bytes = bytes_allocated_by([&] { read = read_plain_pickle(p, "sparse.pickle"); },
                                        std::int64_t{64} << 20);
  EXPECT_LT(bytes, 128 * static_cast<std::int64_t>(p.size())) << "bytes allocated for a file of " << p.size();
  EXPECT_EQ(read.dump(), "[[],[[],[[],[[],[]]]]]") << "every memo reference is the list";
  try {
    (void)read_plain_pickle(std::string("\x80\x04]r") + le(7, 4) + "j" + le(8, 4) + "\x86.", "unset.pickle");
    FAIL() << "a reference to a memo index never stored was read";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unset.pickle: not a memory snapshot pickle memgate can read: at byte 8"));
    EXPECT_THAT(e.what(), HasSubstr("a memo index 8 never stored"));
  }
}

// Memo references expand: a file of some 150 bytes can stand for a million values. What a read may build follows the
// file's size (64 values a byte beyond the first 65,536), so a small file cannot cost gigabytes of JSON.
TEST(SnapshotPickleTest, ExpansionIsBoundedByTheFileSize) {
  testing::TempDir dir;
  const auto file = dir / "expands.pickle";
  python_writes("import pickle, sys\nv = [0]\nfor _ in range(20): v = [v, v]\n"
                "pickle.dump(v, open(sys.argv[1], 'wb'), protocol=4)\n",
                file);
  const auto size = static_cast<std::int64_t>(fs::file_size(file));
  ASSERT_LT(size, 1000);
  try {
    const auto bytes = bytes_allocated_by([&] { (void)load_plain_pickle(file); }, std::int64_t{1} << 30);
    FAIL() << "2^21 values from " << size << " bytes were read, allocating " << bytes << " bytes";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(file));
    EXPECT_THAT(e.what(), HasSubstr("more than " + std::to_string(65536 + 64 * size) + " values for a file of " +
                                        std::to_string(size) + " bytes"));
  }
  // The same value, allowed more per byte, reads as Python reads it.
  EXPECT_EQ(load_plain_pickle(file, {.max_values_per_byte = 1024 * 1024}), python_reads(file));
}

// Python writes a str with lone surrogates (a file name decoded with surrogateescape) as their UTF-8 forms, and
// torch's pickler writes C++ symbols' bytes as they are: neither is UTF-8, and neither may stop a read or the JSON
// written from it. Such text reads as utf8_text() makes it: the well-formed characters kept, each other byte \xNN.
TEST(SnapshotPickleTest, TextThatIsNotUtf8IsCarriedEscaped) {
  EXPECT_EQ(utf8_text("caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80");
  EXPECT_EQ(utf8_text("caf\xe9.py"), "caf\\xe9.py") << "Latin-1";
  EXPECT_EQ(utf8_text("\xed\xb3\xbf/\xed\xb2\x80"), "\\xff/\\x80") << "surrogateescape: the byte it stands for";
  EXPECT_EQ(utf8_text("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "another surrogate";
  EXPECT_EQ(utf8_text("\xc0\xaf \xe0\x80\xaf"), "\\xc0\\xaf \\xe0\\x80\\xaf") << "overlong";
  EXPECT_EQ(utf8_text("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "past U+10FFFF";
  EXPECT_EQ(utf8_text("ab\xe2\x98"), "ab\\xe2\\x98") << "cut short";
  EXPECT_EQ(utf8_text(std::string("a\0b", 3)), std::string("a\0b", 3));

  // {'filename': <bytes>, 'name': <bytes>, <bytes>: 1} as SHORT_BINUNICODE strings, by hand.
  const auto str = [](const std::string& bytes) { return "\x8c" + le(bytes.size(), 1) + bytes; };
  const std::string p = "\x80\x04}(" + str("filename") + str("/home/caf\xe9/tr\xed\xb3\xa9in.py") + str("name") +
                        str("_ZN\xff\xfe") + str("k\xc0") + "K\x01u.";
  const auto read = read_plain_pickle(p, "frames.pickle");
  EXPECT_EQ(read["filename"], "/home/caf\\xe9/tr\\xe9in.py");
  EXPECT_EQ(read["name"], "_ZN\\xff\\xfe");
  EXPECT_EQ(read["k\\xc0"], 1) << "a dict key too";
  EXPECT_NO_THROW((void)read.dump()) << "JSON holds UTF-8 only";
}

}  // namespace
}  // namespace memgate
