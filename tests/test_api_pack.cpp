// The C API's issue-13 additions (API version 4): ls_denoise_params.output_masks (default
// 1 from the init function and for callers of an older, shorter struct; 0 = _forward's
// unmasked velocities, the masks' per-row timesteps kept), audio-only keyframes in both
// forms, and the report's staging fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_test_util.h"
#include "layerstream/layerstream.h"
#include "layerstream/layerstream.hpp"

namespace {

float round_bf16(float f) {  // round to nearest even (finite values)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

using Call = ls_api_test::Inputs;  // one denoiser call's clip and inputs
using ls_api_test::fill;
using ls_api_test::tiny;
using ls_api_test::make_inputs;

using ls_api_test::Out;

// One denoise; `size` < sizeof: an older caller's struct; output_masks < 0: the default.
Out denoise(ls_engine* e, const Call& c, int output_masks = -1, uint32_t size = sizeof(ls_denoise_params)) {
  return ls_api_test::denoise_call(e, c, 0.7f, [&](ls_denoise_params& d) {
    d.size = size;
    if (output_masks >= 0) d.output_masks = output_masks;
  });
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST(ApiPack, OutputMasksDefaultsOnAndOffIsUnmasked) {
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  EXPECT_EQ(d.output_masks, 1);
  auto e = tiny();
  Call c = make_inputs(e.get());
  c.clip.audio_scale = 1.0;  // no carry between the head and the masks
  const int64_t A = c.shape.A;
  std::vector<float> am(static_cast<size_t>(2 * A));
  for (size_t i = 0; i < am.size(); ++i) am[i] = i % 4 == 0 ? 1.0f : 0.1f + 0.03f * static_cast<float>(i % 9);
  c.clip.audio_mask = am.data();
  const Out masked = denoise(e.get(), c);
  ASSERT_EQ(masked.status, LS_OK) << ls_engine_last_error(e.get());
  // An older caller (the struct without output_masks) gets today's masked output.
  const Out old = denoise(e.get(), c, -1, static_cast<uint32_t>(offsetof(ls_denoise_params, output_masks)));
  ASSERT_EQ(old.status, LS_OK) << ls_engine_last_error(e.get());
  EXPECT_EQ(old.hash, masked.hash);
  const Out unmasked = denoise(e.get(), c, 0);
  ASSERT_EQ(unmasked.status, LS_OK) << ls_engine_last_error(e.get());
  EXPECT_NE(unmasked.hash, masked.hash);
  // masked audio = bf16(unmasked * ceil(256 m) / 256), per audio row; video has no mask.
  EXPECT_TRUE(same(unmasked.video, masked.video));
  std::vector<float> want(unmasked.audio.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = round_bf16(unmasked.audio[i] * (std::ceil(am[i % am.size()] * 256.0f) / 256.0f));
  EXPECT_TRUE(same(want, masked.audio));
  // The mask still sets the rows' timesteps.
  c.clip.audio_mask = nullptr;
  const Out plain = denoise(e.get(), c);
  EXPECT_FALSE(same(plain.audio, unmasked.audio));
  // The report: nothing on a device, nothing staged.
  const char* json = nullptr;
  ASSERT_EQ(ls_engine_report_json(e.get(), &json), LS_OK);
  const auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["staged_through_host"], false);
  EXPECT_EQ(j["staged_bytes"]["latents"], 0);
  EXPECT_EQ(j["staged_bytes"]["conditioning"], 0);
  EXPECT_EQ(j["output_readback_bytes"], 0);
}

TEST(ApiPack, AudioOnlyKeyframesInBothForms) {
  auto e = tiny();
  Call c = make_inputs(e.get());
  const ls_model_info& info = c.info;
  const Out plain = denoise(e.get(), c);
  ASSERT_EQ(plain.status, LS_OK);
  const int64_t Ak = 3;
  std::vector<float> ka(static_cast<size_t>(info.audio_latents_dim * 2 * Ak));
  fill(ka, 9);
  ls_keyframe pk{};  // pointer form: video.data NULL
  pk.pixel_frame = 5;
  pk.audio = {ka.data(), Ak};
  c.clip.keyframes = &pk, c.clip.keyframe_count = 1;
  ls_clip_shape shape;
  ls_clip_shape_init(&shape);
  ASSERT_EQ(ls_engine_clip_shape(e.get(), &c.clip, &shape), LS_OK) << ls_engine_last_error(e.get());
  EXPECT_EQ(shape.S, c.shape.S + 2 * Ak);  // its audio rows only
  const Out ptr = denoise(e.get(), c);
  ASSERT_EQ(ptr.status, LS_OK) << ls_engine_last_error(e.get());
  EXPECT_NE(ptr.hash, plain.hash);
  // Tensor form: video NULL.
  c.clip.keyframes = nullptr, c.clip.keyframe_count = 0;
  const int64_t ashape[3] = {info.audio_latents_dim, 2, Ak};
  ls_tensor at;
  ls_tensor_host(&at, ka.data(), LS_DTYPE_F32, 3, ashape);
  ls_keyframe_tensors k;
  ls_keyframe_tensors_init(&k);
  k.pixel_frame = 5;
  k.audio = &at;
  const ls_keyframe_tensors* kp = &k;
  c.clip.keyframe_tensors = &kp, c.clip.keyframe_tensor_count = 1;
  const Out ten = denoise(e.get(), c);
  ASSERT_EQ(ten.status, LS_OK) << ls_engine_last_error(e.get());
  EXPECT_EQ(ten.hash, ptr.hash);
  EXPECT_TRUE(same(ten.audio, ptr.audio));
  // Neither latent: refused, naming the keyframe.
  k.audio = nullptr;
  const Out none = denoise(e.get(), c);
  EXPECT_EQ(none.status, LS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ls_engine_last_error(e.get())).find("keyframe 0 has neither a video nor an audio latent"),
            std::string::npos)
      << ls_engine_last_error(e.get());
}
