#include "exec/phase_output.h"

#include <cmath>

#include "core/dtype.h"

namespace ls::exec {

Expected<std::optional<PddHeads>> select_pdd_heads(const h3::H3Config& cfg, const WeightStore& weights,
                                                    const h3::Conditioning& cond, const h3::Timesteps& ts) {
  if (cfg.pdd_heads <= 1) return std::optional<PddHeads>();
  const int64_t Pv = cfg.video_patch_dim(), Pa = cfg.audio_latents_dim;
  if (Pa > Pv)
    return make_error(ErrorCode::unsupported, "a PDD head bank with audio head rows (" + std::to_string(Pa) +
                                                  ") wider than the video head's (" + std::to_string(Pv) +
                                                  ") is not supported");
  PddHeads p;
  LS_ASSIGN_OR_RETURN(p.video, h3::pdd_effective_head(weights.host("final_layer.video_out.weight"),
                                                      weights.host("final_layer.video_out.bias"), cfg.pdd_heads,
                                                      cond.sample_sigmas, ts.sig.sigma_v, cond.shift_video, cond.shift_video));
  LS_ASSIGN_OR_RETURN(p.audio, h3::pdd_effective_head(weights.host("final_layer.audio_out.weight"),
                                                      weights.host("final_layer.audio_out.bias"), cfg.pdd_heads,
                                                      cond.sample_sigmas, ts.sig.sigma_v, cond.shift_video, cond.shift_audio));
  return std::optional<PddHeads>(std::move(p));
}

Status finish_outputs(const h3::H3Config& cfg, const h3::Conditioning& cond, const h3::Timesteps& ts,
                      const h3::EmbedInputs& inputs, std::vector<float>& vout, std::vector<float>& aout,
                      bool check_finite, std::vector<float>& video, std::vector<float>& audio) {
  const h3::ClipGeometry& g = cond.geometry;
  const int64_t Pv = cfg.video_patch_dim(), Pa = cfg.audio_latents_dim;
  const int64_t video_rows = static_cast<int64_t>(vout.size()) / Pv, audio_rows = static_cast<int64_t>(aout.size()) / Pa;
  video.assign(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl), 0.0f);
  audio.assign(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A), 0.0f);
  // Return [-video.to(bf16), -audio.to(bf16)]: cast first, then negate (exact).
  for (auto& v : vout) v = -round_bf16(v);
  for (auto& v : aout) v = -round_bf16(v);
  for (int64_t r = 0; r < video_rows; ++r)
    h3::video_unpatch_row(vout.data() + r * Pv, cfg.latents_dim, g.T, g.Hl, g.Wl, r, video.data());
  for (int64_t r = 0; r < audio_rows; ++r) h3::audio_unrow(aout.data() + r * Pa, cfg.audio_latents_dim, g.A, r, audio.data());
  // Masks (§2.2 step 5): out *= the mask model_base hands the model: pooled per 2x2
  // patch (amax) and quantised to ceil(m * 256) / 256, the values that also set the
  // per-row timesteps (h3::pooled_video_mask / pooled_audio_mask), broadcast over the
  // channels (video: also over the patch's 2x2 pixels). A bf16 tensor times a bf16 mask
  // (k/256 is exact in bf16): one rounding to bf16.
  if (!cond.video_mask.empty()) {
    const std::vector<float> pm = h3::pooled_video_mask(cond);  // [T * Hl/2 * Wl/2]
    const int64_t hp = g.Hl / 2, wp = g.Wl / 2, plane = g.T * g.Hl * g.Wl;
    for (int64_t c = 0; c < cfg.latents_dim; ++c)
      for (int64_t t = 0; t < g.T; ++t)
        for (int64_t y = 0; y < g.Hl; ++y)
          for (int64_t w = 0; w < g.Wl; ++w) {
            const float mv = pm[static_cast<size_t>((t * hp + y / 2) * wp + w / 2)];
            float& v = video[static_cast<size_t>(c * plane + (t * g.Hl + y) * g.Wl + w)];
            v = round_bf16(v * mv);
          }
  }
  if (!cond.audio_mask.empty()) {
    const std::vector<float> pm = h3::pooled_audio_mask(cond);  // [2A]
    const int64_t plane = 2 * g.A;
    for (int64_t c = 0; c < cfg.audio_latents_dim; ++c)
      for (int64_t i = 0; i < plane; ++i) {
        float& v = audio[static_cast<size_t>(c * plane + i)];
        v = round_bf16(v * pm[static_cast<size_t>(i)]);
      }
  }
  // Audio carry (§2.2 step 6): out = (1 - s) * (audio_src * carry) + bf16(1 + (s - 1) * sigma_a) * out,
  // every op a bf16 tensor op (fp32 inside, one rounding).
  if (cond.audio_scale != 1.0) {
    const double s = cond.audio_scale;
    const auto one_minus_s = static_cast<float>(1.0 - s);
    const float coef = round_bf16(1.0f + static_cast<float>(s - 1.0) * ts.sig.sigma_a_f32);
    const std::vector<float>& ain = inputs.audio_in();
    for (size_t i = 0; i < audio.size(); ++i) {
      const float t1 = round_bf16(one_minus_s * ain[i]);
      const float t2 = round_bf16(coef * audio[i]);
      audio[i] = round_bf16(t1 + t2);
    }
  }
  if (check_finite) {
    // The residual was finite after the last block; the head, masks or carry may still
    // overflow (or a non-finite condition latent reach the carry term).
    int64_t n = 0;
    for (const std::vector<float>* out : {&video, &audio})
      for (float v : *out) n += std::isfinite(v) ? 0 : 1;
    if (n > 0)
      return make_error(ErrorCode::nonfinite, std::to_string(n) +
                                                  " non-finite output value(s) (NaN or inf) after the final layer "
                                                  "(the residual stream was finite); --allow-nonfinite writes them anyway");
  }
  return Status();
}

}  // namespace ls::exec
