// --devices (sequence parallel, docs/multi-gpu.md) on the command line: the device-list
// parser (api::parse_devices, what the CLI and the C API read), forward and generate on
// cpu*N loopback ranks giving one device's output bytes (hash / file bytes), the report
// naming the ranks, and the refusals (exit 2 before any work).
#include <gtest/gtest.h>

#include <unistd.h>

#include "api/session.h"
#include "cli_test_util.h"
#include "file_test_util.h"

using namespace ls;
using ls::test::output_hash;
using ls::test::run_tool;

namespace {

std::string parse_error(const std::string& text) {
  auto d = api::parse_devices(text);
  EXPECT_FALSE(d.ok()) << text;
  return d.ok() ? "" : d.error().message;
}

const char* kForward =
    "forward --random-weights --preset small --frames 9 --width 64 --height 64 --text-tokens 16 --sigma 0.9 -q";

std::string slurp(const std::string& path) { return test::read_all(path); }

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "ls_ulysses_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace

TEST(UlyssesCli, ParseDevices) {
  auto a = api::parse_devices("cpu*4");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, std::vector<std::string>(4, "cpu"));
  auto b = api::parse_devices("cuda:0,cuda:3,cuda");
  ASSERT_FALSE(b.ok());  // "cuda" is cuda:0, given twice
  EXPECT_NE(b.error().message.find("cuda:0 is given twice"), std::string::npos) << b.error().message;
  auto c = api::parse_devices("cuda:1,cuda:0");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (std::vector<std::string>{"cuda:1", "cuda:0"}));
  auto d = api::parse_devices("cpu");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size(), 1u);
  EXPECT_NE(parse_error("cuda:0,cpu").find("cannot be mixed"), std::string::npos);
  EXPECT_NE(parse_error("cpu,cpu").find("cpu*N"), std::string::npos);
  EXPECT_NE(parse_error("gpu:0").find("unknown device 'gpu:0'"), std::string::npos);
  EXPECT_NE(parse_error("cuda:0,,cuda:1").find("an empty entry"), std::string::npos);
  EXPECT_NE(parse_error("cuda:x").find("unknown device"), std::string::npos);
  EXPECT_NE(parse_error("cpu*0").find("1..64"), std::string::npos);
  EXPECT_NE(parse_error("cpu*65").find("1..64"), std::string::npos);
  EXPECT_NE(parse_error("cpu*").find("1..64"), std::string::npos);
  EXPECT_NE(parse_error("").find("no device"), std::string::npos);
}

TEST(UlyssesCli, ForwardOnRanksGivesOneDevicesHash) {
  const test::ToolRun one = run_tool(kForward);
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string h = output_hash(one);
  ASSERT_EQ(h.size(), 16u) << one.out;
  for (const char* extra : {"--devices cpu*2", "--devices 'cpu*4'", "--devices cpu*2 --attn-chunk 7 --mlp-chunk 1 --final-chunk 5",
                            "--devices cpu*4 --budget 300K", "--devices cpu*2 --resident-blocks 1 --slots 1"}) {
    SCOPED_TRACE(extra);
    const test::ToolRun r = run_tool(std::string(kForward) + " " + extra);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(output_hash(r), h) << r.out;
  }
  const std::string json = temp_path("ulysses_report.json");
  const test::ToolRun r = run_tool(std::string(kForward) + " --devices cpu*4 --json '" + json + "'", "", true);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string j = slurp(json);
  EXPECT_NE(j.find("\"ranks\": 4"), std::string::npos) << j;
  EXPECT_NE(j.find("\"rank_measured_peak_bytes\""), std::string::npos) << j;
}

TEST(UlyssesCli, Refusals) {
  struct Case {
    const char* extra;
    const char* says;
  };
  for (const Case& c : {Case{"--devices cpu*3", "3 ranks do not divide the model's 4 attention heads"},
                        Case{"--devices cuda:0,cpu", "cannot be mixed"},
                        Case{"--devices cuda:0,cuda:0", "cuda:0 is given twice"},
                        Case{"--devices npu:0", "unknown device"},
                        Case{"--devices cpu*2 --device cpu", "exclusive"},
                        Case{"--devices cpu*2 --attn-chunk 8 --kv-offload", "not supported yet"},
                        Case{"--devices cpu*2 --attn-chunk 8 --residual-offload", "not supported yet"}}) {
    SCOPED_TRACE(c.extra);
    const test::ToolRun r = run_tool(std::string(kForward) + " " + c.extra);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
  }
}

TEST(UlyssesCli, GenerateOnRanksGivesOneDevicesBytes) {
  const std::string a = temp_path("ulysses_gen1.safetensors"), b = temp_path("ulysses_gen2.safetensors");
  const test::ToolRun one = run_tool("generate --steps 2 -q -o '" + a + "'");
  ASSERT_EQ(one.code, 0) << one.out;
  const test::ToolRun two = run_tool("generate --steps 2 -q --devices cpu*2 -o '" + b + "'");
  ASSERT_EQ(two.code, 0) << two.out;
  const std::string x = slurp(a), y = slurp(b);
  ASSERT_GT(x.size(), 1000u);
  EXPECT_TRUE(x == y) << "the 2-rank output file differs from the one-device file";
  const test::ToolRun bad = run_tool("generate --steps 2 -q --devices cpu*3 -o '" + b + "'");
  EXPECT_EQ(bad.code, 2) << bad.out;
}
