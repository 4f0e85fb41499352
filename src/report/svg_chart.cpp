// Inline SVG charts: computed here, drawn by the browser, no script needed to see them.
#include "memgate/report/svg_chart.h"

#include "memgate/base/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <set>

namespace memgate {
namespace {

// The plot area inside a chart: room on the left for byte labels, on the right for the legend.
struct Frame {
  double left = 84, right, top = 40, bottom;
  Frame(int width, int height, double legend_width) : right(width - legend_width), bottom(height - 52.0) {}
};

std::string num(double v) { return fmt::format("{:.1f}", v); }

// Maps batch sizes to x: log2 when they span a factor of 4 or more, else linear; a margin on each side.
class BatchAxis {
 public:
  BatchAxis(const std::set<std::int64_t>& batches, const Frame& f, bool linear = false) : f_(f) {
    lo_ = static_cast<double>(batches.empty() ? 1 : *batches.begin());
    hi_ = static_cast<double>(batches.empty() ? 1 : *batches.rbegin());
    log_ = !linear && lo_ > 0 && hi_ / lo_ >= 4.0;
    if (log_) lo_ = std::log2(lo_), hi_ = std::log2(hi_);
  }
  [[nodiscard]] double x(std::int64_t batch) const {
    const double v = log_ ? std::log2(static_cast<double>(batch)) : static_cast<double>(batch);
    const double pad = 0.05 * (f_.right - f_.left);
    if (hi_ == lo_) return (f_.left + f_.right) / 2.0;
    return f_.left + pad + (v - lo_) / (hi_ - lo_) * (f_.right - f_.left - 2.0 * pad);
  }
  [[nodiscard]] bool log() const { return log_; }

 private:
  const Frame& f_;
  double lo_, hi_;
  bool log_;
};

void draw_y_axis(std::string& svg, const Frame& f, const ByteTicks& ticks, const std::string& label) {
  auto out = std::back_inserter(svg);
  const auto y = [&](double bytes) { return f.bottom - bytes / ticks.top_bytes * (f.bottom - f.top); };
  const int n = static_cast<int>(std::lround(ticks.top_bytes / ticks.step_bytes));
  for (int i = 0; i <= n; ++i) {
    const double bytes = i * ticks.step_bytes;
    fmt::format_to(out, R"(<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>)", num(f.left), num(f.right),
                   num(y(bytes)), num(y(bytes)));
    fmt::format_to(out, R"(<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>)", num(f.left - 6),
                   num(y(bytes) + 4), escape_html(ticks.label(bytes)));
  }
  fmt::format_to(out, R"svg(<text class="axis-label" transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>)svg",
                 num((f.top + f.bottom) / 2), escape_html(label));
  fmt::format_to(out, R"(<line class="axis" x1="{0}" x2="{0}" y1="{1}" y2="{2}"/>)", num(f.left), num(f.top),
                 num(f.bottom));
  fmt::format_to(out, R"(<line class="axis" x1="{0}" x2="{1}" y1="{2}" y2="{2}"/>)", num(f.left), num(f.right),
                 num(f.bottom));
}

std::string svg_open(const char* kind, int width, int height, const std::string& title) {
  return fmt::format(R"(<svg class="memgate-chart {}" viewBox="0 0 {} {}" )"
                     R"(width="{}" height="{}" role="img" aria-label="{}"><title>{}</title>)"
                     R"(<text class="chart-title" x="{}" y="22" text-anchor="middle">{}</text>)",
                     kind, width, height, width, height, escape_html(title), escape_html(title), width / 2,
                     escape_html(title));
}

}  // namespace

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = byte(i);
    std::size_t n = 0;  // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629: no overlongs, surrogates, > U+10FFFF)
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c == 0xE0) n = 2, lo = 0xA0;
    else if (c == 0xED) n = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 2;
    else if (c == 0xF0) n = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) n = 3;
    else if (c == 0xF4) n = 3, hi = 0x8F;
    bool ok = n > 0 && i + n < text.size();  // its continuation bytes are there
    if (ok) ok = byte(i + 1) >= lo && byte(i + 1) <= hi;
    for (std::size_t k = 2; ok && k <= n; ++k) ok = byte(i + k) >= 0x80 && byte(i + k) <= 0xBF;
    if (ok) {
      out.append(text.substr(i, n + 1));
      i += n + 1;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the one byte; the next is looked at afresh
      ++i;
    }
  }
  return out;
}

std::string escape_html(std::string_view text_in) {
  const auto valid = valid_utf8(text_in);
  const std::string_view text = valid;
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string ByteTicks::label(double bytes) const {
  const double v = std::round(bytes / unit_bytes * 1e6) / 1e6;
  return fmt::format("{:g} {}", v, unit);
}

ByteTicks byte_ticks(double max_bytes, int max_ticks) {
  static constexpr std::array<std::pair<const char*, double>, 5> kUnits{
      {{"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}}};
  ByteTicks t;
  max_bytes = std::max(max_bytes, 1.0);
  for (const auto& [name, bytes] : kUnits) {
    if (max_bytes >= bytes) t.unit = name, t.unit_bytes = bytes;
  }
  const double v = max_bytes / t.unit_bytes;
  const double raw = v / std::max(max_ticks, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10.0 * magnitude;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  if (t.unit == "B") step = std::max(step, 1.0);
  t.step_bytes = step * t.unit_bytes;
  t.top_bytes = std::ceil(v / step - 1e-9) * t.step_bytes;
  if (t.top_bytes < max_bytes) t.top_bytes += t.step_bytes;
  return t;
}

std::string render_line_chart(const LineChart& chart) {
  const double kLegendWidth = chart.width < 700 ? 170 : 200;
  const Frame f(chart.width, chart.height, kLegendWidth);
  std::set<std::int64_t> batches;
  double max_point = 0.0;
  for (const auto& s : chart.series) {
    for (const auto& p : s.points) batches.insert(p.batch_size), max_point = std::max(max_point, p.bytes);
  }
  std::vector<const ChartLevel*> drawn, beyond;
  double top = max_point;
  for (const auto& level : chart.levels) {
    if (max_point > 0 && level.bytes <= chart.level_reach * max_point) {
      drawn.push_back(&level);
      top = std::max(top, level.bytes);
    } else {
      beyond.push_back(&level);
    }
  }
  const auto ticks = byte_ticks(top * 1.04);
  const BatchAxis xaxis(batches, f, chart.linear_x);
  const auto y = [&](double bytes) { return f.bottom - bytes / ticks.top_bytes * (f.bottom - f.top); };

  std::string svg = svg_open("line-chart", chart.width, chart.height, chart.title);
  auto out = std::back_inserter(svg);
  draw_y_axis(svg, f, ticks, chart.y_label);
  std::set<std::int64_t> tick_values = batches;
  if (chart.linear_x && !batches.empty()) {
    tick_values.clear();
    const auto lo = *batches.begin();
    const auto hi = *batches.rbegin();
    for (int i = 0; i <= 5; ++i) tick_values.insert(lo + (hi - lo) * i / 5);
  }
  for (const auto b : tick_values) {
    fmt::format_to(out, R"(<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>)", num(xaxis.x(b)),
                   num(f.bottom + 16), b);
  }
  fmt::format_to(out, R"(<text class="axis-label" x="{}" y="{}" text-anchor="middle">{}{}</text>)",
                 num((f.left + f.right) / 2), num(f.bottom + 38), escape_html(chart.x_label),
                 xaxis.log() ? " (log scale)" : "");
  for (const auto* level : drawn) {
    fmt::format_to(out, R"(<g class="level"><line x1="{}" x2="{}" y1="{}" y2="{}"/>)", num(f.left), num(f.right),
                   num(y(level->bytes)), num(y(level->bytes)));
    fmt::format_to(out, R"(<text x="{}" y="{}" text-anchor="end">{}</text><title>{}</title></g>)", num(f.right - 4),
                   num(y(level->bytes) - 4), escape_html(level->label), escape_html(level->label));
  }
  int row = 0;
  for (const auto& s : chart.series) {
    const auto name = escape_html(s.name);
    fmt::format_to(out, R"(<g class="series" data-series="{}">)", name);
    std::string d;
    for (const auto& p : s.points) {
      d += fmt::format("{}{} {}", d.empty() ? "M" : " L", num(xaxis.x(p.batch_size)), num(y(p.bytes)));
    }
    if (!d.empty()) {
      fmt::format_to(out, R"(<path d="{}" stroke="{}" fill="none"{}/>)", d, s.color,
                     s.dashed ? R"( stroke-dasharray="6 4")" : "");
    }
    for (const auto& p : s.points) {
      if (chart.linear_x && p.title.empty()) continue;  // many points: a marker only where one has something to say
      const auto title = p.title.empty()
                             ? fmt::format("{}, batch {}: {} ({:.0f} bytes)", s.name, p.batch_size,
                                           format_bytes(std::llround(p.bytes)), p.bytes)
                             : p.title;
      fmt::format_to(out, R"(<circle cx="{}" cy="{}" r="3.5" fill="{}"><title>{}</title></circle>)",
                     num(xaxis.x(p.batch_size)), num(y(p.bytes)), s.color, escape_html(title));
    }
    fmt::format_to(out, "</g>");
    const double ly = f.top + 6 + 20.0 * row++;
    fmt::format_to(out, R"(<g class="legend-item" data-series="{}" tabindex="0"><rect x="{}" y="{}" width="14" )"
                        R"(height="14" rx="2" fill="{}"/><text x="{}" y="{}">{}</text></g>)",
                   name, num(f.right + 14), num(ly), s.color, num(f.right + 34), num(ly + 11), name);
  }
  svg += "</svg>";
  std::string figure = "<figure class=\"chart\">" + svg;
  if (!beyond.empty()) {
    std::string names;
    for (const auto* level : beyond) names += (names.empty() ? "" : "; ") + escape_html(level->label);
    figure += fmt::format("<figcaption>Not drawn, more than {:g}x the largest value above: {}.</figcaption>",
                          chart.level_reach, names);
  }
  return figure + "</figure>";
}

std::string render_stacked_bars(const StackedBars& chart) {
  constexpr double kLegendWidth = 200;
  const Frame f(chart.width, chart.height, kLegendWidth);
  double top = 0.0;
  for (const auto& bar : chart.bars) {
    if (bar.missing) continue;
    double sum = 0.0;
    for (const auto v : bar.layers) sum += v;
    top = std::max(top, sum);
    for (const auto m : bar.marks) top = std::max(top, m);
  }
  const auto ticks = byte_ticks(top * 1.04);
  const auto y = [&](double bytes) { return f.bottom - bytes / ticks.top_bytes * (f.bottom - f.top); };
  std::string svg = svg_open("bar-chart", chart.width, chart.height, chart.title);
  auto out = std::back_inserter(svg);
  draw_y_axis(svg, f, ticks, chart.y_label);
  const double band = (f.right - f.left) / static_cast<double>(std::max<std::size_t>(chart.bars.size(), 1));
  const double width = std::min(64.0, band * 0.6);
  for (std::size_t i = 0; i < chart.bars.size(); ++i) {
    const auto& bar = chart.bars[i];
    const double cx = f.left + band * (static_cast<double>(i) + 0.5);
    fmt::format_to(out, R"(<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>)", num(cx),
                   num(f.bottom + 16), escape_html(bar.label));
    if (bar.missing) {
      fmt::format_to(out, R"(<text class="missing" x="{}" y="{}" text-anchor="middle">{}</text>)", num(cx),
                     num(f.bottom - 8), escape_html(bar.missing_text));
      continue;
    }
    fmt::format_to(out, R"(<g class="bar">)");
    double base = 0.0;
    for (std::size_t l = 0; l < bar.layers.size() && l < chart.layer_names.size(); ++l) {
      const double v = bar.layers[l];
      if (v <= 0) continue;
      fmt::format_to(out, R"(<rect class="layer" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}, {}: {} )"
                          R"(({:.0f} bytes)</title></rect>)",
                     num(cx - width / 2), num(y(base + v)), num(width), num(y(base) - y(base + v)),
                     chart.layer_colors[l % chart.layer_colors.size()], escape_html(bar.label),
                     escape_html(chart.layer_names[l]), format_bytes(std::llround(v)), v);
      base += v;
    }
    for (std::size_t m = 0; m < bar.marks.size() && m < chart.mark_names.size(); ++m) {
      const bool dashed = m < chart.mark_styles.size() && chart.mark_styles[m] == "dashed";
      fmt::format_to(out, R"(<line class="mark" x1="{}" x2="{}" y1="{}" y2="{}"{}><title>{}, {}: {} ({:.0f} bytes))"
                          R"(</title></line>)",
                     num(cx - width / 2 - 8), num(cx + width / 2 + 8), num(y(bar.marks[m])), num(y(bar.marks[m])),
                     dashed ? R"( stroke-dasharray="5 3")" : "", escape_html(bar.label),
                     escape_html(chart.mark_names[m]), format_bytes(std::llround(bar.marks[m])), bar.marks[m]);
    }
    fmt::format_to(out, "</g>");
  }
  int row = 0;
  for (std::size_t l = chart.layer_names.size(); l-- > 0;) {  // legend top-down as the stack reads
    const double ly = f.top + 6 + 20.0 * row++;
    fmt::format_to(out, R"(<g class="legend-item"><rect x="{}" y="{}" width="14" height="14" rx="2" fill="{}"/>)"
                        R"(<text x="{}" y="{}">{}</text></g>)",
                   num(f.right + 14), num(ly), chart.layer_colors[l % chart.layer_colors.size()], num(f.right + 34),
                   num(ly + 11), escape_html(chart.layer_names[l]));
  }
  for (std::size_t m = 0; m < chart.mark_names.size(); ++m) {
    const double ly = f.top + 6 + 20.0 * row++;
    const bool dashed = m < chart.mark_styles.size() && chart.mark_styles[m] == "dashed";
    fmt::format_to(out, R"(<g class="legend-item"><line class="mark" x1="{}" x2="{}" y1="{}" y2="{}"{}/>)"
                        R"(<text x="{}" y="{}">{}</text></g>)",
                   num(f.right + 10), num(f.right + 30), num(ly + 7), num(ly + 7),
                   dashed ? R"( stroke-dasharray="5 3")" : "", num(f.right + 34), num(ly + 11),
                   escape_html(chart.mark_names[m]));
  }
  svg += "</svg>";
  return "<figure class=\"chart\">" + svg + "</figure>";
}

}  // namespace memgate
