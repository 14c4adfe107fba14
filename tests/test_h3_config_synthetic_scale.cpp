// Synthetic weights keep activations realistic through 50 blocks: the residual stream's
// RMS after every block stays within a small factor of the embedded input's, and the
// velocities come out finite and O(1). Run through the engine on the CPU (tiny dims,
// 50 blocks, a few dozen tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"

using namespace ls;

namespace {

double rms_bf16(const TensorView& t) {
  // t: bf16 [rows, D] on the host (CPU backend).
  double s = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < t.rows(); ++r)
    for (int64_t c = 0; c < t.size(-1); ++c) {
      const double v = load_as_f64(t.at(r, c), t.dtype, 0);
      s += v * v;
      ++n;
    }
  return std::sqrt(s / static_cast<double>(n));
}

void check_scale(h3::H3Config cfg) {
  cfg.num_layers = 50;
  h3::H3SyntheticSource src(cfg, 1);
  auto be = make_cpu_backend();
  std::vector<double> block_rms(50, -1.0);
  double embed_rms = -1.0;
  exec::EngineOptions opts;
  opts.eval = [&](const std::string& name, int64_t layer, const TensorView& t) {
    if (t.device.kind != DeviceKind::cpu || t.dtype != DType::bf16) return;
    if (name == "x.embed") embed_rms = rms_bf16(t);
    if (name == "block.mlp" && layer >= 0 && layer < 50) block_rms[static_cast<size_t>(layer)] = rms_bf16(t);
  };
  auto engine = exec::Engine::create(src, *be, opts);
  ASSERT_TRUE(engine.ok()) << engine.error().message;

  h3::Conditioning cond;
  cond.geometry = *h3::clip_geometry(5, 64, 64, 8);  // T 2, 4x4 latents, A 8: S = 8 + 16 + 8
  cond.audio_scale = 4.0;
  cond.sample_sigmas = {1.0f, 0.8f, 0.0f};
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> video(static_cast<size_t>(cfg.latents_dim * cond.geometry.T * cond.geometry.Hl * cond.geometry.Wl));
  std::vector<float> audio(static_cast<size_t>(cfg.audio_latents_dim * 2 * cond.geometry.A));
  std::vector<float> text(static_cast<size_t>(cond.geometry.text_tokens * cfg.text_dim));
  for (auto* v : {&video, &audio, &text})
    for (auto& x : *v) x = nd(rng);
  auto refined = (*engine)->refine_text(TensorView(text.data(), DType::f32, {cond.geometry.text_tokens, cfg.text_dim}));
  ASSERT_TRUE(refined.ok()) << refined.error().message;
  auto plan = exec::make_plan(cfg, cond, exec::PlanKnobs{});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto r = (*engine)->forward(
      cond, *refined,
      TensorView(video.data(), DType::f32, {cfg.latents_dim, cond.geometry.T, cond.geometry.Hl, cond.geometry.Wl}),
      TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, cond.geometry.A}), 0.8f, *plan);
  ASSERT_TRUE(r.ok()) << r.error().message;

  ASSERT_GT(embed_rms, 0.0);
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_GT(block_rms[i], 0.0) << "block " << i << " not seen";
    EXPECT_LT(block_rms[i] / embed_rms, 4.0) << "block " << i;
    EXPECT_GT(block_rms[i] / embed_rms, 0.25) << "block " << i;
  }
  double vs = 0;
  for (float v : r->video) {
    ASSERT_TRUE(std::isfinite(v));
    vs += static_cast<double>(v) * v;
  }
  const double video_rms = std::sqrt(vs / static_cast<double>(r->video.size()));
  EXPECT_GT(video_rms, 0.05);
  EXPECT_LT(video_rms, 20.0);
  std::printf("%s: embed rms %.3f, block 0 %.3f, block 24 %.3f, block 49 %.3f, velocity rms %.3f\n",
              cfg.curve_form() ? "curve" : "unpruned", embed_rms, block_rms[0], block_rms[24], block_rms[49], video_rms);
}

}  // namespace

TEST(H3SyntheticScale, ResidualStaysRealisticOver50Blocks) { check_scale(*h3::h3_preset("tiny")); }
TEST(H3SyntheticScale, CurveFormToo) { check_scale(h3::h3_curve_form(*h3::h3_preset("tiny"))); }
