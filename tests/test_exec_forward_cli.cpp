// `layerstream forward` end to end (the built binary, LS_TOOL_PATH): files of different
// plans, total device budgets and residency/offload knobs are byte-identical; the status
// line names the paths; bad flags (and a budget below the named minimum) exit 2, missing
// or bad files exit 1, and neither leaves an output file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "cli_test_util.h"

namespace {

std::string tmp(const std::string& name) {
  const char* d = std::getenv("TMPDIR");
  return std::string(d ? d : "/tmp") + "/ls_forward_cli_" + std::to_string(::getpid()) + "_" + name;
}

struct RunResult {
  int code = -1;
  std::string out;
};
RunResult run(const std::string& args) {
  const std::string log = tmp("log.txt");
  const std::string cmd = std::string(LS_TOOL_PATH) + " forward " + args + " > " + log + " 2>&1";
  RunResult r;
  const int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(log);
  r.out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::remove(log.c_str());
  return r;
}
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
bool exists(const std::string& p) { return std::ifstream(p).good(); }

const std::string kClip = "--preset tiny --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.8 --seed 5";

}  // namespace

TEST(ForwardCli, PlansGiveIdenticalFiles) {
  const std::string a = tmp("a.safetensors"), b = tmp("b.safetensors"), c = tmp("c.safetensors");
  RunResult ra = run(kClip + " -o " + a);
  ASSERT_EQ(ra.code, 0) << ra.out;
  EXPECT_NE(ra.out.find("stock plan"), std::string::npos) << ra.out;
  RunResult rb = run(kClip + " --attn-chunk 7 --mlp-chunk 9 --final-chunk 1 -o " + b);
  ASSERT_EQ(rb.code, 0) << rb.out;
  EXPECT_NE(rb.out.find("two-pass attention (7-row slices)"), std::string::npos) << rb.out;
  EXPECT_NE(rb.out.find("sliced MLP (9)"), std::string::npos) << rb.out;
  RunResult rc = run(kClip + " --budget 120K -o " + c);
  ASSERT_EQ(rc.code, 0) << rc.out;
  const std::string fa = slurp(a);
  ASSERT_GT(fa.size(), 1000u);
  EXPECT_EQ(fa, slurp(b));
  EXPECT_EQ(fa, slurp(c));
  for (const auto& p : {a, b, c}) std::remove(p.c_str());
}

TEST(ForwardCli, BadInputExitsWithoutOutput) {
  const std::string o = tmp("bad.safetensors");
  struct Case {
    std::string args, expect;
    int code;  // 2 usage (flags), 1 run time (files)
  } cases[] = {
      {kClip + " --budget 1K", "smallest budget that works", 2},
      {kClip + " --budget lots", "--budget must be a size", 2},
      {"--preset tiny --frames 22 --width 60 --height 64 --text-tokens 8 --sigma 0.8", "multiples of 32", 2},
      {"--preset tiny --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 1.5", "--sigma", 2},
      {"--preset huge --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.5", "unknown model preset", 2},
      {"--model /nonexistent.safetensors --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.5", "nonexistent", 1},
      {kClip + " --attn-chunk 4 --budget 1G", "not both", 2},
      {kClip + " --keyframe /nonexistent.safetensors", "nonexistent", 1},
  };
  for (const auto& c : cases) {
    RunResult r = run(c.args + " -o " + o);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(exists(o)) << c.args;
    std::remove(o.c_str());
  }
}

// --vram-budget (issue 5): the planner's choice is printed before any work, every budget
// from all-resident down to the minimum gives the same file and the same printed hash,
// and the JSON report carries the decisions. A device budget: on the CPU backend it is
// refused (issue 11: there it only copied weights into more host memory), so this runs
// on a CUDA device only (the GPU machine).
TEST(ForwardCli, VramBudgetsGiveIdenticalFiles) {
  if (!ls::test::cuda_usable()) GTEST_SKIP() << "no CUDA backend or device";
  // The small preset (4 blocks of 6.1 MiB): small budgets must stream blocks.
  const std::string kClip =
      "--preset small --frames 5 --width 128 --height 128 --text-tokens 8 --sigma 0.8 --seed 5 --device cuda";
  const std::string ref = tmp("vref.safetensors"), got = tmp("vgot.safetensors"), js = tmp("v.json");
  RunResult r0 = run(kClip + " --random-weights -o " + ref);
  ASSERT_EQ(r0.code, 0) << r0.out;
  const auto hash_at = r0.out.find("output hash ");
  ASSERT_NE(hash_at, std::string::npos) << r0.out;
  const std::string hash = r0.out.substr(hash_at, 28);
  const std::string fref = slurp(ref);
  ASSERT_GT(fref.size(), 1000u);
  // The minimum, as the planner names it when refusing 1 KiB.
  RunResult low = run(kClip + " --vram-budget 1K");
  ASSERT_EQ(low.code, 2) << low.out;
  const long long minimum = ls::test::named_minimum_budget(low.out);
  ASSERT_GT(minimum, 0) << low.out;
  int streamed = 0;
  for (const std::string& b : {std::string("1G"), std::to_string(minimum * 3 / 2), std::to_string(minimum)}) {
    RunResult r = run(kClip + " --vram-budget " + b + " --json " + js + " -o " + got);
    ASSERT_EQ(r.code, 0) << b << "\n" << r.out;
    EXPECT_NE(r.out.find("[LayerStream] budget "), std::string::npos) << r.out;  // the plan, first
    EXPECT_NE(r.out.find(hash), std::string::npos) << b << "\n" << r.out;
    EXPECT_TRUE(slurp(got) == fref) << "budget " << b << " changed the output";
    const std::string j = slurp(js);
    EXPECT_NE(j.find("\"vram_budget\""), std::string::npos) << j;
    EXPECT_NE(j.find("\"output_hash\""), std::string::npos) << j;
    streamed += r.out.find("streamed through") != std::string::npos;
  }
  EXPECT_GE(streamed, 1);  // the small budgets stream blocks
  RunResult one_below = run(kClip + " --vram-budget " + std::to_string(minimum - 1));
  EXPECT_EQ(one_below.code, 2) << one_below.out;
  RunResult bad = run(kClip + " --vram-budget 1G --kv-offload");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("give it alone"), std::string::npos) << bad.out;
  for (const auto& p : {ref, got, js}) std::remove(p.c_str());
}

// The manual residency and offload knobs (every backend: on the CPU they exercise the
// streaming and offload paths) give the stock run's file.
TEST(ForwardCli, ManualResidencyGivesIdenticalFiles) {
  const std::string kClip = "--preset small --frames 5 --width 128 --height 128 --text-tokens 8 --sigma 0.8 --seed 5";
  const std::string got = tmp("mgot.safetensors");
  // Manual knobs at kv_tile 16 (a numerics setting: compared with the stock run at 16),
  // so the keys really come in several chunks of two tiles.
  const std::string ref16 = tmp("vref16.safetensors");
  RunResult s16 = run(kClip + " --kv-tile 16 -o " + ref16);
  ASSERT_EQ(s16.code, 0) << s16.out;
  RunResult manual = run(kClip + " --kv-tile 16 --attn-chunk 5 --resident-blocks 1 --slots 1 --kv-offload --kv-chunk 32 "
                                 "--residual-offload -o " + got);
  ASSERT_EQ(manual.code, 0) << manual.out;
  EXPECT_NE(manual.out.find("K/V offloaded (32-key chunks)"), std::string::npos) << manual.out;
  ASSERT_GT(slurp(ref16).size(), 1000u);
  EXPECT_TRUE(slurp(got) == slurp(ref16)) << "manual residency and offload changed the output";
  for (const auto& p : {ref16, got}) std::remove(p.c_str());
}
