// Per-module attribution of the counting CPU allocator's blocks: an observer that tags each block with the module
// (or phase) current when it was made, and per tag the bytes alive now and at two peaks.
#include "memgate/backend/module_attribution.h"

#include "memgate/backend/cpu_allocator.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace memgate {
namespace {

// One lock for the names, the module stack and the observer's state. Order: the allocator's lock, then this one
// (the observer is called under the allocator's); nothing here allocates a tensor.
std::mutex g_module_mutex;
std::vector<std::string> g_module_names;                  // tag -> name
std::unordered_map<std::string, int> g_module_ids;        // name -> tag
std::vector<int> g_module_stack;                          // the modules whose forward runs, innermost last

int intern_module(std::string_view name) {  // under g_module_mutex
  const auto [it, added] = g_module_ids.try_emplace(std::string(name), static_cast<int>(g_module_names.size()));
  if (added) g_module_names.emplace_back(name);
  return it->second;
}

}  // namespace

void enter_module(std::string_view name) {
  const std::lock_guard lock(g_module_mutex);
  g_module_stack.push_back(intern_module(name));
}

void exit_module() {
  const std::lock_guard lock(g_module_mutex);
  if (!g_module_stack.empty()) g_module_stack.pop_back();
}

class ModuleAttribution::Impl final : public CountingCpuAllocator::Observer {
 public:
  explicit Impl(CountingCpuAllocator& allocator) : allocator_(allocator) {
    {
      const std::lock_guard lock(g_module_mutex);
      earlier_ = intern_module("(allocated before the probe)");
      phase_ = intern_module("(building the model)");
    }
    allocator_.set_attribution_observer(this);
  }
  ~Impl() override { allocator_.set_attribution_observer(nullptr); }

  void on_alloc(const void* data, std::size_t bytes) override {
    const std::lock_guard lock(g_module_mutex);
    const int tag = g_module_stack.empty() ? phase_ : g_module_stack.back();
    if (!g_module_stack.empty()) saw_modules_ = true;
    live_[data] = {tag, static_cast<std::int64_t>(bytes)};
    add(tag, static_cast<std::int64_t>(bytes));
  }
  void on_free(const void* data, std::size_t bytes) override {
    const std::lock_guard lock(g_module_mutex);
    const auto it = live_.find(data);
    int tag = earlier_;
    if (it != live_.end()) {
      tag = it->second.tag;
      live_.erase(it);
    }
    add(tag, -static_cast<std::int64_t>(bytes));
  }

  void set_phase(std::string_view phase) {
    const std::lock_guard lock(g_module_mutex);
    phase_ = intern_module("(" + std::string(phase) + ")");
  }
  Mark mark() const {
    const std::lock_guard lock(g_module_mutex);
    return current_;
  }
  void reset_peak(Peak which) {
    const std::lock_guard lock(g_module_mutex);
    peaks_[which] = {total_, current_};
  }
  ModuleBytes since(const Mark& from) const {
    const std::lock_guard lock(g_module_mutex);
    return difference(current_, from);
  }
  ModuleBytes peak_since(Peak which, const Mark& from) const {
    const std::lock_guard lock(g_module_mutex);
    return difference(peaks_[which].at, from);
  }
  bool saw_modules() const {
    const std::lock_guard lock(g_module_mutex);
    return saw_modules_;
  }

 private:
  struct Block {
    int tag;
    std::int64_t bytes;
  };
  struct PeakState {
    std::int64_t total = 0;
    Mark at;
  };

  void add(int tag, std::int64_t bytes) {  // under g_module_mutex
    if (static_cast<std::size_t>(tag) >= current_.size()) current_.resize(static_cast<std::size_t>(tag) + 1, 0);
    current_[static_cast<std::size_t>(tag)] += bytes;
    total_ += bytes;
    // A new highest total: what is alive now is that peak's breakdown (the allocator's peak moves at the same
    // allocation, since the two totals differ by what was alive before this attribution began).
    for (auto& peak : peaks_) {
      if (total_ > peak.total) {
        peak.total = total_;
        peak.at = current_;
      }
    }
  }

  static ModuleBytes difference(const Mark& now, const Mark& from) {  // under g_module_mutex
    ModuleBytes out;
    for (std::size_t tag = 0; tag < now.size(); ++tag) {
      const auto bytes = now[tag] - (tag < from.size() ? from[tag] : 0);
      if (bytes != 0) out[g_module_names[tag]] += bytes;
    }
    for (std::size_t tag = now.size(); tag < from.size(); ++tag) {
      if (from[tag] != 0) out[g_module_names[tag]] -= from[tag];
    }
    std::erase_if(out, [](const auto& entry) { return entry.second == 0; });
    return out;
  }

  CountingCpuAllocator& allocator_;
  std::unordered_map<const void*, Block> live_;
  Mark current_;
  std::int64_t total_ = 0;
  PeakState peaks_[2];
  int earlier_ = 0;
  int phase_ = 0;
  bool saw_modules_ = false;
};

ModuleAttribution::ModuleAttribution(c10::Device device) {
  if (device.is_cpu()) impl_ = std::make_unique<Impl>(CountingCpuAllocator::install());
}

ModuleAttribution::~ModuleAttribution() = default;

void ModuleAttribution::set_phase(std::string_view phase) {
  if (impl_) impl_->set_phase(phase);
}
ModuleAttribution::Mark ModuleAttribution::mark() const { return impl_ ? impl_->mark() : Mark{}; }
void ModuleAttribution::reset_peak(Peak which) {
  if (impl_) impl_->reset_peak(which);
}
ModuleBytes ModuleAttribution::since(const Mark& from) const { return impl_ ? impl_->since(from) : ModuleBytes{}; }
ModuleBytes ModuleAttribution::peak_since(Peak which, const Mark& from) const {
  return impl_ ? impl_->peak_since(which, from) : ModuleBytes{};
}
bool ModuleAttribution::saw_modules() const { return impl_ && impl_->saw_modules(); }

}  // namespace memgate
