// Each probe's bytes are independent of what the process measured before it (cuBLAS / cuBLASLt workspaces on
// CUDA live per handle and stream and outlive empty_cache): probing batch sizes in the orders A,B and B,A gives
// identical bytes per probe, each order in a fresh process as `memgate profile` runs.
#pragma once

#include "fixture_util.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace memgate::testing {

inline void expect_order_independent(const std::string& cli, const std::string& device) {
  TempDir dir;
  const auto fixture = dir / "order.yaml";
  write_file(fixture, tiny_vit_yaml("  trainable: all\n"));
  std::map<std::int64_t, nlohmann::json> by_order[2];
  const char* orders[2] = {"1,4", "4,1"};
  for (int i = 0; i < 2; ++i) {
    const auto out = dir / ("order" + std::to_string(i) + ".json");
    std::string log;
    ASSERT_EQ(run(cli + " profile --config " + fixture + " --device " + device + " --batch-sizes " + orders[i] +
                      " --output " + out,
                  &log),
              0)
        << log;
    const auto profile = nlohmann::json::parse(read_file(out));
    for (const auto& p : profile["probes"]) by_order[i][p["batch_size"].get<std::int64_t>()] = p["components"];
  }
  ASSERT_EQ(by_order[0].size(), 2U);
  for (const auto& [batch_size, components] : by_order[0]) {
    EXPECT_EQ(components, by_order[1][batch_size]) << "batch " << batch_size << " on " << device;
  }
}

}  // namespace memgate::testing
