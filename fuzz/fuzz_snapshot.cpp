// Memory snapshot pickles (memgate replay's input): read by the streamed reader and as plain data, and replayed, or
// refused with memgate::Error.
#include "fuzz_common.h"
#include "memgate/allocator/replay.h"
#include "memgate/report/replay_report.h"
#include "memgate/allocator/snapshot_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = memgate::fuzz::write_input(data, size, "snapshot.pickle");
  // The streamed reader memgate replay uses: a snapshot, or memgate::Error.
  (void)memgate::fuzz::expect_clean([&] {
    const auto report = memgate::replay_snapshot(memgate::load_snapshot(path),
                                                 {{"64 MiB", std::nullopt, std::int64_t{64} << 20}});
    (void)memgate::replay_html(report);
  });
  // The general pickle reader and read_snapshot over its tree.
  return memgate::fuzz::expect_clean([&] {
    // Limits a fuzzer can reach in its input sizes; the reader's defaults are for real snapshots.
    const auto data = memgate::load_plain_pickle(path, {.max_values = 1 << 20, .max_depth = 256});
    // A snapshot it holds is replayed, recorded settings and a what-if under a capacity.
    const auto report = memgate::replay_snapshot(memgate::read_snapshot(data, path),
                                                 {{"64 MiB", std::nullopt, std::int64_t{64} << 20}});
    (void)memgate::replay_to_json(report);
    (void)memgate::replay_html(report);
  });
}
