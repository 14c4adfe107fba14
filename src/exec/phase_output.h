// Phase output: the host-side model math around the final layer (h3-model.md §2.2,
// §2.12), none of it on the device:
//   - PDD bank selection (before any device work): the effective video and audio heads
//     of this step, formed from the bank (cfg.pdd_heads > 1);
//   - after the final layer: unpatchify, bf16 rounding, negation (ComfyUI's sign),
//     the inpainting masks, the audio carry transform, and the non-finite check of the
//     outputs.
#pragma once

#include <optional>
#include <vector>

#include "core/status.h"
#include "exec/weights.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"
#include "model/h3/embed.h"
#include "model/h3/final_layer.h"
#include "model/h3/layout.h"

namespace ls::exec {

// The effective heads of a PDD bank: f32 video [Pv, D] + [Pv], audio [Pa, D] + [Pa].
struct PddHeads {
  h3::EffectiveHead video, audio;
};
// nullopt without a bank (pdd_heads == 1). ComfyUI banks both heads with the same n and
// the same [start, stop) (from the video shift); each head's weights come from its own
// stream's shift. Errors: unsupported for a bank whose audio head is wider than the
// video head's (the final phase holds one buffer of the video head's size).
Expected<std::optional<PddHeads>> select_pdd_heads(const h3::H3Config& cfg, const WeightStore& weights,
                                                    const h3::Conditioning& cond, const h3::Timesteps& ts);

// The velocities from the final layer's rows: vout f32 [target video rows, Pv], aout
// f32 [target audio rows, Pa] (consumed) into video fp32 [latents_dim, T, Hl, Wl] and
// audio fp32 [audio_latents_dim, 2, A]. check_finite: ErrorCode::nonfinite when an
// output value is NaN or inf.
Status finish_outputs(const h3::H3Config& cfg, const h3::Conditioning& cond, const h3::Timesteps& ts,
                      const h3::EmbedInputs& inputs, std::vector<float>& vout, std::vector<float>& aout,
                      bool check_finite, std::vector<float>& video, std::vector<float>& audio);

}  // namespace ls::exec
