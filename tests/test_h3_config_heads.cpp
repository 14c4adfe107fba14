// Config detection of the output heads and the hidden width (h3-model.md §1.2, §2.12):
//  - a PDD bank is ComfyUI-shaped on both heads (video_out [n*4C, D], audio_out [n*Ca, D]);
//    n is detected from the heads against the patch projections, and the synthetic
//    source (make-model --pdd-heads) writes that shape;
//  - a file whose two heads disagree (one banked, or different n) is refused, naming both
//    heads' shapes;
//  - every shape error of the detection names the tensor that is wrong: a transposed
//    video_patch_proj.weight is blamed on itself, not on final_layer.video_out (issue 11;
//    the old detection took D from it and then blamed the heads).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/h3/checkpoint.h"
#include "model/h3/config.h"

using namespace ls;
using namespace ls::h3;

namespace {

std::vector<TensorInfo> infos(const H3Config& c) {
  std::vector<TensorInfo> out;
  for (const TensorSpec& s : h3_tensor_specs(c)) out.push_back({s.name, s.dtype, s.shape});
  return out;
}

H3Config tiny() {
  auto c = h3_preset("tiny");
  EXPECT_TRUE(c.ok());
  return *c;
}

TensorInfo& tensor(std::vector<TensorInfo>& t, const std::string& name) {
  for (auto& i : t)
    if (i.name == name) return i;
  ADD_FAILURE() << "no " << name;
  return t.front();
}

bool has(const std::string& msg, const std::string& what) { return msg.find(what) != std::string::npos; }

// The message detect_h3_config refuses `t` with ("" and a failure when it accepts `t`).
std::string refusal(const std::vector<TensorInfo>& t) {
  auto d = detect_h3_config(t);
  if (d.ok()) {
    ADD_FAILURE() << "detect_h3_config accepted the tensors";
    return "";
  }
  return d.error().message;
}

TEST(H3DetectHeads, BankOnBothHeadsDetected) {
  for (int64_t n : {2, 3, 4}) {
    H3Config c = tiny();
    c.pdd_heads = n;
    auto t = infos(c);
    // ComfyUI's shape: both heads banked with the same n.
    EXPECT_EQ(tensor(t, "final_layer.video_out.weight").shape,
              (std::vector<int64_t>{n * 96, c.hidden}));
    EXPECT_EQ(tensor(t, "final_layer.audio_out.weight").shape,
              (std::vector<int64_t>{n * 32, c.hidden}));
    EXPECT_EQ(tensor(t, "final_layer.audio_out.bias").shape,
              (std::vector<int64_t>{n * 32}));
    auto d = detect_h3_config(t);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->pdd_heads, n);
    EXPECT_EQ(d->latents_dim, 24);        // from video_patch_proj, not video_out rows / 4
    EXPECT_EQ(d->audio_latents_dim, 32);  // from audio_patch_proj, not audio_out rows
    EXPECT_TRUE(validate_h3_tensors(*d, t).ok());
  }
}

// The synthetic source (what make-model --pdd-heads writes) is banked on both heads, and
// block 0 of a bank holds the unbanked head's values.
TEST(H3DetectHeads, SyntheticBankIsComfyShaped) {
  H3Config c = tiny();
  c.pdd_heads = 3;
  H3SyntheticSource banked(c, 5);
  H3Config one = tiny();
  H3SyntheticSource plain(one, 5);
  for (const char* name : {"final_layer.video_out.weight", "final_layer.audio_out.weight", "final_layer.audio_out.bias"}) {
    const TensorView b = banked.get(name), p = plain.get(name);
    ASSERT_EQ(b.shape[0], 3 * p.shape[0]) << name;
    const int64_t n0 = p.numel();
    int64_t same = 0;
    for (int64_t i = 0; i < n0; ++i) same += b.ptr<float>()[i] == p.ptr<float>()[i];
    EXPECT_EQ(same, n0) << name;
  }
}

TEST(H3DetectHeads, HeadsThatDisagreeAreRefusedNamingBoth) {
  // Only the video head banked (the engine's old make-model output).
  H3Config c = tiny();
  c.pdd_heads = 4;
  auto t = infos(c);
  tensor(t, "final_layer.audio_out.weight").shape = {32, c.hidden};
  tensor(t, "final_layer.audio_out.bias").shape = {32};
  const std::string m = refusal(t);
  EXPECT_TRUE(has(m, "final_layer.video_out.weight [384, 128]")) << m;
  EXPECT_TRUE(has(m, "final_layer.audio_out.weight [32, 128]")) << m;
  EXPECT_TRUE(has(m, "4 video heads but 1 audio heads")) << m;
  // Only the audio head banked.
  auto t2 = infos(tiny());
  tensor(t2, "final_layer.audio_out.weight").shape = {64, 128};
  const std::string m2 = refusal(t2);
  EXPECT_TRUE(has(m2, "final_layer.video_out.weight [96, 128]")) << m2;
  EXPECT_TRUE(has(m2, "final_layer.audio_out.weight [64, 128]")) << m2;
  // Rows that fit no bank.
  auto t3 = infos(tiny());
  tensor(t3, "final_layer.audio_out.weight").shape = {40, 128};
  const std::string m3 = refusal(t3);
  EXPECT_TRUE(has(m3, "final_layer.audio_out.weight [40, 128]")) << m3;
}

// Issue 11: a transposed video_patch_proj.weight was reported as a wrong
// final_layer.video_out ("has 96 rows, not a multiple of the patch dim 512").
TEST(H3DetectHeads, TransposedPatchProjectionNamedItself) {
  auto t = infos(tiny());
  tensor(t, "video_patch_proj.weight").shape = {96, 128};
  const std::string m = refusal(t);
  EXPECT_TRUE(has(m, "video_patch_proj.weight has shape [96, 128]")) << m;
  EXPECT_TRUE(has(m, "transposed")) << m;
  EXPECT_FALSE(has(m, "final_layer.video_out")) << m;
}

// Each tensor that states the hidden width, when it is the odd one out, is the one named.
TEST(H3DetectHeads, OddHiddenWidthNamesThatTensor) {
  const std::pair<const char*, std::vector<int64_t>> cases[] = {
      {"audio_patch_proj.weight", {32, 128}},       // transposed
      {"condition_proj.weight", {96, 128}},         // transposed
      {"final_layer.video_out.weight", {128, 96}},  // transposed
      {"final_layer.audio_out.weight", {32, 64}},   // wrong width
  };
  for (const auto& [name, shape] : cases) {
    auto t = infos(tiny());
    tensor(t, name).shape = shape;
    const std::string m = refusal(t);
    EXPECT_TRUE(has(m, std::string(name) + " has shape")) << name << ": " << m;
  }
  // A patch projection with input columns not a multiple of 4 is named too.
  auto t = infos(tiny());
  tensor(t, "video_patch_proj.weight").shape = {128, 95};
  const std::string m = refusal(t);
  EXPECT_TRUE(has(m, "video_patch_proj.weight has shape [128, 95]")) << m;
}

}  // namespace
