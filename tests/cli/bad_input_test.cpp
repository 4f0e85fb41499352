// The bad-input catalogue: each case is a file or a flag a user could realistically get wrong. memgate must exit
// with the contract's code (2 a usage error, 3 a bad file, 1 a failed gate) and a message that names what is wrong
// (the file, the key or flag, the line where there is one); no case may crash, hang or print "unexpected error".
#include "cli_fork.h"
#include "fixture_util.h"
#include "test_util.h"

#include "memgate/report/svg_chart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace memgate {
namespace {

using namespace std::string_literals;

struct BadInput {
  std::string name;                          ///< the test's name
  std::map<std::string, std::string> files;  ///< written into the case's folder first
  std::string args;                          ///< after `memgate `; {dir} is the case's folder
  int exit_code;
  std::vector<std::string> says;             ///< each must appear in the output
  std::string env = {};                      ///< VAR=value ... before the command; {dir} is the case's folder
  std::vector<std::string> not_written = {};  ///< files in the case's folder the command must not make
};

void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

const std::string kFixture = testing::tiny_vit_yaml();
std::string fixture_with(const std::string& from, const std::string& to) {
  auto text = kFixture;
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in the tiny fixture");
  return text.replace(at, from.size(), to);
}
std::string training_with(const std::string& lines) { return testing::tiny_vit_yaml(lines); }

const std::string kBaseline =
    R"({"schema": 1, "fixture": "tiny", "device": {"slug": "cpu"},
 "tolerance": {"relative": 0.0025, "absolute_bytes": 0, "reserved_relative": 0.0025, "reserved_absolute_bytes": 0},
 "probes": [{"batch_size": 1, "components": {"params": 1, "gradients": 1, "optimizer_state": 1, "activations": 1,
   "forward_peak": 1, "eval_peak": 1, "step_peak": 1, "step_peak_reserved": 1}, "provenance": {}}]})";
std::string baseline_with(const std::string& from, const std::string& to) {
  auto text = kBaseline;
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in the baseline");
  return text.replace(at, from.size(), to);
}

const std::string kGpu = "name: Test GPU\nmemory_gib: 16\n";
const std::string kBench = R"({"context": {}, "benchmarks": [{"name": "a", "run_type": "iteration", "real_time": 1.0,
  "cpu_time": 1.0, "time_unit": "ms", "iterations": 1}]})";
const std::string kRow =
    R"({"test": "Cpu/ComponentTest.StaysWithinBaseline/tiny_bs1_params", "suite": "cpu", "fixture": "tiny", "device": "cpu", "batch_size": 1, "component": "params", "status": "ok", "baseline": 1, "measured": 1})";

std::string profile(const std::string& file = "f.yaml") { return "profile --config {dir}/" + file + " --device cpu"; }
std::string check_baseline() { return "check --config {dir}/tiny.yaml --batch-sizes 1 --device cpu --baselines {dir}/b"; }

// The hash of the tiny fixture as a baseline records it (its provenance's fixture_hash).
std::string tiny_fixture_hash() {
  testing::TempDir dir;
  testing::write_file(dir / "tiny.yaml", kFixture);
  return load_fixture(dir / "tiny.yaml").hash;
}

std::vector<BadInput> catalogue() {
  std::vector<BadInput> c;
  auto fixture = [&](std::string name, std::string yaml, std::vector<std::string> says) {
    c.push_back({"fixture_" + name, {{"f.yaml", std::move(yaml)}}, profile(), 3, std::move(says)});
  };
  // --- model fixtures ---------------------------------------------------------------------------------------
  fixture("unknown_top_key", kFixture + "epochs: 3\n", {"f.yaml:", "epochs: unknown key"});
  fixture("unknown_model_key", fixture_with("  depth: 4\n", "  depth: 4\n  dept: 4\n"), {"f.yaml:", "model.dept: unknown key"});
  fixture("unknown_training_key", training_with("  lr_schedule: cosine\n"), {"training.lr_schedule: unknown key"});
  fixture("duplicate_key", fixture_with("  depth: 4\n", "  depth: 4\n  depth: 8\n"), {"f.yaml:", "model.depth: given twice"});
  fixture("second_document", kFixture + "---\nname: other\n", {"f.yaml:", "a second YAML document"});
  fixture("name_empty", "name: \"\"\n" + kFixture, {"f.yaml:", "name", "a non-empty name"});
  fixture("cpu_kernels_unknown", training_with("  cpu_kernels: avx512\n"),
          {"f.yaml:", "training.cpu_kernels", "portable", "host"});
  fixture("not_yaml", "model: {arch: vit\n", {"f.yaml:", "not valid YAML"});
  fixture("empty_file", "", {"f.yaml", "model: expected a map (the key is required)"});
  fixture("top_level_list", "- 1\n- 2\n", {"f.yaml", "expected a map"});
  fixture("unknown_arch", fixture_with("arch: vit", "arch: vgg"), {"model.arch: expected one of vit", "'vgg'"});
  // A checkpointed block the model lacks: the fixture, the key, the name and the blocks there are (when the step is
  // built: the model knows its blocks).
  fixture("checkpoint_unknown_block",
          fixture_with("  optimizer: adamw\n", "  optimizer: adamw\n  gradient_checkpointing: {blocks: [blocks.9]}\n"),
          {"f.yaml: training.gradient_checkpointing.blocks: 'blocks.9' is no block", "expected one of blocks.0"});
  fixture("checkpoint_empty_block_list",
          fixture_with("  optimizer: adamw\n", "  optimizer: adamw\n  gradient_checkpointing: {blocks: []}\n"),
          {"f.yaml:", "training.gradient_checkpointing.blocks", "at least one block name"});
  // A selective checkpointing policy (`save`, `policy`): PyTorch's, which runs in Python; its form, and what it is
  // not measured with.
  fixture("checkpoint_save_on_a_zoo_model",
          fixture_with("  optimizer: adamw\n", "  optimizer: adamw\n  gradient_checkpointing: {save: [aten.mm]}\n"),
          {"f.yaml:", "training.gradient_checkpointing.save: expected no selective checkpointing policy for a model "
                      "that is not arch: python", "arch: python fixture"});
  const auto python_saving = [](const std::string& checkpointing, const std::string& more = "") {
    return std::map<std::string, std::string>{
        {"m.py", "def build():\n    pass\n"},
        {"f.yaml", "model:\n  arch: python\n  entry: m.py:build\n  inputs:\n    - {shape: [B, 4]}\n  task: sum\n"
                   "  blocks: \"*\"\ntraining:\n  gradient_checkpointing: " + checkpointing + "\n" + more +
                   "batch_sizes: [1]\n"}};
  };
  c.push_back({"fixture_checkpoint_save_empty", python_saving("{save: []}"), profile(), 3,
               {"f.yaml:", "training.gradient_checkpointing.save: expected at least one op name such as aten.mm"}});
  c.push_back({"fixture_checkpoint_save_not_an_op_name", python_saving("{save: [mm]}"), profile(), 3,
               {"f.yaml:", "training.gradient_checkpointing.save", "<namespace>.<op>", "'mm'"}});
  c.push_back({"fixture_checkpoint_save_and_policy", python_saving("{save: [aten.mm], policy: m.py:build}"),
               profile(), 3, {"f.yaml:", "training.gradient_checkpointing.policy: expected either save", "not both"}});
  c.push_back({"fixture_checkpoint_save_under_distributed",
               python_saving("{save: [aten.mm]}", "  distributed: {strategy: ddp, world_size: 2}\n"), profile(), 3,
               {"f.yaml:", "training.gradient_checkpointing.save: expected no selective checkpointing under "
                           "training.distributed"}});
  c.push_back({"fixture_checkpoint_save_with_activation_offload",
               python_saving("{save: [aten.mm]}", "  activation_offload: cpu\n"), profile(), 3,
               {"f.yaml:", "training.gradient_checkpointing.save: expected no selective checkpointing with "
                           "activation_offload"}});
  c.push_back({"fixture_checkpoint_save_under_compile",
               python_saving("{save: [aten.mm]}", "  compile: true\n"), profile(), 3,
               {"f.yaml:", "training.compile: expected false with gradient_checkpointing"}});
  fixture("missing_arch", fixture_with("  arch: vit\n", ""), {"model.arch", "required"});
  fixture("batch_size_zero", fixture_with("batch_sizes: [1, 2, 4, 8]", "batch_sizes: [0]"), {"batch_sizes", ">= 1"});
  fixture("batch_size_negative", fixture_with("batch_sizes: [1, 2, 4, 8]", "batch_sizes: [-4]"), {"batch_sizes"});
  fixture("batch_size_text", fixture_with("batch_sizes: [1, 2, 4, 8]", "batch_sizes: [eight]"), {"batch_sizes", "'eight'"});
  fixture("batch_size_float", fixture_with("batch_sizes: [1, 2, 4, 8]", "batch_sizes: [1.5]"), {"batch_sizes", "'1.5'"});
  fixture("batch_size_huge", fixture_with("batch_sizes: [1, 2, 4, 8]", "batch_sizes: [99999999999999999999]"), {"batch_sizes"});
  fixture("batch_sizes_missing", fixture_with("batch_sizes: [1, 2, 4, 8]\n", ""), {"batch_sizes", "required"});
  fixture("embed_dim_zero", fixture_with("embed_dim: 64", "embed_dim: 0"), {"model.embed_dim: expected an integer from 1"});
  fixture("embed_dim_list", fixture_with("embed_dim: 64", "embed_dim: [64]"), {"model.embed_dim: expected an integer"});
  fixture("heads_do_not_divide", fixture_with("num_heads: 4", "num_heads: 3"), {"model.num_heads", "divisor"});
  fixture("patch_does_not_divide", fixture_with("patch_size: 8", "patch_size: 7"), {"model.patch_size", "divisor"});
  fixture("mlp_ratio_nan", fixture_with("  depth: 4\n", "  depth: 4\n  mlp_ratio: .nan\n"), {"model.mlp_ratio"});
  fixture("mlp_ratio_inf", fixture_with("  depth: 4\n", "  depth: 4\n  mlp_ratio: .inf\n"), {"model.mlp_ratio"});
  fixture("lora_rank_zero", fixture_with("  depth: 4\n", "  depth: 4\n  lora: {rank: 0}\n"), {"model.lora.rank"});
  fixture("lora_rank_above_width", fixture_with("  depth: 4\n", "  depth: 4\n  lora: {rank: 128}\n"),
          {"model.lora: expected a rank of at most embed_dim (64)", "rank 128"});
  fixture("lora_unknown_target", fixture_with("  depth: 4\n", "  depth: 4\n  lora: {rank: 4, targets: [mlp]}\n"),
          {"model.lora.targets", "qkv"});
  fixture("lora_without_section", training_with("  trainable: lora\n"), {"training.trainable", "lora"});
  fixture("unknown_optimizer", training_with("  optimizer: adam\n").replace(training_with("").find("  optimizer: adamw\n"), 18, ""),
          {"training.optimizer", "adamw, sgd"});
  fixture("precision_fp8", training_with("  precision: fp8\n"), {"training.precision", "fp32, fp16, bf16"});
  fixture("accumulation_zero", training_with("  accumulation_steps: 0\n"), {"training.accumulation_steps"});
  fixture("last_blocks_zero", training_with("  trainable: last_blocks:0\n"), {"training.trainable", "last_blocks:N"});
  fixture("empty_patterns", training_with("  trainable: {train: []}\n"), {"training.trainable.train"});
  fixture("momentum_above_one", training_with("  optimizer: sgd\n  momentum: 1.5\n").replace(
              training_with("").find("  optimizer: adamw\n"), 18, ""), {"training.momentum"});
  fixture("tolerance_negative", kFixture + "gate: {relative: -0.1}\n", {"gate.relative"});
  fixture("tolerance_overflow", kFixture + "gate: {absolute_kib: 9007199254740991}\n", {"gate.absolute_kib"});
  fixture("bad_name", "name: my fixture\n" + kFixture, {"name", "letters, digits"});
  // Optional keys: a misspelling points to the key's name among those the map takes (a null is "not set": below).
  fixture("max_grad_norm_misspelled", training_with("  max_grad_norms: 1.0\n"),
          {"f.yaml:", "training.max_grad_norms: unknown key: did you mean 'max_grad_norm'?", " max_grad_norm,"});
  fixture("ema_misspelled", training_with("  ema_decay: 0.99\n"), {"f.yaml:", "training.ema_decay: unknown key: did you mean 'ema'?", " ema,"});
  // training.activation_offload (save_on_cpu around the forward): its words, and where memgate does not measure it.
  fixture("activation_offload_unknown_word", training_with("  activation_offload: gpu\n"),
          {"f.yaml:", "training.activation_offload: expected one of none, cpu, cpu_pinned, got 'gpu'"});
  fixture("activation_offload_under_distributed",
          training_with("  activation_offload: cpu\n  distributed: {strategy: ddp, world_size: 2}\n"),
          {"f.yaml:", "training.activation_offload: expected none under training.distributed"});
  c.push_back({"fixture_activation_offload_under_compile",
               {{"m.py", "def build():\n    pass\n"},
                {"f.yaml", "model:\n  arch: python\n  entry: m.py:build\n  inputs:\n    - {shape: [B, 4]}\n"
                           "  task: sum\ntraining:\n  activation_offload: cpu_pinned\n  compile: true\n"
                           "batch_sizes: [1]\n"}},
               profile(), 3, {"f.yaml:", "training.activation_offload: expected none under compile: true"}});
  // An estimate of a Python model that offloads: its Python probe refuses it, naming the key (exit 3).
  c.push_back({"estimate_activation_offload_of_a_python_model",
               {{"f.yaml", "model:\n  arch: python\n  entry: " + testing::source_dir() +
                               "/fixtures/models/python/step_models.py:mlp\n  inputs:\n    - {shape: [B, 32]}\n"
                               "  task: sum\ntraining:\n  activation_offload: cpu_pinned\nbatch_sizes: [1]\n"}},
               "estimate --config {dir}/f.yaml --batch-sizes 1", 3,
               {"f.yaml", "training.activation_offload: an estimate of a Python model (arch: python) does not model"}});
  c.push_back({"fixture_optional_keys_null_are_not_set",
               {{"f.yaml", training_with("  max_grad_norm: null\n  ema: null\n")}},
               profile() + " --batch-sizes 1", 0, {"bs 1: step peak"}});
  c.push_back({"fixture_missing_file", {}, profile("nothing.yaml"), 3, {"nothing.yaml", "no such file"}});
  c.push_back({"fixture_is_a_directory", {{"d/x", ""}}, "profile --config {dir}/d --device cpu", 3, {"/d: is a directory"}});
  c.push_back({"torchscript_missing_module", {{"f.yaml", "model:\n  arch: torchscript\n  path: m.pt\n  inputs:\n"
                                                         "    - {shape: [B, 4]}\n  task: sum\nbatch_sizes: [1]\n"}},
               profile(), 3, {"model.path", "m.pt", "not there"}});
  c.push_back({"torchscript_not_a_module", {{"m.pt", "not a zip"}, {"f.yaml", "model:\n  arch: torchscript\n  path: m.pt\n"
                                                                              "  inputs:\n    - {shape: [B, 4]}\n  task: sum\nbatch_sizes: [1]\n"}},
               profile(), 3, {"m.pt: cannot load a TorchScript module"}});
  // --- suites -----------------------------------------------------------------------------------------------
  auto suite = [&](std::string name, std::string yaml, std::vector<std::string> says) {
    c.push_back({"suite_" + name, {{"fixtures/models/tiny.yaml", kFixture}, {"fixtures/suites/s.yaml", std::move(yaml)}},
                 "check --suite {dir}/fixtures/suites/s.yaml", 3, std::move(says)});
  };
  suite("missing_device", "fixtures: [tiny]\n", {"s.yaml", "device"});
  suite("unknown_device", "device: tpu\nfixtures: [tiny]\n", {"s.yaml", "device", "cpu"});
  suite("unknown_fixture", "device: cpu\nfixtures: [huge]\n", {"s.yaml", "huge"});
  suite("fixture_twice", "device: cpu\nfixtures: [tiny, tiny]\n", {"s.yaml", "tiny"});
  suite("unknown_key", "device: cpu\nfixtures: [tiny]\nextra: 1\n", {"s.yaml", "extra: unknown key"});
  suite("bad_batch", "device: cpu\nfixtures:\n  - {fixture: tiny, batch_sizes: [0]}\n", {"s.yaml", "batch_sizes"});
  suite("duplicate_key", "device: cpu\ndevice: cuda\nfixtures: [tiny]\n", {"s.yaml", "device: given twice"});
  // --- GPU fixtures -----------------------------------------------------------------------------------------
  auto gpu = [&](std::string name, std::string yaml, std::vector<std::string> says) {
    c.push_back({"gpu_" + name, {{"tiny.yaml", kFixture}, {"gpus/g.yaml", std::move(yaml)}},
                 "advise --config {dir}/tiny.yaml --gpus {dir}/gpus --gpu g --device cpu", 3, std::move(says)});
  };
  gpu("memory_zero", "name: G\nmemory_gib: 0\n", {"g.yaml", "memory_gib"});
  gpu("memory_text", "name: G\nmemory_gib: lots\n", {"g.yaml", "memory_gib"});
  gpu("usable_above_one", kGpu + "usable_fraction: 1.5\n", {"g.yaml", "usable_fraction"});
  gpu("unknown_key", kGpu + "tdp_watts: 300\n", {"g.yaml", "tdp_watts: unknown key"});
  gpu("nothing_usable", "name: G\nmemory_gib: 0.5\noutside_allocator_mib: 600\n",
      {"g.yaml:3: outside_allocator_mib", "less than memory_gib x usable_fraction"});
  // A --gpu that names no fixture is a usage error (a mistyped flag value), with the ids there are.
  c.push_back({"gpu_unknown_id", {{"tiny.yaml", kFixture}, {"gpus/g.yaml", kGpu}},
               "advise --config {dir}/tiny.yaml --gpus {dir}/gpus --gpu h100 --device cpu", 2,
               {"--gpu h100", "gpus/h100.yaml", "expected one of the known ids: g"}});
  // --- baselines (the measurement never starts: the baseline is read first) ----------------------------------
  auto baseline = [&](std::string name, std::string json, std::vector<std::string> says) {
    c.push_back({"baseline_" + name, {{"tiny.yaml", kFixture}, {"b/cpu/tiny.json", std::move(json)}}, check_baseline(), 3,
                 std::move(says)});
  };
  baseline("not_json", "{\"schema\": 1,", {"tiny.json", "not valid JSON"});
  baseline("number_overflow", baseline_with("\"params\": 1", "\"params\": 1e309"), {"tiny.json", "not valid JSON"});
  baseline("unknown_key", baseline_with("\"schema\": 1", "\"schema\": 1, \"notes\": \"x\""), {"tiny.json", "notes"});
  baseline("unknown_component", baseline_with("\"params\": 1", "\"params\": 1, \"kv_cache\": 1"), {"tiny.json", "kv_cache"});
  baseline("duplicate_batch", baseline_with("\"provenance\": {}}]", "\"provenance\": {}}, {\"batch_size\": 1, "
                                            "\"components\": {}, \"provenance\": {}}]"), {"tiny.json", "twice"});
  baseline("other_fixture", baseline_with("\"fixture\": \"tiny\"", "\"fixture\": \"huge\""), {"tiny.json", "fixture", "huge"});
  baseline("other_device", baseline_with("\"slug\": \"cpu\"", "\"slug\": \"nvidia-a100\""), {"tiny.json", "device.slug"});
  baseline("negative_bytes", baseline_with("\"params\": 1", "\"params\": -5"), {"tiny.json", "params"});
  baseline("missing_components", baseline_with("\"params\": 1, ", ""), {"tiny.json", "params"});
  baseline("wrong_schema", baseline_with("\"schema\": 1", "\"schema\": 7"), {"tiny.json", "schema"});
  baseline("is_a_directory", "", {"tiny.json", "is a directory"});
  c.back().files = {{"tiny.yaml", kFixture}, {"b/cpu/tiny.json/x", ""}};
  // --- command-line flags -----------------------------------------------------------------------------------
  auto flags = [&](std::string name, std::string args, std::vector<std::string> says) {
    c.push_back({"flag_" + name, {{"tiny.yaml", kFixture}}, std::move(args), 2, std::move(says)});
  };
  flags("unknown_subcommand", "prfile", {"unknown subcommand 'prfile'"});
  flags("unknown_flag", "advise --bogus", {"--bogus"});
  flags("missing_config", "profile", {"--config"});
  flags("batch_sizes_zero", "profile --config {dir}/tiny.yaml --batch-sizes 0", {"--batch-sizes"});
  flags("batch_sizes_words", "profile --config {dir}/tiny.yaml --batch-sizes 1,two", {"--batch-sizes"});
  flags("batch_sizes_empty_item", "profile --config {dir}/tiny.yaml --batch-sizes 1,,2", {"--batch-sizes"});
  flags("device_unknown", "profile --config {dir}/tiny.yaml --device tpu", {"--device"});
  flags("memory_limit_overflow", "profile --config {dir}/tiny.yaml --cpu-memory-limit-mib 17592186044417",
        {"--cpu-memory-limit-mib"});
  flags("memory_limit_negative", "profile --config {dir}/tiny.yaml --cpu-memory-limit-mib -1", {"--cpu-memory-limit-mib"});
  flags("threshold_nan", "bench-compare {dir}/tiny.yaml {dir}/tiny.yaml --threshold-pct nan", {"--threshold-pct"});
  flags("capacity_zero", "advise --config {dir}/tiny.yaml --capacity-mib 0", {"--capacity-mib"});
  flags("config_and_suite", "check --config {dir}/tiny.yaml --suite {dir}/tiny.yaml", {"--suite", "--config"});
  c.push_back({"flag_missing_gpu", {{"tiny.yaml", kFixture}}, "advise --config {dir}/tiny.yaml --capacity-mib 100 --device cuda:7", 3,
               {"cuda"}});
  // memgate plan: a GPU or a capacity, a known GPU, a batch of 1 or more; a batch no plan fits says the least needed.
  flags("plan_without_gpu", "plan --config {dir}/tiny.yaml", {"--gpu or --capacity-mib"});
  flags("plan_batch_zero", "plan --config {dir}/tiny.yaml --capacity-mib 64 --batch 0", {"--batch"});
  flags("plan_for_cpu_on_a_gpu", "plan --config {dir}/tiny.yaml --for cpu --gpu h100_80gb",
        {"--for cpu", "expected --capacity-mib or --capacity-bytes", "--gpu h100_80gb"});
  flags("plan_capacity_bytes_zero", "plan --config {dir}/tiny.yaml --for cpu --capacity-bytes 0", {"--capacity-bytes"});
  flags("plan_for_a_tpu", "plan --config {dir}/tiny.yaml --for tpu --capacity-mib 64", {"--for", "tpu"});
  c.push_back({"plan_unknown_gpu", {{"tiny.yaml", kFixture}, {"gpus/g.yaml", kGpu}},
               "plan --config {dir}/tiny.yaml --gpus {dir}/gpus --gpu h100", 2,
               {"--gpu h100", "expected one of the known ids: g"}});
  c.push_back({"plan_nothing_fits", {{"tiny.yaml", kFixture}}, "plan --config {dir}/tiny.yaml --capacity-mib 1 --batch 8",
               3, {"tiny.yaml: no plan fits batch 8 on capacity (1.0 MiB usable)", "the least any plan needs is"}});
  // --world-size on a fixture on one device: FSDP's lever shards over 2 ranks or more.
  c.push_back({"plan_world_size_one_on_one_device", {{"tiny.yaml", kFixture}},
               "plan --config {dir}/tiny.yaml --capacity-mib 64 --world-size 1", 3,
               {"tiny.yaml: --world-size 1: the fixture trains on one device", "expected 2 or more ranks to shard over"}});
  // --- bench JSON and results files -------------------------------------------------------------------------
  auto bench = [&](std::string name, std::string json, std::vector<std::string> says) {
    c.push_back({"bench_" + name, {{"a.json", kBench}, {"b.json", std::move(json)}}, "bench-compare {dir}/a.json {dir}/b.json",
                 3, std::move(says)});
  };
  bench("not_json", "{", {"b.json", "not valid JSON"});
  bench("number_overflow", R"({"benchmarks": [{"name": "a", "real_time": 1e309}]})", {"b.json", "not valid JSON"});
  bench("no_benchmarks", R"({"context": {}})", {"b.json", "benchmarks"});
  bench("empty_run", R"({"context": {}, "benchmarks": []})", {"b.json"});
  bench("negative_time", R"({"benchmarks": [{"name": "a", "real_time": -1.0, "cpu_time": 1.0, "time_unit": "ms"}]})",
        {"b.json", "'a'", "real_time", "zero or more", "-1.0"});
  bench("negative_cpu_time", R"({"benchmarks": [{"name": "a", "real_time": 1.0, "cpu_time": -2.5, "time_unit": "ms"}]})",
        {"b.json", "'a'", "cpu_time", "zero or more"});
  bench("negative_peak",
        R"({"benchmarks": [{"name": "a", "real_time": 1.0, "cpu_time": 1.0, "time_unit": "ms", "max_bytes_used": -4096}]})",
        {"b.json", "'a'", "max_bytes_used", "zero or more"});
  bench("missing_file", "", {"nothing.json", "no such file"});
  c.back().args = "bench-compare {dir}/a.json {dir}/nothing.json";
  c.push_back({"bench_convert_onto_itself", {{"a.json", kBench}}, "bench-convert {dir}/a.json --output {dir}/a.json", 2,
               {"a.json: is also an input"}});
  // An output that is also an input would destroy it: refused before any work, the input kept (checked below).
  c.push_back({"output_onto_profile_config", {{"tiny.yaml", kFixture}},
               "profile --config {dir}/tiny.yaml --device cpu --output {dir}/./tiny.yaml", 2, {"is also an input"}});
  c.push_back({"output_onto_advise_config", {{"tiny.yaml", kFixture}},
               "advise --config {dir}/tiny.yaml --capacity-mib 64 --output {dir}/tiny.yaml", 2, {"is also an input"}});
  c.push_back({"output_onto_merge_input", {{"a.json", kBench}, {"b.json", kBench}},
               "bench-merge {dir}/a.json {dir}/b.json --output {dir}/b.json", 2, {"b.json: is also an input"}});
  c.push_back({"output_onto_summary_results", {{"r.jsonl", kRow + "\n"}},
               "summary --results {dir}/r.jsonl --output {dir}/r.jsonl", 2, {"r.jsonl: is also an input"}});
  auto results = [&](std::string name, std::string rows, std::vector<std::string> says) {
    c.push_back({"results_" + name, {{"r.jsonl", std::move(rows)}}, "summary --results {dir}/r.jsonl", 3, std::move(says)});
  };
  results("not_json", "{\"test\": \n", {"r.jsonl:1"});
  results("missing_measured", std::string(kRow).replace(kRow.find(", \"measured\": 1"), 15, "") + "\n",
          {"r.jsonl:1", "measured"});
  results("unknown_status", std::string(kRow).replace(kRow.find("\"ok\""), 4, "\"great\"") + "\n", {"r.jsonl:1", "status"});
  results("empty", "", {"r.jsonl", "no results"});
  results("is_a_directory", "", {"is a directory"});
  c.back().files = {{"r.jsonl/x", ""}};
  // --- profile and advice JSON (report, compare) --------------------------------------------------------------
  const std::string profile =
      R"({"device": {"name": "AMD EPYC", "slug": "cpu"}, "model": {"name": "tiny"}, "probes": [{"batch_size": 1,
 "components": {"params": 1, "gradients": 1, "optimizer_state": 1, "activations": 1, "forward_peak": 1,
 "eval_peak": 1, "step_peak": 1, "step_peak_reserved": 1}}]})";
  auto report = [&](std::string name, std::string json, std::vector<std::string> says) {
    c.push_back({"report_" + name, {{"a.json", std::move(json)}}, "report {dir}/a.json --output {dir}/r.html", 3,
                 std::move(says)});
  };
  report("not_json", "{", {"a.json", "not valid JSON"});
  report("component_of_another_type",
         std::string(profile).replace(profile.find("\"params\": 1"), 11, "\"params\": \"1\""),
         {"a.json: probes[0].components.params: expected an integer, got string"});
  report("negative_bytes", std::string(profile).replace(profile.find("\"step_peak\": 1"), 14, "\"step_peak\": -1"),
         {"a.json: probes[0].components.step_peak: expected bytes (>= 0), got -1"});
  report("no_probes", R"({"device": {"slug": "cpu"}, "model": {"name": "tiny"}})", {"a.json: probes: missing"});
  report("batch_size_zero",
         std::string(profile).replace(profile.find("\"batch_size\": 1"), 15, "\"batch_size\": 0"),
         {"a.json: probes[0].batch_size: expected an integer >= 1"});
  report("an_array", "[]", {"a.json: (top level): expected a JSON object"});
  report("missing_file", profile, {"nothing.json"});
  c.back().args = "report {dir}/nothing.json --output {dir}/r.html";
  report("output_onto_input", profile, {"--output", "a.json: is also an input (profile.json:"});
  c.back().args = "report {dir}/a.json --output {dir}/a.json";
  c.back().exit_code = 2;
  c.push_back({"compare_one_file", {{"a.json", profile}}, "compare {dir}/a.json", 2, {"profile.json"}});
  c.push_back({"compare_bad_second_file", {{"a.json", profile}, {"b.json", "{\"device\": 1}"}},
               "compare {dir}/a.json {dir}/b.json", 3, {"b.json: device: expected an object, got number"}});
  c.push_back({"compare_threshold_nan", {{"a.json", profile}, {"b.json", profile}},
               "compare {dir}/a.json {dir}/b.json --threshold-pct nan", 2, {"--threshold-pct"}});
  c.push_back({"compare_html_onto_input", {{"a.json", profile}, {"b.json", profile}},
               "compare {dir}/a.json {dir}/b.json --html {dir}/b.json", 2, {"b.json: is also an input"}});
  c.push_back({"snapshot_onto_profile_config", {{"tiny.yaml", kFixture}},
               "profile --config {dir}/tiny.yaml --device cpu --snapshot {dir}/tiny.yaml", 2, {"is also an input"}});
  // memgate replay: snapshot pickles that are not what PyTorch writes, and what-if flags.
  const auto kPickleList = "\x80\x04\x5d\x94\x2e"s;  // pickle.dumps([], protocol=4)
  const auto kNoTrace =  // {'segments': []}
      "\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94"
      "\x73\x2e"s;
  const auto kEmptyTrace =  // {'segments': [], 'device_traces': [[]]}
      "\x80\x04\x95\x27\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94"
      "\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x61\x75\x2e"s;
  const auto kNegativeSize =  // an alloc of -4 bytes
      "\x80\x04\x95\x5d\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94"
      "\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x7d\x94\x28\x8c\x06\x61\x63"
      "\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\x64\x72\x94\x4b\x10\x8c\x04\x73\x69\x7a"
      "\x65\x94\x4a\xfc\xff\xff\xff\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\x4b\x00\x75\x61\x61\x75\x2e"s;
  const auto replay = [&](std::string name, std::string pickle, std::string args, int code,
                          std::vector<std::string> says) {
    c.push_back({"replay_" + std::move(name), {{"s.pickle", std::move(pickle)}}, "replay {dir}/s.pickle" + args, code,
                 std::move(says)});
  };
  replay("not_a_snapshot", kPickleList, "", 3, {"s.pickle: expected a memory snapshot", "list of segments"});
  replay("no_trace", kNoTrace, "", 3, {"s.pickle: the snapshot has no 'device_traces'", "_record_memory_history"});
  replay("negative_size", kNegativeSize, "", 3, {"s.pickle: device_traces[0][0].size: expected a size in bytes"});
  replay("truncated", kEmptyTrace.substr(0, kEmptyTrace.size() - 4), "", 3, {"s.pickle"});
  replay("a_yaml_file", kFixture, "", 3, {"s.pickle"});
  replay("no_device_traced", kEmptyTrace, "", 1, {"no device has a trace"});
  replay("bad_allocator", kEmptyTrace, " --allocator max_split_size_mb:lots", 2,
         {"--allocator", "max_split_size_mb", "lots"});
  replay("unknown_allocator_key", kEmptyTrace, " --allocator expandable:True", 2,
         {"unknown allocator setting 'expandable'"});
  replay("capacity_and_gpu", kEmptyTrace, " --capacity-mib 100 --gpu h100", 2, {"--gpu", "--capacity-mib"});
  replay("capacity_zero", kEmptyTrace, " --capacity-mib 0", 2, {"--capacity-mib"});
  replay("unknown_gpu", kEmptyTrace, " --gpu nope --gpus {dir}", 2, {"--gpu nope", "known ids"});
  replay("output_onto_input", kEmptyTrace, " --output {dir}/s.pickle", 2, {"--output", "s.pickle: is also an input"});
  c.push_back({"estimate_effective_batch_without_gpu", {{"tiny.yaml", kFixture}},
               "estimate --config {dir}/tiny.yaml --effective-batch 64", 2, {"--effective-batch", "--gpu"}});
  c.push_back({"estimate_plan_without_gpu", {{"tiny.yaml", kFixture}}, "estimate --config {dir}/tiny.yaml --plan", 2,
               {"--plan", "needs --gpu or --all-gpus"}});
  c.push_back({"estimate_unknown_gpu", {{"tiny.yml", kFixture}},
               "estimate --config {dir}/tiny.yml --gpu nope --gpus {dir}", 2, {"--gpu nope", "known ids"}});
  c.push_back({"replay_missing_file", {}, "replay {dir}/nothing.pickle", 3, {"nothing.pickle"}});
  c.push_back({"summary_html_onto_results", {{"r.jsonl", kRow + "\n"}},
               "summary --results {dir}/r.jsonl --html {dir}/r.jsonl", 2, {"r.jsonl: is also an input"}});
  // --- a probe in processes of its own: its temporary directory, its size, its rank program ---------------------
  const auto ddp = training_with("  distributed:\n    strategy: ddp\n    world_size: 2\n");
  const auto ddp_profile = "profile --config {dir}/ddp.yaml --batch-sizes 1 --device cpu";
  c.push_back({"tmpdir_missing", {{"ddp.yaml", ddp}}, ddp_profile, 3,
               {"TMPDIR=", "/nowhere does not exist", "set TMPDIR to a writable directory"}, "TMPDIR={dir}/nowhere"});
  c.push_back({"tmpdir_not_a_directory", {{"ddp.yaml", ddp}, {"file", "x"}}, ddp_profile, 3,
               {"/file is not a directory", "TMPDIR"}, "TMPDIR={dir}/file"});
  c.push_back({"world_size_beyond_the_machine",
               {{"ddp.yaml", training_with("  distributed:\n    strategy: ddp\n    world_size: 1000\n")}},
               ddp_profile, 3, {"ddp.yaml", "a world size of 1000", "CPU ranks per core", "memgate estimate"}});
  c.push_back({"advise_world_size_beyond_the_machine", {{"ddp.yaml", ddp}},
               "advise --config {dir}/ddp.yaml --world-size 1000 --capacity-mib 64 --device cpu", 3,
               {"a world size of 1000", "CPU ranks per core"}});
  c.push_back({"rank_timeout_zero", {{"ddp.yaml", ddp}}, ddp_profile + " --rank-timeout 0"s, 2, {"--rank-timeout"}});
  // profile --cpu-memory-limit-mib holds in each rank's process as in memgate's own: out of memory, as the protocol says.
  c.push_back({"cpu_memory_limit_holds_on_each_rank", {{"ddp.yaml", ddp}},
               "profile --config {dir}/ddp.yaml --batch-sizes 64 --device cpu --cpu-memory-limit-mib 4", 1,
               {"memgate: CPU allocator limit reached", "no batch size could be measured: each ran out of memory"}});
  c.push_back({"rank_timeout_env_not_a_number", {{"ddp.yaml", ddp}}, ddp_profile, 2,
               {"--rank-timeout", "MEMGATE_RANK_TIMEOUT"}, "MEMGATE_RANK_TIMEOUT=soon"});
  // The cuDNN device properties an estimate for CUDA speaks for, checked before cuDNN reads them (whose own error
  // was "CUDNN_STATUS_BAD_PARAM: !json_object.IsObject()"): a GPU's name, a fixture's path, an object short of a key.
  const auto cudnn_case = [&](std::string name, std::string value, std::vector<std::string> says) {
    says.insert(says.begin(), "MEMGATE_ESTIMATE_GPU_CUDNN: expected the JSON object of cuDNN's device properties");
    c.push_back({"estimate_gpu_cudnn_" + std::move(name), {{"tiny.yaml", kFixture}},
                 "estimate --config {dir}/tiny.yaml --for cuda --batch-sizes 1", 3, std::move(says),
                 "MEMGATE_ESTIMATE_GPU_CUDNN=" + std::move(value)});
  };
  cudnn_case("not_json", "h200", {"with its 23 keys: deviceVer,", "its value is not JSON ('h200'"});
  cudnn_case("a_path", "{dir}/tiny.yaml",
             {"its value is not JSON", "it names a file: give its JSON text instead"});
  cudnn_case("a_key_missing", "'{\"deviceVer\": 900}'", {"key \"multiProcessorCount\" is missing"});
  // A rank program of another memgate: this one, given a request that says its launcher is memgate 0.0.0.
  c.push_back({"rank_program_of_another_version",
               {{"ddp.yaml", ddp},
                {"rank.sh", "#!/bin/sh\nprev=; for a; do if [ \"$prev\" = --request ]; then "
                            "sed -i 's/\"memgate_version\":\"[^\"]*\"/\"memgate_version\":\"0.0.0\"/' \"$a\"; fi; "
                            "prev=$a; done\nexec "s + MEMGATE_CLI + " \"$@\"\n"}},
               ddp_profile, 3, {"of 2 exited with status 3: memgate rank: this program",
                                "this program is memgate " MEMGATE_VERSION, "\"0.0.0\"", "must run the same memgate"},
               "MEMGATE_RANK_EXECUTABLE={dir}/rank.sh"});
  // FSDP2's offload_policy: its words, FSDP's alone, and pinned host memory, which CPU ranks cannot have (PyTorch's
  // pin_memory() raises without CUDA): said by the rank, naming the fixture, the rank and the key.
  fixture("fsdp_offload_policy_unknown_word",
          training_with("  distributed: {strategy: fsdp, world_size: 2, offload_policy: gpu}\n"),
          {"f.yaml:", "training.distributed.offload_policy: expected one of none, cpu, cpu_pinned, got 'gpu'"});
  fixture("fsdp_offload_policy_under_ddp",
          training_with("  distributed: {strategy: ddp, world_size: 2, offload_policy: cpu}\n"),
          {"f.yaml:", "training.distributed.offload_policy", "no FSDP key with strategy ddp"});
  c.push_back({"fsdp_offload_policy_pinned_on_cpu_ranks",
               {{"f.yaml", training_with("  distributed: {strategy: fsdp, world_size: 2, offload_policy: cpu_pinned}\n")}},
               "profile --config {dir}/f.yaml --batch-sizes 1 --device cpu", 3,
               {"f.yaml at batch 1: rank", "training.distributed.offload_policy: cpu_pinned pins host memory, which "
                "needs CUDA", "expected cpu or none on CPU ranks"}});
  c.push_back({"estimate_fsdp_offload_pinned_for_cpu",
               {{"f.yaml", training_with("  distributed: {strategy: fsdp, world_size: 2, offload_policy: cpu_pinned}\n")}},
               "estimate --config {dir}/f.yaml --batch-sizes 1 --for cpu", 3,
               {"f.yaml: training.distributed.offload_policy: cpu_pinned pins host memory, which needs CUDA",
                "expected cpu or none for the CPU, or --for cuda"}});
  c.push_back({"fsdp_on_torchscript",
               {{"ts.yaml", "model:\n  arch: torchscript\n  path: " + testing::source_dir() +
                                "/fixtures/models/torchscript/vit_tiny_timm.pt\n  inputs:\n    - {shape: [B, 3, 40, 40], "
                                "dtype: float32}\n  task: classify\n  num_classes: 5\ntraining:\n  optimizer: adamw\n"
                                "  distributed:\n    strategy: fsdp\n    world_size: 2\nbatch_sizes: [1]\n"}},
               "profile --config {dir}/ts.yaml --device cpu", 3,
               {"ts.yaml:", "training.distributed", "strategy ddp for a TorchScript model", "strategy fsdp"}});
  c.push_back({"profile_output_and_html_one_file", {{"tiny.yaml", kFixture}},
               "profile --config {dir}/tiny.yaml --batch-sizes 1 --device cpu --output {dir}/p --html {dir}/./p", 2,
               {"--output", "--html", "name one file"}});
  c.push_back({"replay_output_and_html_one_file", {{"s.pickle", kEmptyTrace}},
               "replay {dir}/s.pickle --output {dir}/r --html {dir}/r", 2, {"--output", "--html", "name one file"}});
  // --- outputs (issue 67): no report lands on what the command reads, nor two on one file; said before any probe ---
  const std::map<std::string, std::string> with_baseline{{"tiny.yaml", kFixture}, {"b/cpu/tiny.json", kBaseline}};
  const auto output_case = [&](std::string name, std::map<std::string, std::string> files, std::string args,
                               std::vector<std::string> says, std::vector<std::string> not_written = {}) {
    c.push_back({"output_" + std::move(name), std::move(files), std::move(args), 2, std::move(says), "",
                 std::move(not_written)});
  };
  output_case("check_json_onto_config", with_baseline, check_baseline() + " --json {dir}/tiny.yaml",
              {"--json {dir}/tiny.yaml: is also an input (--config: {dir}/tiny.yaml)", "give --json another file"});
  output_case("check_junit_onto_baseline", with_baseline, check_baseline() + " --junit {dir}/b/cpu/tiny.json",
              {"--junit {dir}/b/cpu/tiny.json: is inside an input (the baselines folder (--baselines): {dir}/b)"});
  output_case("check_json_new_file_in_baselines", with_baseline, check_baseline() + " --json {dir}/b/cpu/r.json",
              {"--json {dir}/b/cpu/r.json: is inside an input", "--baselines"}, {"b/cpu/r.json"});
  output_case("check_json_is_the_baselines_folder", with_baseline, check_baseline() + " --json {dir}/b/",
              {"--json {dir}/b/: is also an input (the baselines folder (--baselines): {dir}/b)"});
  output_case("check_markdown_onto_suite",
              {{"fixtures/models/tiny.yaml", kFixture}, {"fixtures/suites/s.yaml", "device: cpu\nfixtures: [tiny]\n"}},
              "check --suite {dir}/fixtures/suites/s.yaml --markdown {dir}/fixtures/suites/../suites/s.yaml",
              {"--markdown", "is also an input (--suite: {dir}/fixtures/suites/s.yaml)"});
  output_case("check_html_onto_suite_fixture",
              {{"fixtures/models/tiny.yaml", kFixture}, {"fixtures/suites/s.yaml", "device: cpu\nfixtures: [tiny]\n"}},
              "check --suite {dir}/fixtures/suites/s.yaml --html {dir}/fixtures/models/tiny.yaml",
              {"--html {dir}/fixtures/models/tiny.yaml: is also an input (a fixture of --suite:"});
  output_case("check_json_onto_python_entry",
              {{"py.yaml", "model:\n  arch: python\n  entry: m.py:make\n  inputs:\n    - {shape: [B, 4]}\n  task: sum\n"
                           "batch_sizes: [1]\n"},
               {"m.py", "import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n"}},
              "check --config {dir}/py.yaml --device cpu --baselines {dir}/b --json {dir}/m.py",
              {"--json {dir}/m.py: is also an input (model.entry of {dir}/py.yaml"});
  output_case("profile_output_onto_torchscript_module",
              {{"ts.yaml", "model:\n  arch: torchscript\n  path: m.pt\n  inputs:\n    - {shape: [B, 4]}\n  task: sum\n"
                           "batch_sizes: [1]\n"},
               {"m.pt", "PK not a module"}},
              "profile --config {dir}/ts.yaml --device cpu --output {dir}/m.pt",
              {"--output {dir}/m.pt: is also an input (model.path of {dir}/ts.yaml"});
  output_case("check_json_onto_gpu_fixture",
              {{"tiny.yaml", kFixture}, {"fixtures/gpus/g.yaml", kGpu}, {"b/cpu/tiny.json", kBaseline}},
              check_baseline() + " --json {dir}/fixtures/gpus/g.yaml",
              {"--json {dir}/fixtures/gpus/g.yaml: is inside an input (the GPU fixtures"});
  c.back().env = "MEMGATE_PROJECT_DIR={dir}";  // the project whose fixtures/gpus memgate reads (ctest sets another)
  output_case("check_junit_and_json_one_file", with_baseline,
              check_baseline() + " --junit {dir}/r.out --json {dir}/r.out",
              {"--junit {dir}/r.out and --json {dir}/r.out name one file"}, {"r.out"});
  output_case("check_json_and_markdown_one_file_by_two_paths", with_baseline,
              check_baseline() + " --json {dir}/out.json --markdown {dir}/./out.json",
              {"--markdown {dir}/./out.json and --json {dir}/out.json name one file"}, {"out.json"});
  output_case("check_json_under_a_file", with_baseline, check_baseline() + " --json {dir}/tiny.yaml/r.json",
              {"--json {dir}/tiny.yaml/r.json: cannot be written: {dir}/tiny.yaml is a file, not a folder"});
  output_case("profile_output_is_a_folder", {{"tiny.yaml", kFixture}, {"d/x", ""}},
              "profile --config {dir}/tiny.yaml --batch-sizes 1 --device cpu --output {dir}/d",
              {"--output {dir}/d: is a folder: expected a file to write"});
  output_case("profile_html_onto_gpus", {{"tiny.yaml", kFixture}, {"gpus/g.yaml", kGpu}},
              "profile --config {dir}/tiny.yaml --batch-sizes 1 --device cpu --gpus {dir}/gpus "
              "--html {dir}/gpus/g.yaml",
              {"--html {dir}/gpus/g.yaml: is inside an input (the GPU fixtures (--gpus): {dir}/gpus)"});
  output_case("estimate_output_onto_config", {{"tiny.yaml", kFixture}},
              "estimate --config {dir}/tiny.yaml --batch-sizes 1 --output {dir}/tiny.yaml",
              {"--output {dir}/tiny.yaml: is also an input (--config"});
  output_case("estimate_snapshot_and_html_one_file", {{"tiny.yaml", kFixture}},
              "estimate --config {dir}/tiny.yaml --batch-sizes 1 --snapshot {dir}/s --html {dir}/s",
              {"--html {dir}/s and --snapshot {dir}/s name one file"}, {"s"});
  output_case("advise_output_onto_gpus", {{"tiny.yaml", kFixture}, {"gpus/g.yaml", kGpu}},
              "advise --config {dir}/tiny.yaml --gpus {dir}/gpus --capacity-mib 64 --output {dir}/gpus/advice.json",
              {"--output {dir}/gpus/advice.json: is inside an input (the GPU fixtures (--gpus)"}, {"gpus/advice.json"});
  output_case("report_output_onto_gpus", {{"a.json", "{}"}, {"gpus/g.yaml", kGpu}},
              "report {dir}/a.json --gpus {dir}/gpus --output {dir}/gpus/g.yaml",
              {"--output {dir}/gpus/g.yaml: is inside an input (the GPU fixtures (--gpus)"});
  output_case("summary_output_and_html_one_file", {{"r.jsonl", kRow + "\n"}},
              "summary --results {dir}/r.jsonl --output {dir}/s --html {dir}/./s",
              {"--output", "--html", "name one file"}, {"s"});
  output_case("bench_convert_output_under_a_file", {{"a.json", kBench}},
              "bench-convert {dir}/a.json --output {dir}/a.json/x.json",
              {"--output {dir}/a.json/x.json: cannot be written: {dir}/a.json is a file, not a folder"});
  // A folder that cannot be made (root may write anywhere but in /proc and /sys): the flag, the path, the reason.
  c.push_back({"output_check_json_folder_cannot_be_made", {{"tiny.yaml", kFixture}},
               check_baseline() + " --json /proc/memgate-no-folder/r.json", 3,
               {"--json /proc/memgate-no-folder/r.json: cannot write it: /proc/memgate-no-folder: cannot make the "
                "folder (to write /proc/memgate-no-folder/r.json)"}, "MEMGATE_STRICT=0"});
  c.push_back({"output_summary_folder_cannot_be_made", {{"r.jsonl", kRow + "\n"}},
               "summary --results {dir}/r.jsonl --output /sys/memgate-no-folder/s.md", 3,
               {"--output /sys/memgate-no-folder/s.md: cannot write it: /sys/memgate-no-folder: cannot make the "
                "folder"}});
  // $GITHUB_STEP_SUMMARY that cannot be appended: a warning naming it; the exit code stays the gate's.
  const auto step_summary = [&](std::string name, std::string env, std::vector<std::string> says) {
    c.push_back({"step_summary_" + std::move(name), {{"tiny.yaml", kFixture}, {"d/x", ""}}, check_baseline(), 0,
                 std::move(says), "MEMGATE_STRICT=0 " + std::move(env)});
  };
  step_summary("is_a_folder", "GITHUB_STEP_SUMMARY={dir}/d",
               {"memgate: warning: GITHUB_STEP_SUMMARY={dir}/d: the Markdown summary was not appended: it is a "
                "folder"});
  step_summary("in_a_missing_folder", "GITHUB_STEP_SUMMARY={dir}/nowhere/s.md",
               {"memgate: warning: GITHUB_STEP_SUMMARY={dir}/nowhere/s.md: the Markdown summary was not appended: No "
                "such file or directory"});
  step_summary("on_a_full_disk", "GITHUB_STEP_SUMMARY=/dev/full",
               {"memgate: warning: GITHUB_STEP_SUMMARY=/dev/full: the Markdown summary was not appended: No space left "
                "on device"});
  c.push_back({"step_summary_of_summary_on_a_full_disk", {{"r.jsonl", kRow + "\n"}},
               "summary --results {dir}/r.jsonl", 0,
               {"memgate: warning: GITHUB_STEP_SUMMARY=/dev/full: the Markdown summary was not appended"},
               "GITHUB_STEP_SUMMARY=/dev/full"});
  // MEMGATE_STRICT and MEMGATE_UPDATE_BASELINES: CI's words (1, true, yes, on) and their opposites; others refused.
  c.push_back({"strict_true_without_baseline", {{"tiny.yaml", kFixture}}, check_baseline(), 1,
               {"memgate check: FAILED", "strict mode fails a missing baseline"}, "CI= MEMGATE_STRICT=true"});
  c.push_back({"strict_on_with_a_stale_baseline", {{"tiny.yaml", kFixture}}, check_baseline(), 1,
               {"memgate check: FAILED", "stale"}, "CI= MEMGATE_STRICT=on"});
  // Every component far above what the tiny ViT takes, recorded for this fixture: each is stale.
  auto stale =
      baseline_with("\"provenance\": {}", "\"provenance\": {\"fixture_hash\": \"" + tiny_fixture_hash() + "\"}");
  const auto components = stale.find("\"components\": {");
  auto end = stale.find('}', components);
  for (std::size_t at = components; (at = stale.find(": 1", at)) < end; at += 12, end += 9) {
    stale.replace(at, 3, ": 1000000000");
  }
  c.back().files["b/cpu/tiny.json"] = stale;
  c.push_back({"strict_off_under_ci_without_baseline", {{"tiny.yaml", kFixture}}, check_baseline(), 0,
               {"memgate check: passed", "NOTHING WAS COMPARED"}, "CI=true MEMGATE_STRICT=off"});
  c.push_back({"strict_not_a_word", {{"tiny.yaml", kFixture}}, check_baseline(), 2,
               {"MEMGATE_STRICT=maybe: expected 1, true, yes or on to turn it on, or 0, false, no or off"},
               "MEMGATE_STRICT=maybe"});
  c.push_back({"strict_not_a_word_for_summary", {{"r.jsonl", kRow + "\n"}}, "summary --results {dir}/r.jsonl", 2,
               {"MEMGATE_STRICT=2: expected 1, true, yes or on"}, "MEMGATE_STRICT=2"});
  c.push_back({"update_baselines_not_a_word", {{"tiny.yaml", kFixture}}, check_baseline(), 2,
               {"MEMGATE_UPDATE_BASELINES=sure: expected 1, true, yes or on"}, "MEMGATE_UPDATE_BASELINES=sure"});
  // A fixture file whose name is not UTF-8: refused by its name, and every report of the run still well-formed
  // (BadInputReports below reads them).
  c.push_back({"fixture_file_name_not_utf8", {{"ti\xffny.yaml", kFixture}},
               "check --config '{dir}/ti\xffny.yaml' --device cpu --baselines {dir}/b --json {dir}/r.json --junit "
               "{dir}/r.xml --markdown {dir}/r.md --html {dir}/r.html", 3,
               {"ti\xffny.yaml:1: name: expected letters, digits"}});
  // A Python fixture in a folder whose name is not UTF-8: Python cannot import its entry by that path (a
  // UnicodeDecodeError in the probe's process, or a fork server that could not enter the folder), said as the fixture
  // is read.
  c.push_back({"python_entry_path_not_utf8",
               {{"d\xff/m.py", "def build():\n    pass\n"},
                {"d\xff/f.yaml", "model:\n  arch: python\n  entry: m.py:build\n  inputs:\n    - {shape: [B, 4]}\n"
                                 "  task: sum\nbatch_sizes: [1]\n"}},
               "profile --config '{dir}/d\xff/f.yaml' --device cpu", 3,
               {"f.yaml", "model.entry: expected a file whose path is valid UTF-8", "d\xef\xbf\xbd/m.py"}});
  return c;
}

// A Python fixture's model, batches and losses (arch: python), for the cases below.
const std::string kPythonModel = R"(import torch
from torch import nn


def build(width=8, depth=1):
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def batch(batch_size, device, generator, width=8):
    return torch.randn(batch_size, width, device=device, generator=generator)


def wide_batch(batch_size, device, generator):
    return batch(batch_size, device, generator, width=512)


def masked_batch(batch_size, device, generator):
    # Ignores `device`: its mask is made on the CPU, whatever it is asked for.
    return {"x": torch.randn(batch_size, 8, device=device, generator=generator), "mask": torch.ones(batch_size, 8)}


def batch_with_a_meta_tensor(batch_size, device, generator):
    # Its second tensor on the Meta device, whatever it is asked for.
    return torch.randn(batch_size, 8, device=device, generator=generator), torch.zeros(batch_size, 8, device="meta")


def first_of_two_loss(model, batch):
    return model(batch[0]).pow(2).mean()


def masked_loss(model, batch):
    return (model(batch["x"]) * batch["mask"]).pow(2).mean()


def square_loss(model, batch):
    return model(batch).pow(2).mean()


def detached_loss(model, batch):
    return model(batch).pow(2).mean().detach().requires_grad_()


def detached_output_loss(out, batch):
    return out.pow(2).mean().detach().requires_grad_()


def detached_loss_without_grad(model, batch):
    return model(batch).pow(2).mean().detach()


def loss_of_no_parameter(model, batch):
    return model(batch).detach().pow(2).mean() * torch.ones((), requires_grad=True)
)";

std::string python_fixture(const std::string& model_lines, const std::string& batch_sizes = "[2]") {
  return "model:\n  arch: python\n  entry: m.py:build\n" + model_lines + "training:\n  optimizer: adamw\nbatch_sizes: " +
         batch_sizes + "\n";
}

// Python fixtures (where memgate has its Python extension): each probe runs in a Python process of its own.
std::vector<BadInput> python_catalogue() {
  std::vector<BadInput> c;
  auto python = [&](std::string name, std::string yaml, std::string args, int code, std::vector<std::string> says) {
    c.push_back({"python_" + std::move(name), {{"m.py", kPythonModel}, {"f.yaml", std::move(yaml)}},
                 std::move(args), code, std::move(says)});
  };
  // profile --cpu-memory-limit-mib holds for a Python fixture's probe as for a zoo fixture's: a step of ~100 MiB
  // under 64 MiB runs out of memory, reported as the protocol reports it (and the batch size below it is measured).
  const auto wide = python_fixture("  args: {width: 512, depth: 3}\n  batch: m.py:wide_batch\n  compute_loss: m.py:square_loss\n");
  python("cpu_memory_limit_holds", wide, profile() + " --batch-sizes 16384 --cpu-memory-limit-mib 64", 1,
         {"bs 16384: out of memory", "memgate: CPU allocator limit reached",
          "no batch size could be measured: each ran out of memory"});
  python("cpu_memory_limit_holds_at_the_larger_batch", wide,
         profile() + " --batch-sizes 1,16384 --cpu-memory-limit-mib 64 --output {dir}/p.json", 0,
         {"bs 1: step peak", "bs 16384: out of memory", "memgate: CPU allocator limit reached"});
  // A loss detached from the model: no trainable parameter would get a gradient.
  python("compute_loss_detached", python_fixture("  batch: m.py:batch\n  compute_loss: m.py:detached_loss\n"),
         profile(), 3, {"f.yaml", "model.compute_loss: m.py:detached_loss returned a loss detached from the model",
                        "expected the loss computed from the model's output"});
  python("loss_detached", python_fixture("  inputs:\n    - {shape: [B, 8]}\n  loss: m.py:detached_output_loss\n"), profile(), 3,
         {"f.yaml", "model.loss: m.py:detached_output_loss returned a loss detached from the model"});
  python("compute_loss_detached_without_grad",
         python_fixture("  batch: m.py:batch\n  compute_loss: m.py:detached_loss_without_grad\n"), profile(), 3,
         {"f.yaml", "training.trainable: expected at least one trainable parameter that the loss depends on",
          "or model.compute_loss m.py:detached_loss_without_grad returned a loss detached from the model"});
  python("loss_of_no_parameter", python_fixture("  batch: m.py:batch\n  compute_loss: m.py:loss_of_no_parameter\n"),
         profile(), 3, {"f.yaml", "model.compute_loss m.py:loss_of_no_parameter returned a loss that none of the 2 "
                        "trainable parameters' gradients flow from", "expected a loss computed from the model's output"});
  // A batch callable that ignores its device: named with the tensor's place in the batch and both devices.
  python("batch_ignores_device", python_fixture("  batch: m.py:masked_batch\n  compute_loss: m.py:masked_loss\n"),
         "estimate --config {dir}/f.yaml --for cuda", 3,
         {"f.yaml", "model.batch: m.py:masked_batch returned batch[\"mask\"] on cpu, expected it on meta"});
  // Measured on the CPU: a tensor on another device (here the Meta device) is named as well.
  python("batch_off_the_cpu_when_measured",
         python_fixture("  batch: m.py:batch_with_a_meta_tensor\n  compute_loss: m.py:first_of_two_loss\n"), profile(), 3,
         {"f.yaml at batch 2", "model.batch: m.py:batch_with_a_meta_tensor returned batch[1] on meta, expected it on cpu"});
  // The same fixture measured on the CPU, where its mask is where it is asked for: measured.
  // A block list names the blocks as Python names the modules model.blocks matched (issue 70): a name that is none
  // of them is an error naming the fixture, the key, the name and the valid ones, from the Python probe.
  auto unknown_block = python_fixture("  args: {depth: 2}\n  blocks: \"*\"\n  inputs:\n    - {shape: [B, 8]}\n  task: sum\n");
  unknown_block.replace(unknown_block.find("  optimizer: adamw\n"), 19,
                        "  optimizer: adamw\n  gradient_checkpointing: {blocks: [blocks.1]}\n");
  python("checkpointed_block_unknown", unknown_block, profile(), 3,
         {"f.yaml: training.gradient_checkpointing.blocks: 'blocks.1' is no block", "expected one of 0, 1"});
  python("batch_on_the_cpu_is_measured", python_fixture("  batch: m.py:masked_batch\n  compute_loss: m.py:masked_loss\n"),
         profile(), 0, {"bs 2: step peak"});
  // An audio front end ([B, 65536, 1] into a Linear(1, 2), task: sum) at batch 32768: its bias gradient sums the
  // .sum()'s expanded gradient over 2^31 rows (2^32 elements), which CUDA's reduction cannot split for 32-bit indexing
  // (PyTorch 2.11's TensorIterator::split asserts). The estimate for CUDA says so on the Meta device, where its probe
  // was killed by signal 11 (a recursion without end) before.
  c.push_back({"python_estimate_reduction_past_2_to_the_32_elements",
               {{"a.py", "from torch import nn\n\n\ndef audio_front_end():\n    return nn.Linear(1, 2)\n"},
                {"f.yaml", "model:\n  arch: python\n  entry: a.py:audio_front_end\n"
                           "  inputs:\n    - {shape: [B, 65536, 1]}\n  task: sum\n"
                           "training:\n  optimizer: adamw\nbatch_sizes: [2]\n"}},
               "estimate --config {dir}/f.yaml --for cuda --batch-sizes 32768", 3,
               {"f.yaml at batch 32768",
                "on CUDA this reduction fails: its input of sizes [2147483648, 2] and strides [0, 0]",
                "has 4294967296 elements, more than 32-bit indexing covers", "cannot run on CUDA at this size"}});
  return c;
}

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, ExitsWithTheContractsCodeAndNamesTheProblem) {
  const auto& c = GetParam();
  testing::TempDir dir;
  for (const auto& [name, text] : c.files) testing::write_file(dir / name, text);
  auto args = c.args, env = c.env;
  for (auto* text : {&args, &env}) {
    for (std::size_t at; (at = text->find("{dir}")) != std::string::npos;) text->replace(at, 5, dir.path().string());
  }
  if (c.files.contains("rank.sh")) std::filesystem::permissions(dir / "rank.sh", std::filesystem::perms::owner_all);
  // Forked from this program where that is the same run as memgate's own (tests/common/cli_fork.h); a case with a
  // rank program of its own (rank.sh) runs the real one. A Python case's probes fork from this program's Python fork
  // server (cli_fork.h's lend_python_fork_server: ~1.5 CPU-s of a case's ~1.7).
  const bool python = c.files.contains("m.py") && c.files.at("m.py") == kPythonModel;
  const auto run = testing::run_memgate(dir.path().string(), env, args, /*real=*/c.files.contains("rank.sh"), python);
  const int rc = run.exit_code;
  const std::string& out = run.output;
  EXPECT_EQ(rc, c.exit_code) << out;
  for (auto s : c.says) {
    for (std::size_t at; (at = s.find("{dir}")) != std::string::npos;) s.replace(at, 5, dir.path().string());
    EXPECT_THAT(out, ::testing::HasSubstr(s));
  }
  // Every file the case wrote (fixtures, suites, baselines, GPU fixtures, results) is byte-identical afterwards.
  for (const auto& [name, text] : c.files) {
    EXPECT_EQ(testing::read_file(dir / name), text) << name << " was changed";
  }
  for (const auto& name : c.not_written) {
    EXPECT_FALSE(std::filesystem::exists(dir / name)) << name << " was written";
  }
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("unexpected error")));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("frame #")));
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInputTest, ::testing::ValuesIn(catalogue()),
                         [](const ::testing::TestParamInfo<BadInput>& p) { return p.param.name; });

#ifdef MEMGATE_TEST_PYTHON_FIXTURES
INSTANTIATE_TEST_SUITE_P(PythonFixtures, BadInputTest, ::testing::ValuesIn(python_catalogue()),
                         [](const ::testing::TestParamInfo<BadInput>& p) { return p.param.name; });
#endif

TEST(BadInputCatalogue, HasAtLeastSixtyCases) { EXPECT_GE(catalogue().size(), 60U); }

// A fixture file whose name is not UTF-8 is refused, and every report of the run still says so in well-formed files:
// valid JSON and XML, the invalid byte as U+FFFD, the rest of the name kept.
TEST(BadInputReports, KeepAFixtureNameThatIsNotUtf8RecognisableAndWellFormed) {
  testing::TempDir dir;
  const auto config = dir / "ti\xffny.yaml";
  testing::write_file(config, kFixture);
  std::string out;
  const int rc = testing::run_cli(std::string(MEMGATE_CLI) + " check --config '" + config + "' --device cpu " +
                                  "--baselines " + (dir / "b") + " --json " + (dir / "r.json") + " --junit " +
                                  (dir / "r.xml") + " --markdown " + (dir / "r.md") + " --html " + (dir / "r.html"),
                                  &out);
  EXPECT_EQ(rc, 3) << out;
  const std::string kept = "ti\xEF\xBF\xBDny.yaml";  // U+FFFD for the byte 0xFF
  nlohmann::json doc;
  ASSERT_NO_THROW(doc = nlohmann::json::parse(testing::read_file(dir / "r.json"))) << "r.json is not valid JSON";
  ASSERT_EQ(doc["not_judged"].size(), 1U);
  EXPECT_EQ(doc["not_judged"][0]["fixture"], dir / kept);
  for (const auto* file : {"r.xml", "r.md", "r.html"}) {
    const auto text = testing::read_file(dir / file);
    EXPECT_EQ(memgate::valid_utf8(text), text) << file << " is not valid UTF-8";
  }
  EXPECT_THAT(testing::read_file(dir / "r.xml"),
              ::testing::HasSubstr("<error type=\"not judged\" message=\"" + dir / kept));
  EXPECT_THAT(testing::read_file(dir / "r.md"), ::testing::HasSubstr("- `" + dir / kept + "`: "));
}

}  // namespace
}  // namespace memgate
