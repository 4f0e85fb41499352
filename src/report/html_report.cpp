// The HTML of `memgate report` and `memgate compare --html`: a page of inline SVG charts and tables.
#include "memgate/report/html_report.h"

#include "memgate/base/units.h"
#include "memgate/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <map>
#include <set>

namespace memgate {
namespace {

// Tableau 10, as PyTorch's memory_viz colours its blocks.
constexpr std::array<const char*, 10> kPalette{"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                                               "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"};

const char* component_color(std::string_view name) {
  for (std::size_t i = 0; i < kComponentTable.size(); ++i) {
    if (kComponentTable[i].name == name) return kPalette[i == 7 ? 8 : i % kPalette.size()];
  }
  return kPalette[9];
}

constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 0 auto;
       max-width: 1120px; padding: 16px 28px 40px; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 19px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #555; margin: 2px 0; } .badge { background: #fde2b8; border-radius: 4px; padding: 1px 6px; }
figure.chart { margin: 10px 0; } figcaption { color: #666; font-size: 12px; max-width: 760px; }
.charts { display: flex; flex-wrap: wrap; gap: 4px 16px; }
svg.memgate-chart text { font-size: 12px; fill: #333; }
svg.memgate-chart .chart-title { font-size: 14px; font-weight: 600; }
svg.memgate-chart .grid { stroke: #e8e8e8; } svg.memgate-chart .axis { stroke: #444; }
svg.memgate-chart .series path { stroke-width: 2.2; } svg.memgate-chart .hidden { display: none; }
svg.memgate-chart .legend-item { cursor: pointer; } svg.memgate-chart .legend-item.off { opacity: 0.35; }
svg.memgate-chart .level line { stroke: #c0392b; stroke-width: 1.4; stroke-dasharray: 7 4; }
svg.memgate-chart .level text { fill: #c0392b; font-size: 11px; }
svg.memgate-chart .mark { stroke: #111; stroke-width: 2; } svg.memgate-chart .missing { fill: #c0392b; font-weight: 600; }
table { border-collapse: collapse; margin: 8px 0 14px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: 3px 9px; text-align: right; } th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
td.grew { color: #b03a2e; font-weight: 600; } td.shrank { color: #1e7b34; } td.oom { color: #c0392b; }
footer { margin-top: 36px; color: #777; font-size: 12px; }
)";

// Collects errors before anything else runs, so a test (or a reader) can tell that the page's script failed.
constexpr const char* kErrorCatcher = R"(<script>
window.addEventListener('error', function (e) {
  var root = document.documentElement;
  root.setAttribute('data-script-errors', (root.getAttribute('data-script-errors') || '') + e.message + '\n');
});
</script>)";

// Legend entries toggle their series; the body says the page's script ran to the end.
constexpr const char* kScript = R"(<script>
(function () {
  document.querySelectorAll('svg.line-chart').forEach(function (svg) {
    svg.querySelectorAll('.legend-item').forEach(function (item) {
      item.addEventListener('click', function () {
        var name = item.getAttribute('data-series');
        svg.querySelectorAll('.series').forEach(function (g) {
          if (g.getAttribute('data-series') === name) g.classList.toggle('hidden');
        });
        item.classList.toggle('off');
      });
    });
  });
  document.body.setAttribute('data-charts', String(document.querySelectorAll('svg.memgate-chart').length));
  document.body.setAttribute('data-ready', '1');
})();
</script>)";

std::string page(const std::string& title, const std::string& body, const HtmlOptions& options) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n{}\n"
      "<style>{}</style>\n</head>\n<body>\n{}\n<footer>Made by {}. Bytes are binary: 1 KiB = 1024 B, 1 MiB = 1024 KiB. "
      "Hover a point or a bar for its exact bytes; click a legend entry to hide its line.</footer>\n{}\n</body>\n"
      "</html>\n",
      escape_html(title), kErrorCatcher, kStyle, body, escape_html(options.generator), kScript);
}

std::vector<ChartLevel> gpu_levels(const std::vector<GpuLine>& gpus) {
  std::vector<ChartLevel> levels;
  for (const auto& g : gpus) {
    levels.push_back({fmt::format("{}: {} usable", g.name, format_mib(g.allocator_bytes)),
                      static_cast<double>(g.allocator_bytes)});
  }
  return levels;
}

constexpr const char* kCpuNote =
    "<p class=\"meta\">Measured on the CPU with memgate's counting allocator (exact bytes): CUDA kernels, workspaces "
    "and the caching allocator differ, so the GPU lines say little until it is profiled on a GPU.</p>";

std::string meta(const ProfileDocument& d, bool cpu_note = true) {
  std::string s = fmt::format("<p class=\"meta\">{}{} on <b>{}</b> ({})", d.estimated ? "<span class=\"badge\">"
                                                                                        "estimate</span> " : "",
                              d.kind == ProfileDocument::Kind::kAdvice ? "Advice"
                              : d.estimated                            ? "Estimated (nothing measured) for"
                                                                       : "Measured",
                              escape_html(d.device_name), escape_html(d.device_slug));
  if (d.total_params > 0) {
    s += fmt::format("; {} parameters, {} trainable, {} frozen", d.total_params, d.trainable_params, d.frozen_params);
  }
  if (!d.fixture_hash.empty()) s += fmt::format("; fixture {}", escape_html(d.fixture_hash));
  if (!d.path.empty()) s += fmt::format("; file <code>{}</code>", escape_html(d.path));
  s += "</p>";
  if (cpu_note && d.device_slug == "cpu" && !d.estimated) s += kCpuNote;
  return s;
}

std::string component_chart(const ProfileDocument& d, const std::vector<GpuLine>& gpus) {
  LineChart chart;
  chart.title = fmt::format("{}: memory per component", d.label);
  for (const auto& info : kComponentTable) {
    if (!d.has(info)) continue;
    ChartSeries s{std::string(info.name), component_color(info.name), {}, info.kind == ComponentKind::kReserved};
    for (const auto& p : d.probes) {
      if (p.measured()) s.points.push_back({p.batch_size, static_cast<double>(p.components.*info.member), ""});
    }
    chart.series.push_back(std::move(s));
  }
  chart.levels = gpu_levels(gpus);
  return render_line_chart(chart);
}

std::string stacked_chart(const ProfileDocument& d) {
  StackedBars chart;
  chart.title = fmt::format("{}: what the step keeps, and its peaks", d.label);
  chart.layer_names = {"params", "optimizer_state", "gradients", "activations"};
  for (const auto& n : chart.layer_names) chart.layer_colors.emplace_back(component_color(n));
  chart.mark_names = {"step_peak (allocated)", "step_peak_reserved"};
  chart.mark_styles = {"solid", "dashed"};
  for (const auto& p : d.probes) {
    StackedBar bar{fmt::format("bs {}", p.batch_size), {}, {}, !p.measured(), p.oom ? "OOM" : "failed"};
    if (p.measured()) {
      const auto& c = p.components;
      bar.layers = {static_cast<double>(c.params), static_cast<double>(c.optimizer_state),
                    static_cast<double>(c.gradients), static_cast<double>(c.activations)};
      bar.marks = {static_cast<double>(c.step_peak), static_cast<double>(c.step_peak_reserved)};
    }
    chart.bars.push_back(std::move(bar));
  }
  return render_stacked_bars(chart) +
         "<p class=\"meta\">The bar stacks what a step holds: parameters and optimizer state for the whole step, "
         "gradients after backward, activations at the end of the forward. They do not all coexist (backward "
         "frees activations as gradients appear), so the measured peak (solid mark) may sit below the stack's top; "
         "above it is what the step allocates on top (workspaces, temporaries). The dashed mark is what the "
         "allocator reserved.</p>";
}

std::string component_table(const ProfileDocument& d) {
  std::string t = "<table class=\"components\"><tr><th>component</th>";
  for (const auto& p : d.probes) t += fmt::format("<th>bs {}</th>", p.batch_size);
  t += "</tr>";
  for (const auto& info : kComponentTable) {
    if (!d.has(info)) continue;
    t += fmt::format("<tr><td title=\"{}\">{}</td>", escape_html(info.meaning), info.name);
    for (const auto& p : d.probes) {
      t += p.oom      ? std::string("<td class=\"oom\">OOM</td>")
           : p.failed ? std::string("<td class=\"oom\">failed</td>")
                      : fmt::format("<td title=\"{} bytes\">{}</td>", p.components.*info.member,
                               format_bytes(p.components.*info.member));
    }
    t += "</tr>";
  }
  t += "<tr><td>step time</td>";
  for (const auto& p : d.probes) t += p.measured() ? fmt::format("<td>{:.3f} s</td>", p.step_seconds) : "<td>-</td>";
  t += "</tr></table>";
  for (const auto& p : d.probes) {
    if (p.oom) t += fmt::format("<p class=\"meta\">bs {}: out of memory: {}</p>", p.batch_size, escape_html(p.error));
    if (p.failed) t += fmt::format("<p class=\"meta\">bs {}: failed: {}</p>", p.batch_size, escape_html(p.error));
  }
  return t;
}

// Which modules hold the bytes of the largest batch size that has a breakdown: a row per module among the largest
// of any component, a column per component with one.
std::string module_table(const ProfileDocument& d) {
  constexpr std::size_t kTop = 12;
  const DocumentProbe* probe = nullptr;
  for (const auto& p : d.probes) {
    if (p.measured() && !p.modules.empty() && (probe == nullptr || p.batch_size > probe->batch_size)) probe = &p;
  }
  if (probe == nullptr) return "";
  std::vector<std::string_view> components;
  std::map<std::string, std::int64_t, std::less<>> shown;  // module -> the most it holds of any component
  for (const auto component : kBrokenDownComponents) {
    const auto* modules = probe->modules.find(component);
    if (modules == nullptr) continue;
    components.push_back(component);
    std::vector<std::pair<std::int64_t, std::string>> largest;
    for (const auto& [module, bytes] : *modules) largest.emplace_back(bytes, module);
    std::sort(largest.begin(), largest.end(), std::greater<>());
    for (std::size_t i = 0; i < largest.size() && i < kTop; ++i) {
      auto& most = shown[largest[i].second];
      most = std::max(most, largest[i].first);
    }
  }
  std::vector<std::pair<std::int64_t, std::string>> rows;
  for (const auto& [module, most] : shown) rows.emplace_back(most, module);
  std::sort(rows.begin(), rows.end(), std::greater<>());
  std::string t = fmt::format(
      "<h3>By module, batch size {}</h3><p class=\"meta\">What each module's forward allocated that is alive where "
      "the component is read (the largest {} of each component); a name in parentheses is what no module's forward "
      "allocated, by the part of the step that did.</p><table class=\"modules\"><tr><th>module</th>",
      probe->batch_size, kTop);
  for (const auto component : components) t += fmt::format("<th>{}</th>", component);
  t += "</tr>";
  for (const auto& [most, module] : rows) {
    t += fmt::format("<tr><td>{}</td>", escape_html(module));
    for (const auto component : components) {
      const auto& modules = *probe->modules.find(component);
      const auto it = modules.find(module);
      t += it == modules.end() ? std::string("<td>-</td>")
                               : fmt::format("<td title=\"{} bytes\">{}</td>", it->second, format_bytes(it->second));
    }
    t += "</tr>";
  }
  return t + "</table>";
}

// The modules whose bytes changed against the baseline, per batch size and component.
std::string module_changes_table(const std::vector<ComparisonSection::ModuleRow>& rows) {
  if (rows.empty()) return "";
  std::string t = "<h2>By module</h2><table class=\"modules\"><tr><th>batch</th><th>component</th><th>module</th>"
                   "<th>baseline</th><th>this run</th><th>change</th></tr>";
  for (const auto& r : rows) {
    const auto d = r.change.difference();
    t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td title=\"{} bytes\">{}</td><td title=\"{} bytes\">{}</td>"
                     "<td class=\"{}\" title=\"{:+} bytes\">{}</td></tr>",
                     r.batch_size, r.component, escape_html(r.change.module), r.change.baseline,
                     format_bytes(r.change.baseline), r.change.measured, format_bytes(r.change.measured),
                     d > 0 ? "grew" : "shrank", d, format_bytes_delta(d));
  }
  return t + "</table>";
}

std::string fits_table(const std::vector<const ProfileDocument*>& docs, const std::vector<GpuLine>& gpus) {
  if (gpus.empty()) return "";
  std::string t = "<table class=\"fits\"><tr><th>GPU</th><th>memory</th><th>usable</th>";
  for (const auto* d : docs) t += fmt::format("<th>{}</th>", escape_html(d->label));
  t += "</tr>";
  for (const auto& g : gpus) {
    t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td>", escape_html(g.name), format_bytes(g.memory_bytes),
                     format_mib(g.allocator_bytes));
    for (const auto* d : docs) {
      const auto best = largest_fitting_batch(*d, g);
      t += best ? fmt::format("<td>bs {}</td>", *best) : std::string("<td class=\"oom\">none</td>");
    }
    t += "</tr>";
  }
  return t + "</table><p class=\"meta\">The largest measured batch size whose step_peak_reserved fits what the "
             "allocator may hold on each GPU, its usable memory (memory x usable fraction, less the CUDA context and "
             "libraries); "
             "for an advice, the batch it confirmed under that GPU's cap.</p>";
}

std::string advice_section(const ProfileDocument& d) {
  std::string s = "<table class=\"advice\"><tr><th>target</th><th>usable</th><th>largest batch</th><th>predicted"
                  "</th><th>peak = fixed + per sample x batch</th><th>accumulation</th></tr>";
  for (const auto& t : d.targets) {
    s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} + {} x b</td><td>{}</td></tr>",
                     escape_html(t.name), format_mib(t.usable_bytes),
                     t.batch_size ? std::to_string(*t.batch_size) : "none", t.predicted ? std::to_string(*t.predicted) : "-",
                     format_bytes(std::llround(t.fixed_bytes)), format_bytes(std::llround(t.per_sample_bytes)),
                     t.effective_batch ? fmt::format("{} = {} x {} steps", *t.effective_batch, t.micro_batch,
                                                     t.accumulation_steps)
                                       : std::string("-"));
  }
  s += "</table>";
  for (const auto& t : d.targets) {
    if (t.variants.empty()) continue;
    s += fmt::format("<h3>{}: batch {} does not fit; what would</h3><table class=\"variants\"><tr><th>variant</th>"
                     "<th>change</th><th>largest batch</th></tr>",
                     escape_html(t.name), t.wanted_batch);
    for (const auto& v : t.variants) {
      s += fmt::format("<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>", escape_html(v.name),
                       escape_html(v.change), v.batch_size ? std::to_string(*v.batch_size) : "none");
    }
    s += "</table>";
  }
  LineChart chart;
  chart.title = fmt::format("{}: the step's peak at each batch advise ran", d.label);
  chart.level_reach = 1e9;
  std::size_t color = 0;
  for (const auto& t : d.targets) {
    ChartSeries series{t.name, kPalette[color++ % kPalette.size()], {}, false};
    std::vector<DocumentTrial> trials = t.trials;
    std::sort(trials.begin(), trials.end(), [](const auto& a, const auto& b) { return a.batch_size < b.batch_size; });
    for (const auto& trial : trials) {
      if (trial.peak_bytes) {
        series.points.push_back({trial.batch_size, static_cast<double>(*trial.peak_bytes),
                                 fmt::format("{}, batch {}: peak {}, {}", t.name, trial.batch_size,
                                             format_bytes(*trial.peak_bytes), trial.fits ? "fits" : "does not fit")});
      }
    }
    if (!series.points.empty()) chart.series.push_back(std::move(series));
    chart.levels.push_back({fmt::format("{}: {} usable", t.name, format_mib(t.usable_bytes)),
                            static_cast<double>(t.usable_bytes)});
  }
  if (!chart.series.empty()) s += render_line_chart(chart);
  return s;
}

std::string overview_chart(const std::vector<const ProfileDocument*>& docs, const std::vector<GpuLine>& gpus,
                           std::string_view component, int width = 760, int height = 380) {
  LineChart chart;
  chart.title = fmt::format("{}, every file", component);
  chart.width = width;
  chart.height = height;
  std::size_t color = 0;
  for (const auto* d : docs) {
    ChartSeries s{d->label, kPalette[color++ % kPalette.size()], {}, false};
    for (const auto& p : d->probes) {
      if (p.measured()) s.points.push_back({p.batch_size, static_cast<double>(p.components.get(component)), ""});
    }
    chart.series.push_back(std::move(s));
  }
  if (component == "step_peak_reserved") chart.levels = gpu_levels(gpus);
  return render_line_chart(chart);
}

std::vector<const ProfileDocument*> profiles_of(const std::vector<ProfileDocument>& documents) {
  std::vector<const ProfileDocument*> out;
  for (const auto& d : documents) {
    if (d.kind == ProfileDocument::Kind::kProfile) out.push_back(&d);
  }
  return out;
}

std::string names_of(const std::vector<ProfileDocument>& documents, const char* separator) {
  std::string names;
  for (const auto& d : documents) names += (names.empty() ? "" : separator) + d.label;
  return names;
}

}  // namespace

std::string render_report_html(const std::vector<ProfileDocument>& documents, const std::vector<GpuLine>& gpus,
                               const HtmlOptions& options) {
  const auto title = options.title.empty() ? "memgate report: " + names_of(documents, ", ") : options.title;
  std::string body = fmt::format("<h1>{}</h1>", escape_html(title));
  const auto profiles = profiles_of(documents);
  if (profiles.size() >= 2) {
    body += "<h2>Overview</h2>" + overview_chart(profiles, gpus, "step_peak_reserved") + fits_table(profiles, gpus);
  }
  for (std::size_t i = 0; i < documents.size(); ++i) {
    const auto& d = documents[i];
    body += fmt::format("<section class=\"document\" id=\"document-{}\"><h2>{}</h2>{}", i, escape_html(d.label), meta(d));
    if (d.kind == ProfileDocument::Kind::kAdvice) {
      body += advice_section(d);
    } else {
      body += "<div class=\"charts\">" + component_chart(d, gpus) + stacked_chart(d) + "</div>";
      body += component_table(d);
      body += module_table(d);
      if (profiles.size() < 2) body += fits_table({&d}, gpus);
    }
    body += "</section>";
  }
  return page(title, body, options);
}

namespace {

std::string comparison_body(const std::vector<ProfileDocument>& documents, const std::vector<GpuLine>& gpus,
                            const ProfileComparison& comparison) {
  std::string body;
  for (std::size_t i = 0; i < documents.size(); ++i) {
    body += fmt::format("<h3>{}{}</h3>", i == 0 ? "reference: " : "", escape_html(documents[i].label)) +
            meta(documents[i], /*cpu_note=*/false);
  }
  if (std::any_of(documents.begin(), documents.end(), [](const auto& d) { return d.device_slug == "cpu"; })) {
    body += kCpuNote;
  }
  const auto profiles = profiles_of(documents);
  if (comparison.common_batch_sizes.empty() && profiles.size() == documents.size()) {
    body += "<p class=\"meta\">No batch size was measured in every profile: nothing to put side by side.</p>";
  }
  const auto& first = documents.front();
  for (const auto b : comparison.common_batch_sizes) {
    body += fmt::format("<h2>Batch size {}</h2><table class=\"compare\"><tr><th>component</th>", b);
    for (const auto* d : profiles) body += fmt::format("<th>{}</th>", escape_html(d->label));
    for (std::size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].kind == ProfileDocument::Kind::kProfile) {
        body += fmt::format("<th>{} - {}</th>", escape_html(documents[i].label), escape_html(first.label));
      }
    }
    body += "</tr>";
    for (const auto& info : kComponentTable) {
      if (std::none_of(profiles.begin(), profiles.end(), [&](const ProfileDocument* d) { return d->has(info); })) continue;
      body += fmt::format("<tr><td>{}</td>", info.name);
      for (const auto* d : profiles) {
        const auto v = d->measured(b)->components.*info.member;
        body += fmt::format("<td title=\"{} bytes\">{}</td>", v, format_bytes(v));
      }
      for (const auto& diff : comparison.differences) {
        if (diff.batch_size != b || diff.component != info.name) continue;
        const auto pct = diff.pct();
        const char* cls = diff.delta() > 0 ? "grew" : diff.delta() < 0 ? "shrank" : "same";
        body += fmt::format("<td class=\"{}\" title=\"{:+} bytes\">{} ({})</td>", cls, diff.delta(),
                            format_bytes_delta(diff.delta()), pct ? fmt::format("{:+.2f}%", *pct) : "new");
      }
      body += "</tr>";
    }
    body += "</table>";
  }
  std::vector<const ProfileDocument*> all;
  for (const auto& d : documents) all.push_back(&d);
  if (!gpus.empty()) body += "<h2>Largest batch per GPU</h2>" + fits_table(all, gpus);
  if (!profiles.empty()) {
    body += "<h2>Every component</h2><div class=\"charts\">";
    for (const auto& info : kComponentTable) {
      if (std::any_of(profiles.begin(), profiles.end(), [&](const ProfileDocument* d) { return d->has(info); })) {
        body += overview_chart(profiles, gpus, info.name, 540, 300);
      }
    }
    body += "</div>";
  }
  if (comparison.threshold_pct) {
    body += fmt::format("<h2>Threshold {:g}%: {}</h2>", *comparison.threshold_pct,
                        comparison.failed() ? fmt::format("{} components grew beyond it", comparison.over_threshold.size())
                                            : std::string("nothing grew beyond it"));
  }
  return body;
}

}  // namespace

std::string render_comparison_html(const std::vector<ProfileDocument>& documents, const std::vector<GpuLine>& gpus,
                                   const ProfileComparison& comparison, const HtmlOptions& options) {
  const auto title = options.title.empty() ? "memgate compare: " + names_of(documents, " vs ") : options.title;
  return page(title, fmt::format("<h1>{}</h1>", escape_html(title)) + comparison_body(documents, gpus, comparison),
              options);
}

std::string render_comparisons_html(const std::vector<ComparisonSection>& sections, const std::vector<GpuLine>& gpus,
                                    const HtmlOptions& options) {
  const auto title = options.title.empty() ? std::string("memgate comparisons") : options.title;
  std::string body = fmt::format("<h1>{}</h1>", escape_html(title));
  if (sections.empty()) body += "<p class=\"meta\">Nothing to compare.</p>";
  for (std::size_t i = 0; i < sections.size(); ++i) {
    body += fmt::format("<section class=\"comparison\" id=\"comparison-{}\"><h1>{}</h1>{}</section>", i,
                        escape_html(sections[i].title),
                        comparison_body(sections[i].documents, gpus, sections[i].comparison) +
                            module_changes_table(sections[i].modules));
  }
  return page(title, body, options);
}

}  // namespace memgate
