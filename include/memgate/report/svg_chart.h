// Charts as inline SVG for memgate's HTML reports: line charts of bytes against batch size, stacked bars. No
// script and no network at view time; each data point carries a <title>, which browsers show on hover.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memgate {

/// `text` with each byte that is not part of valid UTF-8 (a file name of another encoding) replaced by U+FFFD, the
/// rest kept: what every report writes of a name, so that it stays recognisable and the file well-formed.
[[nodiscard]] std::string valid_utf8(std::string_view text);

/// `text` safe inside HTML or SVG text and attribute values (valid UTF-8, valid_utf8's).
[[nodiscard]] std::string escape_html(std::string_view text);

/// One line of a line chart.
struct ChartSeries {
  std::string name;    ///< legend text
  std::string color;   ///< CSS colour
  struct Point {
    std::int64_t batch_size;
    double bytes;
    std::string title;  ///< hover text; "" for the default (name, batch size, bytes)
  };
  std::vector<Point> points;
  bool dashed = false;
};

/// A level drawn across a chart: a GPU's usable memory.
struct ChartLevel {
  std::string label;
  double bytes = 0.0;
};

struct LineChart {
  std::string title;
  std::string x_label = "batch size";
  std::string y_label = "memory";
  std::vector<ChartSeries> series;
  std::vector<ChartLevel> levels;  ///< drawn when below `level_reach` x the largest point (else listed under it)
  double level_reach = 2.0;
  int width = 760;
  int height = 380;
  /// A linear x axis with evenly spaced ticks (an event index, a time), for many points: no marker per point.
  bool linear_x = false;
};

/// The chart as a <figure> holding an <svg class="memgate-chart line-chart">: a log2 batch-size axis when the batch
/// sizes span a factor of 4 or more (else linear), a byte axis in binary units from 0, one <g class="series"> per
/// series with a data-series attribute (the report's legend toggles them), and a caption listing the levels too far
/// above the data to draw.
[[nodiscard]] std::string render_line_chart(const LineChart& chart);

/// One bar of a stacked bar chart.
struct StackedBar {
  std::string label;                ///< under the bar: "bs 8"
  std::vector<double> layers;       ///< bytes of each layer, bottom first
  std::vector<double> marks;        ///< bytes of each mark (a tick across the bar), as StackedBars::mark_names
  bool missing = false;             ///< drawn as "OOM" instead of a bar
  std::string missing_text = "OOM";
};

struct StackedBars {
  std::string title;
  std::string y_label = "memory";
  std::vector<std::string> layer_names;
  std::vector<std::string> layer_colors;
  std::vector<std::string> mark_names;   ///< e.g. "step peak (allocated)"
  std::vector<std::string> mark_styles;  ///< "solid" or "dashed", per mark
  std::vector<StackedBar> bars;
  int width = 760;
  int height = 380;
};

/// The bars as a <figure> holding an <svg class="memgate-chart bar-chart">, each layer a <rect class="layer"> with its
/// bytes as hover text, each mark a line across its bar.
[[nodiscard]] std::string render_stacked_bars(const StackedBars& chart);

/// Axis ticks for [0, max_bytes]: multiples of 1, 2, 2.5 or 5 x 10^k of the binary unit that fits (B, KiB, MiB,
/// GiB, TiB), at most `max_ticks` + 1 of them, the last at or above max_bytes.
struct ByteTicks {
  double step_bytes = 1.0;
  double top_bytes = 1.0;
  std::string unit;     ///< "MiB"
  double unit_bytes = 1.0;
  [[nodiscard]] std::string label(double bytes) const;  ///< "2.5 MiB"
};
[[nodiscard]] ByteTicks byte_ticks(double max_bytes, int max_ticks = 6);

}  // namespace memgate
