// Host-side input rows of the packed sequence (h3-model.md §2.2, §2.7): patchify the
// video latents, pack the audio latents, noise-augment the condition latents, the audio
// carry transform on the input; and the inverse mapping of the output heads.
//
// The condition rows are tiny next to the sequence's hidden states (96 or 32 fp32 values
// per row), so they are made on the host; the executor copies rows of a slice to the
// device and projects them there. The target latents are packed by the backend ops
// (backend.h, "latent packing"): on the device when they live there (issue 13).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"
#include "model/h3/layout.h"

namespace ls::h3 {

// Video patch row r = (t * Hl/2 + i) * Wl/2 + j of a latent fp32 [C, T, Hl, Wl]:
// out[4c + 2p + q] = lat[c, t, 2i + p, 2j + q] (p row, q column inside the 2x2 patch).
void video_patch_row(const float* lat, int64_t C, int64_t T, int64_t Hl, int64_t Wl, int64_t r, float* out);
// Audio row r = ch * A + j of a latent fp32 [C, 2, A]: out[c] = lat[c, ch, j].
void audio_row(const float* lat, int64_t C, int64_t A, int64_t r, float* out);
// Inverses: scatter a row back into the latent layout.
void video_unpatch_row(const float* row, int64_t C, int64_t T, int64_t Hl, int64_t Wl, int64_t r, float* lat);
void audio_unrow(const float* row, int64_t C, int64_t A, int64_t r, float* lat);

// The inputs of every non-text segment of one call: the target latents as the caller's
// views (packed per slice by Backend::pack_video_rows / pack_audio_rows, on the device
// when the views live there) and the condition rows (small: built here on the host).
class EmbedInputs {
 public:
  // video: f32|bf16 [C, T, Hl, Wl] and audio: f32|bf16 [Ca, 2, A] (the sampler's state),
  // any strides, in host memory or on the engine's device; they must stay valid (and
  // unchanged) until the call's outputs are written. Packing rounds both to bf16 as
  // ComfyUI casts to the compute dtype, the audio additionally multiplied (bf16) by
  // `carry_bf16` (1 when no carry transform). Condition latents: fp32, patchified /
  // packed to rows first, then blended with noise in the rows' order when their
  // stream's aug < 1 (the caller's ConditionNoise, else torch_cpu_randn). A caller noise
  // of the wrong size is refused (noise for a stream the condition lacks is not read).
  static Expected<EmbedInputs> prepare(const H3Config& cfg, const PackedLayout& layout, const Conditioning& cond,
                                       const TensorView& video, const TensorView& audio, float carry_bf16);
  // fp32 rows [a, b) (absolute packed rows inside condition segment s) into out [(b - a), width(s)].
  void rows(const Segment& s, int64_t a, int64_t b, float* out) const;
  int64_t width(const Segment& s) const { return s.is_video() ? 4 * cfg_.latents_dim : cfg_.audio_latents_dim; }
  // The target latents as given, and the audio's carry factor (a bf16 value).
  const TensorView& video() const { return video_; }
  const TensorView& audio() const { return audio_; }
  float carry() const { return carry_; }

 private:
  H3Config cfg_;
  const Conditioning* cond_ = nullptr;
  TensorView video_, audio_;  // the caller's target latents
  float carry_ = 1.0f;
  // Condition rows in packed order (fp32 [rows, width] row-major), augmented.
  std::vector<std::vector<float>> key_video_, key_audio_, ref_video_, ref_audio_;
};

}  // namespace ls::h3
