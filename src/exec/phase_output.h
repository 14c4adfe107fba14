// Phase output: the model math around the final layer (h3-model.md §2.2, §2.12):
//   - PDD bank selection (host, before any device work): the effective video and audio
//     heads of this step, formed from the bank (cfg.pdd_heads > 1);
//   - after the final layer: unpatchify, bf16 rounding, negation (ComfyUI's sign), the
//     inpainting masks, the audio carry transform (Backend::unpack_*_rows: on the device
//     into the caller's device outputs, or on the host), and the non-finite check.
#pragma once

#include <optional>
#include <vector>

#include "backend/backend.h"
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

// How the head rows become the call's velocities (h3-model.md §2.2 steps 4-6), for
// Backend::unpack_video_rows / unpack_audio_rows: the masks as ComfyUI's forward
// multiplies them (pooled per target row; empty without a mask or when
// cond.output_masks is off, as ComfyUI's _forward returns) and the audio carry
// (constants, and the target audio input the carry term reads).
struct OutputMapping {
  std::vector<float> video_mask;  // f32 [target video rows] or empty
  std::vector<float> audio_mask;  // f32 [target audio rows] or empty
  Backend::AudioCarryOut carry;
};
OutputMapping output_mapping(const h3::Conditioning& cond, const h3::Timesteps& ts, const h3::EmbedInputs& inputs);

// The velocities into video fp32 [latents_dim, T, Hl, Wl] and audio fp32
// [audio_latents_dim, 2, A]. A stream whose device view (video_dev / audio_dev) is set
// was written there by the final phase: its values are read back (bf16 widened, exact)
// for the fingerprint and the check. Otherwise its head rows vout f32 [target video
// rows, Pv] / aout f32 [target audio rows, Pa] (host) are unpacked on the host by the CPU
// ops. check_finite: ErrorCode::nonfinite when an output value is NaN or inf.
Status finish_outputs(Backend& be, const h3::H3Config& cfg, const h3::Conditioning& cond, const OutputMapping& om,
                      const TensorView& video_dev, const TensorView& audio_dev, std::vector<float>& vout,
                      std::vector<float>& aout, bool check_finite, std::vector<float>& video, std::vector<float>& audio);

}  // namespace ls::exec
