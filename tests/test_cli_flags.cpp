// The flags of every command, on the built binary (issue 11): one strict parser and one
// range per quantity in forward, generate and make-model; a refusal for every flag that
// has no effect in the combination given; --help with type, range, unit, default and
// REQUIRED; --version; exit codes (2 usage, 1 at run time).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"

using ls::test::run_tool;
using ls::test::ToolRun;

namespace {

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ls_cli_flags_" + std::to_string(getpid()) + "_" + name)).string();
}

// A command line from default flags, with `set` replacing or adding flags ("--sigma 0x1",
// several separated by spaces; a flag given as "--seed=" is left out): each flag once,
// as CLI11 refuses a repeated one.
std::string with(const std::string& cmd, const std::vector<std::pair<std::string, std::string>>& defaults,
                 const std::string& set) {
  std::vector<std::pair<std::string, std::string>> flags = defaults;
  std::vector<std::string> words;
  for (size_t b = 0; b < set.size();) {
    size_t e = set.find(' ', b);
    if (e == std::string::npos) e = set.size();
    // keep quoted values ('' or ' 5') in one word
    if (set[b] == '\'') {
      e = set.find('\'', b + 1) + 1;
    }
    if (e > b) words.push_back(set.substr(b, e - b));
    b = e + 1;
  }
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.rfind("--", 0) != 0) continue;
    const bool has_value = i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0;
    const std::string value = has_value ? words[i + 1] : "";
    bool replaced = false;
    for (auto& f : flags)
      if (f.first == w) f.second = value, replaced = true;
    if (!replaced) flags.emplace_back(w, value);
  }
  std::string r = cmd;
  for (const auto& [f, v] : flags) r += " " + f + (v.empty() ? "" : " " + v);
  return r;
}
const std::vector<std::pair<std::string, std::string>> kForwardFlags = {
    {"--preset", "tiny"}, {"--frames", "5"}, {"--width", "64"}, {"--height", "64"}, {"--text-tokens", "4"},
    {"--sigma", "0.8"},   {"-q", ""}};
const std::vector<std::pair<std::string, std::string>> kGenerateFlags = {
    {"--preset", "tiny"}, {"--steps", "1"}, {"--frames", "5"}, {"--width", "64"}, {"--height", "64"}, {"-q", ""}};
std::string fwd(const std::string& set = "") { return with("forward", kForwardFlags, set); }
std::string gen(const std::string& set = "") { return with("generate", kGenerateFlags, set); }
const std::string kForward = fwd();
const std::string kGenerate = gen();

// A refusal: exit 2, "error:", the expected text, and no output file.
void expect_usage_error(const std::string& args, const std::string& expect) {
  const std::string out = tmp("never.safetensors");
  const ToolRun r = run_tool(args + " -o " + out);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("error"), std::string::npos) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(expect), std::string::npos) << args << "\nexpected: " << expect << "\n" << r.out;
  EXPECT_FALSE(std::filesystem::exists(out)) << args;
  std::filesystem::remove(out);
}

}  // namespace

// Empty values were taken as the defaults (`--kv-tile ''` ran with the device's tile).
TEST(CliFlags, EmptyValuesAreRefused) {
  for (const char* flag : {"--kv-tile", "--mlp-chunk", "--attn-chunk", "--final-chunk", "--seed", "--threads",
                           "--budget"}) {
    expect_usage_error(kForward + " " + flag + " ''", std::string(flag) + " must be");
    expect_usage_error(kGenerate + " " + flag + " ''", std::string(flag) + " must be");
  }
  expect_usage_error(kGenerate + " --cfg ''", "--cfg must be a finite number in [0, 100] (got an empty value)");
  expect_usage_error(gen("--steps ''"), "--steps must be an integer in 1..1000 (got an empty value)");
  expect_usage_error(kForward + " --kv-tile ''", "--kv-tile must be an integer in 1..2^30 (got an empty value)");
  expect_usage_error("make-model --preset tiny --seed ''", "--seed must be an integer");
}

// --cfg took hex, '+5', ' 5', '-1' and 1e99 (which gave an all-NaN output with exit 0).
TEST(CliFlags, CfgIsStrictAndFinite) {
  for (const char* bad : {"0x5", "+5", "' 5'", "'5 '", "-1", "1e99", "inf", "nan", "101", "5,0"})
    expect_usage_error(kGenerate + " --cfg " + bad, "--cfg must be a finite number in [0, 100]");
  const ToolRun ok = run_tool(kGenerate + " --cfg 2.5 -o " + tmp("cfg.safetensors"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  std::filesystem::remove(tmp("cfg.safetensors"));
}

TEST(CliFlags, NumbersAreStrict) {
  for (const char* bad : {"0x10", "+8", "' 8'", "8.0", "1e3", "8x"})
    expect_usage_error(kForward + " --mlp-chunk " + std::string(bad), "--mlp-chunk must be an integer in 0..2^40");
  expect_usage_error(fwd("--sigma 0x1p-1"), "--sigma must be a finite number in (0, 1]");
  expect_usage_error(fwd("--sigma 1e-60"), "--sigma must be a finite number in (0, 1]");  // rounds to 0 in fp32
  // Sizes are 1024-based; decimal units are refused rather than silently taken as 10^9.
  expect_usage_error(kForward + " --budget 3GB", "1024-based");
  expect_usage_error(kGenerate + " --budget '3 G'", "--budget must be a size");
  expect_usage_error(kGenerate + " --budget 0", "--budget must be a size in 1 B..1 EiB");
}

// One range per quantity, the same in every command (they differed: --text-tokens 0..1e6
// in forward and 1..1e7 in generate; seeds below 2^64 in generate and make-model).
TEST(CliFlags, RangesAreSharedByCommands) {
  // (--budget 1K: should the range ever widen again, the run is refused by the planner at
  // once instead of attending over a million tokens.)
  for (const char* l : {"0", "1000001"}) {
    expect_usage_error(fwd("--budget 1K --text-tokens " + std::string(l)), "--text-tokens must be an integer in 1..1000000");
    expect_usage_error(kGenerate + " --budget 1K --text-tokens " + l, "--text-tokens must be an integer in 1..1000000");
  }
  const std::string too_big = "9223372036854775808";  // 2^63
  expect_usage_error(kForward + " --seed " + too_big, "--seed must be an integer in 0..2^63-1");
  expect_usage_error(kGenerate + " --seed " + too_big, "--seed must be an integer in 0..2^63-1");
  expect_usage_error(kGenerate + " --weights-seed " + too_big, "--weights-seed must be an integer in 0..2^63-1");
  expect_usage_error("make-model --preset tiny --seed " + too_big, "--seed must be an integer in 0..2^63-1");
  expect_usage_error(fwd("--frames 100001"), "--frames must be an integer in 1..100000");
  expect_usage_error(gen("--frames 100001"), "--frames must be an integer in 1..100000");
  for (const std::string& cmd : {kForward, kGenerate}) {
    expect_usage_error(cmd + " --threads 4097", "--threads must be an integer in 0..4096");
  }
  // The largest seed is taken by both.
  EXPECT_EQ(run_tool(kForward + " --seed 9223372036854775807").code, 0);
  EXPECT_EQ(run_tool(kGenerate + " --seed 9223372036854775807 -o " + tmp("s.safetensors")).code, 0);
  std::filesystem::remove(tmp("s.safetensors"));
}

// Flags that had no effect in the combination given were silently accepted.
TEST(CliFlags, FlagsWithoutEffectAreRefused) {
  const std::string model = tmp("tiny.safetensors");
  ASSERT_EQ(run_tool("make-model --preset tiny -q -o " + model).code, 0);
  const std::string fm = "forward --model " + model + " --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.8 -q";
  expect_usage_error(kForward + " --attn-chunk 8 --kv-chunk 32", "--kv-chunk has no effect without --kv-offload");
  expect_usage_error(kForward + " --slots 1", "--slots has no effect without --resident-blocks");
  expect_usage_error(kForward + " --resident-blocks 2 --slots 1", "--slots has no effect: --resident-blocks 2 keeps all 2");
  expect_usage_error(fm + " --weights-seed 3", "--weights-seed has no effect with --model");
  expect_usage_error(kForward + " --budget 1M --kv-offload", "--kv-offload");
  expect_usage_error("generate --model " + model + " --steps 1 --frames 5 --width 64 --height 64 -q --weights-seed 3",
                     "--weights-seed has no effect with --model");
  // On the CPU backend --vram-budget raised host memory instead of meaning anything.
  expect_usage_error(kForward + " --vram-budget 2G", "use --budget");
  expect_usage_error(kGenerate + " --vram-budget 2G", "use --budget");
  expect_usage_error(kForward + " --keep-prefetch", "--keep-prefetch goes with --vram-budget");
  // The same flags in the combinations where they act are taken.
  EXPECT_EQ(run_tool(kForward + " --attn-chunk 8 --kv-offload --kv-chunk 2048").code, 0);
  EXPECT_EQ(run_tool(kForward + " --resident-blocks 1 --slots 1").code, 0);
  std::filesystem::remove(model);
}

TEST(CliFlags, HelpShowsTypeRangeUnitDefaultAndRequired) {
  const ToolRun f = run_tool("forward --help");
  ASSERT_EQ(f.code, 0) << f.out;
  for (const char* want : {"--frames INT 1..100000 REQUIRED", "--sigma FLOAT in (0, 1] REQUIRED",
                           "--seed INT 0..2^63-1 [0]", "--kv-tile INT 1..2^30 [the device's]", "--budget SIZE",
                           "1024-based", "KiB/MiB/GiB", "--device DEVICE [cpu]", "--allow-nonfinite", "--memory-plot"})
    EXPECT_NE(f.out.find(want), std::string::npos) << want << "\n" << f.out;
  const ToolRun g = run_tool("generate --help");
  ASSERT_EQ(g.code, 0) << g.out;
  for (const char* want : {"--cfg FLOAT in [0, 100] [1]", "--steps INT 1..1000 [4]", "--frames INT 1..100000 [22]",
                           "--vram-budget SIZE", "--allow-nonfinite", "--memory-plot"})
    EXPECT_NE(g.out.find(want), std::string::npos) << want << "\n" << g.out;
  const ToolRun m = run_tool("make-model --help");
  ASSERT_EQ(m.code, 0) << m.out;
  for (const char* want : {"--preset NAME REQUIRED", "-o,--output FILE REQUIRED", "--seed INT 0..2^63-1 [0]"})
    EXPECT_NE(m.out.find(want), std::string::npos) << want << "\n" << m.out;
}

TEST(CliFlags, Version) {
  const ToolRun v = run_tool("--version");
  ASSERT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(v.out.rfind("layerstream ", 0), 0u) << v.out;
  for (const char* want : {"commit ", " build", "backends: cpu"}) EXPECT_NE(v.out.find(want), std::string::npos) << v.out;
}

// docs/checkpoints.md said I/O failures exit 1; they exited 2. Now: 2 for usage errors,
// 1 for everything at run time (files, I/O), in every command.
TEST(CliFlags, ExitCodes) {
  const std::string out = tmp("never.safetensors");
  const std::string clip = " --frames 5 --width 64 --height 64 -q -o " + out;
  struct Case {
    std::string args;
    int code;
  } cases[] = {
      {"forward --preset tiny --no-such-flag" + clip, 2},
      {"forward --preset tiny --sigma 0.5" + clip, 2},  // --text-tokens missing
      {"forward --model /nonexistent.safetensors --text-tokens 4 --sigma 0.5" + clip, 1},
      {"forward --preset tiny --text-tokens 4 --sigma 0.5 --frames 5 --width 64 --height 64 -q -o /nonexistent-dir/x", 1},
      {"generate --preset tiny --steps x" + clip, 2},
      {"generate --model /nonexistent.safetensors" + clip, 1},
      {"generate --preset tiny --frames 5 --width 64 --height 64 -q -o /nonexistent-dir/x", 1},
      {"make-model --preset tiny --blocks 0 -o " + out, 2},
      {"make-model --preset tiny -o /nonexistent-dir/x", 1},
      {"no-such-command", 2},
  };
  for (const Case& c : cases) {
    const ToolRun r = run_tool(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args;
  }
  // The test hook's variable is checked like a flag.
  const ToolRun bad_env = run_tool(kForward, "LAYERSTREAM_TEST_FAIL_ALLOC=x");
  EXPECT_EQ(bad_env.code, 2) << bad_env.out;
  EXPECT_NE(bad_env.out.find("LAYERSTREAM_TEST_FAIL_ALLOC must be an integer"), std::string::npos) << bad_env.out;
}
