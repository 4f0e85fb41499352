// Ranks of a distributed run: the c10d process group, DistributedDataParallel through LibTorch's c10d::Reducer, and
// the distributed probe, which starts one process per rank and gathers what each measured.
#include "memgate/measure/distributed.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/measure/device.h"
#include "memgate/measure/meta_kernels.h"
#include "memgate/measure/probe.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace memgate {

namespace {

// ProcessGroupGloo's options with one worker thread (PyTorch's default is two). A collective's Work holds its
// tensors until its last reference goes, and the worker's goes when the worker gets to it after the collective ran,
// which on a loaded machine can be well into the next forward: a tensor the program has dropped (DDP's first
// buckets, the indices its rebuild broadcasts) then lives on at the scheduler's whim. With one worker, works run and
// are let go in order, so a barrier behind them (let_gloo_go) returns only once every earlier one is dropped.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> gloo_options(std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  options->threads = 1;
  return options;
}

// A process group of `size` ranks over `store`, LibTorch's ProcessGroupGloo its CPU backend and its default.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  add_gloo_backend(*group, store, rank, size, timeout);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

}  // namespace

void add_gloo_backend(c10d::ProcessGroup& group, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout) {
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options(timeout));
  group.setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
}

void let_gloo_go(const RankGroup& group) {
  if (!group.store) return;  // the Meta device's collectives are done as issued and hold nothing
  // The backend's own barrier: the process group's would allocate a tensor for it.
  group.group->getBackend(c10::DeviceType::CPU)->barrier()->wait();
}

RankGroup join_gloo_group(const std::string& store_path, int rank, int world_size, std::chrono::seconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(fmt::format("rank {} of {}: expected 0 <= rank < world size", rank, world_size));
  }
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  store->setTimeout(timeout);
  auto group = gloo_group(store, rank, world_size, timeout);
  return {rank, world_size, std::move(group), std::move(store), timeout};
}

RankGroup consecutive_subgroup(const RankGroup& group, int size) {
  if (size < 1 || group.world_size % size != 0) {
    throw Error(fmt::format("a group of {} consecutive ranks out of {}: expected a divisor of the world size", size,
                            group.world_size));
  }
  const int first = group.rank / size * size;
  const int rank = group.rank - first;
  if (!group.store) return meta_process_group(rank, size);
  if (group.device.is_cuda()) return nccl_subgroup(group, first, size);
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("ranks_{}_to_{}", first, first + size - 1), group.store);
  auto sub = gloo_group(store, rank, size, group.timeout);
  return {rank, size, std::move(sub), std::move(store), group.timeout};
}

namespace {

// A collective of the Meta device's process group: done as soon as it is issued, its outputs (the tensors it was
// given, in place) in its future, as Gloo's and NCCL's works hold them for the Reducer.
class DoneWork final : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {}
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors_));
    return future;
  }

 private:
  std::vector<at::Tensor> tensors_;
};

using CollectiveResult = std::tuple<std::vector<at::Tensor>, c10::intrusive_ptr<c10d::Work>>;
using CollectiveResult1 = std::tuple<at::Tensor, c10::intrusive_ptr<c10d::Work>>;

CollectiveResult meta_allreduce(at::TensorList tensors, const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                const c10::intrusive_ptr<c10d::ReduceOp>& /*op*/,
                                const std::optional<at::Tensor>& /*sparse_indices*/, bool /*async_op*/,
                                std::int64_t /*timeout*/) {
  std::vector<at::Tensor> out(tensors.begin(), tensors.end());
  return {out, c10::make_intrusive<DoneWork>(out)};
}

CollectiveResult meta_broadcast(at::TensorList tensors, const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                std::int64_t /*root_rank*/, std::int64_t /*root_tensor*/, bool /*async_op*/,
                                std::int64_t /*timeout*/) {
  std::vector<at::Tensor> out(tensors.begin(), tensors.end());
  return {out, c10::make_intrusive<DoneWork>(out)};
}

// For the CPU, Gloo's all-gather as it runs: into a flat output of its own (AsyncAllgatherWork's flatOutputTensor,
// the size of the output), copied out into the output, and freed before the work completes. NCCL gathers in place.
CollectiveResult1 meta_allgather_base(at::Tensor& output, at::Tensor& /*input*/,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/, bool /*async_op*/,
                                      std::int64_t /*timeout*/) {
  if (meta_kernels_target() == EstimateTarget::kCpu) (void)at::empty_like(output);
  return {output, c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output})};
}

CollectiveResult1 meta_reduce_scatter_base(at::Tensor& output, at::Tensor& /*input*/,
                                           const c10::intrusive_ptr<c10d::ProcessGroup>& /*group*/,
                                           const c10::intrusive_ptr<c10d::ReduceOp>& /*op*/, bool /*async_op*/,
                                           std::int64_t /*timeout*/) {
  return {output, c10::make_intrusive<DoneWork>(std::vector<at::Tensor>{output})};
}

}  // namespace

// In-place collectives on Meta tensors: their outputs are their inputs, shapes and all (PyTorch registers these in
// Python, torch/distributed/_meta_registrations.py; LibTorch alone has none).
// (The boxing LibTorch's headers inline here reads IValue vectors GCC 12 cannot prove non-null.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
TORCH_LIBRARY_IMPL(c10d, Meta, m) {
  m.impl("allreduce_", meta_allreduce);
  m.impl("broadcast_", meta_broadcast);
  m.impl("_allgather_base_", meta_allgather_base);
  m.impl("_reduce_scatter_base_", meta_reduce_scatter_base);
}
#pragma GCC diagnostic pop

RankGroup meta_process_group(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(fmt::format("rank {} of {}: expected 0 <= rank < world size", rank, world_size));
  }
  return {rank, world_size, c10::make_intrusive<c10d::ProcessGroup>(rank, world_size), /*store=*/{}, /*timeout=*/{}};
}

const RankComponents* find_rank(const std::vector<RankComponents>& ranks, int rank) {
  const auto it = std::find_if(ranks.begin(), ranks.end(), [rank](const RankComponents& r) { return r.rank == rank; });
  return it == ranks.end() ? nullptr : &*it;
}

Components max_over_ranks(const std::vector<RankComponents>& ranks) {
  Components out;
  for (const auto& info : kComponentTable) {
    std::int64_t most = 0;
    for (const auto& r : ranks) most = std::max(most, r.components.*info.member);
    out.*info.member = most;
  }
  return out;
}

namespace {

// Rank 0's tensors to every rank, each in place. DistributedDataParallel broadcasts them coalesced
// (c10d::broadcast_coalesced: flat 250 MiB buffers); the flat buffer is freed when Gloo's worker thread lets go of
// the broadcast, which is sometimes after the first forward has begun: PyTorch's own DDP read 0.86 MB more in one
// rank's eval_peak in one probe of twelve (tools/ddp_reference.py), and so did this code when it broadcast coalesced.
// In place, a collective holds only the tensors it syncs, which live on: no byte depends on the worker's timing.
void broadcast_in_place(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    std::vector<torch::Tensor> one{t};
    group->broadcast(one)->wait();
  }
}

std::vector<torch::Tensor> detached(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.detach());
  return out;
}

}  // namespace

DataParallel::DataParallel(torch::nn::Module& module, std::vector<torch::Tensor> trainable, const DistributedSpec& spec,
                           RankGroup group)
    : module_(module), group_(std::move(group)), params_(trainable), spec_(spec) {
  // _verify_param_shape_across_processes, then _sync_module_states: every parameter, then every buffer.
  // (The shape check all-gathers and reads the shapes back on the CPU: not on the Meta device, where every rank is
  // this one.)
  if (trainable.empty() || !trainable.front().is_meta()) {
    c10d::verify_params_across_processes(group_.group, trainable, std::nullopt);
  }
  auto states = detached(module_.parameters());
  for (const auto& b : module_.buffers()) states.push_back(b.detach());
  broadcast_in_place(group_.group, states);
  // _ddp_init_helper: without unused-parameter search the first iteration has one bucket (sys.maxsize); the
  // Reducer takes the buckets reversed.
  const std::vector<bool> expect_sparse(trainable.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      trainable, {static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())}, expect_sparse);
  (void)limits;
  std::reverse(buckets.begin(), buckets.end());
  if (!params_.empty() && params_.front().is_meta()) {
    // The Reducer's rebuild reads the rebuilt bucket indices back from the device after broadcasting them, which a
    // Meta tensor cannot do: on Meta the rebuild is done here, from the same arrival order, by the same functions.
    arrival_ = std::make_shared<ArrivalLog>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i].register_hook([arrival = arrival_, i](const torch::Tensor&) {
        if (arrival->recording) arrival->order.push_back(static_cast<std::int64_t>(i));
        return torch::Tensor();
      });
    }
  }
  reducer_ = std::make_unique<c10d::Reducer>(
      std::move(trainable), std::move(buckets), group_.group, expect_sparse, spec.bucket_bytes_cap(),
      /*find_unused_parameters=*/false, spec.gradient_as_bucket_view,
      /*param_names=*/std::unordered_map<std::size_t, std::string>{}, spec.first_bucket_bytes_cap(),
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<std::int64_t>{});
  let_gloo_go(group_);  // the shape check's all-gather buffers freed before the first forward
}

DataParallel::~DataParallel() = default;

void DataParallel::pre_forward(bool sync) {
  const bool grad = torch::GradMode::is_enabled();
  if (grad && sync) reducer_->prepare_for_forward();
  if (grad) {
    if (arrival_) {
      rebuild_buckets_on_meta();
    } else if (reducer_->rebuild_buckets()) {
      // The first iteration's buckets and the broadcast bucket indices freed now, not when Gloo's worker gets to
      // them: a 2-rank probe capped just above its peak ran out of memory in one run of a few dozen without this.
      let_gloo_go(group_);
    }
  }
  const auto buffers = module_.buffers();
  if (require_forward_param_sync_ && !buffers.empty()) {
    torch::NoGradGuard no_grad;
    broadcast_in_place(group_.group, detached(buffers));
  }
}

// Reducer::rebuild_buckets without its broadcast of the indices: the parameters in the order their gradients
// arrived in the first backward, assigned to buckets of the first-bucket cap, then the cap.
void DataParallel::rebuild_buckets_on_meta() {
  if (!arrival_->recording || arrival_->order.empty()) return;
  std::vector<torch::Tensor> ordered;
  std::vector<std::int64_t> indices;
  std::vector<bool> seen(params_.size(), false);
  for (const auto i : arrival_->order) {
    if (seen[static_cast<std::size_t>(i)]) continue;
    seen[static_cast<std::size_t>(i)] = true;
    ordered.push_back(params_[static_cast<std::size_t>(i)]);
    indices.push_back(i);
  }
  const std::vector<bool> expect_sparse(ordered.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      ordered,
      {static_cast<std::size_t>(spec_.first_bucket_bytes_cap()), static_cast<std::size_t>(spec_.bucket_bytes_cap())},
      expect_sparse, indices);
  (void)limits;
  reducer_->initialize_buckets(std::move(buckets));
  arrival_->recording = false;
  arrival_->order.clear();
}

void DataParallel::post_forward(bool sync) {
  if (torch::GradMode::is_enabled() && sync) {
    require_forward_param_sync_ = true;
    reducer_->prepare_for_backward({});
  } else {
    require_forward_param_sync_ = false;
  }
}

std::int64_t DataParallel::bucket_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& bucket : reducer_->get_grad_buckets(/*return_zero_tensors=*/false)) {
    bytes += static_cast<std::int64_t>(bucket.getBuffer().nbytes());
  }
  return bytes;
}

std::int64_t DataParallel::bucket_count() const {
  return static_cast<std::int64_t>(reducer_->get_grad_buckets(/*return_zero_tensors=*/false).size());
}

// ---- The distributed probe: one process per rank ----

namespace {

// A distributed probe's own figures from its ranks': the largest of each.
void fold_ranks(ProbeResult& result) {
  result.components = max_over_ranks(result.ranks);
  for (const auto& r : result.ranks) {
    result.comm_buffer_bytes = std::max(result.comm_buffer_bytes, r.comm_buffer_bytes);
    result.comm_buffers = std::max(result.comm_buffers, r.comm_buffers);
    result.communicator_bytes = std::max(result.communicator_bytes, r.communicator_bytes);
    result.outside_allocator_bytes = std::max(result.outside_allocator_bytes, r.outside_allocator_bytes);
    result.library_workspace_bytes = std::max(result.library_workspace_bytes, r.library_workspace_bytes);
  }
}

bool& rank_host() {
  static bool host = false;
  return host;
}

// The program each rank runs: MEMGATE_RANK_EXECUTABLE; else this program when its main() runs ranks (the memgate
// CLI, a memory suite); else the memgate CLI beside it (bin/memgate of an install or a build tree: tests/ and bin/).
std::string rank_executable() {
  if (const char* exe = std::getenv("MEMGATE_RANK_EXECUTABLE"); exe != nullptr && *exe != '\0') return exe;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find this program to start ranks from (/proc/self/exe): set MEMGATE_RANK_EXECUTABLE");
  if (rank_host()) return self.string();
  for (const auto& candidate : {self.parent_path() / "memgate", self.parent_path().parent_path() / "bin" / "memgate"}) {
    if (std::filesystem::is_regular_file(candidate, ec)) return candidate.string();
  }
  throw Error(self.string() + " does not run ranks and no memgate program is beside it: set MEMGATE_RANK_EXECUTABLE "
              "to memgate's path (or call memgate::rank_main from main(), as memgate_add_memory_suite's programs do)");
}

}  // namespace

void declare_rank_host() { rank_host() = true; }

namespace {

// A folder of its own for one distributed probe: the store, each rank's result and log.
std::filesystem::path make_run_dir() {
  static std::atomic<int> counter{0};
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("memgate-ranks-{}-{}", ::getpid(), counter.fetch_add(1));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error(fmt::format("cannot start rank process {}: {}", argv[0], std::strerror(rc)));
  return pid;
}

std::string tail_of(const std::string& path, std::size_t chars = 4000) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  auto text = s.str();
  if (text.size() > chars) text = "..." + text.substr(text.size() - chars);
  return text;
}

// What rank `rank` wrote into `dir` (rank_result_text); throws for a rank that left none.
nlohmann::json read_rank_result(const std::filesystem::path& dir, int rank) {
  return nlohmann::json::parse(read_text_file((dir / fmt::format("rank{}.json", rank)).string(), "a rank's result file"));
}

std::string rank_oom_error(int rank, const nlohmann::json& j) {
  return fmt::format("rank {}: {}", rank, j.at("error").get<std::string>());
}

Components components_from(const nlohmann::json& j) {
  Components c;
  for (const auto& info : kComponentTable) c.*info.member = j.at(std::string(info.name)).get<std::int64_t>();
  return c;
}

}  // namespace

std::string rank_result_text(int rank, const ProbeResult& r) {
  nlohmann::json components = nlohmann::json::object();
  for (const auto& info : kComponentTable) components[std::string(info.name)] = r.components.*info.member;
  return nlohmann::json{{"rank", rank},
          {"batch_size", r.batch_size},
          {"oom", r.oom},
          {"error", r.error},
          {"components", components},
          {"comm_buffer_bytes", r.comm_buffer_bytes},
          {"comm_buffers", r.comm_buffers},
          {"communicator_bytes", r.communicator_bytes},
          {"outside_allocator_bytes", r.outside_allocator_bytes},
          {"library_workspace_bytes", r.library_workspace_bytes},
          {"seconds", r.seconds},
          {"step_seconds", r.step_seconds}}.dump();
}

ProbeResult run_distributed_probe(const Workload& workload, std::int64_t batch_size, c10::Device device,
                                  const ProbeOptions& options) {
  require_batch_size(workload, batch_size);
  const auto& spec = workload.training.distributed;
  const int world = static_cast<int>(spec.world_size);
  if (device.is_meta()) {
    // An estimate: each rank in turn, in this process, over the Meta device's process group.
    ProbeResult result;
    result.batch_size = batch_size;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < world; ++r) {
      const auto group = meta_process_group(r, world);
      auto rank_options = options;
      rank_options.rank_group = &group;
      auto one = run_probe(workload, batch_size, device, rank_options);
      if (one.oom) return one;
      if (options.snapshot) result.rank_snapshots.push_back(std::move(one.snapshot));
      result.step_seconds = std::max(result.step_seconds, one.step_seconds);
      result.ranks.push_back({r, one.components, one.comm_buffer_bytes, one.comm_buffers});
    }
    fold_ranks(result);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  if (!device.is_cpu() && !device.is_cuda()) {
    throw Error(fmt::format("{}: a distributed probe runs on the CPU (Gloo) or on GPUs (NCCL), not on {}",
                            workload.source, device.str()));
  }
  // On GPUs, one per rank; this process touches none of them (no context of its own on a rank's GPU).
  std::vector<std::string> rank_devices(static_cast<std::size_t>(world), "cpu");
  if (device.is_cuda()) {
    if (!nccl_available()) {
      throw Error(fmt::format("{}: this memgate was built without NCCL, so its ranks cannot train on GPUs: build it "
                              "against a CUDA LibTorch with NCCL's headers, or estimate the ranks (memgate estimate "
                              "--world-size {})", workload.source, world));
    }
    const auto gpus = !options.rank_devices.empty()
                          ? options.rank_devices
                          : consecutive_gpus(device.has_index() ? device.index() : 0, world,
                                             static_cast<int>(torch::cuda::device_count()));
    if (static_cast<int>(gpus.size()) != world) {
      throw Error(fmt::format("{}: {} GPUs given for {} ranks: expected one per rank", workload.source, gpus.size(),
                              world));
    }
    for (int r = 0; r < world; ++r) rank_devices[static_cast<std::size_t>(r)] = fmt::format("cuda:{}", gpus[r]);
  }
  if (workload.source.empty() || !std::filesystem::is_regular_file(workload.source)) {
    throw Error(fmt::format("{}: a distributed probe starts each rank from the fixture's file, and '{}' is not one",
                            workload.name, workload.source));
  }
  const auto exe = rank_executable();
  const auto dir = make_run_dir();
  struct Cleanup {
    std::filesystem::path dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv{
        exe, "--memgate-rank", "--fixture", workload.source, "--batch-size", std::to_string(batch_size),
        "--rank", std::to_string(r), "--world-size", std::to_string(world), "--store", (dir / "store").string(),
        "--output", (dir / fmt::format("rank{}.json", r)).string(),
        "--cpu-kernels", std::string(name_of(kCpuKernelsNames, workload.training.cpu_kernels)),
        "--warmup-steps", std::to_string(options.warmup_steps), "--cpu-threads", std::to_string(options.cpu_threads),
        "--seed", std::to_string(options.seed), "--cap-bytes", std::to_string(options.rank_cap_bytes),
        "--device", rank_devices[static_cast<std::size_t>(r)]};
    if (options.snapshot) {
      argv.insert(argv.end(), {"--snapshot", (dir / fmt::format("rank{}.pickle", r)).string()});
    }
    pids.push_back(spawn(argv, (dir / fmt::format("rank{}.log", r)).string()));
  }
  // Each rank's end; the first that fails stops the others (they would wait on it in a collective).
  std::string failure;
  for (std::size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) {
      ++left;
      continue;
    }
    const auto at = std::find(pids.begin(), pids.end(), pid);
    if (at == pids.end()) {
      ++left;
      continue;
    }
    const auto rank = static_cast<int>(at - pids.begin());
    *at = -1;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = fmt::format("rank {} of {} {}:\n{}", rank, world,
                            WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                                              : fmt::format("was killed by signal {}", WTERMSIG(status)),
                            tail_of((dir / fmt::format("rank{}.log", rank)).string()));
      for (const auto other : pids) {
        if (other > 0) ::kill(other, SIGTERM);
      }
    }
  }
  ProbeResult result;
  result.batch_size = batch_size;
  if (!failure.empty()) {
    // A rank that ran out of memory leaves the collective its peers wait in: they fail with a closed connection.
    // Ranks differ (FSDP's shards do), so one may run out alone: the probe ran out of memory, as that rank did.
    for (int r = 0; r < world; ++r) {
      try {
        const auto j = read_rank_result(dir, r);
        if (j.at("oom").get<bool>()) {
          result.oom = true;
          result.error = rank_oom_error(r, j);
          result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          return result;
        }
      } catch (const std::exception&) {
        // No result from this rank: not the one that ran out of memory.
      }
    }
    throw Error(fmt::format("{} at batch {}: {}", workload.source, batch_size, failure));
  }
  for (int r = 0; r < world; ++r) {
    nlohmann::json j;
    try {
      j = read_rank_result(dir, r);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: rank {} left no result ({})", workload.source, r, e.what()));
    }
    if (j.at("oom").get<bool>()) {
      result.oom = true;
      if (result.error.empty()) result.error = rank_oom_error(r, j);
      continue;
    }
    RankComponents rc{.rank = r,
                      .components = components_from(j.at("components")),
                      .comm_buffer_bytes = j.at("comm_buffer_bytes").get<std::int64_t>(),
                      .comm_buffers = j.at("comm_buffers").get<std::int64_t>(),
                      .communicator_bytes = j.at("communicator_bytes").get<std::int64_t>(),
                      .outside_allocator_bytes = j.at("outside_allocator_bytes").get<std::int64_t>(),
                      .library_workspace_bytes = j.at("library_workspace_bytes").get<std::int64_t>()};
    result.step_seconds = std::max(result.step_seconds, j.at("step_seconds").get<double>());
    result.ranks.push_back(rc);
  }
  if (result.oom) result.ranks.clear();
  else fold_ranks(result);
  if (options.snapshot && !result.oom) {
    for (int r = 0; r < world; ++r) {
      const auto path = dir / fmt::format("rank{}.pickle", r);
      result.rank_snapshots.push_back(std::filesystem::is_regular_file(path) ? read_text_file(path, "a memory snapshot")
                                                                              : std::string());
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace memgate
