// Numerics as explicit parameters (src/backend/numerics.h, issue 12): the validator's
// messages, the CPU backend's resolution and refusals, the names and JSON form, and
// that nothing under src/ reads the environment (every bit-changing setting comes in
// through Backend::set_numerics).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/session.h"
#include "backend/backend.h"
#include "backend/numerics.h"
#include "forwarding_backend.h"
#include "model/h3/config.h"

namespace ls {
namespace {

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// validate()'s message for n, or "" when n is accepted.
std::string refusal(const Numerics& n) {
  const Status s = validate(n);
  return s.ok() ? std::string() : s.message();
}

TEST(Numerics, DefaultsAreValid) { EXPECT_EQ(refusal(Numerics{}), ""); }

TEST(Numerics, ValidatorNamesTheFieldAndTheAcceptedValues) {
  Numerics n;
  n.kv_tile = -1;
  EXPECT_TRUE(has(refusal(n), "kv_tile -1")) << refusal(n);
  n = {};
  n.kv_tile = 1;
  EXPECT_EQ(refusal(n), "");
  for (int64_t bad : {0, 32, 100, 65536 + 64, -64}) {
    n = {};
    n.cudnn_q_chunk = bad;
    EXPECT_TRUE(has(refusal(n), "cudnn_q_chunk " + std::to_string(bad)) && has(refusal(n), "multiple of 64"))
        << bad << ": " << refusal(n);
  }
  for (int64_t good : {64, 1024, 2048, 65536}) {
    n = {};
    n.cudnn_q_chunk = good;
    EXPECT_EQ(refusal(n), "") << good;
  }
  n = {};
  n.native_variant = "2x2";
  EXPECT_TRUE(has(refusal(n), "native_variant '2x2'") && has(refusal(n), "4x2")) << refusal(n);
  for (const char* v : {"4x1", "8x1", "4x2"}) {
    n.native_variant = v;
    EXPECT_EQ(refusal(n), "") << v;
  }
  n = {};
  n.cudnn_form = "fused";
  EXPECT_TRUE(has(refusal(n), "cudnn_form 'fused'") && has(refusal(n), "composite-f32p")) << refusal(n);
  n = {};
  n.cudnn_skip_configs = -2;
  EXPECT_TRUE(has(refusal(n), "cudnn_skip_configs -2")) << refusal(n);
  n = {};
  n.gemm_candidate = {{0, 1}};
  EXPECT_TRUE(has(refusal(n), "gemm_candidate key K 0")) << refusal(n);
  n.gemm_candidate = {{5376, -1}};
  EXPECT_TRUE(has(refusal(n), "gemm_candidate index -1")) << refusal(n);
  n = {};
  n.attention = static_cast<AttentionAlgorithm>(7);  // as a C caller could pass
  EXPECT_TRUE(has(refusal(n), "attention algorithm 7")) << refusal(n);
  n = {};
  n.gemm_f32 = static_cast<GemmF32Order>(-1);
  EXPECT_TRUE(has(refusal(n), "fp32 GEMM order -1")) << refusal(n);
}

TEST(Numerics, NamesRoundTrip) {
  for (AttentionAlgorithm a : {AttentionAlgorithm::backend_default, AttentionAlgorithm::native, AttentionAlgorithm::cudnn,
                                AttentionAlgorithm::hopper, AttentionAlgorithm::int8}) {
    auto p = parse_attention(to_string(a));
    ASSERT_TRUE(p.ok()) << to_string(a);
    EXPECT_EQ(*p, a);
  }
  for (GemmF32Order g : {GemmF32Order::lanes16, GemmF32Order::cublaslt}) {
    auto p = parse_gemm_f32(to_string(g));
    ASSERT_TRUE(p.ok()) << to_string(g);
    EXPECT_EQ(*p, g);
  }
  EXPECT_FALSE(parse_attention("flash").ok());
  EXPECT_TRUE(has(parse_attention("flash").error().message, "auto, native, cudnn, hopper or int8"));
  EXPECT_FALSE(parse_gemm_f32("tf32").ok());

  auto every = parse_gemm_candidate("3");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(*every, (std::map<int64_t, int>{{-1, 3}}));
  auto per_k = parse_gemm_candidate("5376:1,14336:7,*:2");
  ASSERT_TRUE(per_k.ok()) << per_k.error().message;
  EXPECT_EQ(*per_k, (std::map<int64_t, int>{{-1, 2}, {5376, 1}, {14336, 7}}));
  auto back = parse_gemm_candidate(format_gemm_candidate(*per_k));
  ASSERT_TRUE(back.ok()) << format_gemm_candidate(*per_k);
  EXPECT_EQ(*back, *per_k);
  EXPECT_EQ(format_gemm_candidate(*every), "3");
  auto none = parse_gemm_candidate("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (const char* bad : {"x", "5376:", ":1", "0:1", "5376:-1", "1,2"})
    EXPECT_FALSE(parse_gemm_candidate(bad).ok()) << bad;
}

TEST(Numerics, DescribeAndJsonNameEverySetting) {
  Numerics n;
  n.attention = AttentionAlgorithm::cudnn;
  n.kv_tile = 8192;
  EXPECT_EQ(describe(n), "attention cudnn, kv_tile 8192, fp32 GEMM lanes16");
  n.cudnn_q_chunk = 1024;
  n.cudnn_form = "composite";
  n.gemm_candidate = {{5376, 1}};
  EXPECT_EQ(describe(n), "attention cudnn, kv_tile 8192, fp32 GEMM lanes16, cudnn q_chunk 1024, cudnn form composite, "
                         "gemm candidate 5376:1");
  const nlohmann::json j = n;
  EXPECT_EQ(j.at("attention"), "cudnn");
  EXPECT_EQ(j.at("kv_tile"), 8192);
  EXPECT_EQ(j.at("gemm_f32"), "lanes16");
  EXPECT_EQ(j.at("cudnn_q_chunk"), 1024);
  EXPECT_EQ(j.at("cudnn_form"), "composite");
  EXPECT_EQ(j.at("gemm_candidate"), "5376:1");
  EXPECT_EQ(j.size(), 8u) << j.dump();
  const nlohmann::json d = Diagnostics{true, false};
  EXPECT_EQ(d.at("gemm_verbose"), true);
}

TEST(Numerics, CpuResolvesTheDefaults) {
  auto cpu = make_cpu_backend();
  const Numerics r = cpu->numerics();
  EXPECT_EQ(r.attention, AttentionAlgorithm::native);
  EXPECT_EQ(r.kv_tile, 1024);
  EXPECT_EQ(r.gemm_f32, GemmF32Order::lanes16);
  EXPECT_EQ(cpu->default_kv_tile(), 1024);
  EXPECT_EQ(describe(r), "attention native, kv_tile 1024, fp32 GEMM lanes16");

  // auto and an explicit kv_tile: resolved and kept; default_kv_tile follows it.
  Numerics n;
  n.kv_tile = 8;
  ASSERT_TRUE(cpu->set_numerics(n, {}).ok());
  EXPECT_EQ(cpu->numerics().attention, AttentionAlgorithm::native);
  EXPECT_EQ(cpu->numerics().kv_tile, 8);
  EXPECT_EQ(cpu->default_kv_tile(), 8);
  n = {};
  n.attention = AttentionAlgorithm::native;
  ASSERT_TRUE(cpu->set_numerics(n, Diagnostics{true, true}).ok());
  EXPECT_EQ(cpu->numerics(), r);
  EXPECT_EQ(cpu->diagnostics(), (Diagnostics{true, true}));

  // make_backend with numerics: the same resolution.
  auto b = make_backend("cpu", Numerics{}, Diagnostics{});
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ((*b)->numerics(), r);

  // The model's head dim never moves the CPU's attention (native, the reference, for
  // every head dim; CUDA may resolve auto per head dim: tests/cuda/test_attention_default_cuda.cpp).
  for (const int64_t hd : {16, 64, 128, 256}) {
    ASSERT_TRUE((*b)->set_model_head_dim(hd).ok());
    EXPECT_EQ((*b)->numerics(), r) << "head dim " << hd;
  }
}

TEST(Numerics, CpuRefusesWhatItCannotHonour) {
  auto cpu = make_cpu_backend();
  Numerics keep;
  keep.kv_tile = 16;
  ASSERT_TRUE(cpu->set_numerics(keep, {}).ok());
  const Numerics before = cpu->numerics();
  struct Bad {
    const char* what;
    Numerics n;
    const char* says;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what, auto edit, const char* says) {
    Numerics n;
    edit(n);
    bad.push_back({what, n, says});
  };
  add("cudnn", [](Numerics& n) { n.attention = AttentionAlgorithm::cudnn; }, "no cuDNN attention");
  add("hopper", [](Numerics& n) { n.attention = AttentionAlgorithm::hopper; }, "no Hopper attention kernel");
  add("cublaslt", [](Numerics& n) { n.gemm_f32 = GemmF32Order::cublaslt; }, "no cuBLASLt");
  add("variant", [](Numerics& n) { n.native_variant = "8x1"; }, "native_variant '8x1'");
  add("q chunk", [](Numerics& n) { n.cudnn_q_chunk = 1024; }, "cudnn_q_chunk");
  add("form", [](Numerics& n) { n.cudnn_form = "unified"; }, "cudnn_form");
  add("skip", [](Numerics& n) { n.cudnn_skip_configs = 1; }, "cudnn_skip_configs");
  add("candidate", [](Numerics& n) { n.gemm_candidate = {{-1, 2}}; }, "gemm_candidate 2");
  add("bad q chunk", [](Numerics& n) { n.cudnn_q_chunk = 100; }, "multiple of 64");
  add("bad kv_tile", [](Numerics& n) { n.kv_tile = -8; }, "kv_tile -8");
  for (const Bad& b : bad) {
    const Status s = cpu->set_numerics(b.n, {});
    ASSERT_FALSE(s.ok()) << b.what;
    EXPECT_TRUE(has(s.message(), b.says)) << b.what << ": " << s.message();
    EXPECT_EQ(cpu->numerics(), before) << b.what << ": a refusal must keep the previous settings";
  }
  auto made = make_backend("cpu", bad[0].n, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(has(made.error().message, "cpu: the cpu backend has no cuDNN")) << made.error().message;
}

// The developer variables' mapping (numerics.h apply_developer_variables), with a fake
// lookup: every variable lands on its field, "used" lists them, bad values are refused
// naming the variable, and skipped names are left alone.
TEST(Numerics, DeveloperVariablesMapOntoTheStruct) {
  std::map<std::string, std::string> env = {
      {"LAYERSTREAM_ATTENTION", "native"},     {"LAYERSTREAM_GEMM_F32", "cublaslt"},
      {"LAYERSTREAM_ATTN_VARIANT", "4x1"},     {"LAYERSTREAM_CUDNN_QCHUNK", "1024"},
      {"LAYERSTREAM_CUDNN_FORM", "composite"}, {"LAYERSTREAM_CUDNN_CONFIG", "2"},
      {"LAYERSTREAM_GEMM_CANDIDATE", "5376:1"}, {"LAYERSTREAM_GEMM_VERBOSE", "1"},
      {"LAYERSTREAM_CUDNN_VERBOSE", "0"},      {"LAYERSTREAM_UNRELATED", "x"}};
  const VariableLookup lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  Numerics n;
  Diagnostics d;
  std::vector<std::string> used;
  ASSERT_TRUE(apply_developer_variables(lookup, &n, &d, &used).ok());
  EXPECT_EQ(n.attention, AttentionAlgorithm::native);
  EXPECT_EQ(n.gemm_f32, GemmF32Order::cublaslt);
  EXPECT_EQ(n.native_variant, "4x1");
  EXPECT_EQ(n.cudnn_q_chunk, 1024);
  EXPECT_EQ(n.cudnn_form, "composite");
  EXPECT_EQ(n.cudnn_skip_configs, 2);
  EXPECT_EQ(n.gemm_candidate, (std::map<int64_t, int>{{5376, 1}}));
  EXPECT_TRUE(d.gemm_verbose);
  EXPECT_FALSE(d.cudnn_verbose);
  EXPECT_EQ(used.size(), 9u);
  EXPECT_EQ(used.front(), "LAYERSTREAM_ATTENTION=native");

  // Skipped (a flag was given): untouched and not listed; empty values count as unset.
  Numerics m;
  Diagnostics dm;
  std::vector<std::string> used2;
  env = {{"LAYERSTREAM_ATTENTION", "cudnn"}, {"LAYERSTREAM_GEMM_F32", ""}};
  ASSERT_TRUE(apply_developer_variables(lookup, &m, &dm, &used2, {"LAYERSTREAM_ATTENTION"}).ok());
  EXPECT_EQ(m, Numerics{});
  EXPECT_TRUE(used2.empty());

  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"LAYERSTREAM_ATTENTION", "flash"},
           {"LAYERSTREAM_CUDNN_QCHUNK", "100"},
           {"LAYERSTREAM_CUDNN_QCHUNK", "2048x"},
           {"LAYERSTREAM_ATTN_VARIANT", "2x2"},
           {"LAYERSTREAM_CUDNN_FORM", "fused"},
           {"LAYERSTREAM_CUDNN_CONFIG", "-1"},
           {"LAYERSTREAM_GEMM_CANDIDATE", "a:b"}}) {
    env = {{name, value}};
    Numerics b;
    Diagnostics db;
    std::vector<std::string> u;
    const Status s = apply_developer_variables(lookup, &b, &db, &u);
    ASSERT_FALSE(s.ok()) << name << "=" << value;
    EXPECT_TRUE(has(s.message(), name + "=" + value)) << s.message();
  }
}

// Nothing under src/ reads the environment (issue 12: `grep -rn getenv src/` finds
// nothing): the numerics come in as parameters, the CLI maps developer variables.
TEST(Numerics, SourceTreeReadsNoEnvironment) {
  const std::filesystem::path src = std::filesystem::path(LS_TEST_DATA_DIR) / ".." / ".." / "src";
  ASSERT_TRUE(std::filesystem::is_directory(src)) << src;
  int files = 0;
  std::vector<std::string> hits;
  for (const auto& e : std::filesystem::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".c" && ext != ".hpp") continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int no = 1; std::getline(in, line); ++no)
      for (const char* word : {"getenv", "environ[", "setenv", "putenv"})
        if (has(line, word)) hits.push_back(e.path().string() + ":" + std::to_string(no) + ": " + line);
  }
  EXPECT_GT(files, 50) << "the walk found too few sources under " << src;
  std::ostringstream all;
  for (const std::string& h : hits) all << h << "\n";
  EXPECT_TRUE(hits.empty()) << "src/ reads the environment:\n" << all.str();
}

// Session::load_weights tells the backend the model's head dim (Backend::set_model_head_dim),
// where CUDA resolves attention auto per model; a recording backend sees it once per load.
class HeadDimRecorder final : public ls::test::ForwardingBackend {
 public:
  HeadDimRecorder() : ForwardingBackend(make_cpu_backend()) {}
  std::vector<int64_t> seen;
  Status set_model_head_dim(int64_t hd) override {
    seen.push_back(hd);
    return in_->set_model_head_dim(hd);
  }
};

TEST(Numerics, SessionTellsTheBackendTheModelsHeadDim) {
  auto rec = std::make_shared<HeadDimRecorder>();
  auto session = api::Session::with_backend(rec);
  for (const char* preset : {"tiny", "small"}) {
    api::WeightsSpec w;
    w.preset = preset;
    ASSERT_TRUE(session->load_weights(w).ok()) << preset;
  }
  auto tiny = h3::h3_preset("tiny"), small = h3::h3_preset("small");
  ASSERT_TRUE(tiny.ok() && small.ok());
  EXPECT_EQ(rec->seen, (std::vector<int64_t>{tiny->head_dim, small->head_dim}));
  EXPECT_EQ(rec->numerics().attention, AttentionAlgorithm::native);  // the CPU's, whatever the head dim
}

}  // namespace
}  // namespace ls
