// Twins: two fixtures of one model (a Python module and the zoo's C++ one), whose probes must give the same bytes on
// every component, per rank too. Used by the Python fixtures' tests on the CPU (tests/python) and on a GPU
// (tests/cuda).
#pragma once

#include <cstdlib>

#include "memgate/base/components.h"
#include "memgate/gate/fixture.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memgate::testing {

/// fixtures/models/<name>.yaml.
inline Fixture model_fixture(const std::string& name) {
  return load_fixture(source_dir() + "/fixtures/models/" + name + ".yaml");
}

inline void expect_equal_components(const Components& a, const Components& b, const std::string& what) {
  for (const auto& c : kComponentTable) {
    EXPECT_EQ(a.*c.member, b.*c.member) << what << ": " << c.name;
  }
}

/// Each batch probed on `device` for both fixtures: every component equal, every rank's too, and the library
/// workspaces beside them.
inline void expect_twins(const std::string& python_name, const std::string& zoo_name,
                         const std::vector<std::int64_t>& batches, c10::Device device = kCpu) {
  const auto python = model_fixture(python_name);
  const auto zoo = model_fixture(zoo_name);
  for (const auto b : batches) {
    const auto p = run_probe(python, b, device);
    const auto z = run_probe(zoo, b, device);
    ASSERT_FALSE(p.oom) << p.error;
    ASSERT_FALSE(z.oom) << z.error;
    expect_equal_components(p.components, z.components, fmt::format("{} vs {} at batch {}", python_name, zoo_name, b));
    EXPECT_EQ(p.library_workspace_bytes, z.library_workspace_bytes) << "batch " << b;
    ASSERT_EQ(p.ranks.size(), z.ranks.size());
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      expect_equal_components(p.ranks[r].components, z.ranks[r].components,
                              fmt::format("{} vs {} at batch {}, rank {}", python_name, zoo_name, b, r));
      EXPECT_EQ(p.ranks[r].comm_buffer_bytes, z.ranks[r].comm_buffer_bytes) << "rank " << r;
      EXPECT_EQ(p.ranks[r].comm_buffers, z.ranks[r].comm_buffers) << "rank " << r;
    }
  }
}

/// The same for the two fixtures' estimates for CUDA.
/// `eval_peak_slack_bytes`: what the two codes may keep alive differently while a cuDNN workspace is held in the
/// eval forward (a Python block's local variable outliving its use), by which eval_peak alone may differ.
inline void expect_cuda_estimate_twins(const std::string& python_name, const std::string& zoo_name,
                                       const std::vector<std::int64_t>& batches,
                                       std::int64_t eval_peak_slack_bytes = 0) {
  const auto python = model_fixture(python_name);
  const auto zoo = model_fixture(zoo_name);
  for (const auto b : batches) {
    const auto p = estimate_probe(python, b, EstimateTarget::kCuda);
    const auto z = estimate_probe(zoo, b, EstimateTarget::kCuda);
    ASSERT_FALSE(p.oom) << p.error;
    const auto what = fmt::format("{} vs {}, estimate for CUDA at batch {}", python_name, zoo_name, b);
    auto zoo_components = z.components;
    EXPECT_LE(std::abs(p.components.eval_peak - z.components.eval_peak), eval_peak_slack_bytes) << what << ": eval_peak";
    zoo_components.eval_peak = p.components.eval_peak;
    expect_equal_components(p.components, zoo_components, what);
  }
}

}  // namespace memgate::testing
