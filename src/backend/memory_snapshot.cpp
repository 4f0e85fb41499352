// Allocator histories for memory_viz: CUDA's own record, and the counting CPU allocator's written the same way.
#include "memgate/backend/memory_snapshot.h"

#include "memgate/base/error.h"
#include "memgate/backend/cpu_allocator.h"
#include "memgate/backend/meta_allocator.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

namespace memgate {

class AllocationHistory::Impl {
 public:
  virtual ~Impl() = default;
  virtual void set_phase(std::string_view phase) = 0;
  virtual std::string finish() = 0;
};

namespace {

using c10::IValue;

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }
c10::impl::GenericList new_list() { return c10::impl::GenericList(c10::AnyType::get()); }

// Python's pickle of an IValue made of dicts, lists, strings, ints and bools, as torch writes its own snapshots
// (no type tags: Python's pickle reads it without torch).
std::string pickle(const IValue& value) {
  std::string out;
  torch::jit::Pickler pickler([&](const char* data, std::size_t size) { out.append(data, size); }, nullptr, nullptr,
                              nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  return out;
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The LibTorch ops running on this thread, outermost first (RecordFunction callbacks push and pop them).
thread_local std::vector<const char*> t_ops;

std::unique_ptr<at::ObserverContext> op_enter(const at::RecordFunction& fn) {
  t_ops.push_back(fn.name());
  return nullptr;
}

void op_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (!t_ops.empty()) t_ops.pop_back();
}

// A counting allocator's allocations and frees (the CPU's, or the Meta device's for an estimate), with the ops and
// the phase each was made in. Meta blocks have no address: each gets one of its own, as if laid end to end.
class CountingHistory final : public AllocationHistory::Impl,
                         public CountingCpuAllocator::Observer,
                         public CountingMetaAllocator::Observer {
 public:
  CountingHistory(const SnapshotOptions& options, bool meta) : options_(options), meta_(meta) {
    allocator_ = &CountingCpuAllocator::install();
    if (meta_) meta_allocator_ = &CountingMetaAllocator::install();
    phases_.emplace_back("");
    t_ops.clear();
    callback_ = at::addGlobalCallback(at::RecordFunctionCallback(&op_enter, &op_exit)
                                          .needsInputs(false)
                                          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                   at::RecordScope::USER_SCOPE}));
    if (meta_) meta_allocator_->set_observer(static_cast<CountingMetaAllocator::Observer*>(this));
    else allocator_->set_observer(static_cast<CountingCpuAllocator::Observer*>(this));
  }
  ~CountingHistory() override { stop(); }

  void set_phase(std::string_view phase) override {
    const std::lock_guard lock(mutex_);
    phases_.emplace_back(phase);
  }

  void on_alloc(const void* data, std::size_t bytes) override { record(kAlloc, data, bytes); }
  void on_free(const void* data, std::size_t bytes) override { record(kFree, data, bytes); }
  void on_alloc(std::uint64_t id, std::size_t bytes, std::uint64_t stream) override {
    const std::lock_guard lock(meta_mutex_);
    const auto addr = next_address_;
    next_address_ += (bytes + 511) / 512 * 512 + 512;
    meta_live_[id] = {addr, bytes, stream};
    record(kAlloc, reinterpret_cast<const void*>(addr), bytes, stream);
  }
  void on_free(std::uint64_t id, std::size_t bytes) override {
    const std::lock_guard lock(meta_mutex_);
    const auto it = meta_live_.find(id);
    if (it == meta_live_.end()) return;  // allocated before the recording began
    record(kFree, reinterpret_cast<const void*>(it->second.address), bytes, it->second.stream);
    meta_live_.erase(it);
  }

  std::string finish() override {
    stop();
    const IValue name_s = "name", filename_s = "filename", line_s = "line";
    // Each distinct stack once: the pickler writes a list it has seen as a reference to it.
    std::vector<c10::impl::GenericList> frames;
    for (const auto& stack : stacks_) {
      auto list = new_list();
      for (const auto& frame : stack) {
        auto f = new_dict();
        f.insert(name_s, frame);
        f.insert(filename_s, std::string("memgate"));
        f.insert(line_s, std::int64_t{0});
        list.push_back(f);
      }
      frames.push_back(list);
    }
    const IValue action_s = "action", addr_s = "addr", size_s = "size", stream_s = "stream", time_s = "time_us",
                 frames_s = "frames";
    auto trace = new_list();
    auto entry = [&](const char* action, const Event& e) {
      auto d = new_dict();
      d.insert(action_s, std::string(action));
      d.insert(addr_s, static_cast<std::int64_t>(e.addr));
      d.insert(size_s, static_cast<std::int64_t>(e.size));
      d.insert(stream_s, static_cast<std::int64_t>(e.stream));
      d.insert(time_s, e.time_us);
      d.insert(frames_s, frames[e.stack]);
      trace.push_back(d);
    };
    // The CPU has no cache: every allocation is a segment of its own, made and given back with it.
    for (const auto& e : events_) {
      if (e.action == kAlloc) {
        entry("segment_alloc", e);
        entry("alloc", e);
      } else {
        entry("free_requested", e);
        entry("free_completed", e);
        entry("segment_free", e);
      }
    }
    // What is live at the end, as blocks of segments; the frames of the alloc that made each, if recorded.
    std::unordered_map<std::uintptr_t, int> stack_of_live;
    for (const auto& e : events_) {
      if (e.action == kAlloc) stack_of_live[e.addr] = e.stack;
      else stack_of_live.erase(e.addr);
    }
    auto segments = new_list();
    auto empty_frames = new_list();
    // Each live block with the stream it was allocated on (the CPU has one).
    const auto for_each_live = [&](const std::function<void(const void*, std::size_t, std::uint64_t)>& visit) {
      if (!meta_) {
        return allocator_->for_each_live([&](const void* data, std::size_t bytes) { visit(data, bytes, 0); });
      }
      for (const auto& [id, block] : meta_live_) {
        visit(reinterpret_cast<const void*>(block.address), block.bytes, block.stream);
      }
    };
    for_each_live([&](const void* data, std::size_t bytes, std::uint64_t stream) {
      const auto addr = reinterpret_cast<std::uintptr_t>(data);
      const auto it = stack_of_live.find(addr);
      const IValue block_frames = it == stack_of_live.end() ? IValue(empty_frames) : IValue(frames[it->second]);
      auto block = new_dict();
      block.insert(IValue("address"), static_cast<std::int64_t>(addr));
      block.insert(IValue("size"), static_cast<std::int64_t>(bytes));
      block.insert(IValue("requested_size"), static_cast<std::int64_t>(bytes));
      block.insert(IValue("state"), std::string("active_allocated"));
      block.insert(frames_s, block_frames);
      auto blocks = new_list();
      blocks.push_back(block);
      auto seg = new_dict();
      seg.insert(IValue("device"), std::int64_t{0});
      seg.insert(IValue("address"), static_cast<std::int64_t>(addr));
      seg.insert(IValue("total_size"), static_cast<std::int64_t>(bytes));
      seg.insert(IValue("allocated_size"), static_cast<std::int64_t>(bytes));
      seg.insert(IValue("active_size"), static_cast<std::int64_t>(bytes));
      seg.insert(IValue("requested_size"), static_cast<std::int64_t>(bytes));
      seg.insert(stream_s, static_cast<std::int64_t>(stream));
      seg.insert(IValue("segment_type"), std::string(bytes <= (1 << 20) ? "small" : "large"));
      seg.insert(IValue("segment_pool_id"), c10::ivalue::Tuple::create({IValue(std::int64_t{0}), IValue(std::int64_t{0})}));
      seg.insert(IValue("is_expandable"), false);
      seg.insert(frames_s, block_frames);
      seg.insert(IValue("blocks"), blocks);
      segments.push_back(seg);
    });
    auto traces = new_list();
    traces.push_back(trace);
    auto settings = new_dict();
    settings.insert(IValue("PYTORCH_CUDA_ALLOC_CONF"), std::string(""));
    settings.insert(IValue("expandable_segments"), false);
    settings.insert(IValue("memgate_allocator"), std::string(meta_ ? "estimate on the Meta device (no cache)"
                                                                   : "counting CPU allocator (no cache)"));
    auto snapshot = new_dict();
    snapshot.insert(IValue("segments"), segments);
    snapshot.insert(IValue("device_traces"), traces);
    snapshot.insert(IValue("allocator_settings"), settings);
    return pickle(snapshot);
  }

 private:
  enum Action : std::uint8_t { kAlloc, kFree };
  struct Event {
    Action action;
    std::uintptr_t addr;
    std::size_t size;
    std::int64_t time_us;
    int stack;
    std::uint64_t stream;  ///< 0 but in an estimate for CUDA, whose side streams (FSDP's) keep pools of their own
  };

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    if (meta_) meta_allocator_->set_observer(nullptr);
    else allocator_->set_observer(nullptr);
    at::removeCallback(callback_);
  }

  // Under the allocator's lock.
  void record(Action action, const void* data, std::size_t bytes, std::uint64_t stream = 0) {
    const std::lock_guard lock(mutex_);
    if (events_.size() >= options_.max_entries) return;
    std::string key;
    for (auto it = t_ops.rbegin(); it != t_ops.rend(); ++it) key.append(*it).push_back('\n');
    key.append(phases_.back());
    auto [at, added] = stack_ids_.try_emplace(key, static_cast<int>(stacks_.size()));
    if (added) {
      std::vector<std::string> stack;
      for (auto it = t_ops.rbegin(); it != t_ops.rend(); ++it) stack.emplace_back(*it);
      if (!phases_.back().empty()) stack.push_back(phases_.back());
      stacks_.push_back(std::move(stack));
    }
    events_.push_back({action, reinterpret_cast<std::uintptr_t>(data), bytes, now_us(), at->second, stream});
  }

  SnapshotOptions options_;
  bool meta_;
  CountingCpuAllocator* allocator_ = nullptr;
  CountingMetaAllocator* meta_allocator_ = nullptr;
  std::mutex meta_mutex_;
  std::uintptr_t next_address_ = 0x10000000;
  struct MetaBlock {
    std::uintptr_t address;
    std::size_t bytes;
    std::uint64_t stream;
  };
  std::map<std::uint64_t, MetaBlock> meta_live_;
  at::CallbackHandle callback_ = 0;
  bool stopped_ = false;
  std::mutex mutex_;
  std::vector<std::string> phases_;
  std::vector<Event> events_;
  std::vector<std::vector<std::string>> stacks_;
  std::unordered_map<std::string, int> stack_ids_;
};

// The caching allocator's own history, through the calls PyTorch's Python uses.
class CudaHistory final : public AllocationHistory::Impl {
 public:
  explicit CudaHistory(const SnapshotOptions& options) {
    torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"),
                                        options.cpp_stacks ? "all" : "python", options.max_entries,
                                        /*clearHistory=*/true);
  }
  ~CudaHistory() override { stop(); }
  void set_phase(std::string_view) override {}
  std::string finish() override {
    auto snapshot = torch::cuda::_memory_snapshot_pickled();
    stop();
    return snapshot;
  }

 private:
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    torch::cuda::_record_memory_history(std::optional<std::string>(), std::optional<std::string>(), "python", 0);
  }
  bool stopped_ = false;
};

}  // namespace

AllocationHistory::AllocationHistory(c10::Device device, const SnapshotOptions& options) {
  if (device.is_cpu() || device.is_meta()) {
    impl_ = std::make_unique<CountingHistory>(options, device.is_meta());
  } else if (device.is_cuda()) {
    impl_ = std::make_unique<CudaHistory>(options);
  } else {
    throw Error("memory snapshots are recorded on the CPU, CUDA or Meta (estimates), not on " + device.str());
  }
}

AllocationHistory::~AllocationHistory() = default;

void AllocationHistory::set_phase(std::string_view phase) { impl_->set_phase(phase); }

std::string AllocationHistory::finish() {
  if (!impl_) throw Error("a memory snapshot was already taken from this recording");
  auto out = impl_->finish();
  impl_.reset();
  return out;
}

}  // namespace memgate
