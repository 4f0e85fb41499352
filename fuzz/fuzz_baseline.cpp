// Baselines (JSON): load_baseline, as the gate reads them (expecting their fixture and device).
#include "fuzz_common.h"
#include "memgate/gate/baseline.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "cpu/vit_tiny_lora.json");
  return memgate::fuzz::expect_clean([&] { (void)memgate::load_baseline(path, "vit_tiny_lora", "cpu"); });
}
