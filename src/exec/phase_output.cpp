#include "exec/phase_output.h"

#include <cmath>

#include "backend/cpu/pack.h"
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

OutputMapping output_mapping(const h3::Conditioning& cond, const h3::Timesteps& ts, const h3::EmbedInputs& inputs) {
  OutputMapping om;
  // Masks (§2.2 step 5): out *= the mask model_base hands the model: pooled per 2x2
  // patch (amax) and quantised to ceil(m * 256) / 256, the values that also set the
  // per-row timesteps (h3::pooled_video_mask / pooled_audio_mask), broadcast over the
  // channels (video: also over the patch's 2x2 pixels). A bf16 tensor times a bf16 mask
  // (k/256 is exact in bf16): one rounding to bf16. output_masks off: _forward's
  // unmasked velocities (the rows' timesteps still come from the masks).
  if (cond.output_masks) {
    om.video_mask = h3::pooled_video_mask(cond);  // [T * Hl/2 * Wl/2]: one per patch row
    om.audio_mask = h3::pooled_audio_mask(cond);  // [2A]: one per audio row
  }
  // Audio carry (§2.2 step 6): out = (1 - s) * (audio_src * carry) + bf16(1 + (s - 1) * sigma_a) * out,
  // every op a bf16 tensor op (fp32 inside, one rounding).
  if (cond.audio_scale != 1.0) {
    const double sc = cond.audio_scale;
    om.carry.apply = true;
    om.carry.carry = inputs.carry();
    om.carry.one_minus_s = static_cast<float>(1.0 - sc);
    om.carry.coef = round_bf16(1.0f + static_cast<float>(sc - 1.0) * ts.sig.sigma_a_f32);
    om.carry.src = inputs.audio();
  }
  return om;
}

namespace {
TensorView mask_view(const std::vector<float>& m) {
  return m.empty() ? TensorView() : TensorView(const_cast<float*>(m.data()), DType::f32, {static_cast<int64_t>(m.size())});
}
// A device output's values as fp32 on the host (bf16 widened: exact).
Status read_back(Backend& be, const TensorView& dev, std::vector<float>& out) {
  const auto n = static_cast<size_t>(dev.numel());
  out.assign(n, 0.0f);
  const TensorView flat_dev(dev.data, dev.dtype, {dev.numel()}, dev.device);
  if (dev.dtype == DType::f32) {
    LS_TRY(be.copy(TensorView(out.data(), DType::f32, {dev.numel()}), flat_dev));
    return be.synchronize();
  }
  std::vector<uint16_t> bits(n);
  LS_TRY(be.copy(TensorView(bits.data(), DType::bf16, {dev.numel()}), flat_dev));
  LS_TRY(be.synchronize());
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bits[i]);
  return Status();
}
}  // namespace

Status finish_outputs(Backend& be, const h3::H3Config& cfg, const h3::Conditioning& cond, const OutputMapping& om,
                      const TensorView& video_dev, const TensorView& audio_dev, std::vector<float>& vout,
                      std::vector<float>& aout, bool check_finite, std::vector<float>& video, std::vector<float>& audio) {
  const h3::ClipGeometry& g = cond.geometry;
  const int64_t Pv = cfg.video_patch_dim(), Pa = cfg.audio_latents_dim;
  if (!video_dev.empty()) {
    LS_TRY(read_back(be, video_dev, video));
  } else {
    video.assign(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl), 0.0f);
    const int64_t rows = static_cast<int64_t>(vout.size()) / Pv;
    LS_TRY(cpu::cpu_op_unpack_video_rows(TensorView(vout.data(), DType::f32, {rows, Pv}), mask_view(om.video_mask), 0,
                                         TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})));
  }
  if (!audio_dev.empty()) {
    LS_TRY(read_back(be, audio_dev, audio));
  } else {
    audio.assign(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A), 0.0f);
    const int64_t rows = static_cast<int64_t>(aout.size()) / Pa;
    LS_TRY(cpu::cpu_op_unpack_audio_rows(TensorView(aout.data(), DType::f32, {rows, Pa}), mask_view(om.audio_mask),
                                         om.carry, 0,
                                         TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A})));
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
