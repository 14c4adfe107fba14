// Helpers shared by the C API tests (test_api.cpp, test_api_pack.cpp): bf16-exact inputs
// from integer formulas, a tiny clip's inputs sized by ls_engine_clip_shape, one denoise
// call, and the tiny preset's engine. Public headers only, as a consumer of the API would write them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "layerstream/layerstream.h"
#include "layerstream/layerstream.hpp"

namespace ls_api_test {

// Integer-formula inputs in steps of 1/64 (bf16-exact, never all zero).
inline void fill(std::vector<float>& x, uint32_t salt) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(((i * 37 + salt * 11) % 97)) / 64.0f - 0.75f;
}

// A 22-frame 64x64 clip with 8 text tokens and its filled video, audio and text inputs;
// the engine's model info beside them.
struct Inputs {
  ls_clip clip;
  ls_clip_shape shape;
  std::vector<float> video, audio, text;
  ls_model_info info;
};
inline Inputs make_inputs(ls_engine* e) {
  Inputs in;
  ls_clip_init(&in.clip);
  in.clip.frames = 22, in.clip.width = 64, in.clip.height = 64, in.clip.text_tokens = 8;
  ls_clip_shape_init(&in.shape);
  EXPECT_EQ(ls_engine_clip_shape(e, &in.clip, &in.shape), LS_OK) << ls_engine_last_error(e);
  in.video.resize(in.shape.video_count), in.audio.resize(in.shape.audio_count), in.text.resize(in.shape.text_count);
  fill(in.video, 1), fill(in.audio, 2), fill(in.text, 3);
  ls_model_info_init(&in.info);
  EXPECT_EQ(ls_engine_model_info(e, &in.info), LS_OK) << ls_engine_last_error(e);
  return in;
}

// One denoise call's outputs (f32, pointer form), output hash and status.
struct Out {
  std::vector<float> video, audio;
  uint64_t hash = 0;
  ls_status status = LS_OK;
};

// Denoises `in` at `sigma`; `tweak` edits the params last (null: none).
inline Out denoise_call(ls_engine* e, const Inputs& in, float sigma,
                        const std::function<void(ls_denoise_params&)>& tweak = nullptr) {
  Out o;
  o.video.resize(in.shape.video_count), o.audio.resize(in.shape.audio_count);
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  d.clip = &in.clip, d.video = in.video.data(), d.audio = in.audio.data(), d.text = in.text.data(), d.sigma = sigma;
  d.video_out = o.video.data(), d.video_out_count = o.video.size();
  d.audio_out = o.audio.data(), d.audio_out_count = o.audio.size();
  if (tweak) tweak(d);
  o.status = ls_engine_denoise(e, &d);
  o.hash = ls_engine_output_hash(e);
  return o;
}

// The tiny preset's engine; `tweak` edits the params first.
inline layerstream::EnginePtr tiny(void (*tweak)(ls_engine_params&) = nullptr) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  if (tweak) tweak(p);
  ls_status s = LS_OK;
  auto e = layerstream::make_engine(p, &s);
  EXPECT_EQ(s, LS_OK) << ls_last_error();
  return e;
}

}  // namespace ls_api_test
