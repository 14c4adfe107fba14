// The seeded clip the engine benchmarks denoise (bench_budget, bench_drift): latents and
// text from PyTorch's CPU randn streams 0 / 1 / 2 (model/h3/torch_random.h), at the
// geometry of `frames` x `width` x `height` with L text tokens, and the call's tensor views
// over them.
#pragma once
#include <cstdint>
#include <vector>

#include "api/session.h"
#include "bench_args.h"  // die
#include "model/h3/torch_random.h"

namespace ls::bench {

struct Clip {
  h3::Conditioning cond;
  std::vector<float> video, audio, text;
};

// An invalid geometry ends the benchmark: "prog: message" on stderr, exit status 2.
inline Clip make_clip(const char* prog, const h3::H3Config& cfg, int64_t frames, int64_t w, int64_t h, int64_t L) {
  auto g = h3::clip_geometry(frames, w, h, L);
  if (!g.ok()) die(prog, 2, g.error().message);
  Clip c;
  c.cond.geometry = *g;
  c.video = h3::torch_cpu_randn(0, cfg.latents_dim * g->T * g->Hl * g->Wl);
  c.audio = h3::torch_cpu_randn(1, cfg.audio_latents_dim * 2 * g->A);
  c.text = h3::torch_cpu_randn(2, g->text_tokens * cfg.text_dim);
  return c;
}

// Points call's conditioning and inputs at the clip (which must outlive the call).
inline void set_inputs(api::DenoiseCall& call, const Clip& clip, const h3::H3Config& cfg) {
  const auto& g = clip.cond.geometry;
  call.cond = &clip.cond;
  call.text = TensorView(const_cast<float*>(clip.text.data()), DType::f32, {g.text_tokens, cfg.text_dim});
  call.video = TensorView(const_cast<float*>(clip.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
  call.audio = TensorView(const_cast<float*>(clip.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A});
}

}  // namespace ls::bench
