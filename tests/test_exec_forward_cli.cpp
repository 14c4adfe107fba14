// `layerstream forward` end to end (the built binary, LS_TOOL_PATH): files of different
// plans are byte-identical; the status line names the paths; bad input exits 2 and
// leaves no output file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

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

TEST(ForwardCli, BadInputExits2WithoutOutput) {
  const std::string o = tmp("bad.safetensors");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {kClip + " --budget 1K", "smallest budget that works"},
      {kClip + " --budget lots", "cannot read 'lots'"},
      {"--preset tiny --frames 22 --width 60 --height 64 --text-tokens 8 --sigma 0.8", "multiples of 32"},
      {"--preset tiny --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 1.5", "--sigma"},
      {"--preset huge --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.5", "unknown model preset"},
      {"--model /nonexistent.safetensors --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.5", "nonexistent"},
      {kClip + " --attn-chunk 4 --budget 1G", "not both"},
      {kClip + " --keyframe /nonexistent.safetensors", "nonexistent"},
  };
  for (const auto& c : cases) {
    RunResult r = run(c.args + " -o " + o);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(exists(o)) << c.args;
    std::remove(o.c_str());
  }
}
