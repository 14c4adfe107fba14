// The packed sequence of one H3 call: segment order, 3-D positions (float64), per-row
// timesteps and modulation rows (h3-model.md §2.3, §2.4).
//
// Segment order (contiguous rows):
//   text | keyframes (video rows, then audio rows, per keyframe) | references | target audio | target video
// Target audio and target video are always the last two segments.
//
// Positions are float64 (t, h, w) per row, exactly as ComfyUI builds them; the RoPE
// table converts them to fp32 (model/h3/rope.h). One t unit = 1/40 s.
//
// Timesteps are float64 per row; `unique_t` is the ascending list of distinct values;
// the modulation row of token s is t_index(s) * 3 + tag(s) (tags: video 0, text 1,
// audio 2) into the [3M, D] AdaLN tables; the final layer uses t_index(s) alone.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls::h3 {

enum class SegmentKind : uint8_t {
  text,
  cond_video,    // keyframe video rows
  cond_audio,    // keyframe audio rows
  ref_video,     // reference image / video rows
  ref_audio,     // reference audio rows
  target_audio,
  target_video,
};
const char* segment_kind_name(SegmentKind k);

constexpr int kTagVideo = 0, kTagText = 1, kTagAudio = 2;

struct Segment {
  SegmentKind kind = SegmentKind::text;
  int64_t start = 0, stop = 0;  // rows [start, stop)
  int64_t source = -1;          // keyframe index (cond_*), reference index (ref_*), else -1
  int64_t T = 0, Hl = 0, Wl = 0;  // video kinds: latent geometry of the rows
  int64_t A = 0;                  // audio kinds: audio frames (rows = 2A)
  bool is_video() const { return kind == SegmentKind::cond_video || kind == SegmentKind::ref_video || kind == SegmentKind::target_video; }
  bool is_audio() const { return kind == SegmentKind::cond_audio || kind == SegmentKind::ref_audio || kind == SegmentKind::target_audio; }
  bool is_target() const { return kind == SegmentKind::target_audio || kind == SegmentKind::target_video; }
  int tag() const { return is_video() ? kTagVideo : is_audio() ? kTagAudio : kTagText; }
  int64_t rows() const { return stop - start; }
};

struct PackedLayout {
  int64_t S = 0;
  int64_t L = 0;
  std::vector<Segment> segments;
  std::vector<double> positions;  // float64 [S, 3] (t, h, w); empty when built without positions
  const Segment& target_audio() const { return segments[segments.size() - 2]; }
  const Segment& target_video() const { return segments.back(); }
  int64_t target_rows() const { return S - target_audio().start; }
};

// Validates the conditioning against the config (latent sizes, masks, tags) and builds
// the layout; `with_positions` = false skips the [S, 3] positions (planner use).
Expected<PackedLayout> build_layout(const H3Config& cfg, const Conditioning& cond, bool with_positions = true);

// ---- position helpers (exposed for tests) ------------------------------------------
// Area-normalised spatial axis of a latent dim d (patch 2) of a Hl x Wl latent:
// r = d / sqrt(Hl * Wl), n = d / 2, axis[i] = (i * r / n + (1 - r) / 2) * 32.
std::vector<double> spatial_axis(int64_t d, int64_t Hl, int64_t Wl);
// t of each latent frame k of a video block at `origin`: origin + exclusive cumsum of
// 5/3 * FPT[k mod 5], FPT = (1, 4, 4, 4, 4).
std::vector<double> video_frame_times(int64_t T, double origin);
// Total span 5/3 * sum FPT[k mod 5] over k < T.
double video_span(int64_t T);

// ---- sigma / timestep arithmetic (h3-model.md §2.2, §2.3, §10) ------------------------
// time_shift_sigma(s, f, g): b = s / (f + s * (1 - f)); g * b / (1 + (g - 1) * b).
double time_shift_sigma(double s, double f, double g);
float time_shift_sigma_f32(float s, float f, float g);  // every op rounded to fp32

struct SigmaInfo {
  float sigma_v_f32 = 0;   // fl32(fl32(sigma * 1000) / 1000), clamped >= 1e-6
  double sigma_v = 0;      // the same value as a double
  double t_v = 0;          // 1 - sigma_v
  double sigma_a = 0;      // time_shift_sigma(sigma_v, shift_v, shift_a) (float64)
  double t_a = 0;          // 1 - sigma_a
  float sigma_a_f32 = 0;   // fp32 chain (carry transform)
};
SigmaInfo sigma_info(float sigma, const Conditioning& cond);

struct Timesteps {
  SigmaInfo sig;
  std::vector<double> unique_t;     // ascending distinct timesteps
  std::vector<int32_t> mod_rows;    // [S] t_index * 3 + tag
  std::vector<int32_t> final_rows;  // [S] t_index
};
// Per-row timesteps for the call at `sigma` (masks, condition pins, tags).
Timesteps layout_timesteps(const PackedLayout& layout, const Conditioning& cond, float sigma);
// Just the distinct timesteps (for the AdaLN precompute over a schedule).
std::vector<double> distinct_timesteps(const PackedLayout& layout, const Conditioning& cond, float sigma);
// The distinct timesteps of a whole schedule, ascending: every sigma > 0 (the terminal
// 0 is never evaluated). The rows of the AdaLN tables precompute_adaln builds.
std::vector<double> schedule_timesteps(const PackedLayout& layout, const Conditioning& cond,
                                       const std::vector<float>& sigmas);

// The masks as ComfyUI's model_base hands them to the model (h3-model.md §2.2 step 5,
// §2.3 step 5): per target video row, the amax over its 2x2 patch, then
// ceil(m * 256) / 256 in fp32 [T * Hl/2 * Wl/2]; per target audio row, ceil(m * 256) / 256
// [2A]. Empty when no mask. These values set the masked rows' timesteps and multiply
// the output velocities (bf16 * value: exact values k/256 in bf16).
std::vector<float> pooled_video_mask(const Conditioning& cond);
std::vector<float> pooled_audio_mask(const Conditioning& cond);
// True when every pooled value is >= fl32(1 - 1e-3) (then 1): such a mask sets no
// per-row timesteps (ComfyUI's mask_row_values returns None). Also true when empty.
bool mask_generates_everywhere(const std::vector<float>& pooled);

}  // namespace ls::h3
