// Suites (YAML): load_suite, with memgate's own model fixtures to refer to.
#include "fuzz_common.h"
#include "memgate/gate/suite.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "suites/suite.yaml");
  return memgate::fuzz::expect_clean([&] { (void)memgate::load_suite(path, MEMGATE_FUZZ_FIXTURES "/models"); });
}
