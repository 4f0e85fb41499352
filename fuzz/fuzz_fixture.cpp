// Model fixtures (YAML): load_fixture.
#include "fuzz_common.h"
#include "memgate/gate/fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "models/fixture.yaml");
  return memgate::fuzz::expect_clean([&] { (void)memgate::load_fixture(path); });
}
