// memgate_replay_bench: how fast `memgate replay` reads and replays a memory snapshot, and how much memory it takes,
// as Google Benchmark cases (no LibTorch):
//
//   BM_ReplaySynthetic/events:5000000/manual_time    a synthetic snapshot, written as PyTorch writes one
//   BM_ReplayTrace/decomfl_memory/manual_time         each committed real trace (tests/data/snapshots)
//
// One iteration is load_snapshot + replay_snapshot (the recorded settings, compared event by event), timed in a
// child process of its own, so that its peak resident memory (getrusage's ru_maxrss) is its own and start-up is left
// out. Counters: events_per_s, peak_rss_MiB, pickle_MiB and rss_per_pickle_byte (peak memory over the file's size).
//
// The synthetic snapshot is made by running memgate's caching-allocator model on a random program of several
// streams (tensors of every size class allocated and freed, the number alive rising and falling, an empty_cache()
// every 50,000 events), so its trace and final state agree and the replay is exact; it is pickled as
// torch.cuda.memory._dump_snapshot does (protocol 4, every dict, list and str memoized, the frames of a traceback
// shared through memo references, a free_completed sharing its free_requested's frames). Set
// MEMGATE_REPLAY_BENCH_DIR to keep the files it writes (default: the system's temporary folder).
#include "memgate/allocator/caching_allocator_model.h"
#include "memgate/allocator/replay.h"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <stdexcept>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

using memgate::CachingAllocatorModel;

// A pickle of plain data, protocol 4, written as Python's pickle module writes it.
class PickleWriter {
 public:
  explicit PickleWriter(const std::string& path) : out_(std::fopen(path.c_str(), "wb")) {
    if (out_ == nullptr) throw std::runtime_error("cannot write " + path);
    buf_ += "\x80\x04";
  }
  ~PickleWriter() {
    if (out_ != nullptr) std::fclose(out_);
  }
  PickleWriter(const PickleWriter&) = delete;
  PickleWriter& operator=(const PickleWriter&) = delete;

  void op(char c) { buf_ += c; }
  std::uint32_t memoize() {
    buf_ += '\x94';
    return memo_++;
  }
  // A new str object (memoized, as Python memoizes every str).
  std::uint32_t str(std::string_view s) {
    if (s.size() < 256) {
      buf_ += '\x8c';
      buf_ += static_cast<char>(s.size());
    } else {
      buf_ += 'X';
      le(s.size(), 4);
    }
    buf_ += s;
    return memoize();
  }
  // A str written once, then referenced.
  void key(std::string_view s) {
    const auto it = keys_.find(std::string(s));
    if (it != keys_.end()) return get(it->second);
    keys_.emplace(std::string(s), str(s));
  }
  void get(std::uint32_t index) {
    if (index < 256) {
      buf_ += 'h';
      buf_ += static_cast<char>(index);
    } else {
      buf_ += 'j';
      le(index, 4);
    }
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      buf_ += 'K';
      le(static_cast<std::uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      buf_ += 'M';
      le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      buf_ += 'J';
      le(static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))), 4);
    } else {  // LONG1: the fewest bytes of two's complement
      std::string bytes;
      auto u = static_cast<std::uint64_t>(v);
      for (int i = 0; i < 8; ++i) bytes += static_cast<char>((u >> (8 * i)) & 0xff);
      while (bytes.size() > 1) {
        const auto last = static_cast<unsigned char>(bytes.back());
        const auto before = static_cast<unsigned char>(bytes[bytes.size() - 2]);
        if ((last == 0 && (before & 0x80) == 0) || (last == 0xff && (before & 0x80) != 0)) {
          bytes.pop_back();
        } else {
          break;
        }
      }
      buf_ += '\x8a';
      buf_ += static_cast<char>(bytes.size());
      buf_ += bytes;
    }
  }
  void boolean(bool b) { buf_ += b ? '\x88' : '\x89'; }
  void real(double d) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof d);
    buf_ += 'G';
    for (int i = 7; i >= 0; --i) buf_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void flush() {
    if (std::fwrite(buf_.data(), 1, buf_.size(), out_) != buf_.size()) throw std::runtime_error("write failed");
    buf_.clear();
  }
  void maybe_flush() {
    if (buf_.size() > (1 << 20)) flush();
  }
  void finish() {
    buf_ += '.';
    flush();
  }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::FILE* out_;
  std::string buf_;
  std::uint32_t memo_ = 0;
  std::unordered_map<std::string, std::uint32_t> keys_;
};

// A synthetic snapshot of about `events` trace entries; returns the number written.
std::int64_t write_synthetic_snapshot(const std::string& path, std::int64_t events) {
  PickleWriter w(path);
  CachingAllocatorModel model;
  model.record_segment_events(true);
  std::mt19937_64 rng(42);
  const std::vector<std::uint64_t> streams{0, 0x5555a0001000, 0x5555a0002000};

  // Frames: a pool of frame dicts, each written once and then referenced; a call site is a traceback of 6 to 12.
  std::vector<std::int64_t> frame_memo(96, -1);
  const auto frame = [&](std::size_t f) {
    if (frame_memo[f] >= 0) return w.get(static_cast<std::uint32_t>(frame_memo[f]));
    w.op('}');
    frame_memo[f] = w.memoize();
    w.op('(');
    w.key("name");
    (void)w.str(f % 3 == 0 ? fmt::format("forward_{}", f) : fmt::format("c10::cuda::CUDACachingAllocator::op_{}", f));
    w.key("filename");
    (void)w.str(f % 3 == 0 ? fmt::format("/home/user/project/model/layer_{}.py", f % 7)
                           : fmt::format("/usr/lib/python3/site-packages/torch/nn/modules/module_{}.py", f % 5));
    w.key("line");
    w.integer(static_cast<std::int64_t>(10 + f * 7));
    w.op('u');
  };
  const auto frames_list = [&](std::uint64_t site) {
    w.op(']');
    const auto index = w.memoize();
    w.op('(');
    const auto n = 6 + site % 7;
    for (std::uint64_t k = 0; k < n; ++k) frame(static_cast<std::size_t>((site * 13 + k * 29) % frame_memo.size()));
    w.op('e');
    return index;
  };
  std::int64_t time_us = 1763324225770003;
  std::int64_t written = 0;
  // One trace entry; `frames`: a memo index of a frames list to share, else a new one for `site`.
  const auto entry = [&](const char* action, std::uint64_t addr, std::int64_t size, std::uint64_t stream,
                         std::uint64_t site, std::int64_t frames) {
    w.op('}');
    (void)w.memoize();
    w.op('(');
    w.key("action");
    w.key(action);
    w.key("addr");
    w.integer(static_cast<std::int64_t>(addr));
    w.key("size");
    w.integer(size);
    w.key("stream");
    w.integer(static_cast<std::int64_t>(stream));
    w.key("time_us");
    w.integer(time_us += 7);
    w.key("compile_context");
    (void)w.str("N/A");
    w.key("frames");
    std::int64_t index = frames;
    if (frames >= 0) {
      w.get(static_cast<std::uint32_t>(frames));
    } else {
      index = frames_list(site);
    }
    w.op('u');
    ++written;
    if (written % 1000 == 0) {  // APPENDS in batches of 1000, as Python's pickler writes a list
      w.op('e');
      w.op('(');
    }
    w.maybe_flush();
    return index;
  };

  w.op('}');
  (void)w.memoize();
  w.op('(');
  w.key("device_traces");
  w.op(']');
  (void)w.memoize();
  w.op(']');
  (void)w.memoize();
  w.op('(');
  struct Live {
    std::uint64_t id;
    std::uint64_t addr;
    std::int64_t size;
    std::uint64_t stream;
    std::uint64_t site;
  };
  std::vector<Live> live;
  std::unordered_map<std::uint64_t, std::int64_t> requested;  // by model id
  std::uint64_t next_id = 1;
  std::int64_t next_empty_cache = 50000;
  while (written < events) {
    const double phase = static_cast<double>(written) / 200000.0;
    const auto target = static_cast<std::size_t>(1500 + 1200 * std::sin(phase * 6.283185307179586));
    if (written >= next_empty_cache) {
      next_empty_cache += 50000;
      model.clear_segment_events();
      model.empty_cache();
      for (const auto& s : model.segment_events()) entry("segment_free", s.address, s.size, s.stream, 0, -1);
      continue;
    }
    const bool allocate = live.empty() || (live.size() < target ? rng() % 4 != 0 : rng() % 4 == 0);
    if (allocate) {
      const auto kind = rng() % 10;
      std::int64_t size = 0;
      if (kind < 6) {
        size = static_cast<std::int64_t>(1 + rng() % 4096) * 256;  // up to 1 MiB: the small pool
      } else if (kind < 9) {
        size = static_cast<std::int64_t>((1 << 20) + rng() % (9 << 20));
      } else {
        size = static_cast<std::int64_t>((10 << 20) + rng() % (190 << 20));
      }
      const auto stream = streams[rng() % 10 < 7 ? 0 : 1 + rng() % 2];
      const auto site = rng() % 40;
      const auto id = next_id++;
      model.clear_segment_events();
      const auto addr = model.malloc(id, size, stream);
      for (const auto& s : model.segment_events()) entry("segment_alloc", s.address, s.size, s.stream, site, -1);
      entry("alloc", *addr, size, stream, site, -1);
      requested[id] = size;
      live.push_back({id, *addr, size, stream, site});
    } else {
      const auto k = static_cast<std::size_t>(rng() % live.size());
      const auto b = live[k];
      live[k] = live.back();
      live.pop_back();
      const auto frames = entry("free_requested", b.addr, b.size, b.stream, b.site + 40, -1);
      model.free(b.id);
      requested.erase(b.id);
      entry("free_completed", b.addr, b.size, b.stream, 0, frames);
    }
  }
  w.op('e');
  w.op('a');  // device 0's trace into device_traces
  w.key("segments");
  w.op(']');
  (void)w.memoize();
  w.op('(');
  for (const auto& s : model.segment_views()) {
    w.op('}');
    (void)w.memoize();
    w.op('(');
    std::int64_t allocated = 0, req = 0;
    for (const auto& b : s.blocks) {
      allocated += b.allocated ? b.size : 0;
      req += b.allocated ? requested[b.id] : 0;
    }
    w.key("device");
    w.integer(0);
    w.key("address");
    w.integer(static_cast<std::int64_t>(s.address));
    w.key("total_size");
    w.integer(s.size);
    w.key("allocated_size");
    w.integer(allocated);
    w.key("active_size");
    w.integer(allocated);
    w.key("requested_size");
    w.integer(req);
    w.key("stream");
    w.integer(static_cast<std::int64_t>(s.stream));
    w.key("segment_type");
    w.key(s.small ? "small" : "large");
    w.key("segment_pool_id");
    w.integer(0);
    w.integer(0);
    w.op('\x86');
    (void)w.memoize();
    w.key("is_expandable");
    w.boolean(false);
    w.key("frames");
    w.op(']');
    (void)w.memoize();
    w.key("blocks");
    w.op(']');
    (void)w.memoize();
    w.op('(');
    for (const auto& b : s.blocks) {
      w.op('}');
      (void)w.memoize();
      w.op('(');
      w.key("address");
      w.integer(static_cast<std::int64_t>(b.address));
      w.key("size");
      w.integer(b.size);
      w.key("requested_size");
      w.integer(b.allocated ? requested[b.id] : 0);
      w.key("state");
      w.key(b.allocated ? "active_allocated" : "inactive");
      w.key("frames");
      w.op(']');
      (void)w.memoize();
      w.op('u');
    }
    w.op('e');
    w.op('u');
    w.maybe_flush();
  }
  w.op('e');
  w.key("allocator_settings");
  w.op('}');
  (void)w.memoize();
  w.op('(');
  w.key("PYTORCH_CUDA_ALLOC_CONF");
  w.key("");
  w.key("max_split_size");
  w.integer(-1);
  w.key("garbage_collection_threshold");
  w.real(0.0);
  w.key("expandable_segments");
  w.boolean(false);
  w.op('u');
  w.op('u');
  w.finish();
  return written;
}

// What one child process measured: load + replay time, peak memory, and whether the replay was exact.
struct Measured {
  double seconds = 0;
  long max_rss_kib = 0;
  std::int64_t events = 0;
  int exact = 0;
  char error[200] = {};
};

// load_snapshot + replay_snapshot of `path` in a child process.
Measured measure_in_child(const std::string& path) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Measured m;
    try {
      const auto start = std::chrono::steady_clock::now();
      const auto snapshot = memgate::load_snapshot(path);
      const auto report = memgate::replay_snapshot(snapshot);
      m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (const auto& d : report.devices) m.events += d.events;
      m.exact = report.exact() ? 1 : 0;
    } catch (const std::exception& e) {
      std::snprintf(m.error, sizeof m.error, "%s", e.what());
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    m.max_rss_kib = usage.ru_maxrss;
    (void)!write(fds[1], &m, sizeof m);
    _exit(0);
  }
  close(fds[1]);
  Measured m;
  const auto n = read(fds[0], &m, sizeof m);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n != static_cast<ssize_t>(sizeof m)) std::snprintf(m.error, sizeof m.error, "the measuring process died");
  return m;
}

void run_case(benchmark::State& state, const std::string& path) {
  const auto bytes = static_cast<double>(std::filesystem::file_size(path));
  Measured last;
  for (auto _ : state) {
    last = measure_in_child(path);
    if (last.error[0] != '\0') {
      state.SkipWithError(last.error);
      return;
    }
    state.SetIterationTime(last.seconds);
  }
  const double rss = static_cast<double>(last.max_rss_kib) * 1024.0;
  state.counters["events"] = static_cast<double>(last.events);
  state.counters["events_per_s"] = static_cast<double>(last.events) / last.seconds;
  state.counters["peak_rss_MiB"] = rss / (1 << 20);
  state.counters["pickle_MiB"] = bytes / (1 << 20);
  state.counters["rss_per_pickle_byte"] = rss / bytes;
  state.counters["exact"] = last.exact;
}

std::string bench_dir() {
  if (const char* dir = std::getenv("MEMGATE_REPLAY_BENCH_DIR"); dir != nullptr && *dir != '\0') return dir;
  return std::filesystem::temp_directory_path().string();
}

// The synthetic snapshot of state.range(0) events, written once per size (in a child, so that the measuring
// processes, forked from this one, start small).
void BM_ReplaySynthetic(benchmark::State& state) {
  const auto events = state.range(0);
  const auto path = fmt::format("{}/memgate_replay_bench_{}.pickle", bench_dir(), events);
  if (!std::filesystem::exists(path)) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        (void)write_synthetic_snapshot(path + ".part", events);
        std::filesystem::rename(path + ".part", path);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      state.SkipWithError("could not write the synthetic snapshot");
      return;
    }
  }
  run_case(state, path);
}
BENCHMARK(BM_ReplaySynthetic)
    ->ArgName("events")
    ->Arg(100000)
    ->Arg(1000000)
    ->Arg(5000000)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// The committed real traces.
void BM_ReplayTrace(benchmark::State& state, const std::string& name) {
  run_case(state, std::string(MEMGATE_SOURCE_DIR) + "/tests/data/snapshots/" + name + ".pickle");
}
BENCHMARK_CAPTURE(BM_ReplayTrace, decomfl_memory, std::string("decomfl_memory"))
    ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayTrace, cs336_forward_fp32_128, std::string("cs336_silmont2000_memory_forward_fp32_128"))
    ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReplayTrace, cs336_mem_snapshot, std::string("cs336_silmont2000_mem_snapshot"))
    ->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
