// tools/checkpoint_reference.py, launched from a test: PyTorch's plain loop over a fixture's timm twin with chosen
// blocks in torch.utils.checkpoint (--blocks) or every training forward inside save_on_cpu (--save-on-cpu), one
// "selection" per option given. Used by CheckpointReferenceTest (step_test.cpp),
// ActivationOffloadReferenceTest (offload_test.cpp) and SelectiveCheckpointReferenceTest (selective_checkpoint_test.cpp).
#pragma once

#include "memgate/base/files.h"
#include "test_util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace memgate::testing {

/// The reference run once over fixtures/models/<fixture>.yaml with `options` (e.g. "--blocks blocks.1 --batch-sizes
/// 1,4"): its JSON's "selections", or, where it failed, a JSON string saying why (its output and its stderr).
inline nlohmann::json checkpoint_reference_selections(const std::string& fixture, const std::string& options) {
  TempDir dir;
  std::string out;
  const int rc = run(fmt::format("({} {}/tools/checkpoint_reference.py --config {}/fixtures/models/{}.yaml {} 2>{}) "
                                 "> {}", MEMGATE_TORCH_PYTHON, source_dir(), source_dir(), fixture, options,
                                 dir / "err.txt", dir / "ref.json"),
                     &out);
  if (rc != 0) return nlohmann::json(out + read_file(dir / "err.txt"));
  return nlohmann::json::parse(read_text_file(dir / "ref.json", "the reference's JSON")).at("selections");
}

/// The reference run once over several fixtures, each with its options (`--then` between them: torch and the
/// fixtures' libraries imported once): each fixture's "selections", in order, or, where the launch failed, one JSON
/// string saying why for each.
inline std::vector<nlohmann::json> checkpoint_reference_selections(
    const std::vector<std::pair<std::string, std::string>>& fixtures_and_options) {
  TempDir dir;
  std::string args;
  for (const auto& [fixture, options] : fixtures_and_options) {
    args += fmt::format("{}--config {}/fixtures/models/{}.yaml {}", args.empty() ? "" : " --then ", source_dir(),
                        fixture, options);
  }
  std::string out;
  const int rc = run(fmt::format("({} {}/tools/checkpoint_reference.py {} 2>{}) > {}", MEMGATE_TORCH_PYTHON,
                                 source_dir(), args, dir / "err.txt", dir / "ref.json"),
                     &out);
  std::vector<nlohmann::json> selections;
  if (rc != 0) {
    selections.assign(fixtures_and_options.size(), nlohmann::json(out + read_file(dir / "err.txt")));
    return selections;
  }
  const auto doc = nlohmann::json::parse(read_text_file(dir / "ref.json", "the reference's JSON"));
  if (fixtures_and_options.size() == 1) return {doc.at("selections")};
  for (const auto& run : doc.at("runs")) selections.push_back(run.at("selections"));
  return selections;
}

}  // namespace memgate::testing
