// Profiles side by side: the differences from the first at every batch size they share, as text.
#include "memgate/report/compare.h"

#include "memgate/base/error.h"
#include "memgate/base/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>

namespace memgate {
namespace {

// Column letters for a terminal table: A, B, ..., Z, AA, AB, ...
std::string letter(std::size_t i) {
  std::string s;
  for (++i; i > 0; i = (i - 1) / 26) s.insert(s.begin(), static_cast<char>('A' + (i - 1) % 26));
  return s;
}

std::string cell(std::int64_t bytes) { return format_bytes(bytes); }

std::string format_difference(const ComponentDifference& d) {
  const auto pct = d.pct();
  return fmt::format("{} ({})", format_bytes_delta(d.delta()), pct ? fmt::format("{:+.2f}%", *pct) : "new");
}

}  // namespace

std::optional<double> ComponentDifference::pct() const {
  if (reference == 0) return value == 0 ? std::optional<double>(0.0) : std::nullopt;
  return 100.0 * static_cast<double>(value - reference) / static_cast<double>(reference);
}

ProfileComparison compare_documents(const std::vector<ProfileDocument>& documents, const std::vector<GpuLine>& gpus,
                                    const ProfileCompareOptions& options) {
  if (documents.size() < 2) throw Error("compare: expected two or more profile files");
  ProfileComparison c;
  c.threshold_pct = options.threshold_pct;

  std::vector<const ProfileDocument*> profiles;
  for (const auto& d : documents) {
    if (d.kind == ProfileDocument::Kind::kProfile) profiles.push_back(&d);
  }
  if (!profiles.empty()) {
    std::set<std::int64_t> common;
    for (const auto& p : profiles.front()->probes) {
      if (p.measured()) common.insert(p.batch_size);
    }
    for (const auto* d : profiles) {
      std::erase_if(common, [&](std::int64_t b) { return d->measured(b) == nullptr; });
    }
    c.common_batch_sizes.assign(common.begin(), common.end());
  }
  const auto& first = documents.front();
  if (first.kind == ProfileDocument::Kind::kProfile) {
    for (std::size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].kind != ProfileDocument::Kind::kProfile) continue;
      for (const auto b : c.common_batch_sizes) {
        for (const auto& info : kComponentTable) {
          if (!first.has(info) && !documents[i].has(info)) continue;
          ComponentDifference d{i, b, std::string(info.name), first.measured(b)->components.*info.member,
                                documents[i].measured(b)->components.*info.member};
          if (options.threshold_pct && d.delta() > 0 && (!d.pct() || *d.pct() > *options.threshold_pct)) {
            c.over_threshold.push_back(d);
          }
          c.differences.push_back(std::move(d));
        }
      }
    }
  }

  auto out = std::back_inserter(c.text);
  fmt::format_to(out, "memgate compare: {} files, each against A\n", documents.size());
  for (std::size_t i = 0; i < documents.size(); ++i) {
    const auto& d = documents[i];
    fmt::format_to(out, "  {}  {}{}: {} on {}", letter(i), d.label,
                   d.kind == ProfileDocument::Kind::kAdvice ? " (advice)" : "", d.path.empty() ? "-" : d.path,
                   d.device_slug);
    if (d.total_params > 0) {
      fmt::format_to(out, ", {} parameters ({} trainable)", d.total_params, d.trainable_params);
    }
    fmt::format_to(out, "\n");
  }
  for (std::size_t i = 1; i < documents.size(); ++i) {
    if (documents[i].device_slug != first.device_slug) {
      fmt::format_to(out, "  note: {} was measured on {}, A on {}: differences include the device's\n", letter(i),
                     documents[i].device_slug, first.device_slug);
    }
  }

  if (first.kind != ProfileDocument::Kind::kProfile) {
    fmt::format_to(out, "\nA is an advice, not a profile: only the batch sizes per GPU are compared.\n");
  } else if (c.common_batch_sizes.empty()) {
    fmt::format_to(out, "\nno batch size was measured in every profile:\n");
    for (std::size_t i = 0; i < documents.size(); ++i) {
      std::string sizes;
      for (const auto& p : documents[i].probes) {
        sizes += fmt::format("{}{}{}", sizes.empty() ? "" : ",", p.batch_size, p.oom ? " (OOM)" : p.failed ? " (failed)" : "");
      }
      fmt::format_to(out, "  {}: {}\n", letter(i), sizes.empty() ? "-" : sizes);
    }
  }
  constexpr int kName = 20, kCol = 13, kDiff = 26;
  for (const auto b : c.common_batch_sizes) {
    fmt::format_to(out, "\nbatch size {}\n{:<{}}", b, "component", kName);
    for (std::size_t i = 0; i < documents.size(); ++i) {
      if (documents[i].kind == ProfileDocument::Kind::kProfile) fmt::format_to(out, "{:>{}}", letter(i), kCol);
    }
    for (std::size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].kind == ProfileDocument::Kind::kProfile) {
        fmt::format_to(out, "{:>{}}", fmt::format("{} - A", letter(i)), kDiff);
      }
    }
    fmt::format_to(out, "\n");
    for (const auto& info : kComponentTable) {
      if (std::none_of(documents.begin(), documents.end(), [&](const ProfileDocument& d) {
            return d.kind == ProfileDocument::Kind::kProfile && d.has(info);
          })) {
        continue;
      }
      fmt::format_to(out, "{:<{}}", info.name, kName);
      for (const auto& d : documents) {
        if (d.kind == ProfileDocument::Kind::kProfile) {
          fmt::format_to(out, "{:>{}}", cell(d.measured(b)->components.*info.member), kCol);
        }
      }
      for (const auto& d : c.differences) {
        if (d.batch_size == b && d.component == info.name) {
          fmt::format_to(out, "{:>{}}", format_difference(d), kDiff);
        }
      }
      fmt::format_to(out, "\n");
    }
  }

  if (!gpus.empty()) {
    fmt::format_to(out, "\nlargest batch size that fits (step_peak_reserved within what the allocator may hold; "
                        "measured batch sizes only):\n{:<40}", "GPU");
    for (std::size_t i = 0; i < documents.size(); ++i) fmt::format_to(out, "{:>8}", letter(i));
    fmt::format_to(out, "\n");
    for (const auto& g : gpus) {
      fmt::format_to(out, "{:<40}", g.name.substr(0, 39));
      for (const auto& d : documents) {
        const auto best = largest_fitting_batch(d, g);
        fmt::format_to(out, "{:>8}", best ? std::to_string(*best) : std::string("-"));
      }
      fmt::format_to(out, "\n");
    }
    if (std::any_of(documents.begin(), documents.end(), [](const auto& d) { return d.device_slug == "cpu"; })) {
      fmt::format_to(out, "(a profile measured on the CPU says little about a GPU: CUDA kernels and workspaces "
                          "differ)\n");
    }
  }

  if (options.threshold_pct) {
    if (c.over_threshold.empty()) {
      fmt::format_to(out, "\nno component grew by more than {:g}% against A\n", *options.threshold_pct);
    } else {
      fmt::format_to(out, "\n{} components grew by more than {:g}% against A:\n", c.over_threshold.size(),
                     *options.threshold_pct);
      for (const auto& d : c.over_threshold) {
        fmt::format_to(out, "  {} bs {} {}: {} -> {}, {}\n", letter(d.document), d.batch_size, d.component,
                       cell(d.reference), cell(d.value), format_difference(d));
      }
    }
  }
  return c;
}

}  // namespace memgate
