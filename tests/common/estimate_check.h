// Estimates against what they estimate: for CUDA, a GPU's recorded baselines (baselines/<slug>/): step_peak within 3%,
// step_peak_reserved within 5%, for every fixture of the GPU suite recorded there and each batch size it recorded
// (used on the CPU against the H200's, EstimateForCudaTest in tests/launch, and on a GPU against its own,
// CudaEstimateTest in tests/cuda); for the CPU, a fixture measured on the CPU beside its estimate, batch by batch.
#pragma once

#include "memgate/gate/baseline.h"
#include "memgate/gate/fixture.h"
#include "memgate/gate/suite.h"
#include "memgate/launch/estimate.h"
#include "memgate/launch/run.h"
#include "fixture_util.h"
#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace memgate::testing {

/// A probe measured on the CPU and its estimate for the CPU, at one batch size.
struct MeasuredAndEstimated {
  std::int64_t batch_size = 0;
  ProbeResult measured, estimated;
};

/// `fixture` measured on the CPU (run_probes) and estimated for the CPU (estimate_profile) at each of `batches`, paired
/// by batch size. A batch size that either side could not run throws, naming it and both sides' errors: the test fails.
inline std::vector<MeasuredAndEstimated> measure_and_estimate_for_cpu(const Fixture& fixture,
                                                                     const std::vector<std::int64_t>& batches) {
  const auto measured = run_probes(fixture, batches, kCpu);
  const auto estimated = estimate_profile(fixture, batches, EstimateTarget::kCpu).probes;
  if (measured.size() != batches.size() || estimated.size() != batches.size()) {
    throw std::runtime_error(fmt::format("{}: {} batch sizes asked, {} measured and {} estimated", fixture.name,
                                         batches.size(), measured.size(), estimated.size()));
  }
  std::vector<MeasuredAndEstimated> out;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    if (!measured[i].measured() || !estimated[i].measured()) {
      throw std::runtime_error(fmt::format("{} at batch {}: measured: {}; estimated: {}", fixture.name, batches[i],
                                           measured[i].measured() ? "yes" : measured[i].error,
                                           estimated[i].measured() ? "yes" : estimated[i].error));
    }
    out.push_back({.batch_size = batches[i], .measured = measured[i], .estimated = estimated[i]});
  }
  return out;
}

/// A fixture the CPU measures and the estimate refuses: asserts that `batch` is measured on the CPU and returns the
/// estimate's refusal for the CPU (the probe's error, or what estimate_profile threw), empty where it ran.
inline std::string measured_but_estimate_refused(const Fixture& fixture, std::int64_t batch) {
  const std::vector<std::int64_t> batches{batch};
  const auto measured = run_probes(fixture, batches, kCpu);
  EXPECT_EQ(measured.size(), 1U);
  EXPECT_TRUE(!measured.empty() && measured[0].measured()) << (measured.empty() ? "" : measured[0].error);
  try {
    const auto estimated = estimate_profile(fixture, batches, EstimateTarget::kCpu).probes;
    EXPECT_EQ(estimated.size(), 1U);
    return estimated.empty() ? std::string() : estimated[0].error;
  } catch (const std::exception& e) {
    return e.what();
  }
}

/// Known gaps, each a fixture whose estimate still falls short somewhere. The ResNets (bias-free, channels-first
/// convolutions): with cuDNN's workspaces as cuDNN sizes them for the H200 (cudnn_workspace.h) their step_peak is
/// within 1%, but their reserved bytes are up to 9% low at batch 2 and 4 (the fp16 one 15% at batch 4), for reasons
/// not found yet (docs/accuracy.md). They are listed, not exempt: each must still miss somewhere, so that a change that
/// brings one within bounds fails until it is taken off the list (and docs/accuracy.md).
inline const std::set<std::string>& cuda_estimate_known_gaps() {
  static const std::set<std::string> gaps = {"resnet18_fewshot", "resnet34_fewshot", "resnet18_fewshot_amp_accum"};
  return gaps;
}

inline void expect_cuda_estimates_match_baselines(const std::string& slug) {
  const auto root = source_dir() + "/baselines";
  const auto suite_path = source_dir() + "/fixtures/suites/gpu.yaml";
  const auto& known_gaps = cuda_estimate_known_gaps();
  int compared = 0;
  double worst_step = 0.0, worst_reserved = 0.0;
  std::set<std::string> seen, still_missing;
  for (const auto& f : suite_fixtures(load_suite(suite_path, suite_models_dir(suite_path)))) {
    const auto path = baseline_path(root, slug, f.name);
    if (!std::filesystem::exists(path)) continue;
    const auto baseline = load_baseline(path, f.name, slug);
    const auto fixture = load_fixture(f.path);
    const bool known = known_gaps.contains(f.name);
    seen.insert(f.name);
    for (const auto& recorded : baseline.probes) {
      const auto r = estimate_probe(fixture, recorded.batch_size, EstimateTarget::kCuda);
      ASSERT_FALSE(r.oom) << f.name << " at batch " << recorded.batch_size << ": " << r.error;
      const auto& e = r.components;
      const auto& m = recorded.components;
      const auto pct = [](std::int64_t a, std::int64_t b) {
        return b == 0 ? 0.0 : 100.0 * static_cast<double>(a - b) / static_cast<double>(b);
      };
      const auto step = pct(e.step_peak, m.step_peak), reserved = pct(e.step_peak_reserved, m.step_peak_reserved);
      if (known) {
        if (std::abs(step) > 3.0 || std::abs(reserved) > 5.0) still_missing.insert(f.name);
      } else {
        EXPECT_LE(std::abs(step), 3.0) << f.name << " at batch " << recorded.batch_size << ": step_peak "
                                       << e.step_peak << " estimated, " << m.step_peak << " measured";
        EXPECT_LE(std::abs(reserved), 5.0) << f.name << " at batch " << recorded.batch_size << ": step_peak_reserved "
                                           << e.step_peak_reserved << " estimated, " << m.step_peak_reserved
                                           << " measured";
        worst_step = std::max(worst_step, std::abs(step));
        worst_reserved = std::max(worst_reserved, std::abs(reserved));
      }
      std::cout << fmt::format("[ ESTIMATE ] {} bs {}: step_peak {:+.2f}%, step_peak_reserved {:+.2f}%{}\n", f.name,
                               recorded.batch_size, step, reserved, known ? " (known gap)" : "");
      ++compared;
    }
  }
  EXPECT_GT(compared, 0) << "baselines/" << slug << " holds none of the GPU suite's fixtures";
  for (const auto& name : known_gaps) {
    if (!seen.contains(name)) continue;
    EXPECT_TRUE(still_missing.contains(name))
        << name << " is now within bounds at every batch size: take it off cuda_estimate_known_gaps (and "
        << "docs/accuracy.md)";
  }
  std::cout << fmt::format("[ ESTIMATE ] {} probes against baselines/{}: largest error outside the known gaps: "
                           "step_peak {:.2f}%, reserved {:.2f}%\n", compared, slug, worst_step, worst_reserved);
}

}  // namespace memgate::testing
