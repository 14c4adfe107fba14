// Which attention `auto` runs on CUDA (issue 15: "the default on sm_90 is the fastest one
// that passes"): hopper for a model of head dim 128 on an sm_90 device in a build with the
// Hopper kernel, cudnn otherwise (where built), and never a change to an explicit choice
// or to auto given with another path's knobs. Resolution happens when a Session loads the
// weights (Backend::set_model_head_dim), so numerics() and every report name what ran.
// Then the CLI's default run at H3 width is pinned to the recorded "cuda cli" fingerprints
// (tests/data/fingerprints.json): the default equals --attention hopper on sm_90 (cudnn
// elsewhere), and the cudnn run keeps its value of sessions 4-6 (016ce082fd98be77).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "api/session.h"
#include "backend/cuda/attention_cudnn.cuh"
#include "backend/cuda/attention_hopper.cuh"
#include "cli_test_util.h"
#include "fingerprint_cases.h"  // recorded(section)

namespace ls {
namespace {

bool hopper_here() { return cuda::attention_hopper_built() && cuda::attention_hopper_available(0).ok(); }

// The attention the session's backend resolved after loading `preset`.
Expected<AttentionAlgorithm> resolved_after_load(const std::string& preset, const Numerics& n) {
  LS_ASSIGN_OR_RETURN(auto s, api::Session::open_backend("cuda", n));
  api::WeightsSpec w;
  w.preset = preset;
  w.blocks = 1;
  LS_TRY(s->load_weights(w));
  return s->backend().numerics().attention;
}

TEST(AttentionDefaultCuda, AutoPicksHopperForHeadDim128OnSm90) {
  if (!make_backend("cuda").ok()) GTEST_SKIP() << "no CUDA device";
  const AttentionAlgorithm other = cuda::attention_cudnn_built() ? AttentionAlgorithm::cudnn : AttentionAlgorithm::native;
  // Before any model: the backend's own default (cudnn where built).
  auto be = make_backend("cuda", Numerics{}, {});
  ASSERT_TRUE(be.ok()) << be.error().message;
  EXPECT_EQ((*be)->numerics().attention, other);
  // h3 (head dim 128) and tiny (another head dim).
  auto h3 = resolved_after_load("h3", {});
  ASSERT_TRUE(h3.ok()) << h3.error().message;
  EXPECT_EQ(*h3, hopper_here() ? AttentionAlgorithm::hopper : other);
  auto tiny = resolved_after_load("tiny", {});
  ASSERT_TRUE(tiny.ok()) << tiny.error().message;
  EXPECT_EQ(*tiny, other);
  // An explicit choice stays.
  for (const AttentionAlgorithm a : {AttentionAlgorithm::native, AttentionAlgorithm::cudnn}) {
    if (a == AttentionAlgorithm::cudnn && !cuda::attention_cudnn_built()) continue;
    Numerics n;
    n.attention = a;
    auto r = resolved_after_load("h3", n);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, a);
  }
  // auto with a cudnn knob keeps cudnn; auto with a native variant keeps native.
  if (cuda::attention_cudnn_built()) {
    Numerics n;
    n.cudnn_q_chunk = 4096;
    auto r = resolved_after_load("h3", n);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, AttentionAlgorithm::cudnn);
  }
  // One backend, two models: auto is resolved again for each (it is kept as given).
  auto be2 = make_backend("cuda", Numerics{}, {});
  ASSERT_TRUE(be2.ok());
  ASSERT_TRUE((*be2)->set_model_head_dim(128).ok());
  EXPECT_EQ((*be2)->numerics().attention, hopper_here() ? AttentionAlgorithm::hopper : other);
  ASSERT_TRUE((*be2)->set_model_head_dim(64).ok());
  EXPECT_EQ((*be2)->numerics().attention, other);
  EXPECT_FALSE((*be2)->set_model_head_dim(-1).ok());
}

// info --devices names what auto runs on each GPU: hopper for head dim 128 on sm_90.
TEST(AttentionDefaultCuda, InfoDevicesNamesTheResolution) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device (or no CUDA backend in the binary)";
  const auto r = test::run_tool("info --devices --json", "", /*merge_stderr=*/false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_GE(j["devices"].size(), 2u) << r.out;
  const auto& d = j["devices"][1];
  EXPECT_EQ(d["device"], "cuda:0");
  ASSERT_TRUE(d.contains("memory")) << d.dump();
  EXPECT_GT(d["memory"]["total_bytes"].get<uint64_t>(), 0u);
  const std::string other = cuda::attention_cudnn_built() ? "cudnn" : "native";
  EXPECT_EQ(d["numerics_head_dim_128"]["attention"], hopper_here() ? "hopper" : other) << d.dump();
  EXPECT_EQ(d["numerics_other_head_dims"]["attention"], other) << d.dump();
}

TEST(AttentionDefaultCuda, CliDefaultAtH3WidthMatchesRecorded) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device (or no CUDA backend in the binary)";
  const std::string run =
      "forward --random-weights --preset h3 --blocks 2 --frames 39 --width 512 --height 384 --text-tokens 64 "
      "--sigma 0.9 --device cuda";
  std::map<std::string, std::string> got;
  for (const char* a : {"auto", "cudnn", "hopper"}) {
    if (std::string(a) == "hopper" && !hopper_here()) continue;
    if (std::string(a) == "cudnn" && !cuda::attention_cudnn_built()) continue;
    const auto r = test::run_tool(run + " --attention " + a);
    ASSERT_EQ(r.code, 0) << r.out;
    got[a] = test::output_hash(r);
    ASSERT_EQ(got[a].size(), 16u) << r.out;
    // The numerics line names what ran.
    const std::string ran = std::string(a) != "auto" ? a : hopper_here() ? "hopper" : "cudnn";
    EXPECT_NE(r.out.find("attention " + ran), std::string::npos) << r.out;
  }
  if (hopper_here()) {
    EXPECT_EQ(got["auto"], got["hopper"]) << "auto is hopper at head dim 128 on sm_90";
  } else if (cuda::attention_cudnn_built()) {
    EXPECT_EQ(got["auto"], got["cudnn"]);
  }
  const auto want = test::fingerprint::recorded("cuda cli");
  std::printf("observed (the \"cuda cli\" section of tests/data/fingerprints.json):\n");
  for (const auto& [k, v] : got) std::printf("    \"h3 2 blocks 39x512x384 L64 sigma 0.9 %s\": \"%s\",\n", k.c_str(), v.c_str());
  for (const auto& [k, v] : got) {
    if (k == "auto") continue;  // equal to one of the others (checked above)
    const std::string key = "h3 2 blocks 39x512x384 L64 sigma 0.9 " + k;
    auto it = want.find(key);
    ASSERT_TRUE(it != want.end() && !it->second.empty())
        << key << " is not recorded: check the run is the intended numerics, record the value printed above in "
                  "tests/data/fingerprints.json and docs/numerics.md (\"Fingerprint changes\")";
    EXPECT_EQ(v, it->second) << key << ": an output bit changed (record a deliberate change in docs/numerics.md)";
  }
}

}  // namespace
}  // namespace ls
