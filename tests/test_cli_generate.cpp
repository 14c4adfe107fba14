// `layerstream generate` end to end: the built binary (LS_TOOL_PATH) on the built-in
// demonstration and the tiny preset; outputs readable, plans byte-identical, bad
// inputs rejected (exit 2 for flags, 1 for files) with a message and no output file.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "file_test_util.h"
#include "io/safetensors.h"

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

using ls::test::read_all;

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

class CliGenerate : public ls::test::TempDirTest {
 protected:
  CliGenerate() : TempDirTest("ls_cli_generate") {}
  std::string path(const std::string& name) const { return file(name); }

  Result run(const std::string& args) {
    Result r;
    const std::string out = path("stdout.txt"), err = path("stderr.txt");
    const std::string cmd = std::string(LS_TOOL_PATH) + " generate " + args + " > '" + out + "' 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_all(out);
    r.err = read_all(err);
    return r;
  }

  // A text-states file: "text" [L, 96] and optionally "negative" [Ln, 96] (tiny text_dim).
  std::string text_file(int64_t L, int64_t Ln, int64_t width = 96) {
    std::vector<float> t(static_cast<size_t>(L * width)), n(static_cast<size_t>(Ln * width));
    for (size_t i = 0; i < t.size(); ++i) t[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < n.size(); ++i) n[i] = std::cos(0.11f * static_cast<float>(i));
    std::vector<ls::NamedTensor> ts{{"text", ls::TensorView(t.data(), ls::DType::f32, {L, width})}};
    if (Ln > 0) ts.push_back({"negative", ls::TensorView(n.data(), ls::DType::f32, {Ln, width})});
    const std::string p = path("text_" + std::to_string(L) + "_" + std::to_string(Ln) + "_" + std::to_string(width) +
                               ".safetensors");
    EXPECT_TRUE(ls::write_safetensors(p, ts).ok());
    return p;
  }
};

// The tensors of an output file as raw bytes, checked for shape, dtype and content.
std::string latents_bytes(const std::string& file, const std::vector<int64_t>& vshape,
                          const std::vector<int64_t>& ashape) {
  auto r = ls::SafetensorsReader::open(file);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  std::string bytes;
  for (const char* name : {"video", "audio"}) {
    const ls::SafetensorsEntry* e = (*r)->find(name);
    EXPECT_NE(e, nullptr) << name;
    if (!e) return {};
    EXPECT_EQ(e->dtype, ls::DType::f32);
    EXPECT_EQ(e->shape, std::string(name) == "video" ? vshape : ashape) << name;
    const float* p = static_cast<const float*>((*r)->data(*e));
    double sq = 0;
    for (int64_t i = 0; i < e->numel(); ++i) {
      EXPECT_TRUE(std::isfinite(p[i])) << name << " " << i;
      sq += static_cast<double>(p[i]) * p[i];
    }
    EXPECT_GT(sq, 0.0) << name << " is all zeros";
    bytes.append(reinterpret_cast<const char*>(p), static_cast<size_t>(e->numel()) * 4);
  }
  return bytes;
}

}  // namespace

TEST_F(CliGenerate, BuiltinDemonstration) {
  // The README's main command (plus an output file and a report).
  const Result r = run("-o '" + path("out.safetensors") + "' --json '" + path("report.json") + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("byte-compare stock vs sliced: identical"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("video sigma (shift 12): 1, 0.972973, 0.923077, 0.8, 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("audio sigma (shift 3): 1, 0.9, 0.75, 0.5, 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[LayerStream] sliced: two-pass attention (128-row slices)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory: stock plan activation peak"), std::string::npos) << r.out;
  // Not a terminal: plain progress lines over steps x blocks (4 steps x 2 blocks).
  EXPECT_NE(r.err.find("sliced: 100% (8/8 block passes)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  // 22 frames at 256x256: T 7, latent 16x16, A 37.
  const std::string bytes = latents_bytes(path("out.safetensors"), {24, 7, 16, 16}, {32, 2, 37});
  EXPECT_EQ(bytes.size(), (24u * 7 * 16 * 16 + 32 * 2 * 37) * 4);
  const nlohmann::json j = nlohmann::json::parse(read_all(path("report.json")));
  EXPECT_TRUE(j["comparison"]["identical"].get<bool>());
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_TRUE(j["runs"][0]["plan"]["stock"].get<bool>());
  EXPECT_TRUE(j["runs"][1]["plan"]["two_pass_attention"].get<bool>());
  EXPECT_LT(j["runs"][1]["peaks"]["measured_bytes"].get<uint64_t>(), j["runs"][0]["peaks"]["measured_bytes"].get<uint64_t>());
  EXPECT_EQ(j["runs"][1]["forwards"].size(), 4u);
  EXPECT_EQ(j["runs"][0]["output"]["video_fnv1a64"], j["runs"][1]["output"]["video_fnv1a64"]);
}

TEST_F(CliGenerate, BuiltinWithCfgAndNegative) {
  const Result r = run("--cfg 3 --steps 2 --frames 5 --width 128 --height 64 -q");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("byte-compare stock vs sliced: identical"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 steps x 2 forwards = 4 forwards"), std::string::npos) << r.out;
}

TEST_F(CliGenerate, PresetTextFilePlansAreByteIdentical) {
  // Positive 5 tokens, negative 8 tokens (another packed layout), CFG 2.
  const std::string text = text_file(5, 8);
  const std::string common = "--preset tiny --text '" + text + "' --cfg 2 --steps 2 --frames 22 --width 64 --height 96 -q";
  const Result a = run(common + " -o '" + path("a.safetensors") + "'");
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  const Result b = run(common + " --attn-chunk 7 --mlp-chunk 13 --final-chunk 1 -o '" + path("b.safetensors") + "'");
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("two-pass attention (7-row slices), sliced MLP (13), sliced head (1)"), std::string::npos) << b.out;
  const Result c = run(common + " --budget 200K -o '" + path("c.safetensors") + "'");
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  // T 7, latent 6x4, A 37.
  const std::string ba = latents_bytes(path("a.safetensors"), {24, 7, 6, 4}, {32, 2, 37});
  const std::string bb = latents_bytes(path("b.safetensors"), {24, 7, 6, 4}, {32, 2, 37});
  const std::string bc = latents_bytes(path("c.safetensors"), {24, 7, 6, 4}, {32, 2, 37});
  ASSERT_FALSE(ba.empty());
  EXPECT_TRUE(ba == bb);
  EXPECT_TRUE(ba == bc);
  // A different seed gives different latents.
  const Result d = run(common + " --seed 9 -o '" + path("d.safetensors") + "'");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_FALSE(ba == latents_bytes(path("d.safetensors"), {24, 7, 6, 4}, {32, 2, 37}));
}

// --vram-budget: one total for weights, tables, activations and workspace. Positive 5
// tokens, negative 8 (the longer prompt is the one planned), CFG 2, the small preset (4
// blocks): budgets from generous down to the minimum the planner names stream blocks,
// and the latents stay byte-identical to the unbudgeted run; the device peak is printed
// and stays within the plan; below the minimum the run is refused before any work. A
// device budget: refused on the CPU backend (below), so this runs on a CUDA device only.
TEST_F(CliGenerate, VramBudgetsGiveIdenticalLatents) {
  if (!ls::test::cuda_usable()) GTEST_SKIP() << "no CUDA backend or device";
  const std::string text = text_file(5, 8, 256);  // the small preset's text_dim
  const std::string common =
      "--preset small --text '" + text + "' --cfg 2 --steps 2 --frames 5 --width 128 --height 128 -q --device cuda";
  const Result ref = run(common + " -o '" + path("ref.safetensors") + "'");
  ASSERT_EQ(ref.code, 0) << ref.out << ref.err;
  const std::string bref = latents_bytes(path("ref.safetensors"), {24, 2, 8, 8}, {32, 2, 8});
  ASSERT_FALSE(bref.empty());
  const Result low = run(common + " --vram-budget 1K -o '" + path("low.safetensors") + "'");
  ASSERT_EQ(low.code, 2) << low.out << low.err;
  EXPECT_FALSE(exists(path("low.safetensors")));
  const long long minimum = ls::test::named_minimum_budget(low.err);
  ASSERT_GT(minimum, 0) << low.err;
  int streamed = 0;
  for (const std::string& b : {std::string("1G"), std::to_string(minimum * 3 / 2), std::to_string(minimum)}) {
    const std::string out = path("b" + b + ".safetensors"), js = path("b" + b + ".json");
    const Result r = run(common + " --vram-budget " + b + " --json '" + js + "' -o '" + out + "'");
    ASSERT_EQ(r.code, 0) << b << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("vram budget "), std::string::npos) << r.out;  // the plan, before the run
    EXPECT_NE(r.out.find("vram: LayerStream device peak "), std::string::npos) << r.out;
    EXPECT_TRUE(latents_bytes(out, {24, 2, 8, 8}, {32, 2, 8}) == bref) << "budget " << b << " changed the latents";
    const nlohmann::json j = nlohmann::json::parse(read_all(js));
    ASSERT_TRUE(j.contains("vram_budget")) << j.dump();
    EXPECT_LE(j["vram_budget"]["device_peak_bytes"].get<uint64_t>(),
              j["vram_budget"]["predicted_peak_bytes"].get<uint64_t>());
    EXPECT_LE(j["vram_budget"]["predicted_peak_bytes"].get<uint64_t>(), j["vram_budget"]["budget_bytes"].get<uint64_t>());
    // Blocks the plan streams really cross over (and none when all are resident).
    const bool plan_streams = j["vram_budget"]["resident_blocks"].get<int64_t>() < 4;
    EXPECT_EQ(j["vram_budget"]["weight_copy_bytes"].get<uint64_t>() > 0, plan_streams) << b;
    streamed += plan_streams;
  }
  EXPECT_GE(streamed, 1);  // the small budgets stream blocks
  // With other memory flags, or on the built-in demonstration: refused.
  for (const std::string& bad : {common + " --vram-budget 1G --budget 1G", common + " --vram-budget 1G --mlp-chunk 4",
                                 std::string("--vram-budget 1G -q")}) {
    const Result r = run(bad + " -o '" + path("bad.safetensors") + "'");
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    EXPECT_NE(r.err.find("--vram-budget"), std::string::npos) << r.err;
    EXPECT_FALSE(exists(path("bad.safetensors")));
  }
}

TEST_F(CliGenerate, BadInputsFailCleanly) {
  const std::string out = path("bad.safetensors");
  const std::string o = " -o '" + out + "' -q";
  const std::string text_no_negative = text_file(4, 0);
  const std::string text_wrong_width = text_file(4, 0, 50);
  struct CaseCode {
    std::string args;
    std::string message;
    int code;  // 2 usage (flags, a budget below the minimum), 1 run time (files)
  };
  const std::vector<CaseCode> cases = {
      {"--preset tiny --steps 0", "--steps", 2},
      {"--preset tiny --steps abc", "--steps", 2},
      {"--preset tiny --frames 22x", "--frames", 2},
      {"--preset tiny --width 100", "multiples of 32", 2},
      {"--preset nope", "nope", 2},
      {"--model '" + path("missing.safetensors") + "'", "missing.safetensors", 1},
      {"--preset tiny --budget 1K", "smallest budget", 2},
      {"--preset tiny --budget 3 --mlp-chunk 4", "--budget", 2},
      {"--preset tiny --cfg 2 --text '" + text_no_negative + "'", "negative", 2},
      {"--preset tiny --text '" + text_wrong_width + "'", "text_dim", 2},
      {"--preset tiny --keyframe '" + path("nokf.safetensors") + "'", "nokf.safetensors", 1},
      {"--preset tiny --cfg nan", "--cfg", 2},
      {"--preset tiny --mlp-chunk -3", "--mlp-chunk", 2},
      // A device budget on the CPU backend: refused, pointing at --budget (issue 11).
      {"--preset tiny --vram-budget 1G", "use --budget", 2},
  };
  for (const CaseCode& c : cases) {
    const Result r = run(c.args + o);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
    EXPECT_FALSE(exists(out)) << c.args;
  }
  // --preset without -o.
  const Result r = run("--preset tiny -q");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("-o"), std::string::npos) << r.err;
  // Nothing half-written (no temporary file) left behind in the folder either.
  const std::string listing_cmd = "ls '" + dir_.string() + "' | grep -c tmp > '" + path("count.txt") + "'";
  (void)std::system(listing_cmd.c_str());
  EXPECT_EQ(read_all(path("count.txt")), "0\n");
}

TEST_F(CliGenerate, TextWithBatchDimension) {
  // ComfyUI's cross_attn layout [1, L, text_dim].
  std::vector<float> t(4 * 96);
  for (size_t i = 0; i < t.size(); ++i) t[i] = std::sin(0.5f * static_cast<float>(i));
  const std::string p = path("text3d.safetensors");
  ASSERT_TRUE(ls::write_safetensors(p, {{"text", ls::TensorView(t.data(), ls::DType::f32, {1, 4, 96})}}).ok());
  const Result r = run("--preset tiny --text '" + p + "' --steps 1 --frames 5 --width 64 --height 64 -q -o '" +
                       path("o.safetensors") + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("L 4 ->"), std::string::npos) << r.out;
  EXPECT_FALSE(latents_bytes(path("o.safetensors"), {24, 2, 4, 4}, {32, 2, 8}).empty());
}
