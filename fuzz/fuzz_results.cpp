// The memory suites' results (JSON lines, memgate summary): summarize_results.
#include "fuzz_common.h"
#include "memgate/report/summary.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "results.jsonl");
  return memgate::fuzz::expect_clean([&] { (void)memgate::summarize_results(path); });
}
