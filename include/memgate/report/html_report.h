// `memgate report` and `memgate compare --html`: one self-contained HTML file (inline SVG and CSS, a few lines of
// script for legends; nothing fetched at view time) from profile and advice documents.
#pragma once

#include "memgate/report/compare.h"
#include "memgate/report/profile_document.h"

#include <string>
#include <vector>

namespace memgate {

struct HtmlOptions {
  std::string title;               ///< the page's title; "" for one made from the documents
  std::string generator = "memgate";  ///< "memgate 0.x", shown in the footer
};

/// The report of each document: memory per component against batch size with a line per GPU's usable memory, a
/// stacked bar of what the step keeps at each batch size with its peaks marked, the component table, which modules
/// hold the bytes (where the document has a per-module breakdown), the largest batch that fits each GPU, and the advice where a document is one; with two or more profiles, an overview of
/// their step peaks first.
[[nodiscard]] std::string render_report_html(const std::vector<ProfileDocument>& documents,
                                             const std::vector<GpuLine>& gpus, const HtmlOptions& options = {});

/// The comparison as HTML: one chart per component with a line per document, the table of every component at
/// every common batch size with the differences from the first document, and the largest batch per GPU.
[[nodiscard]] std::string render_comparison_html(const std::vector<ProfileDocument>& documents,
                                                 const std::vector<GpuLine>& gpus,
                                                 const ProfileComparison& comparison, const HtmlOptions& options = {});

/// Several comparisons on one page, each under its title (the gate's summary: baseline against this run, per
/// changed fixture).
struct ComparisonSection {
  std::string title;
  std::vector<ProfileDocument> documents;
  ProfileComparison comparison;
  /// The modules whose bytes changed, per batch size and component, the largest change first (the verdicts'
  /// ComponentVerdict::modules): shown as a table "by module" under the comparison.
  struct ModuleRow {
    std::int64_t batch_size = 0;
    std::string component;
    ModuleChange change;
  };
  std::vector<ModuleRow> modules;
};
[[nodiscard]] std::string render_comparisons_html(const std::vector<ComparisonSection>& sections,
                                                  const std::vector<GpuLine>& gpus, const HtmlOptions& options = {});

}  // namespace memgate
