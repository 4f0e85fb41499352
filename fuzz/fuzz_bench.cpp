// Google Benchmark JSON (bench-compare, bench-merge, bench-convert): load_bench_json.
#include "fuzz_common.h"
#include "memgate/bench/bench_compare.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "bench.json");
  return memgate::fuzz::expect_clean([&] { (void)memgate::load_bench_json(path); });
}
