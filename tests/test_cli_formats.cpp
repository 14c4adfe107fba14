// Weight formats through the CLI (issue 14): --format gives the synthetic weights
// make-model --format writes (same output bytes), quantised models keep their bytes
// under every memory knob, --precision fp8 is lossy and says so, `info` prints the
// census, and bad combinations are refused with exit 2.
#include <gtest/gtest.h>

#include <string>

#include "cli_test_util.h"
#include "file_test_util.h"

using namespace ls;

namespace {

class CliFormats : public test::TempDirTest {
 protected:
  CliFormats() : TempDirTest("ls_cli_formats") {}
  const std::string clip_ = " --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.7 --seed 2";
};

TEST_F(CliFormats, SyntheticFormatsEqualTheirMadeFilesAndKeepTheirBytes) {
  const std::string bf16 = test::output_hash(test::run_tool("forward --preset tiny --random-weights" + clip_));
  ASSERT_EQ(bf16.size(), 16u);
  for (const std::string f : {"int8-convrot", "int8-convrot-full", "fp8"}) {
    const std::string path = file(f + ".safetensors");
    ASSERT_EQ(test::run_tool("make-model --preset tiny -q --format " + f + " -o " + path).code, 0) << f;
    const auto synth = test::run_tool("forward --preset tiny --random-weights --format " + f + clip_);
    ASSERT_EQ(synth.code, 0) << synth.out;
    EXPECT_NE(synth.out.find("[LayerStream] weights:"), std::string::npos) << synth.out;
    const std::string h = test::output_hash(synth);
    EXPECT_EQ(test::output_hash(test::run_tool("forward --model " + path + clip_)), h) << f;
    EXPECT_NE(h, bf16) << f;
    for (const std::string knobs : {" --mlp-chunk 1 --attn-chunk 3", " --attn-chunk 4 --kv-offload --residual-offload",
                                    " --resident-blocks 0 --slots 1", " --budget 120K"})
      EXPECT_EQ(test::output_hash(test::run_tool("forward --model " + path + clip_ + knobs)), h) << f << knobs;
    const auto info = test::run_tool("info " + path);
    ASSERT_EQ(info.code, 0) << info.out;
    EXPECT_NE(info.out.find(f == "fp8" ? "fp8_e4m3" : "int8_convrot"), std::string::npos) << info.out;
  }
}

TEST_F(CliFormats, PrecisionFp8IsLossyAndSaysSo) {
  const std::string bf16 = test::output_hash(test::run_tool("forward --preset tiny --random-weights" + clip_));
  const auto fp8 = test::run_tool("forward --preset tiny --random-weights --precision fp8" + clip_);
  ASSERT_EQ(fp8.code, 0) << fp8.out;
  EXPECT_NE(fp8.out.find("lossy"), std::string::npos) << fp8.out;
  EXPECT_NE(test::output_hash(fp8), bf16);
  const auto dyn = test::run_tool("forward --preset tiny --random-weights --precision fp8-dynamic" + clip_);
  ASSERT_EQ(dyn.code, 0) << dyn.out;
  EXPECT_NE(test::output_hash(dyn), test::output_hash(fp8));
  EXPECT_EQ(test::output_hash(test::run_tool("forward --preset tiny --random-weights --precision fp8 --mlp-chunk 2" + clip_)),
            test::output_hash(fp8));
  const auto g = test::run_tool("generate --preset tiny --precision fp8 --frames 22 --width 64 --height 64 "
                                "--text-tokens 8 --steps 2 -o " + file("g.safetensors"));
  EXPECT_EQ(g.code, 0) << g.out;
}

TEST_F(CliFormats, BadCombinationsAreUsageErrors) {
  const std::string path = file("m.safetensors");
  ASSERT_EQ(test::run_tool("make-model --preset tiny -q -o " + path).code, 0);
  auto r = test::run_tool("forward --model " + path + " --format fp8" + clip_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--format goes with --preset"), std::string::npos) << r.out;
  r = test::run_tool("forward --preset tiny --random-weights --precision fp4" + clip_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("preserve, fp8 or fp8-dynamic"), std::string::npos) << r.out;
  r = test::run_tool("forward --preset tiny --random-weights --format int4" + clip_);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("int4"), std::string::npos) << r.out;
}

}  // namespace
