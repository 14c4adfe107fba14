// Host-side input rows of the packed sequence (h3-model.md §2.2, §2.7): patchify the
// video latents, pack the audio latents, noise-augment the condition latents, the audio
// carry transform on the input; and the inverse mapping of the output heads.
//
// Everything here is tiny next to the sequence's hidden states (96 or 32 fp32 values
// per row), so it runs on the host; the executor copies rows of a slice to the device
// and projects them there.
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

// The fp32 input rows of every non-text segment of one call.
class EmbedInputs {
 public:
  // video: host fp32 [C, T, Hl, Wl] and audio: host fp32 [Ca, 2, A] (the sampler's state):
  // both rounded to bf16 as ComfyUI casts to the compute dtype; the audio additionally
  // multiplied (bf16) by `carry_bf16` (1 when no carry transform). Condition latents:
  // fp32, patchified / packed to rows first, then blended with noise in the rows' order
  // when their stream's aug < 1 (the caller's ConditionNoise, else torch_cpu_randn).
  // A caller noise of the wrong size is refused.
  static Expected<EmbedInputs> prepare(const H3Config& cfg, const PackedLayout& layout, const Conditioning& cond,
                                       const TensorView& video, const TensorView& audio, float carry_bf16);
  // fp32 rows [a, b) (absolute packed rows inside segment s) into out [(b - a), width(s)].
  void rows(const Segment& s, int64_t a, int64_t b, float* out) const;
  int64_t width(const Segment& s) const { return s.is_video() ? 4 * cfg_.latents_dim : cfg_.audio_latents_dim; }
  // The bf16-rounded (and carried) target audio input, fp32 [Ca, 2, A]: the carry
  // transform of the output needs it.
  const std::vector<float>& audio_in() const { return audio_; }

 private:
  H3Config cfg_;
  const Conditioning* cond_ = nullptr;
  std::vector<float> video_, audio_;                   // target, bf16-rounded
  // Condition rows in packed order (fp32 [rows, width] row-major), augmented.
  std::vector<std::vector<float>> key_video_, key_audio_, ref_video_, ref_audio_;
};

}  // namespace ls::h3
