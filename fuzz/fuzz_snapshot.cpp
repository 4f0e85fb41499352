// Memory snapshot pickles (memgate replay's input): read strictly as plain data, or refused with memgate::Error.
#include "fuzz_common.h"
#include "memgate/report/snapshot_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "snapshot.pickle");
  return memgate::fuzz::expect_clean([&] {
    // Limits a fuzzer can reach in its input sizes; the reader's defaults are for real snapshots.
    (void)memgate::load_plain_pickle(path, {.max_values = 1 << 20, .max_depth = 256});
  });
}
