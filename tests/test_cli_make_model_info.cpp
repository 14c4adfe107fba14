// The `layerstream make-model` and `layerstream info` commands, run as the built binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_util.h"
#include "exec/planner.h"
#include "model/h3/checkpoint.h"
#include "model/h3/memory_table.h"

using namespace ls;
using namespace ls::h3;

namespace {

struct RunResult {
  int rc = -1;
  std::string out;  // stdout (stderr too when merge_stderr)
};

RunResult run_tool(const std::string& args, bool merge_stderr = false) {
  const ls::test::ToolRun r = ls::test::run_tool(args, "", merge_stderr);
  return RunResult{r.code, r.out};
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ls_cli_" + std::to_string(getpid()) + "_" + name)).string();
}

// Every tensor of the file equals the synthetic source's bytes for the same config.
void expect_file_equals_synthetic(const std::string& path, const H3Config& want, uint64_t seed) {
  auto f = open_h3_checkpoint(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const H3Config& got = (*f)->cfg();
  EXPECT_EQ(h3_config_json(got), h3_config_json(want));
  H3SyntheticSource syn(want, seed);
  int64_t nonzero = 0;
  for (const TensorSpec& s : syn.specs()) {
    TensorView a = (*f)->get(s.name), b = syn.get(s.name);
    ASSERT_EQ(a.nbytes(), b.nbytes()) << s.name;
    ASSERT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.nbytes())), 0) << s.name;
    for (int64_t i = 0; i < std::min<int64_t>(a.numel(), 16); ++i) nonzero += load_as_f32(a.data, a.dtype, i) != 0.0f;
  }
  EXPECT_GT(nonzero, 0);
}

}  // namespace

TEST(CliMakeModel, TinyFileEqualsSyntheticSource) {
  const std::string path = temp_path("tiny.safetensors");
  RunResult r = run_tool("make-model --preset tiny --seed 11 -o " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("wrote " + path), std::string::npos);
  expect_file_equals_synthetic(path, *h3_preset("tiny"), 11);
  auto f = open_h3_checkpoint(path);
  ASSERT_TRUE(f.ok());
  const auto& md = (*f)->file().metadata();
  EXPECT_EQ(md.at("layerstream.preset"), "tiny");
  EXPECT_EQ(md.at("layerstream.seed"), "11");
  EXPECT_EQ(md.count("layerstream.version"), 1u);
  // Every tensor is aligned in the file (fp32 tensors come first).
  for (const auto& e : (*f)->file().entries()) EXPECT_TRUE((*f)->file().is_aligned(e)) << e.name;
  std::filesystem::remove(path);
}

TEST(CliMakeModel, VariantsCurvePddGateBlocks) {
  const std::string path = temp_path("variant.safetensors");
  RunResult r = run_tool("make-model --preset tiny --blocks 3 --adaln-curve --pdd-heads 2 --gate-compress --seed 5 -q -o " + path);
  ASSERT_EQ(r.rc, 0) << r.out;
  H3Config want = h3_curve_form(*h3_preset("tiny"));
  want.num_layers = 3;
  want.pdd_heads = 2;
  want.gate_compress = true;
  expect_file_equals_synthetic(path, want, 5);
  std::filesystem::remove(path);
}

TEST(CliMakeModel, BadArgumentsExit2AndWriteNothing) {
  const std::string path = temp_path("never.safetensors");
  for (const std::string args : {"--preset huge -o ", "--preset tiny --blocks 0 -o ", "--preset tiny --blocks x -o ",
                                 "--preset tiny --pdd-heads -1 -o ", "--preset tiny --seed -3 -o ",
                                 "--preset tiny --seed '' -o ", "--preset tiny --blocks +2 -o ",
                                 "--preset tiny --seed 0x10 -o "}) {
    RunResult r = run_tool("make-model " + args + path, true);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("error"), std::string::npos) << args;
    EXPECT_FALSE(std::filesystem::exists(path)) << args;
  }
  RunResult r = run_tool("make-model --preset tiny", true);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--output is required"), std::string::npos) << r.out;
  // Seeds: 0..2^63-1 as in every command (was < 2^64 here, <= 2^63-1 elsewhere).
  r = run_tool("make-model --preset tiny --seed 9223372036854775808 -o " + path, true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--seed must be an integer in 0..2^63-1"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(path));
  r = run_tool("make-model -o " + path, true);  // no --preset
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--preset is required"), std::string::npos) << r.out;
  // An unwritable destination is a runtime failure (1), refused before any work, with
  // nothing left behind.
  r = run_tool("make-model --preset tiny -o /nonexistent-dir/x.safetensors", true);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("/nonexistent-dir"), std::string::npos) << r.out;
  r = run_tool("make-model --preset tiny -o " + std::filesystem::temp_directory_path().string(), true);  // a directory
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("error"), std::string::npos) << r.out;
}

TEST(CliInfo, WorkedExampleOnH3Preset) {
  // h3-model.md §6.4: 362 frames at 1024x1024 with 500 text tokens.
  RunResult r = run_tool("info --preset h3 --frames 362 --width 1024 --height 1024 --text-tokens 500 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["clip"]["S"], 111274);
  EXPECT_EQ(j["clip"]["T"], 107);
  EXPECT_EQ(j["clip"]["A"], 603);
  EXPECT_EQ(j["clip"]["video_tokens"], 109568);
  const int64_t want[] = {1196418048, 4785672192, 1595224064, 1595224064, 6380896256,
                          3190448128, 42729216,   42729216,   2356150272};
  ASSERT_EQ(j["buffers"].size(), 9u);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(j["buffers"][i]["bytes"].get<int64_t>(), want[i]) << i;
  ASSERT_EQ(j["block_memory"].size(), 2u);
  const H3Config h3 = *h3_preset("h3");
  // The activation tables are the one planner's (exec::plan_memory, knobs mode): the
  // stock plan and 8192-row slices, as forward would allocate them.
  Conditioning cond;
  cond.geometry = *clip_geometry(362, 1024, 1024, 500);
  for (int i = 0; i < 2; ++i) {
    ls::exec::PlanRequest q;
    q.cfg = &h3;
    q.cond = &cond;
    q.knobs.attn_chunk_tokens = q.knobs.mlp_chunk_tokens = q.knobs.final_chunk_tokens = i == 0 ? 0 : 8192;
    auto planned = ls::exec::plan_memory(q);
    ASSERT_TRUE(planned.ok()) << planned.error().message;
    EXPECT_EQ(j["block_memory"][i]["peak_bytes"].get<uint64_t>(), planned->plan.predicted_peak_bytes) << i;
  }
  EXPECT_EQ(j["total"]["params"].get<int64_t>(), 33122992912);
  EXPECT_EQ(j["groups"]["blocks"]["params"].get<int64_t>(), 50 * 385362688LL);  // big linears + norms

  // The text form says the same numbers.
  RunResult t = run_tool("info --preset h3 --frames 362 --width 1024 --height 1024 --text-tokens 500");
  ASSERT_EQ(t.rc, 0);
  EXPECT_NE(t.out.find("S = 111,274"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("4,785,672,192"), std::string::npos);
  EXPECT_NE(t.out.find("33,122,992,912"), std::string::npos);

  RunResult c = run_tool("info --preset h3 --adaln-curve --json");
  ASSERT_EQ(c.rc, 0);
  EXPECT_NEAR(nlohmann::json::parse(c.out)["total"]["params"].get<double>() / 1e9, 20.11, 0.005);
}

TEST(CliInfo, FileAndErrors) {
  const std::string path = temp_path("info.safetensors");
  ASSERT_EQ(run_tool("make-model --preset small --blocks 1 --seed 3 -q -o " + path).rc, 0);
  RunResult r = run_tool("info " + path + " --json --tensors --frames 22 --width 64 --height 64 --text-tokens 7");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["source"]["kind"], "file");
  EXPECT_EQ(j["config"]["hidden_size"], 512);
  EXPECT_EQ(j["config"]["num_layers"], 1);
  EXPECT_EQ(j["metadata"]["layerstream.seed"], "3");
  H3Config small = *h3_preset("small");
  small.num_layers = 1;
  int64_t params = 0;
  for (const auto& s : h3_tensor_specs(small)) params += s.numel();
  EXPECT_EQ(j["total"]["params"].get<int64_t>(), params);
  EXPECT_EQ(j["tensors"].size(), h3_tensor_specs(small).size());
  // 22 frames -> T 7; 64x64 -> 2x2 patches per frame; A = round(22*5/3) = 37.
  EXPECT_EQ(j["clip"]["S"], 7 + 2 * 37 + 7 * 2 * 2);

  float one = 1.0f;
  ASSERT_TRUE(write_safetensors(path, {{"x", TensorView(&one, DType::f32, {1})}}).ok());
  RunResult bad = run_tool("info " + path, true);
  EXPECT_EQ(bad.rc, 1);  // a file that is not a checkpoint: a failure at run time (usage errors are 2)
  EXPECT_NE(bad.out.find("not an H3 checkpoint"), std::string::npos) << bad.out;
  EXPECT_EQ(run_tool("info").rc, 2);
  EXPECT_EQ(run_tool("info --preset h3 --frames 5").rc, 2);
  EXPECT_EQ(run_tool("info --preset h3 --frames 5 --width 30 --height 32").rc, 2);
  EXPECT_EQ(run_tool("info " + path + " --preset h3").rc, 2);
  std::filesystem::remove(path);
}
