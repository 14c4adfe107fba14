// Shared helpers for the engine's exactness tests: tiny random H3 configurations,
// random layouts (keyframes, references, masks, text tags) and seeded inputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "exec/engine.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"

namespace ls::test {

// Gives `be` numerics with kv_tile `tile`, every other field as it is: a plan's kv_tile
// must be the backend's (Engine::prepare and forward refuse another), and the text
// refiner walks its keys in the same tiles.
inline Status use_kv_tile(Backend& be, int64_t tile) {
  Numerics n = be.numerics();
  n.kv_tile = tile;
  return be.set_numerics(n, be.diagnostics());
}

inline h3::H3Config tiny_cfg(std::mt19937_64& rng, bool vary = true) {
  h3::H3Config c;
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  c.heads = vary ? pick(1, 3) : 2;
  c.rope_inv_freq_len = vary ? pick(1, 3) : 2;
  c.head_dim = 2 * (3 * c.rope_inv_freq_len + (vary ? pick(0, 4) : 2));  // rot_dim 6 len <= head_dim, even
  c.hidden = vary ? 8 * pick(3, 6) : 32;
  c.num_layers = vary ? pick(1, 2) : 2;
  c.refiner_layers = vary ? pick(0, 1) : 1;
  c.ffn = vary ? 8 * pick(3, 8) : 48;
  c.text_dim = vary && pick(0, 3) == 0 ? c.hidden : 24;
  c.timestep_input_dim = 32;
  c.time_embed_hidden = 24;
  c.time_embed_dim = 16;
  c.pdd_heads = vary ? (pick(0, 2) == 0 ? pick(2, 4) : 1) : 1;
  if (vary && pick(0, 2) == 0) c = h3::h3_curve_form(c, pick(2, 33), pick(2, 8));
  return c;
}

// A plain clip's conditioning (t2va, no extras) from pixel sizes (h3::clip_geometry).
inline h3::Conditioning clip(int64_t frames, int64_t w, int64_t h, int64_t L) {
  h3::Conditioning c;
  auto g = h3::clip_geometry(frames, w, h, L);
  EXPECT_TRUE(g.ok());
  c.geometry = *g;
  return c;
}

inline std::vector<float> randn(std::mt19937_64& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline h3::VideoLatent video_latent(std::mt19937_64& rng, const h3::H3Config& cfg, int64_t T, int64_t Hl, int64_t Wl) {
  h3::VideoLatent v;
  v.T = T, v.Hl = Hl, v.Wl = Wl;
  v.data = randn(rng, static_cast<size_t>(cfg.latents_dim * T * Hl * Wl));
  return v;
}
inline h3::AudioLatent audio_latent(std::mt19937_64& rng, const h3::H3Config& cfg, int64_t A) {
  h3::AudioLatent a;
  a.A = A;
  a.data = randn(rng, static_cast<size_t>(cfg.audio_latents_dim * 2 * A));
  return a;
}

// A random small conditioning; `extras` enables keyframes, references, masks, tags.
inline h3::Conditioning random_cond(std::mt19937_64& rng, const h3::H3Config& cfg, bool extras) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  h3::Conditioning c;
  c.geometry.T = pick(1, 3);
  c.geometry.Hl = 2 * pick(1, 3);
  c.geometry.Wl = 2 * pick(1, 3);
  c.geometry.A = pick(1, 6);
  c.geometry.text_tokens = pick(1, 9);
  c.geometry.frames = 5;
  c.seed = static_cast<uint64_t>(pick(0, 1000));
  c.audio_scale = pick(0, 3) == 0 ? 1.0 : 4.0;
  c.sample_sigmas = {1.0f, 0.9f, 0.75f, 0.5f, 0.0f};
  if (!extras) return c;
  // Condition noise augmentation on either stream (< 1 blends noise into the condition
  // rows; 0.5 makes the noise half of every condition value).
  const double augs[] = {0.5, 0.999, 1.0};
  c.vis_aug = augs[pick(0, 2)];
  c.aud_aug = augs[pick(0, 2)];
  if (pick(0, 1)) {
    c.text_token_tags.resize(static_cast<size_t>(c.geometry.text_tokens));
    for (auto& t : c.text_token_tags) t = static_cast<int8_t>(pick(0, 1));
  }
  for (int64_t k = pick(0, 2); k > 0; --k) {
    h3::Keyframe kf;
    kf.pixel_frame = pick(0, 20);
    kf.video = video_latent(rng, cfg, pick(1, 2), c.geometry.Hl, c.geometry.Wl);
    if (pick(0, 1)) kf.audio = audio_latent(rng, cfg, pick(1, 3));
    if (pick(0, 1)) {  // caller-drawn noise (ConditionNoise) in the rows' shape
      kf.noise.video = randn(rng, kf.video.data.size());
      kf.noise.audio = randn(rng, kf.audio.data.size());
    }
    c.keyframes.push_back(kf);
  }
  for (int64_t k = pick(0, 2); k > 0; --k) {
    h3::Reference r;
    r.kind = static_cast<h3::ReferenceKind>(pick(0, 3));
    if (r.kind != h3::ReferenceKind::audio)
      r.video = video_latent(rng, cfg, r.kind == h3::ReferenceKind::image ? 1 : pick(1, 3), 2 * pick(1, 2), 2 * pick(1, 2));
    if (r.kind == h3::ReferenceKind::audio || r.kind == h3::ReferenceKind::video_audio) r.audio = audio_latent(rng, cfg, pick(1, 3));
    c.refs.push_back(r);
  }
  if (pick(0, 1)) {
    c.video_mask.resize(static_cast<size_t>(c.geometry.T * c.geometry.Hl * c.geometry.Wl));
    for (auto& m : c.video_mask) m = pick(0, 2) == 0 ? 0.0f : std::uniform_real_distribution<float>(0, 1)(rng);
  }
  if (pick(0, 1)) {
    c.audio_mask.resize(static_cast<size_t>(2 * c.geometry.A));
    for (auto& m : c.audio_mask) m = pick(0, 2) == 0 ? 1.0f : std::uniform_real_distribution<float>(0, 1)(rng);
  }
  return c;
}

// Every input mode ComfyUI's H3 has beyond t2va, on an existing conditioning (its
// geometry final): partial video and audio masks (values not multiples of 1/256, not
// constant per 2x2 patch, some exact 0s and 1s), a keyframe with video and audio, an
// image reference with its own grid and an audio reference, augmentation 0.5 on both
// streams (half of every condition value is noise), the keyframe's noise handed in by
// the caller and the references' from the engine's generator. With cfg.pdd_heads > 1
// (set before the source is made) the case also runs a PDD bank on both heads.
inline void add_all_modes(std::mt19937_64& rng, const h3::H3Config& cfg, h3::Conditioning& c) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  auto mask_value = [&]() {
    const int64_t k = pick(0, 3);
    return k == 0 ? 0.0f : k == 1 ? 1.0f : std::uniform_real_distribution<float>(0, 1)(rng);
  };
  const h3::ClipGeometry& g = c.geometry;
  c.video_mask.resize(static_cast<size_t>(g.T * g.Hl * g.Wl));
  for (auto& m : c.video_mask) m = mask_value();
  // The first 2x2 patch pools to a partial value whatever the draws (amax 0.3 -> 77/256).
  const float patch[4] = {0.3f, 0.1f, 0.2f, 0.05f};
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 2; ++q) c.video_mask[static_cast<size_t>(p * g.Wl + q)] = patch[2 * p + q];
  c.audio_mask.resize(static_cast<size_t>(2 * g.A));
  for (auto& m : c.audio_mask) m = mask_value();
  c.audio_mask[0] = 0.3f;
  c.vis_aug = 0.5;
  c.aud_aug = 0.5;
  c.seed = static_cast<uint64_t>(pick(0, 1 << 20));
  h3::Keyframe kf;
  kf.pixel_frame = pick(0, 8);
  kf.video = video_latent(rng, cfg, 1, g.Hl, g.Wl);
  kf.audio = audio_latent(rng, cfg, pick(1, 3));
  kf.noise.video = randn(rng, kf.video.data.size());
  kf.noise.audio = randn(rng, kf.audio.data.size());
  c.keyframes.push_back(std::move(kf));
  h3::Reference img;
  img.kind = h3::ReferenceKind::image;
  img.video = video_latent(rng, cfg, 1, 2 * pick(1, 3), 2 * pick(1, 3));
  c.refs.push_back(std::move(img));
  h3::Reference aud;
  aud.kind = h3::ReferenceKind::audio;
  aud.audio = audio_latent(rng, cfg, pick(1, 4));
  c.refs.push_back(std::move(aud));
  if (c.sample_sigmas.empty()) c.sample_sigmas = {1.0f, 0.9f, 0.75f, 0.5f, 0.0f};
}

struct Inputs {
  std::vector<float> video, audio, text;
  TensorView video_view(const h3::H3Config& cfg, const h3::Conditioning& c) {
    return TensorView(video.data(), DType::f32, {cfg.latents_dim, c.geometry.T, c.geometry.Hl, c.geometry.Wl});
  }
  TensorView audio_view(const h3::H3Config& cfg, const h3::Conditioning& c) {
    return TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, c.geometry.A});
  }
  TensorView text_view(const h3::H3Config& cfg, const h3::Conditioning& c) {
    return TensorView(text.data(), DType::f32, {c.geometry.text_tokens, cfg.text_dim});
  }
};

inline Inputs random_inputs(std::mt19937_64& rng, const h3::H3Config& cfg, const h3::Conditioning& c) {
  Inputs in;
  in.video = randn(rng, static_cast<size_t>(cfg.latents_dim * c.geometry.T * c.geometry.Hl * c.geometry.Wl));
  in.audio = randn(rng, static_cast<size_t>(cfg.audio_latents_dim * 2 * c.geometry.A));
  in.text = randn(rng, static_cast<size_t>(c.geometry.text_tokens * cfg.text_dim));
  return in;
}

// A fixed three-block case (the engine and phase tests): a tiny config (not varied), a
// 9-frame 64x64 clip with `text_tokens` tokens sampled at {1, 0.8, 0}, random inputs,
// all drawn from `seed`.
struct SmallCase {
  h3::H3Config cfg;
  h3::Conditioning cond;
  Inputs in;
};
inline SmallCase small_case(uint64_t seed, int64_t text_tokens) {
  std::mt19937_64 rng(seed);
  SmallCase c;
  c.cfg = tiny_cfg(rng, false);
  c.cfg.num_layers = 3;
  c.cond = clip(9, 64, 64, text_tokens);
  c.cond.sample_sigmas = {1.0f, 0.8f, 0.0f};
  c.in = random_inputs(rng, c.cfg, c.cond);
  return c;
}

inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double sum_abs(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += std::abs(static_cast<double>(x));
  return s;
}

}  // namespace ls::test
