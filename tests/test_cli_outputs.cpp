// What forward and generate write, on the built binary (issue 11): files `cmp`-identical
// across memory settings (no plan in the metadata), every output path checked before
// any work, non-finite outputs refused unless --allow-nonfinite, a failed allocation
// (LAYERSTREAM_TEST_FAIL_ALLOC) a clean error with no file, progress with rate and ETA,
// and a "version" object in every JSON report.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "file_test_util.h"
#include "io/safetensors.h"

using ls::test::run_tool;
using ls::test::ToolRun;

namespace {

class CliOutputs : public ls::test::TempDirTest {
 protected:
  CliOutputs() : TempDirTest("ls_cli_outputs") {}
  std::string path(const std::string& name) const { return file(name); }
  // Files left in the folder (a failed run leaves neither its output nor a temporary).
  size_t files() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) n += e.is_regular_file();
    return n;
  }
};

std::string slurp(const std::string& p) { return ls::test::read_all(p); }

const std::string kForward = "forward --preset tiny --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.8 --seed 5";
const std::string kGenerate = "generate --preset tiny --steps 2 --frames 22 --width 64 --height 64 --seed 3";

// A tiny checkpoint with one NaN in video_patch_proj.bias (added to every video token).
std::string nan_model(const std::string& file) {
  EXPECT_EQ(run_tool("make-model --preset tiny -q -o " + file).code, 0);
  uint64_t data_begin = 0, offset = 0;
  {
    auto r = ls::SafetensorsReader::open(file);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return file;
    const ls::SafetensorsEntry* e = (*r)->find("video_patch_proj.bias");
    EXPECT_NE(e, nullptr);
    if (!e) return file;
    EXPECT_EQ(e->dtype, ls::DType::f32);
    offset = e->begin;
  }
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), 8);  // little-endian header length
  data_begin = 8 + header;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(static_cast<std::streamoff>(data_begin + offset));
  f.write(reinterpret_cast<const char*>(&nan), 4);
  return file;
}

}  // namespace

// The README's promise: "None of them changes a bit of the output (`cmp` the files)".
// generate put the plan into the metadata, so files of different budgets differed.
TEST_F(CliOutputs, FilesOfDifferentMemorySettingsAreCmpIdentical) {
  const ToolRun a = run_tool(kGenerate + " -q -o " + path("a.safetensors"));
  ASSERT_EQ(a.code, 0) << a.out;
  const ToolRun b = run_tool(kGenerate + " -q --budget 120K -o " + path("b.safetensors"));
  ASSERT_EQ(b.code, 0) << b.out;
  const ToolRun c = run_tool(kGenerate + " -q --attn-chunk 7 --mlp-chunk 9 --final-chunk 3 -o " + path("c.safetensors"));
  ASSERT_EQ(c.code, 0) << c.out;
  const std::string fa = slurp(path("a.safetensors"));
  ASSERT_GT(fa.size(), 10000u);
  EXPECT_TRUE(fa == slurp(path("b.safetensors"))) << "generate: --budget changed the file";
  EXPECT_TRUE(fa == slurp(path("c.safetensors"))) << "generate: the chunk flags changed the file";
  const std::string cmp = "cmp '" + path("a.safetensors") + "' '" + path("b.safetensors") + "'";
  EXPECT_EQ(std::system(cmp.c_str()), 0);
  // forward too (its manual residency and offload knobs included).
  const ToolRun fa1 = run_tool(kForward + " -q -o " + path("fa.safetensors"));
  ASSERT_EQ(fa1.code, 0) << fa1.out;
  const ToolRun fb1 = run_tool(kForward + " -q --attn-chunk 5 --resident-blocks 1 --slots 1 --kv-offload "
                               "--residual-offload -o " + path("fb.safetensors"));
  ASSERT_EQ(fb1.code, 0) << fb1.out;
  EXPECT_TRUE(slurp(path("fa.safetensors")) == slurp(path("fb.safetensors")));
  // The metadata holds only what determines the bytes.
  for (const char* f : {"a.safetensors", "fa.safetensors"}) {
    auto r = ls::SafetensorsReader::open(path(f));
    ASSERT_TRUE(r.ok());
    const auto& md = (*r)->metadata();
    EXPECT_EQ(md.count("plan"), 0u) << f;
    EXPECT_EQ(md.count("budget"), 0u) << f;
    EXPECT_EQ(md.at("kv_tile"), "1024") << f;
    EXPECT_EQ(md.at("backend"), "cpu") << f;
  }
}

// -o an existing directory, --json into a missing folder (which left the -o file behind):
// refused before any work, with nothing written.
TEST_F(CliOutputs, OutputPathsAreCheckedBeforeAnyWork) {
  std::filesystem::create_directory(path("adir"));
  const std::string missing = path("missing/report.json");
  for (const std::string& cmd : {kForward, kGenerate}) {
    const ToolRun d = run_tool(cmd + " -q -o " + path("adir"));
    EXPECT_NE(d.code, 0) << cmd << "\n" << d.out;
    EXPECT_NE(d.out.find(path("adir")), std::string::npos) << d.out;
    EXPECT_EQ(d.out.find("[LayerStream]"), std::string::npos) << "work was done first:\n" << d.out;
    const ToolRun j = run_tool(cmd + " -q -o " + path("o.safetensors") + " --json " + missing);
    EXPECT_EQ(j.code, 1) << cmd << "\n" << j.out;
    EXPECT_NE(j.out.find("--json"), std::string::npos) << j.out;
    EXPECT_EQ(j.out.find("[LayerStream]"), std::string::npos) << "work was done first:\n" << j.out;
    EXPECT_FALSE(std::filesystem::exists(path("o.safetensors"))) << cmd;
    const ToolRun p = run_tool(cmd + " -q -o " + path("o.safetensors") + " --memory-plot " + path("missing/m.svg"));
    EXPECT_EQ(p.code, 1) << cmd << "\n" << p.out;
    EXPECT_NE(p.out.find("--memory-plot"), std::string::npos) << p.out;
    const ToolRun same = run_tool(cmd + " -q -o " + path("x.json") + " --json " + path("x.json"));
    EXPECT_EQ(same.code, 2) << same.out;
    EXPECT_NE(same.out.find("same file"), std::string::npos) << same.out;
    const ToolRun empty = run_tool(cmd + " -q -o ''");
    EXPECT_NE(empty.code, 0) << empty.out;
  }
  EXPECT_EQ(files(), 0u);
}

// A NaN in one weight gave an all-NaN output with exit 0 and no warning.
TEST_F(CliOutputs, NonFiniteOutputsFailUnlessAllowed) {
  const std::string model = nan_model(path("nan.safetensors"));
  const std::string fw = "forward --model " + model + " --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.8 -q";
  const std::string gen = "generate --model " + model + " --steps 1 --frames 22 --width 64 --height 64 -q";
  for (const std::string& cmd : {fw, gen}) {
    const std::string out = path("o.safetensors"), js = path("o.json");
    const ToolRun r = run_tool(cmd + " -o " + out + " --json " + js);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("non-finite"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--allow-nonfinite"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << cmd;
    EXPECT_FALSE(std::filesystem::exists(js)) << cmd;
    const ToolRun a = run_tool(cmd + " --allow-nonfinite -o " + out + " --json " + js);
    EXPECT_EQ(a.code, 0) << cmd << "\n" << a.out;
    EXPECT_NE(a.out.find("warning:"), std::string::npos) << a.out;
    EXPECT_NE(a.out.find("non-finite values"), std::string::npos) << a.out;
    EXPECT_TRUE(std::filesystem::exists(out)) << cmd;
    const nlohmann::json j = nlohmann::json::parse(slurp(js));
    EXPECT_GT(j["nonfinite_values"].get<int64_t>(), 0) << cmd;
    std::filesystem::remove(out);
    std::filesystem::remove(js);
  }
}

// LAYERSTREAM_TEST_FAIL_ALLOC=k fails the k-th allocation: a clean error, exit 1, no file.
// (helper D's test walks every k of a small run; this one checks the CLI wiring.)
TEST_F(CliOutputs, FailedAllocationIsACleanError) {
  const std::string out = path("o.safetensors");
  const ToolRun r = run_tool(kForward + " -q -o " + out + " --json " + path("o.json"), "LAYERSTREAM_TEST_FAIL_ALLOC=1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error:"), std::string::npos) << r.out;
  EXPECT_EQ(files(), 0u);
  const ToolRun g = run_tool(kGenerate + " -q -o " + out, "LAYERSTREAM_TEST_FAIL_ALLOC=2");
  EXPECT_EQ(g.code, 1) << g.out;
  EXPECT_EQ(files(), 0u);
  // Disarmed (0): a normal run.
  EXPECT_EQ(run_tool(kForward + " -q -o " + out, "LAYERSTREAM_TEST_FAIL_ALLOC=0").code, 0);
}

// forward had no progress display; generate's had no rate or ETA. Not a terminal: a
// plain line every 10 % (the small preset's 4 blocks: 25, 50, 75, 100 %).
TEST_F(CliOutputs, ProgressWithRateAndEta) {
  const ToolRun f = run_tool("forward --preset small --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.8");
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_NE(f.out.find("forward: 100% (4/4 blocks), "), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("/s, "), std::string::npos) << f.out;  // the rate
  // Intermediate lines come from EngineOptions::progress (called by the engine after each block).
  EXPECT_NE(f.out.find("forward: 50% (2/4 blocks), "), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("ETA "), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find('\r'), std::string::npos) << f.out;
  const ToolRun q = run_tool("forward --preset small --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.8 -q");
  EXPECT_EQ(q.out.find("forward: "), std::string::npos) << q.out;
  // generate: 4 steps x 2 blocks; every forward's start places the count.
  const ToolRun g = run_tool("generate --preset tiny --steps 4 --frames 5 --width 64 --height 64 -o " + path("g.safetensors"));
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_NE(g.out.find("run: 50% (4/8 block passes), "), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("ETA "), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("run: 100% (8/8 block passes), "), std::string::npos) << g.out;
}

TEST_F(CliOutputs, JsonReportsCarryTheVersion) {
  const ToolRun f = run_tool(kForward + " -q --json " + path("f.json"));
  ASSERT_EQ(f.code, 0) << f.out;
  const ToolRun g = run_tool(kGenerate + " -q -o " + path("g.safetensors") + " --json " + path("g.json"));
  ASSERT_EQ(g.code, 0) << g.out;
  const ToolRun v = run_tool("--version");
  for (const char* file : {"f.json", "g.json"}) {
    const nlohmann::json j = nlohmann::json::parse(slurp(path(file)));
    ASSERT_TRUE(j.contains("version")) << file;
    const nlohmann::json& ver = j["version"];
    EXPECT_FALSE(ver["version"].get<std::string>().empty());
    EXPECT_FALSE(ver["git_commit"].get<std::string>().empty());
    EXPECT_TRUE(ver.contains("build_type"));
    ASSERT_TRUE(ver["backends"].is_array());
    EXPECT_EQ(ver["backends"][0], "cpu");
    // The same build as --version says.
    EXPECT_NE(v.out.find(ver["git_commit"].get<std::string>()), std::string::npos) << v.out;
  }
}

// --memory-plot FILE.svg draws the device memory of the run (the renderer: cli/memory_plot.cpp).
TEST_F(CliOutputs, MemoryPlotIsWritten) {
  const ToolRun f = run_tool(kForward + " -q --memory-plot " + path("f.svg"));
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_NE(slurp(path("f.svg")).find("<svg"), std::string::npos);
  const ToolRun g = run_tool(kGenerate + " -q -o " + path("g.safetensors") + " --memory-plot " + path("g.svg"));
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_NE(slurp(path("g.svg")).find("<svg"), std::string::npos);
}
