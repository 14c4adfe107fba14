// The --memory-plot renderer (cli/memory_plot.h): the SVG is well-formed XML (checked
// by a small parser below), self-contained (no script, no external reference), has one
// filled path per kind of memory, puts the budget line at the height of a stack that
// reaches exactly the budget and the predicted peak halfway when it is half the budget,
// escapes the title, and an empty sample list is refused with a clear error and no file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

// The renderer lives in the CLI (tools/), which is no library: compile it into this test.
#include "../cli/memory_plot.cpp"

namespace {

using ls::exec::MemorySample;
using ls::cli::MemoryPlotInput;

constexpr uint64_t MiB = 1ull << 20, GiB = 1ull << 30;

// ---- a small XML checker ----------------------------------------------------------------
struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // character data directly inside (entities decoded)
};

struct Xml {
  bool ok = false;
  std::string error;
  std::vector<Element> elements;  // document order
  std::string root;
};

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.'; }

// Decodes entities of `s`; false on a bare '&' or an unknown entity, or a '<'.
bool decode(const std::string& s, std::string* out) {
  static const std::map<std::string, char> kEnt = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') return false;
    if (s[i] != '&') {
      *out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string::npos) return false;
    auto it = kEnt.find(s.substr(i + 1, semi - i - 1));
    if (it == kEnt.end()) return false;
    *out += it->second;
    i = semi;
  }
  return true;
}

// Elements, attributes (quoted, unique), entities, nesting and a single root; a prolog
// <?xml ...?> is allowed at the start. Enough for the renderer's output (no CDATA,
// comments or doctype, which it never writes).
Xml parse_xml(const std::string& s) {
  Xml x;
  auto fail = [&](const std::string& why, size_t at) {
    x.ok = false;
    x.error = why + " at byte " + std::to_string(at);
    return x;
  };
  size_t i = 0;
  if (s.compare(0, 5, "<?xml") == 0) {
    i = s.find("?>");
    if (i == std::string::npos) return fail("unterminated prolog", 0);
    i += 2;
  }
  std::vector<size_t> open;  // indices into elements
  int roots = 0;
  while (i < s.size()) {
    const size_t lt = s.find('<', i);
    const std::string chunk = s.substr(i, (lt == std::string::npos ? s.size() : lt) - i);
    std::string text;
    if (!decode(chunk, &text)) return fail("bad character data", i);
    if (open.empty()) {
      if (chunk.find_first_not_of(" \t\r\n") != std::string::npos) return fail("text outside the root", i);
    } else {
      x.elements[open.back()].text += text;
    }
    if (lt == std::string::npos) break;
    i = lt + 1;
    if (i < s.size() && s[i] == '/') {  // end tag
      size_t j = i + 1;
      while (j < s.size() && name_char(s[j])) ++j;
      const std::string name = s.substr(i + 1, j - i - 1);
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size() || s[j] != '>') return fail("bad end tag", i);
      if (open.empty() || x.elements[open.back()].name != name) return fail("mismatched </" + name + ">", i);
      open.pop_back();
      i = j + 1;
      continue;
    }
    size_t j = i;
    while (j < s.size() && name_char(s[j])) ++j;
    if (j == i) return fail("bad tag name", i);
    Element e;
    e.name = s.substr(i, j - i);
    bool self_closing = false;
    for (;;) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return fail("unterminated tag", i);
      if (s[j] == '>') {
        ++j;
        break;
      }
      if (s[j] == '/') {
        if (j + 1 >= s.size() || s[j + 1] != '>') return fail("bad '/'", j);
        self_closing = true;
        j += 2;
        break;
      }
      size_t k = j;
      while (k < s.size() && name_char(s[k])) ++k;
      if (k == j || k >= s.size() || s[k] != '=') return fail("bad attribute", j);
      const std::string an = s.substr(j, k - j);
      const char q = s[k + 1];
      if (q != '"' && q != '\'') return fail("unquoted attribute " + an, k);
      const size_t end = s.find(q, k + 2);
      if (end == std::string::npos) return fail("unterminated attribute " + an, k);
      std::string v;
      if (!decode(s.substr(k + 2, end - k - 2), &v)) return fail("bad attribute value of " + an, k);
      if (!e.attrs.emplace(an, v).second) return fail("duplicate attribute " + an, j);
      j = end + 1;
    }
    if (open.empty()) {
      ++roots;
      x.root = e.name;
    }
    x.elements.push_back(e);
    if (!self_closing) open.push_back(x.elements.size() - 1);
    i = j;
  }
  if (!open.empty()) return fail("unclosed <" + x.elements[open.back()].name + ">", s.size());
  if (roots != 1) return fail("expected one root element, got " + std::to_string(roots), 0);
  x.ok = true;
  return x;
}

std::vector<const Element*> select(const Xml& x, const std::string& name, const std::string& cls = "") {
  std::vector<const Element*> r;
  for (const auto& e : x.elements)
    if (e.name == name && (cls.empty() || (e.attrs.count("class") && e.attrs.at("class") == cls))) r.push_back(&e);
  return r;
}

// The y coordinates of a path's "M x,y L x,y ..." data.
std::vector<double> path_ys(const std::string& d) {
  std::vector<double> ys;
  std::istringstream in(d);
  std::string tok;
  while (in >> tok) {
    if (tok == "Z") continue;
    const size_t comma = tok.find(',');
    if (comma == std::string::npos) continue;
    ys.push_back(std::stod(tok.substr(comma + 1)));
  }
  return ys;
}

// A run of `blocks` blocks, attention then MLP, with an embedding and a final phase:
// weights, slots, tables and workspace constant, activations rising with the block
// phases, K/V chunks during attention.
std::vector<MemorySample> run_samples(int64_t blocks, uint64_t scale) {
  std::vector<MemorySample> v;
  auto add = [&](const std::string& phase, int64_t block, uint64_t act, uint64_t kv) {
    MemorySample s;
    s.phase = phase;
    s.block = block;
    s.weights = 3 * scale;
    s.slots = 2 * scale;
    s.adaln = scale / 2;
    s.workspace = scale / 4;
    s.activations = act;
    s.kv = kv;
    s.held = s.weights + s.slots + s.adaln + s.workspace + s.activations;
    v.push_back(s);
  };
  add("embed", -1, scale, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    add("attention", b, 3 * scale, scale);
    add("mlp", b, 2 * scale, 0);
  }
  add("final", -1, scale, 0);
  return v;
}

uint64_t held_peak(const std::vector<MemorySample>& v) {
  uint64_t m = 0;
  for (const auto& s : v) m = std::max(m, s.held);
  return m;
}

}  // namespace

TEST(MemoryPlot, WellFormedSelfContainedOnePathPerKind) {
  MemoryPlotInput in;
  in.title = "forward, S 8 234, --vram-budget 4 GiB <test> & \"quotes\"";
  in.samples = run_samples(12, 100 * MiB);
  in.budget_bytes = 4 * GiB;
  in.predicted_peak_bytes = held_peak(in.samples) + 10 * MiB;
  const std::string svg = ls::cli::memory_plot_svg(in);
  const Xml x = parse_xml(svg);
  ASSERT_TRUE(x.ok) << x.error;
  EXPECT_EQ(x.root, "svg");
  EXPECT_EQ(select(x, "svg")[0]->attrs.at("xmlns"), "http://www.w3.org/2000/svg");
  // Self-contained: no script, no event handler, no external reference.
  EXPECT_TRUE(select(x, "script").empty());
  for (const auto& e : x.elements)
    for (const auto& [k, v] : e.attrs) {
      EXPECT_NE(k.rfind("on", 0), 0u) << e.name << " " << k;
      EXPECT_EQ(k.find("href"), std::string::npos) << e.name << " " << k;
    }
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // The title, escaped and read back.
  ASSERT_EQ(select(x, "title").size(), 1u);
  EXPECT_EQ(select(x, "title")[0]->text, in.title);

  // One filled path per kind, named, in stack order; "arena headroom" only when held counts more.
  const auto paths = select(x, "path", "kind");
  std::vector<std::string> kinds;
  for (const auto* p : paths) kinds.push_back(p->attrs.at("data-kind"));
  EXPECT_EQ(kinds, (std::vector<std::string>{"weights", "slots", "AdaLN tables", "workspace", "activations", "K/V chunks"}));
  for (const auto* p : paths) EXPECT_FALSE(p->attrs.at("fill").empty());
  // Each kind's name appears in the legend with its largest value.
  std::string all_text;
  for (const auto& e : x.elements) all_text += e.text + "\n";
  for (const auto& k : kinds) EXPECT_NE(all_text.find(k + "  "), std::string::npos) << k;
  EXPECT_NE(all_text.find("weights  300 MiB"), std::string::npos) << all_text;
  EXPECT_NE(all_text.find("budget 4.00 GiB"), std::string::npos) << all_text;
  // Block numbers on the x axis and 1024-based units on the y axis.
  EXPECT_NE(all_text.find("\n0\n"), std::string::npos);
  EXPECT_NE(all_text.find(" GiB\n"), std::string::npos);
  EXPECT_NE(all_text.find("DiT block"), std::string::npos);

  MemoryPlotInput more = in;
  more.samples[3].held += 50 * MiB;  // 50 MiB the kinds do not name
  const Xml y = parse_xml(ls::cli::memory_plot_svg(more));
  ASSERT_TRUE(y.ok) << y.error;
  ASSERT_EQ(select(y, "path", "kind").size(), 7u);
  EXPECT_EQ(select(y, "path", "kind").back()->attrs.at("data-kind"), "arena headroom");
}

TEST(MemoryPlot, BudgetLineAtTheHeightOfAStackThatReachesIt) {
  // The stack's top reaches the budget exactly at its peak sample, and the predicted
  // peak is half the budget: the budget line is at the top of the stack, the dashed line
  // halfway between it and the zero line (the bottom of the lowest path).
  MemoryPlotInput in;
  in.samples = run_samples(5, 64 * MiB);
  const uint64_t peak = held_peak(in.samples);
  in.budget_bytes = peak;
  in.predicted_peak_bytes = peak / 2;
  const Xml x = parse_xml(ls::cli::memory_plot_svg(in));
  ASSERT_TRUE(x.ok) << x.error;
  double top = 1e9, zero = -1e9;
  for (const auto* p : select(x, "path", "kind"))
    for (double v : path_ys(p->attrs.at("d"))) top = std::min(top, v), zero = std::max(zero, v);
  ASSERT_LT(top, zero - 100);  // a tall plot: the check below is not trivially within tolerance
  const auto budget = select(x, "line", "budget");
  ASSERT_EQ(budget.size(), 1u);
  EXPECT_NEAR(std::stod(budget[0]->attrs.at("y1")), top, 0.11);
  EXPECT_EQ(budget[0]->attrs.at("y1"), budget[0]->attrs.at("y2"));  // horizontal
  const auto pred = select(x, "line", "predicted");
  ASSERT_EQ(pred.size(), 1u);
  EXPECT_NEAR(std::stod(pred[0]->attrs.at("y1")), (top + zero) / 2, 0.2);
  EXPECT_FALSE(pred[0]->attrs.at("stroke-dasharray").empty());

  // No budget given: no budget line, no dashed line.
  MemoryPlotInput none = in;
  none.budget_bytes = 0;
  none.predicted_peak_bytes = 0;
  const Xml y = parse_xml(ls::cli::memory_plot_svg(none));
  ASSERT_TRUE(y.ok) << y.error;
  EXPECT_TRUE(select(y, "line", "budget").empty());
  EXPECT_TRUE(select(y, "line", "predicted").empty());
}

TEST(MemoryPlot, StackedHeightsFollowTheSamples) {
  // Two samples, the second with twice the activations: the activations path is twice as
  // tall in the second column; the weights path is equally tall in both.
  MemorySample a;
  a.phase = "attention";
  a.block = 0;
  a.weights = 100 * MiB;
  a.activations = 50 * MiB;
  a.held = 150 * MiB;
  MemorySample b = a;
  b.phase = "mlp";
  b.activations = 100 * MiB;
  b.held = 200 * MiB;
  MemoryPlotInput in;
  in.samples = {a, b};
  const Xml x = parse_xml(ls::cli::memory_plot_svg(in));
  ASSERT_TRUE(x.ok) << x.error;
  const Element* w = nullptr;
  const Element* act = nullptr;
  for (const auto* p : select(x, "path", "kind")) {
    if (p->attrs.at("data-kind") == "weights") w = p;
    if (p->attrs.at("data-kind") == "activations") act = p;
  }
  ASSERT_TRUE(w && act);
  // Path layout: M (top of column 0), L (end of column 0), L (top of column 1), L (end of
  // column 1), L (bottom at the end), L ... back along the bottom.
  const std::vector<double> wy = path_ys(w->attrs.at("d")), ay = path_ys(act->attrs.at("d"));
  ASSERT_GE(ay.size(), 8u);
  const double zero = *std::max_element(wy.begin(), wy.end());
  const double w_h = zero - wy[0];
  EXPECT_GT(w_h, 50);
  EXPECT_NEAR(zero - wy[2], w_h, 0.11);  // weights: same height in both columns
  // activations column 0: from wy[0] up to ay[0]; column 1: from wy[2] up to ay[2].
  const double h0 = wy[0] - ay[0], h1 = wy[2] - ay[2];
  EXPECT_NEAR(h0 * 2, w_h, 0.25);
  EXPECT_NEAR(h1, w_h, 0.25);
}

TEST(MemoryPlot, EmptySamplesAreAClearErrorAndNoFile) {
  MemoryPlotInput in;
  in.title = "empty";
  in.budget_bytes = GiB;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ls_plot_" + std::to_string(getpid()) + "_empty.svg")).string();
  std::filesystem::remove(path);
  const ls::Status s = ls::cli::write_memory_plot(path, in);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ls::ErrorCode::not_found);  // a run-time condition: exit 1
  EXPECT_NE(s.error().message.find("no memory samples"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
  EXPECT_FALSE(std::filesystem::exists(path));
  // The SVG text itself still renders (a preview never breaks): it says there is nothing.
  const std::string svg = ls::cli::memory_plot_svg(in);
  const Xml x = parse_xml(svg);
  ASSERT_TRUE(x.ok) << x.error;
  EXPECT_TRUE(select(x, "path", "kind").empty());
  EXPECT_NE(svg.find("no memory samples"), std::string::npos);
}

TEST(MemoryPlot, WritesTheSvgToTheFile) {
  MemoryPlotInput in;
  in.title = "write";
  in.samples = run_samples(3, 10 * MiB);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ls_plot_" + std::to_string(getpid()) + "_write.svg")).string();
  ASSERT_TRUE(ls::cli::write_memory_plot(path, in).ok());
  std::ifstream f(path, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, ls::cli::memory_plot_svg(in));
  std::filesystem::remove(path);
}

TEST(MemoryPlot, ManyBlocksAndForwardsStayReadable) {
  // 50 blocks x 3 forwards: labels thinned so neighbours stay >= 26 px apart; every
  // coordinate inside the picture.
  MemoryPlotInput in;
  for (int f = 0; f < 3; ++f) {
    auto v = run_samples(50, 700 * MiB);
    in.samples.insert(in.samples.end(), v.begin(), v.end());
  }
  in.budget_bytes = 8 * GiB;
  const std::string svg = ls::cli::memory_plot_svg(in);
  const Xml x = parse_xml(svg);
  ASSERT_TRUE(x.ok) << x.error;
  std::vector<double> label_x;
  for (const auto* t : select(x, "text"))
    if (!t->text.empty() && std::all_of(t->text.begin(), t->text.end(), ::isdigit) && t->attrs.count("x"))
      label_x.push_back(std::stod(t->attrs.at("x")));
  ASSERT_GT(label_x.size(), 5u);
  for (size_t i = 1; i < label_x.size(); ++i) EXPECT_GE(label_x[i] - label_x[i - 1], 26 - 1e-9);
  for (const auto* p : select(x, "path", "kind"))
    for (double y : path_ys(p->attrs.at("d"))) {
      EXPECT_GE(y, 0);
      EXPECT_LE(y, std::stod(select(x, "svg")[0]->attrs.at("height")));
    }
  EXPECT_NE(svg.find("3 forwards"), std::string::npos);
}
