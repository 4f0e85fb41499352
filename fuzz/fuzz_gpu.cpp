// GPU fixtures (YAML): load_gpu.
#include "fuzz_common.h"
#include "memgate/gate/budget.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "gpus/gpu.yaml");
  return memgate::fuzz::expect_clean([&] { (void)memgate::load_gpu(path); });
}
