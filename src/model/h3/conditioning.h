// What one H3 denoiser call is conditioned on besides the latents and the text: the clip
// geometry, keyframe condition latents (fl2va / AddGuide), reference blocks (ref2va),
// inpainting masks, noise augmentation strengths, the sampler seed, the flow shifts,
// the audio carry scale and the sampling schedule (for the PDD head bank).
// h3-model.md §2.1, §2.3, §2.4, §2.7, §2.12, §2.14.
//
// Everything here lives on the host; the model turns it into a packed layout
// (model/h3/layout.h) and condition rows. Latents are fp32 and PyTorch-ordered.
#pragma once

#include <cstdint>
#include <vector>

#include "model/h3/config.h"

namespace ls::h3 {

// A video latent: fp32 [C, T, Hl, Wl], C = cfg.latents_dim. Hl and Wl must be even
// (canvas multiples of 32; the 2x2 patch grid needs no padding).
struct VideoLatent {
  std::vector<float> data;  // fp32 [C, T, Hl, Wl]
  int64_t T = 0, Hl = 0, Wl = 0;
  bool empty() const { return T == 0; }
};

// An audio latent: fp32 [C, 2, A], C = cfg.audio_latents_dim (stereo as a batch-like axis).
struct AudioLatent {
  std::vector<float> data;  // fp32 [C, 2, A]
  int64_t A = 0;
  bool empty() const { return A == 0; }
};

// A keyframe (first/last frame guide): its rows are placed at
// t = cursor + 5/3 * pixel_frame (one t unit = 1/40 s; a pixel frame at 24 fps = 5/3 units),
// on the target's spatial grid. Video rows first, then its audio rows (if any). A
// keyframe may carry audio only (ComfyUI's MiniMaxH3AddGuide with audio and no image:
// `audio_latent` and no `latent`): then it adds only its audio rows, at the same t.
//
// Noise augmentation (vis_aug / aud_aug < 1) blends noise into the condition's *rows*
// (h3-model.md §2.7): rows = aug * rows + (1 - aug) * n, with n of the rows' shape, in
// row-major order (video: the patch rows [T*Hl/2*Wl/2, 4C]; audio: the packed rows
// [2A, Ca], channel-major). ComfyUI draws n = torch.randn(rows.shape) from a CPU
// generator reseeded with `seed` for every video condition and `seed + 1` for every
// audio condition. `video_noise` / `audio_noise` hand that draw in (a Python caller
// passes torch's own values and is exact); empty = the engine's restatement of
// torch's CPU generator (h3::torch_cpu_randn, within a few fp32 ulp of torch: see
// docs/exactness.md). Read only when the stream's aug < 1.
struct ConditionNoise {
  std::vector<float> video;  // fp32 [T*Hl/2*Wl/2, 4C] row-major, or empty
  std::vector<float> audio;  // fp32 [2A, Ca] row-major, or empty
};

struct Keyframe {
  int64_t pixel_frame = 0;  // 0 = first frame, frames - 1 = last frame of the target clip
  VideoLatent video;        // Hl, Wl equal to the target's; usually T = 1 (an image); may be empty with audio
  AudioLatent audio;        // optional (required when video is empty)
  ConditionNoise noise;     // optional caller-drawn augmentation noise (see above)
};

enum class ReferenceKind { image, audio, video, video_audio };

// A reference block (ref2va). image: video with T = 1; audio: audio only; video: video
// only; video_audio: both. Each has its own spatial grid (from its own Hl, Wl).
struct Reference {
  ReferenceKind kind = ReferenceKind::image;
  VideoLatent video;
  AudioLatent audio;
  ConditionNoise noise;  // optional caller-drawn augmentation noise (see Keyframe)
};

struct Conditioning {
  // Target clip: T, Hl, Wl (latent), A (audio frames), text_tokens (L, the refined text length).
  ClipGeometry geometry;
  // Per text token: 1 = text, 0 = a vision token (incl. <|vision_start|>/<|vision_end|>),
  // which is modulated with the *video* modulation row. Empty = all text. int8 [L].
  std::vector<int8_t> text_token_tags;
  std::vector<Keyframe> keyframes;
  std::vector<Reference> refs;
  // Inpainting masks, 1 = denoise, 0 = keep. Empty = none. As ComfyUI's model_base
  // hands them to the model: pooled (amax) to the 2x2 patch grid and quantised to
  // ceil(m * 256) / 256 (pooled_video_mask / pooled_audio_mask in layout.h). Those
  // processed values set the per-row timesteps and multiply the output velocities.
  std::vector<float> video_mask;  // fp32 [T, Hl, Wl] (raw; pooled per 2x2 patch by amax)
  std::vector<float> audio_mask;  // fp32 [2, A] (one value per audio row)
  // Multiply the output velocities by the masks (ComfyUI's forward does; its _forward,
  // the call a DIFFUSION_MODEL wrapper replaces, does not). false: unmasked velocities;
  // the masked rows' timesteps still come from the masks.
  bool output_masks = true;
  // Condition timesteps: video condition rows use max(t_video, vis_aug), audio condition
  // rows max(t_audio, aud_aug); aug < 1 also blends noise into that stream's condition
  // rows (ConditionNoise above).
  double vis_aug = 0.999;
  double aud_aug = 1.0;
  uint64_t seed = 0;  // sampler seed: the noise-augmentation generator is seeded with it
  double shift_video = 12.0;
  double shift_audio = 3.0;
  // shift_video / shift_audio (4.0) while sampling the packed AV latent: the audio input
  // is the carried variable (h3-model.md §2.2); 1.0 disables the carry transform.
  double audio_scale = 4.0;
  // The full sampling schedule (descending, terminal 0 allowed). Only the PDD head bank
  // (cfg.pdd_heads > 1) reads it; required then.
  std::vector<float> sample_sigmas;
};

}  // namespace ls::h3
