// A replay's results as docs/design.md's JSON, as text for a terminal, and as an HTML page with its charts.
#include "memgate/report/replay_report.h"

#include "memgate/base/units.h"
#include "memgate/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>

namespace memgate {

using nlohmann::json;


namespace {

json totals_json(const ReplayTotals& t) {
  json out = {{"peak_reserved", t.peak_reserved}, {"peak_allocated", t.peak_allocated},
              {"segment_allocs", t.segment_allocs}, {"segment_frees", t.segment_frees}};
  if (t.peak_allocated_blocks) out["peak_allocated_blocks"] = *t.peak_allocated_blocks;
  return out;
}

json fragmentation_json(const Fragmentation& f) {
  json segments = json::array();
  for (const auto& s : f.emptiest) {
    segments.push_back({{"address", s.address}, {"size", s.size}, {"allocated", s.allocated},
                        {"made_by_event", s.made_by_event}, {"made_by_request", s.made_by_size},
                        {"where", s.where}});
  }
  return {{"event", f.event}, {"reserved", f.reserved}, {"allocated", f.allocated},
          {"reserved_minus_allocated", f.reserved - f.allocated}, {"largest_free_block", f.largest_free_block},
          {"emptiest_segments", segments}};
}

}  // namespace

json replay_to_json(const ReplayReport& report) {
  json devices = json::array();
  for (const auto& d : report.devices) {
    json what_if = json::array();
    for (const auto& w : d.what_if) {
      json entry = {{"label", w.spec.label}, {"allocator", w.settings.to_string()},
                    {"capacity", w.spec.capacity ? json(*w.spec.capacity) : json(nullptr)},
                    {"fits", w.fits}, {"ooms", w.ooms}, {"alloc_retries", w.retries},
                    {"replayed", totals_json(w.totals)}, {"fragmentation", fragmentation_json(w.fragmentation)}};
      if (w.first_oom_event >= 0) {
        entry["first_oom"] = {{"event", w.first_oom_event}, {"size", w.first_oom_size}};
      } else {
        entry["first_oom"] = nullptr;
      }
      what_if.push_back(std::move(entry));
    }
    json divergence = nullptr;
    if (d.first_divergence) {
      divergence = {{"event", d.first_divergence->event}, {"action", d.first_divergence->action},
                    {"recorded", d.first_divergence->expected}, {"replayed", d.first_divergence->replayed},
                    {"context", d.first_divergence->context}};
    }
    devices.push_back({{"device", d.device}, {"events", d.events}, {"compared", d.compared}, {"exact", d.exact},
                       {"allocator", d.settings.to_string()},
                       {"initial", {{"segments", d.initial_segments}, {"reserved", d.initial_reserved},
                                    {"allocated", d.initial_allocated}}},
                       {"requests", d.requests}, {"external_releases", d.external_releases},
                       {"addresses_compared", d.addresses_compared},
                       {"recorded", totals_json(d.recorded)}, {"replayed", totals_json(d.replayed)},
                       {"first_divergence", divergence}, {"not_followed", d.not_followed},
                       {"fragmentation", fragmentation_json(d.fragmentation)}, {"what_if", what_if}});
  }
  return {{"file", report.file},
          {"allocator_settings_recorded", report.has_settings},
          {"PYTORCH_CUDA_ALLOC_CONF", report.settings_text},
          {"devices", devices}};
}

std::string replay_summary(const ReplayReport& report) {
  std::string out;
  auto o = std::back_inserter(out);
  fmt::format_to(o, "{}\n", report.file);
  if (!report.has_settings) {
    fmt::format_to(o, "  no allocator_settings recorded (a PyTorch before 2.1?): LibTorch's defaults assumed\n");
  }
  if (report.devices.empty()) fmt::format_to(o, "  no device has a trace\n");
  for (const auto& d : report.devices) {
    fmt::format_to(o, "  device {}: {} events, {} requests; {} segment(s) when the trace began ({} reserved)\n",
                   d.device, d.events, d.requests, d.initial_segments, format_bytes(d.initial_reserved));
    fmt::format_to(o, "    {:<10} {:>14} {:>14} {:>10} {:>10}\n", "", "peak reserved", "peak active", "seg allocs",
                   "seg frees");
    for (const auto& [name, t] : {std::pair{"recorded", d.recorded}, std::pair{"replayed", d.replayed}}) {
      fmt::format_to(o, "    {:<10} {:>14} {:>14} {:>10} {:>10}\n", name, format_bytes(t.peak_reserved),
                     format_bytes(t.peak_allocated), t.segment_allocs, t.segment_frees);
    }
    if (d.replayed.peak_allocated_blocks) {
      fmt::format_to(o, "    peak allocated in whole blocks (torch.cuda.max_memory_allocated()): {}{}\n",
                     format_bytes(*d.replayed.peak_allocated_blocks), d.exact ? "" : ", as replayed");
    }
    for (const auto& n : d.not_followed) fmt::format_to(o, "    not followed: {}\n", n);
    if (d.exact) {
      fmt::format_to(o, "    EXACT: every segment event, {} block addresses, reserved after every event and the "
                        "final state as recorded\n", d.addresses_compared);
    } else if (d.first_divergence) {
      const auto& v = *d.first_divergence;
      fmt::format_to(o, "    DIVERGES at event {} ({}):\n      recorded: {}\n      replayed: {}\n", v.event, v.action,
                     v.expected, v.replayed);
      for (const auto& line : v.context) fmt::format_to(o, "      {}\n", line);
    } else {
      fmt::format_to(o, "    not compared\n");
    }
    const auto& f = d.fragmentation;
    fmt::format_to(o, "    at the peak: reserved {}, allocated {}, reserved - allocated {}, largest free block {}\n",
                   format_bytes(f.reserved), format_bytes(f.allocated), format_bytes(f.reserved - f.allocated),
                   format_bytes(f.largest_free_block));
    for (std::size_t i = 0; i < f.emptiest.size() && i < 3; ++i) {
      const auto& s = f.emptiest[i];
      fmt::format_to(o, "      segment {:#x}: {} of {} allocated, made by {}\n", s.address, format_bytes(s.allocated),
                     format_bytes(s.size),
                     s.made_by_event < 0 ? std::string("an allocation before the trace")
                                         : fmt::format("event {} ({}{})", s.made_by_event, format_bytes(s.made_by_size),
                                                       s.where.empty() ? "" : " at " + s.where));
    }
    for (const auto& w : d.what_if) {
      fmt::format_to(o, "    what if {}: peak reserved {} ({}), {} segment allocs", w.spec.label,
                     format_bytes(w.totals.peak_reserved),
                     format_bytes_delta(w.totals.peak_reserved - d.replayed.peak_reserved), w.totals.segment_allocs);
      if (w.spec.capacity) {
        fmt::format_to(o, "; {}", w.fits ? fmt::format("fits in {}", format_bytes(*w.spec.capacity))
                                         : fmt::format("OUT OF MEMORY at event {} (a request of {}), {} request(s) "
                                                       "failed", w.first_oom_event, format_bytes(w.first_oom_size),
                                                       w.ooms));
        if (w.retries > 0) fmt::format_to(o, ", {} cache flush(es) to make room", w.retries);
      }
      fmt::format_to(o, "\n");
    }
  }
  return out;
}

std::string replay_html(const ReplayReport& report) {
  std::string body;
  auto o = std::back_inserter(body);
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  for (const auto& d : report.devices) {
    fmt::format_to(o, "<h2>Device {}: {}</h2>\n", d.device,
                   d.exact ? "the replay is exact"
                   : d.first_divergence ? fmt::format("diverges at event {}", d.first_divergence->event)
                                        : std::string("not compared"));
    LineChart chart;
    chart.title = fmt::format("Reserved and active memory over the trace (device {})", d.device);
    chart.x_label = "event";
    chart.linear_x = true;
    chart.width = 900;
    const auto add = [&](const std::string& name, const std::vector<ReplayPoint>& points, std::size_t color,
                         bool dashed, bool reserved) {
      ChartSeries s{.name = name, .color = kColors[color % 6], .points = {}, .dashed = dashed};
      for (const auto& p : points) {
        s.points.push_back({std::max<std::int64_t>(p.event, 0),
                            static_cast<double>(reserved ? p.reserved : p.allocated), ""});
      }
      chart.series.push_back(std::move(s));
    };
    add("reserved, recorded", d.recorded_series, 0, false, true);
    add("active, recorded", d.recorded_series, 2, false, false);
    add("reserved, replayed", d.replayed_series, 1, true, true);
    for (std::size_t i = 0; i < d.what_if.size(); ++i) {
      add("reserved, " + d.what_if[i].spec.label, d.what_if[i].series, 3 + i, true, true);
      if (d.what_if[i].spec.capacity) {
        chart.levels.push_back({fmt::format("capacity of '{}': {}", d.what_if[i].spec.label,
                                            format_bytes(*d.what_if[i].spec.capacity)),
                                static_cast<double>(*d.what_if[i].spec.capacity)});
      }
    }
    body += render_line_chart(chart);
    fmt::format_to(o, "<pre>{}</pre>\n", escape_html(replay_summary(ReplayReport{
                                             report.file, report.has_settings, report.settings_text, {d}})));
  }
  return fmt::format(
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memgate replay: {}</title>"
      "<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}}pre{{background:#f6f6f6;"
      "padding:1em;overflow-x:auto}}.grid{{stroke:#e5e5e5}}.tick{{font-size:11px;fill:#555}}"
      ".axis-label{{font-size:12px}}.level line{{stroke:#888;stroke-dasharray:2 3}}.level text{{font-size:11px}}"
      ".legend-item text{{font-size:12px}}</style></head>\n<body><h1>memgate replay</h1><p>{}</p>\n{}</body></html>\n",
      escape_html(report.file), escape_html(report.file), body);
}

}  // namespace memgate
