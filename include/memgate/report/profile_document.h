// Profile, estimate and advise JSON read back for reports and comparisons (DESIGN.md, "The command-line tool").
// Needs no LibTorch: a report can be made on any machine from the JSON a GPU runner wrote.
#pragma once

#include "memgate/base/components.h"
#include "memgate/base/module_breakdown.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace memgate {

/// One batch size of a profile: its components, or the out-of-memory that stopped it.
struct DocumentProbe {
  std::int64_t batch_size = 0;
  bool oom = false;
  std::string error;        ///< the out-of-memory message, or the failure's (first line)
  Components components;    ///< when measured()
  double step_seconds = 0.0;
  bool failed = false;      ///< the probe failed with another error than an out-of-memory (`error`)
  ModuleBreakdown modules;  ///< which module holds the bytes (a Python fixture's, on the CPU), where the file has it

  [[nodiscard]] bool measured() const { return !oom && !failed; }
};

/// One probe an advise search ran for a target.
struct DocumentTrial {
  std::int64_t batch_size = 0;
  bool fits = false;
  std::optional<std::int64_t> peak_bytes;
};

/// A fixture variant advise measured because the wanted batch did not fit.
struct DocumentVariant {
  std::string name;
  std::string change;
  std::optional<std::int64_t> batch_size;
};

/// What advise found for one target.
struct DocumentTarget {
  std::string id;
  std::string name;
  std::int64_t usable_bytes = 0;
  std::optional<std::int64_t> batch_size;  ///< the largest batch that ran under the target's cap
  std::optional<std::int64_t> predicted;
  double fixed_bytes = 0.0;                 ///< the affine fit of the step's peak
  double per_sample_bytes = 0.0;
  std::vector<DocumentTrial> trials;
  std::int64_t wanted_batch = 0;
  std::optional<std::int64_t> effective_batch;  ///< accumulation: reached with micro_batch x steps
  std::int64_t micro_batch = 0;
  std::int64_t accumulation_steps = 0;
  std::vector<DocumentVariant> variants;
};

/// A profile (`memgate profile`/`estimate --output`) or an advice (`memgate advise --output`) file.
struct ProfileDocument {
  enum class Kind { kProfile, kAdvice };
  std::string path;          ///< the file it was read from ("" when built in memory)
  std::string label;         ///< how reports name it: the model's name, made unique among the files of a report
  Kind kind = Kind::kProfile;
  bool estimated = false;    ///< `"estimated": true`: not measured
  std::string device_name;
  std::string device_slug;
  std::string model;
  std::string fixture_hash;
  std::int64_t total_params = 0;
  std::int64_t trainable_params = 0;
  std::int64_t frozen_params = 0;
  std::vector<DocumentProbe> probes;    ///< profile: one per batch size, in the file's order
  std::vector<DocumentTarget> targets;  ///< advice: one per target

  /// The probe at `batch_size` that ran (not out of memory), if any.
  [[nodiscard]] const DocumentProbe* measured(std::int64_t batch_size) const;
  /// Whether a probe of it has the component `info` (`ema` only where the fixture keeps an EMA copy).
  [[nodiscard]] bool has(const ComponentInfo& info) const;
};

/// Reads a profile or advice document from parsed JSON; `source` names it in errors ("out/a.json"). Fields
/// memgate does not know are ignored (a newer memgate may add some); a known field of the wrong type, a missing
/// one, or a component that is not a byte count is a memgate::Error naming the source and the field's path
/// (`probes[2].components.params`).
[[nodiscard]] ProfileDocument profile_document_from_json(const nlohmann::json& json, const std::string& source);

/// Reads the file at `path` (profile_document_from_json); a missing, unreadable or non-JSON file is a
/// memgate::Error naming it.
[[nodiscard]] ProfileDocument load_profile_document(const std::string& path);

/// Gives each document a label for legends and column heads: its model name, with the file's stem added where two
/// documents share a model name (`vit_tiny_lora (fp32)`, `vit_tiny_lora (bf16)`), and " [estimate]" for estimates.
void label_documents(std::vector<ProfileDocument>& documents);

/// A GPU as reports draw it: the bytes its allocator may hold for a step (memory x usable fraction, less the CUDA
/// context and libraries outside the allocator), the line a step_peak_reserved must stay under.
struct GpuLine {
  std::string id;    ///< `rtx_4090_24gb`
  std::string name;  ///< `NVIDIA GeForce RTX 4090`
  std::int64_t memory_bytes = 0;
  std::int64_t allocator_bytes = 0;
};

/// The largest batch size of `document` that ran and whose step_peak_reserved fits `gpu`: measured probes of a
/// profile, or for an advice, the batch it confirmed on a target of the same id.
[[nodiscard]] std::optional<std::int64_t> largest_fitting_batch(const ProfileDocument& document, const GpuLine& gpu);

}  // namespace memgate
