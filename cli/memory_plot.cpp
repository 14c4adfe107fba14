// The --memory-plot renderer (memory_plot.h): device memory over a run as a stacked-area
// SVG. Plain text assembly, no library: one <path> per kind, axes, budget lines, legend.
//
// Geometry: samples are drawn as steps in run order, sample i filling the column
// [i, i + 1) of n (each sample is what the arenas held when a phase ended, so the value
// holds over that phase). Kinds stack bottom-up from the steady ones to the changing
// ones: weights, slots, AdaLN tables, workspace, activations (without the K/V chunks),
// K/V chunks, and "arena headroom" (held minus the kinds: mostly the activation arena's
// capacity, reserved at the plan's peak, beyond what the phase used) only when a sample
// has any. The y axis
// is 1024-based (KiB / MiB / GiB / TiB) with 1-2-2.5-5 ticks; it runs to the largest of
// the peak held, the budget and the predicted peak, plus 6 %.
#include "memory_plot.h"  // cli/memory_plot.h (same folder: tests compile this file too)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "io/output_file.h"

namespace ls::cli {
namespace {

constexpr double kWidth = 1000, kHeight = 560;
constexpr double kLeft = 84, kRight = 214, kTop = 64, kBottom = 78;  // margins around the plot area
// A white outline behind a label drawn over the areas, so it stays legible.
constexpr const char* kHalo = "stroke=\"#ffffff\" stroke-width=\"3\" stroke-opacity=\"0.85\" paint-order=\"stroke\"";
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

struct Kind {
  const char* name;
  const char* color;  // Okabe-Ito palette (distinguishable with colour-vision deficiencies)
};
// Stack order, bottom first. The legend lists them top first, as they appear.
constexpr Kind kKinds[] = {
    {"weights", "#0072B2"},  {"slots", "#56B4E9"},      {"AdaLN tables", "#009E73"}, {"workspace", "#999999"},
    {"activations", "#E69F00"}, {"K/V chunks", "#CC79A7"}, {"arena headroom", "#F0E442"},
};
constexpr int kNumKinds = sizeof kKinds / sizeof kKinds[0];
constexpr int kOther = kNumKinds - 1;

// Bytes of each kind of one sample (activations without the K/V chunks, which live in
// the same arena; "arena headroom" = whatever `held` counts beyond the kinds: the
// activation arena is allocated at the plan's predicted peak, so a phase that uses less
// leaves the rest reserved but unused).
std::vector<uint64_t> kinds_of(const exec::MemorySample& s) {
  const uint64_t act = s.activations > s.kv ? s.activations - s.kv : 0;
  const uint64_t kv = std::min(s.kv, s.activations);
  const uint64_t sum = s.weights + s.slots + s.adaln + s.workspace + s.activations;
  return {s.weights, s.slots, s.adaln, s.workspace, act, kv, s.held > sum ? s.held - sum : 0};
}

std::string escape(const std::string& t) {
  std::string r;
  for (char c : t) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      case '\'': r += "&apos;"; break;
      default:
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') r += ' ';
        else r += c;
    }
  }
  return r;
}

std::string num(double v) {  // coordinates: 0.1 px
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// 1024-based units: the largest whose value is >= 1 (B, KiB, MiB, GiB, TiB).
struct Unit {
  double bytes;
  const char* name;
};
Unit unit_for(double v) {
  static constexpr Unit kUnits[] = {{1.0, "B"}, {1024.0, "KiB"}, {1048576.0, "MiB"}, {1073741824.0, "GiB"},
                                    {1099511627776.0, "TiB"}};
  Unit u = kUnits[0];
  for (const Unit& c : kUnits)
    if (v >= c.bytes) u = c;
  return u;
}

// "8 GiB", "2.5 GiB", "735.0 MiB": a value in its own unit, 3 significant digits.
std::string size_text(uint64_t b) {
  const Unit u = unit_for(static_cast<double>(b));
  const double v = static_cast<double>(b) / u.bytes;
  char s[48];
  if (u.bytes == 1.0) std::snprintf(s, sizeof s, "%llu B", static_cast<unsigned long long>(b));
  else if (v >= 100) std::snprintf(s, sizeof s, "%.0f %s", v, u.name);
  else if (v >= 10) std::snprintf(s, sizeof s, "%.1f %s", v, u.name);
  else std::snprintf(s, sizeof s, "%.2f %s", v, u.name);
  return s;
}

// Tick step in bytes: 1, 2, 2.5 or 5 x 10^k of the axis' unit, for about 5-8 ticks.
struct Ticks {
  Unit unit;
  double step;  // bytes
};
Ticks ticks_for(double top) {
  const Unit u = unit_for(top);
  const double span = top / u.bytes;
  const double raw = span / 6.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double m = 1;
  for (double c : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (c * p >= raw) {
      m = c;
      break;
    }
  return {u, m * p * u.bytes};
}

std::string tick_label(double bytes, const Unit& u) {
  char s[48];
  const double v = bytes / u.bytes;
  if (std::fabs(v - std::round(v)) < 1e-9) std::snprintf(s, sizeof s, "%.0f %s", v, u.name);
  else std::snprintf(s, sizeof s, "%g %s", v, u.name);
  return s;
}

std::string short_phase(const std::string& p) {
  if (p == "attention") return "attn";
  return p;
}

std::string svg_text(double x, double y, const std::string& t, const std::string& attrs = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (attrs.empty() ? "" : " " + attrs) + ">" + escape(t) +
         "</text>\n";
}

std::string header(const std::string& title, const std::string& desc) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" + num(kHeight) +
         "\" viewBox=\"0 0 " + num(kWidth) + " " + num(kHeight) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n<title>" + escape(title) +
         "</title>\n<desc>" + escape(desc) + "</desc>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
}

}  // namespace

namespace {

// The stacked kinds per sample: the top of each kind's band, each kind's largest value,
// the peak and where it was.
struct Stack {
  std::vector<std::vector<uint64_t>> top;
  std::vector<uint64_t> kind_max;
  uint64_t peak = 0;
  size_t peak_at = 0;
  int kinds = 0;  // kinds drawn ("other" only when it occurs)
};

Stack stack_of(const std::vector<exec::MemorySample>& samples) {
  const size_t n = samples.size();
  Stack st;
  st.top.assign(kNumKinds, std::vector<uint64_t>(n));
  st.kind_max.assign(kNumKinds, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<uint64_t> k = kinds_of(samples[i]);
    uint64_t acc = 0;
    for (int j = 0; j < kNumKinds; ++j) {
      acc += k[j];
      st.top[j][i] = acc;
      st.kind_max[j] = std::max(st.kind_max[j], k[j]);
    }
    if (acc > st.peak) st.peak = acc, st.peak_at = i;
  }
  st.kinds = st.kind_max[kOther] > 0 ? kNumKinds : kNumKinds - 1;
  return st;
}

// Bytes and sample index to picture coordinates.
struct Frame {
  size_t n = 0;
  double ymax = 1, cw = 1;
  double Y(double bytes) const { return kTop + kPlotH - bytes / ymax * kPlotH; }
  double X(size_t i) const { return kLeft + cw * static_cast<double>(i); }
};

// Grid and y axis.
std::string y_axis(const Frame& f, const Ticks& t) {
  std::string s = "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n";
  for (double v = t.step; v < f.ymax; v += t.step)
    s += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(f.Y(v)) + "\" x2=\"" + num(kLeft + kPlotW) + "\" y2=\"" +
         num(f.Y(v)) + "\"/>\n";
  s += "</g>\n<g font-size=\"11\" fill=\"#333333\" text-anchor=\"end\">\n";
  for (double v = 0; v < f.ymax; v += t.step) s += svg_text(kLeft - 6, f.Y(v) + 4, tick_label(v, t.unit));
  s += "</g>\n";
  s += svg_text(18, kTop + kPlotH / 2, "device memory (1024-based)",
                "font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + num(kTop + kPlotH / 2) + ")\"");
  return s;
}

// The stacked areas: one closed step path per kind, from its top down to the kind below.
std::string stacked_areas(const Frame& f, const Stack& st) {
  const size_t n = f.n;
  std::string s = "<g stroke=\"none\">\n";
  for (int j = 0; j < st.kinds; ++j) {
    // "M x,y L x,y ...": appended piece by piece (a few thousand points for 50 blocks).
    std::string d;
    auto to = [&d](char op, double x, double y) {
      if (!d.empty()) d += ' ';
      d += op;
      d += num(x);
      d += ',';
      d += num(y);
    };
    auto up = [&](size_t i) { return f.Y(static_cast<double>(st.top[j][i])); };
    auto low = [&](size_t i) { return f.Y(j == 0 ? 0.0 : static_cast<double>(st.top[j - 1][i])); };
    to('M', f.X(0), up(0));
    for (size_t i = 0; i < n; ++i) {
      to('L', f.X(i + 1), up(i));
      if (i + 1 < n) to('L', f.X(i + 1), up(i + 1));
    }
    to('L', f.X(n), low(n - 1));
    for (size_t i = n; i-- > 0;) {
      to('L', f.X(i), low(i));
      if (i > 0) to('L', f.X(i), low(i - 1));
    }
    d += " Z";
    s += "<path class=\"kind\" data-kind=\"" + escape(kKinds[j].name) + "\" fill=\"" + kKinds[j].color +
         "\" fill-opacity=\"0.9\" d=\"" + d + "\"/>\n";
  }
  s += "</g>\n";
  return s;
}

// x axis: a tick and the block number where a block's first phase starts (thinned to
// keep labels apart); faint lines where a new forward starts (the block index falls).
std::string x_axis(const Frame& f, const std::vector<exec::MemorySample>& samples) {
  const size_t n = f.n;
  const double cw = f.cw;
  std::string s = "<g stroke=\"#555555\" stroke-width=\"1\">\n<line x1=\"" + num(kLeft) + "\" y1=\"" +
                  num(kTop + kPlotH) + "\" x2=\"" + num(kLeft + kPlotW) + "\" y2=\"" + num(kTop + kPlotH) +
                  "\"/>\n<line x1=\"" + num(kLeft) + "\" y1=\"" + num(kTop) + "\" x2=\"" + num(kLeft) + "\" y2=\"" +
                  num(kTop + kPlotH) + "\"/>\n</g>\n";
  std::string labels, marks;
  // Wide columns (short runs): each column also names its phase.
  const bool wide = cw >= 34;
  double last_label = -1e9;
  int64_t prev_block = -1;  // the last block seen in the current forward
  int forwards = 1;
  for (size_t i = 0; i < n; ++i) {
    const exec::MemorySample& m = samples[i];
    // A new forward: its embedding, or a block index that falls (samples without one).
    if (i > 0 && (m.phase == "embed" || (m.block >= 0 && m.block < prev_block))) {
      ++forwards;
      prev_block = -1;
      marks += "<line x1=\"" + num(f.X(i)) + "\" y1=\"" + num(kTop) + "\" x2=\"" + num(f.X(i)) + "\" y2=\"" +
               num(kTop + kPlotH) + "\" stroke=\"#bbbbbb\" stroke-dasharray=\"2,3\"/>\n";
    }
    if (wide) labels += svg_text(f.X(i) + cw / 2, kTop + kPlotH + 14, short_phase(m.phase),
                                 "text-anchor=\"middle\" font-size=\"10\" fill=\"#666666\"");
    if (m.block < 0 || m.block == prev_block) continue;
    prev_block = m.block;
    const double x = f.X(i);
    marks += "<line x1=\"" + num(x) + "\" y1=\"" + num(kTop + kPlotH) + "\" x2=\"" + num(x) + "\" y2=\"" +
             num(kTop + kPlotH + (wide ? 18 : 4)) + "\" stroke=\"#555555\"/>\n";
    if (x - last_label >= 26) {
      labels += svg_text(x + (wide ? 3 : 0), kTop + kPlotH + (wide ? 28 : 16), (wide ? "block " : "") + std::to_string(m.block),
                         wide ? "" : "text-anchor=\"middle\"");
      last_label = x;
    }
  }
  s += marks + "<g font-size=\"11\" fill=\"#333333\">\n" + labels + "</g>\n";
  std::string xl = "DiT block (each block's phases in run order: attention, MLP)";
  if (forwards > 1) xl += "; " + std::to_string(forwards) + " forwards, dotted lines between them";
  s += svg_text(kLeft + kPlotW / 2, kTop + kPlotH + (wide ? 48 : 38), xl, "text-anchor=\"middle\" font-size=\"12\"");
  return s;
}

// Budget (solid) and the planner's predicted peak (dashed), labelled at the right end.
std::string budget_lines(const Frame& f, const MemoryPlotInput& in) {
  std::string s;
  double budget_label_y = -1;
  if (in.budget_bytes) {
    const double y = f.Y(static_cast<double>(in.budget_bytes));
    s += "<line class=\"budget\" x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kLeft + kPlotW) +
         "\" y2=\"" + num(y) + "\" stroke=\"#D55E00\" stroke-width=\"2\"/>\n";
    budget_label_y = y - 5;
    s += svg_text(kLeft + kPlotW - 4, budget_label_y, "budget " + size_text(in.budget_bytes),
                  "text-anchor=\"end\" fill=\"#D55E00\" font-weight=\"bold\" " + std::string(kHalo));
  }
  if (in.predicted_peak_bytes) {
    const double y = f.Y(static_cast<double>(in.predicted_peak_bytes));
    s += "<line class=\"predicted\" x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kLeft + kPlotW) +
         "\" y2=\"" + num(y) + "\" stroke=\"#000000\" stroke-width=\"1.5\" stroke-dasharray=\"7,4\"/>\n";
    // Above the line, unless that collides with the budget's label: then below it.
    double ly = y - 5;
    if (budget_label_y >= 0 && std::fabs(ly - budget_label_y) < 14) ly = y + 15;
    s += svg_text(kLeft + 6, ly, "predicted peak " + size_text(in.predicted_peak_bytes), "fill=\"#000000\" " + std::string(kHalo));
  }
  return s;
}

// Legend: top of the stack first; each kind with its largest value over the run.
std::string legend(const Stack& st, const MemoryPlotInput& in, const std::string& where) {
  const std::vector<uint64_t>& kind_max = st.kind_max;
  const int kinds = st.kinds;
  const uint64_t peak = st.peak;
  std::string s;
  const double lx = kLeft + kPlotW + 18;
  double ly = kTop + 4;
  s += "<g font-size=\"12\" fill=\"#222222\">\n";
  s += svg_text(lx, ly + 8, "kind (largest)", "font-weight=\"bold\"");
  ly += 22;
  for (int j = kinds - 1; j >= 0; --j) {
    s += "<rect x=\"" + num(lx) + "\" y=\"" + num(ly - 10) + "\" width=\"14\" height=\"14\" fill=\"" + kKinds[j].color +
         "\"/>\n";
    if (kind_max[j] == 0) s += svg_text(lx + 20, ly + 1, std::string(kKinds[j].name) + "  none", "fill=\"#999999\"");
    else s += svg_text(lx + 20, ly + 1, std::string(kKinds[j].name) + "  " + size_text(kind_max[j]));
    ly += 20;
  }
  ly += 8;
  if (in.budget_bytes) {
    s += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 3) + "\" x2=\"" + num(lx + 14) + "\" y2=\"" + num(ly - 3) +
         "\" stroke=\"#D55E00\" stroke-width=\"2\"/>\n" + svg_text(lx + 20, ly + 1, "budget");
    ly += 20;
  }
  if (in.predicted_peak_bytes) {
    s += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 3) + "\" x2=\"" + num(lx + 14) + "\" y2=\"" + num(ly - 3) +
         "\" stroke=\"#000000\" stroke-width=\"1.5\" stroke-dasharray=\"4,2\"/>\n" +
         svg_text(lx + 20, ly + 1, "predicted peak");
    ly += 20;
  }
  s += svg_text(lx, ly + 6, "peak held " + size_text(peak), "font-weight=\"bold\"");
  s += svg_text(lx, ly + 22, "at " + where, "fill=\"#444444\"");
  return s;
}

}  // namespace

std::string memory_plot_svg(const MemoryPlotInput& in) {
  const std::string title = in.title.empty() ? std::string("LayerStream device memory") : in.title;
  const size_t n = in.samples.size();
  if (n == 0) {
    return header(title, "no memory samples were recorded") +
           svg_text(kWidth / 2, kHeight / 2, "no memory samples were recorded", "text-anchor=\"middle\" font-size=\"16\"") +
           "</svg>\n";
  }
  const Stack st = stack_of(in.samples);
  Frame f;
  f.n = n;
  f.ymax = std::max<double>({1.0, static_cast<double>(st.peak), static_cast<double>(in.budget_bytes),
                             static_cast<double>(in.predicted_peak_bytes)}) * 1.06;
  f.cw = kPlotW / static_cast<double>(n);
  const Ticks t = ticks_for(f.ymax);

  const exec::MemorySample& ps = in.samples[st.peak_at];
  const std::string where =
      ps.block >= 0 ? "block " + std::to_string(ps.block) + " " + ps.phase : ps.phase;
  std::string desc = "Stacked device memory per kind over " + std::to_string(n) + " phase samples; peak held " +
                     size_text(st.peak) + " (" + where + ")";
  if (in.budget_bytes) desc += "; budget " + size_text(in.budget_bytes);
  if (in.predicted_peak_bytes) desc += "; predicted peak " + size_text(in.predicted_peak_bytes);
  std::string s = header(title, desc);
  // 16 px bold unless the title would run past the picture (about 0.62 em per character).
  const double title_px = std::clamp((kWidth - kLeft - 10) / (0.62 * static_cast<double>(title.size())), 10.0, 16.0);
  s += svg_text(kLeft, 26, title, "font-size=\"" + num(title_px) + "\" font-weight=\"bold\"");
  s += svg_text(kLeft, 46, desc.substr(desc.find("peak held")), "font-size=\"12\" fill=\"#444444\"");
  s += y_axis(f, t);
  s += stacked_areas(f, st);
  s += x_axis(f, in.samples);
  s += budget_lines(f, in);
  s += legend(st, in, where);
  s += "</g>\n</svg>\n";
  return s;
}

Status write_memory_plot(const std::string& path, const MemoryPlotInput& in) {
  if (in.samples.empty())
    // A run-time condition, not a bad flag (exit 1 in the CLI): nothing was recorded.
    return make_error(ErrorCode::not_found,
                      "--memory-plot " + path +
                          ": no memory samples were recorded (the run did no forward, or the engine was not asked "
                          "to record memory: EngineOptions::record_memory); nothing written");
  return io::write_output_file(path, memory_plot_svg(in), "--memory-plot");
}

}  // namespace ls::cli
