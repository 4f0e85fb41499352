// Fixtures for tests: a fixture from YAML text, and a tiny ViT.
#pragma once

#include "memgate/backend/device.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/models/model.h"
#include "memgate/models/zoo.h"
#include "test_util.h"

#include <string>

namespace memgate::testing {

/// The device CPU probes run on.
inline const c10::Device kCpu(c10::DeviceType::CPU);

/// The CPU that baselines recorded by the tests name: "Test CPU", slug cpu, torch 2.11.0, portable kernels, 1 thread.
inline DeviceInfo cpu_info() {
  DeviceInfo d;
  d.name = "Test CPU";
  d.slug = "cpu";
  d.torch_version = "2.11.0";
  d.cpu_kernels = "portable";
  d.cpu_threads = 1;
  return d;
}

/// A fixture from YAML text, loaded through a temporary file named `<name>.yaml`.
inline Fixture fixture_from(const std::string& yaml, const std::string& name = "probe_fixture") {
  TempDir dir;
  const auto path = dir / (name + ".yaml");
  write_file(path, yaml);
  return load_fixture(path);
}

/// A tiny ViT fixture, with extra YAML lines appended to its training section.
inline std::string tiny_vit_yaml(const std::string& training = "", const std::string& model_extra = "") {
  return "model:\n  arch: vit\n  img_size: 32\n  patch_size: 8\n  embed_dim: 64\n  depth: 4\n  num_heads: 4\n"
         "  num_classes: 5\n" + model_extra + "training:\n  optimizer: adamw\n" + training +
         "batch_sizes: [1, 2, 4, 8]\n";
}

/// The traced TorchScript LM (fixtures/models/torchscript/token_lm_traced.pt, trained on its logits' sum) under DDP over
/// `world_size` ranks with its gradients as views into the buckets, at batches 1 and 3.
inline std::string torchscript_lm_ddp_yaml(int world_size) {
  return "model:\n  arch: torchscript\n  path: " + source_dir() +
         "/fixtures/models/torchscript/token_lm_traced.pt\n  inputs:\n    - {shape: [B, 16], dtype: int64, high: 64}\n"
         "  task: sum\ntraining:\n  optimizer: adamw\n  trainable: all\n  distributed:\n    strategy: ddp\n"
         "    world_size: " + std::to_string(world_size) + "\n    gradient_as_bucket_view: true\nbatch_sizes: [1, 3]\n";
}

/// How many parameter tensors train (each has one `step` scalar in AdamW's state, as torch.optim keeps it).
inline std::int64_t trainable_tensors(const Fixture& f) {
  auto model = build_model(f.model, c10::Device(c10::DeviceType::CPU));
  return static_cast<std::int64_t>(select_trainable(*model, f.training.trainable).size());
}

/// AdamW's state on the CPU: exp_avg and exp_avg_sq (fp32) per trainable element, a 4-byte step per tensor.
inline std::int64_t adamw_state_bytes(const Fixture& f, std::int64_t trainable_elements) {
  return 2 * trainable_elements * 4 + 4 * trainable_tensors(f);
}

}  // namespace memgate::testing
