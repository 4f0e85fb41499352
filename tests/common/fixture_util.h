// Fixtures for tests: a fixture from YAML text, and a tiny ViT.
#pragma once

#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "test_util.h"

#include <string>

namespace memgate::testing {

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

}  // namespace memgate::testing
