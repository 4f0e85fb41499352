// A probe's request (launch/request.h) as JSON and back, without starting a process: every field survives, and a
// malformed request is an error naming its key.
#include "memgate/launch/request.h"

#include "memgate/base/error.h"
#include "memgate/base/files.h"
#include "memgate/gate/fixture.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace memgate {
namespace {

using nlohmann::json;

// A request whose every field differs from its default, with the model `spec`.
ProbeRequest unusual_request(ModelSpec spec) {
  ProbeRequest r;
  r.workload.name = "unusual";
  r.workload.source = "/fixtures/unusual.yaml";
  r.workload.model = std::move(spec);
  auto& t = r.workload.training;
  t.optimizer = Optimizer::kSgd;
  t.optimizer_impl = OptimizerImpl::kFused;
  t.lr = 0.25;
  t.weight_decay = 0.5;
  t.momentum = 0.75;
  t.trainable = {.kind = TrainableSpec::Kind::kPatterns, .last_blocks = 3, .patterns = {"head.*", "*.lora_*"}};
  t.precision = Precision::kBf16;
  t.gradient_checkpointing = true;
  t.checkpoint_blocks = {"blocks.1", "blocks.3"};
  t.accumulation_steps = 4;
  t.deterministic = true;
  t.allocator = "expandable_segments:True";
  t.cpu_kernels = CpuKernels::kHost;
  t.distributed = {.strategy = DistributedStrategy::kFsdp, .world_size = 3, .bucket_cap_mb = 12.5,
                   .gradient_as_bucket_view = true, .units = "layers", .reshard_after_forward = false,
                   .reshard_after_forward_group = 2, .backward_prefetch = 0, .reduce_dtype = Precision::kFp16};
  t.compile = true;
  t.max_grad_norm = 1.5;
  t.own_optimizer = true;
  t.ema_decay = 0.999;
  r.batch_sizes = {1, 8, 64};
  r.device = "cuda:3";
  r.estimate = EstimateContext{.target = EstimateTarget::kCuda, .cpu_kernels = CpuKernels::kHost,
                               .gpu = {40, 1024}, .cudnn_device_json = R"({"note": "a T4's"})"};
  r.cap_bytes = 123456789;
  r.cpu_limit_bytes = 987654321;
  r.warmup_steps = 2;
  r.cpu_threads = 4;
  r.seed = 18446744073709551557ULL;  // beyond int64
  r.timeout = std::chrono::seconds(77);
  r.keep_going = true;
  r.rank = 2;
  r.world_size = 3;
  r.store = "/tmp/run/store";
  r.output = "/tmp/run/rank2.json";
  r.heartbeat = "/tmp/run/rank2.beat";
  r.snapshot = "/tmp/run/rank2.pickle";
  r.search = R"({"targets": []})";
  r.flops = R"({"batch_sizes": [4], "target": "cuda"})";
  return r;
}

ProbeRequest round_trip(const ProbeRequest& request) {
  return json::parse(json(request).dump()).get<ProbeRequest>();
}

TEST(ProbeRequestTest, EveryFieldSurvivesTheRoundTrip) {
  PythonOptions py;
  py.entry = "model.py:build";
  py.entry_file = "/m/model.py";
  py.entry_module = "pkg.model";
  py.entry_callable = "build";
  py.args = {{"depth", 2}, {"names", {"a", "b"}}};
  py.inputs = {{.shape = {-1, 3, 32, 32}, .dtype = c10::ScalarType::BFloat16, .high = 7,
                .fill = TorchScriptInput::Fill::kUniform, .low_value = -1.5, .high_value = 2.5, .kwarg = "pixels"}};
  py.task = TorchScriptOptions::Task::kClassify;
  py.num_classes = 10;
  py.loss = "loss.py:ce";
  py.loss_file = "/m/loss.py";
  py.loss_module = "pkg.loss";
  py.loss_callable = "ce";
  py.batch = {.text = "b.py:make", .file = "/m/b.py", .module = "", .callable = "make"};
  py.compute_loss = {.text = "pkg.l:f", .file = "", .module = "pkg.l", .callable = "f"};
  py.target = {{.shape = {-1}, .dtype = c10::ScalarType::Long, .high = 10}};
  py.optimizer_class = "torch.optim.RMSprop";
  py.optimizer_kwargs = {{"alpha", 0.9}};
  py.optimizer = {.text = "o.py:opt", .file = "/m/o.py", .module = "", .callable = "opt"};
  py.blocks = "layers";
  py.python = "/venv/bin/python";
  py.python_written = "../venv/bin/python";
  py.python_key = "f.yaml:4: model.python";
  py.compile = true;
  const auto request = unusual_request({.arch = Arch::kPython, .options = py});
  const auto back = round_trip(request);

  EXPECT_EQ(json(back), json(request));
  // Field by field where a name could be lost on one side only.
  EXPECT_EQ(back.workload.name, "unusual");
  EXPECT_EQ(back.workload.source, "/fixtures/unusual.yaml");
  const auto& t = back.workload.training;
  EXPECT_EQ(t.optimizer, Optimizer::kSgd);
  EXPECT_EQ(t.optimizer_impl, OptimizerImpl::kFused);
  EXPECT_EQ(t.lr, 0.25);
  EXPECT_EQ(t.weight_decay, 0.5);
  EXPECT_EQ(t.momentum, 0.75);
  EXPECT_EQ(t.trainable.str(), request.workload.training.trainable.str());
  EXPECT_EQ(t.trainable.last_blocks, 3);
  EXPECT_EQ(t.precision, Precision::kBf16);
  EXPECT_TRUE(t.gradient_checkpointing);
  EXPECT_EQ(t.checkpoint_blocks, (std::vector<std::string>{"blocks.1", "blocks.3"}));
  EXPECT_EQ(t.accumulation_steps, 4);
  EXPECT_TRUE(t.deterministic);
  EXPECT_EQ(t.allocator, "expandable_segments:True");
  EXPECT_EQ(t.cpu_kernels, CpuKernels::kHost);
  EXPECT_EQ(t.distributed.strategy, DistributedStrategy::kFsdp);
  EXPECT_EQ(t.distributed.world_size, 3);
  EXPECT_EQ(t.distributed.bucket_cap_mb, 12.5);
  EXPECT_TRUE(t.distributed.gradient_as_bucket_view);
  EXPECT_EQ(t.distributed.units, "layers");
  EXPECT_EQ(t.distributed.reshard_after_forward, false);
  EXPECT_EQ(t.distributed.reshard_after_forward_group, 2);
  EXPECT_EQ(t.distributed.backward_prefetch, 0);
  EXPECT_EQ(t.distributed.reduce_dtype, Precision::kFp16);
  EXPECT_TRUE(t.compile);
  EXPECT_EQ(t.max_grad_norm, 1.5);
  EXPECT_TRUE(t.own_optimizer);
  EXPECT_EQ(t.ema_decay, 0.999);
  ASSERT_EQ(back.workload.model.arch, Arch::kPython);
  const auto& p = std::get<PythonOptions>(back.workload.model.options);
  EXPECT_EQ(p.entry_file, "/m/model.py");
  EXPECT_EQ(p.entry_module, "pkg.model");
  EXPECT_EQ(p.args, py.args);
  ASSERT_EQ(p.inputs.size(), 1U);
  EXPECT_EQ(p.inputs[0].shape, (std::vector<std::int64_t>{-1, 3, 32, 32}));
  EXPECT_EQ(p.inputs[0].dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(p.inputs[0].fill, TorchScriptInput::Fill::kUniform);
  EXPECT_EQ(p.inputs[0].low_value, -1.5);
  EXPECT_EQ(p.inputs[0].kwarg, "pixels");
  EXPECT_EQ(p.loss_callable, "ce");
  EXPECT_EQ(p.compute_loss.module, "pkg.l");
  EXPECT_EQ(p.optimizer.file, "/m/o.py");
  EXPECT_EQ(p.optimizer_kwargs, py.optimizer_kwargs);
  EXPECT_EQ(p.python_key, "f.yaml:4: model.python");
  EXPECT_TRUE(p.compile);
  EXPECT_EQ(back.batch_sizes, (std::vector<std::int64_t>{1, 8, 64}));
  EXPECT_EQ(back.device, "cuda:3");
  ASSERT_TRUE(back.estimate.has_value());
  EXPECT_EQ(*back.estimate, *request.estimate);
  EXPECT_EQ(back.cap_bytes, 123456789);
  EXPECT_EQ(back.cpu_limit_bytes, 987654321);
  EXPECT_EQ(back.warmup_steps, 2);
  EXPECT_EQ(back.cpu_threads, 4);
  EXPECT_EQ(back.seed, 18446744073709551557ULL);
  EXPECT_EQ(back.timeout, std::chrono::seconds(77));
  EXPECT_TRUE(back.keep_going);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.world_size, 3);
  EXPECT_EQ(back.store, "/tmp/run/store");
  EXPECT_EQ(back.output, "/tmp/run/rank2.json");
  EXPECT_EQ(back.heartbeat, "/tmp/run/rank2.beat");
  EXPECT_EQ(back.snapshot, "/tmp/run/rank2.pickle");
  EXPECT_EQ(back.search, request.search);
  EXPECT_EQ(back.flops, request.flops);
  // to_json writes this memgate's version, whatever the value held: the child compares it with its own.
  auto other = request;
  other.memgate_version = "0.0-another";
  EXPECT_FALSE(back.memgate_version.empty());
  EXPECT_EQ(round_trip(other).memgate_version, back.memgate_version);
}

// Each architecture's options come back as that architecture's, each field as written (the nested ones too: a
// multimodal model's LLM and vision tower, LoRA's targets).
TEST(ProbeRequestTest, EveryArchitecturesOptionsSurviveTheRoundTrip) {
  GptOptions gpt{.vocab_size = 11, .seq_len = 12, .n_layer = 13, .n_embd = 14, .n_head = 2, .mlp_hidden = 15,
                 .mlp = GptOptions::Mlp::kSwiglu, .norm = GptOptions::Norm::kRmsNorm,
                 .position = GptOptions::Position::kNone, .bias = false, .tied_embeddings = false,
                 .lora = {.rank = 4, .alpha = 8.0, .targets = {"qkv", "fc2"}}};
  VitOptions vit{.img_size = 32, .patch_size = 4, .in_chans = 1, .embed_dim = 24, .depth = 3, .num_heads = 2,
                 .mlp_ratio = 2.5, .num_classes = 7, .qkv_bias = false, .attention = VitOptions::Attention::kMath,
                 .proj_drop = 0.1, .lora = {.rank = 2, .alpha = 1.0, .targets = {"proj"}}};
  const std::vector<ModelSpec> specs{
      {.arch = Arch::kVit, .options = vit},
      {.arch = Arch::kResNet, .options = ResNetOptions{.depth = 18, .img_size = 64, .in_chans = 1, .width = 8,
                                                       .num_classes = 3, .task = ResNetOptions::Task::kProtonet,
                                                       .ways = 2, .shots = 3, .queries = 4}},
      {.arch = Arch::kUNet, .options = UNetOptions{.img_size = 64, .in_chans = 1, .num_classes = 2,
                                                   .base_channels = 8, .levels = 2, .bilinear = true}},
      {.arch = Arch::kGpt, .options = gpt},
      {.arch = Arch::kSegNet, .options = SegNetOptions{.img_size = 64, .in_chans = 1, .num_classes = 2,
                                                       .dims = {8, 16}, .depths = {1, 2}, .decoder_dim = 16,
                                                       .deep_supervision = true, .num_experts = 2}},
      {.arch = Arch::kMultimodal, .options = MultimodalOptions{.llm = gpt, .vision = vit, .text_len = 9,
                                                               .decoder_dim = 32, .decoder_depth = 1,
                                                               .decoder_heads = 2,
                                                               .frozen_dtype = Precision::kFp16}},
      {.arch = Arch::kTorchScript, .options = TorchScriptOptions{.path = "/m/lm.pt",
                                                                 .inputs = {{.shape = {-1, 16},
                                                                             .dtype = c10::ScalarType::Long,
                                                                             .high = 100}},
                                                                 .task = TorchScriptOptions::Task::kRegress,
                                                                 .num_classes = 0}},
      {.arch = Arch::kRegistered, .options = RegisteredOptions{.name = "mine", .options = {{"width", 3}}}},
  };
  for (const auto& spec : specs) {
    const auto request = unusual_request(spec);
    const auto back = round_trip(request);
    EXPECT_EQ(json(back), json(request)) << json(request.workload.model.arch).dump();
    EXPECT_EQ(back.workload.model.arch, spec.arch);
    EXPECT_EQ(back.workload.model.options.index(), spec.options.index());
  }
  const auto back = round_trip(unusual_request(specs[5]));
  const auto& m = std::get<MultimodalOptions>(back.workload.model.options);
  EXPECT_EQ(m.llm.mlp, GptOptions::Mlp::kSwiglu);
  EXPECT_EQ(m.llm.lora.targets, (std::vector<std::string>{"qkv", "fc2"}));
  EXPECT_EQ(m.vision.attention, VitOptions::Attention::kMath);
  EXPECT_EQ(m.vision.mlp_ratio, 2.5);
  EXPECT_EQ(m.frozen_dtype, Precision::kFp16);
  const auto segnet = std::get<SegNetOptions>(round_trip(unusual_request(specs[4])).workload.model.options);
  EXPECT_EQ(segnet.dims, (std::vector<std::int64_t>{8, 16}));
  EXPECT_TRUE(segnet.deep_supervision);
}

// Every fixture of the repository's, as the parent parses it, is the workload the child reads: the request holds
// what load_fixture gave, and nothing of the file is read again.
TEST(ProbeRequestTest, EveryCommittedFixtureSurvivesTheRoundTrip) {
  int fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::source_dir() + "/fixtures/models")) {
    if (entry.path().extension() != ".yaml") continue;
    ProbeRequest request;
    request.workload = load_fixture(entry.path().string());
    request.batch_sizes = {2};
    const auto back = round_trip(request);
    EXPECT_EQ(json(back), json(request)) << entry.path();
    EXPECT_EQ(back.workload.model.options.index(), request.workload.model.options.index()) << entry.path();
    ++fixtures;
  }
  EXPECT_GE(fixtures, 50);
}

// A malformed request is refused with the key's path from `request`, what was expected and what it holds.
TEST(ProbeRequestTest, AMalformedRequestIsAnErrorNamingTheKey) {
  const json good = unusual_request({.arch = Arch::kGpt, .options = GptOptions{}});
  struct Case {
    std::string name;
    std::function<void(json&)> spoil;
    std::string says;
  };
  const std::vector<Case> cases{
      {"missing key", [](json& j) { j.erase("batch_sizes"); }, "request.batch_sizes: missing"},
      {"wrong type", [](json& j) { j["workload"]["training"]["lr"] = "fast"; },
       "request.workload.training.lr: expected a number, got a string (\"fast\")"},
      {"not an integer", [](json& j) { j["batch_sizes"][1] = 2.5; },
       "request.batch_sizes[1]: expected an integer, got a number (2.5)"},
      {"enum out of range", [](json& j) { j["workload"]["training"]["precision"] = 7; },
       "request.workload.training.precision: expected an enum's value from 0 to 2, got an integer (7)"},
      {"alternative out of range", [](json& j) { j["workload"]["model"]["options"]["index"] = 42; },
       "request.workload.model.options.index: expected an alternative's index from 0 to 8, got an integer (42)"},
      {"int out of range", [](json& j) { j["rank"] = 1LL << 40; },
       "request.rank: expected an integer from -2147483648 to 2147483647"},
      {"negative unsigned", [](json& j) { j["seed"] = -1; }, "request.seed: expected an integer from 0"},
      {"unknown key", [](json& j) { j["workload"]["training"]["lr_schedule"] = "cosine"; },
       "request.workload.training.lr_schedule: not a key of a probe's request"},
      {"nested missing", [](json& j) { j["estimate"]["gpu"].erase("multiprocessors"); },
       "request.estimate.gpu.multiprocessors: missing"},
      {"not an object", [](json& j) { j["workload"]["training"]["distributed"] = 3; },
       "request.workload.training.distributed: expected an object, got an integer (3)"},
  };
  for (const auto& c : cases) {
    auto bad = good;
    c.spoil(bad);
    try {
      (void)bad.get<ProbeRequest>();
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(c.says)) << c.name;
    }
  }
}

// The child's file: written atomically and read back whole; a file that is not JSON, or a key that is wrong, names
// the file too.
TEST(ProbeRequestTest, ARequestFileIsReadBackAndItsErrorsNameIt) {
  testing::TempDir dir;
  const auto path = (dir.path() / "rank0.request.json").string();
  const auto request = unusual_request({.arch = Arch::kUNet, .options = UNetOptions{}});
  write_probe_request(path, request);
  EXPECT_EQ(json(read_probe_request(path)), json(request));

  write_file_atomically(path, "{not json");
  EXPECT_THAT([&] { (void)read_probe_request(path); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(path + ": a probe's request is not JSON")));
  auto j = json(request);
  j["device"] = 3;
  write_file_atomically(path, j.dump());
  EXPECT_THAT([&] { (void)read_probe_request(path); },
              ::testing::ThrowsMessage<Error>(
                  ::testing::HasSubstr(path + ": request.device: expected a string, got an integer (3)")));
}

}  // namespace
}  // namespace memgate
