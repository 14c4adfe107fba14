#include "model/h3/embed.h"

#include <algorithm>
#include <string>

#include "core/dtype.h"
#include "model/h3/torch_random.h"

namespace ls::h3 {

void video_patch_row(const float* lat, int64_t C, int64_t T, int64_t Hl, int64_t Wl, int64_t r, float* out) {
  const int64_t hp = Hl / 2, wp = Wl / 2;
  const int64_t t = r / (hp * wp), i = (r / wp) % hp, j = r % wp;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t q = 0; q < 2; ++q) out[4 * c + 2 * p + q] = lat[((c * T + t) * Hl + 2 * i + p) * Wl + 2 * j + q];
}

void video_unpatch_row(const float* row, int64_t C, int64_t T, int64_t Hl, int64_t Wl, int64_t r, float* lat) {
  const int64_t hp = Hl / 2, wp = Wl / 2;
  const int64_t t = r / (hp * wp), i = (r / wp) % hp, j = r % wp;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t q = 0; q < 2; ++q) lat[((c * T + t) * Hl + 2 * i + p) * Wl + 2 * j + q] = row[4 * c + 2 * p + q];
}

void audio_row(const float* lat, int64_t C, int64_t A, int64_t r, float* out) {
  const int64_t ch = r / A, j = r % A;
  for (int64_t c = 0; c < C; ++c) out[c] = lat[(c * 2 + ch) * A + j];
}

void audio_unrow(const float* row, int64_t C, int64_t A, int64_t r, float* lat) {
  const int64_t ch = r / A, j = r % A;
  for (int64_t c = 0; c < C; ++c) lat[(c * 2 + ch) * A + j] = row[c];
}

namespace {
// The fp32 rows of one condition latent in packed order: video patch rows
// [T*Hl/2*Wl/2, 4C] or audio rows [2A, Ca], row-major.
std::vector<float> video_rows_of(const VideoLatent& v, int64_t C) {
  const int64_t n = v.T * (v.Hl / 2) * (v.Wl / 2), w = 4 * C;
  std::vector<float> rows(static_cast<size_t>(n * w));
  for (int64_t r = 0; r < n; ++r) video_patch_row(v.data.data(), C, v.T, v.Hl, v.Wl, r, rows.data() + r * w);
  return rows;
}
std::vector<float> audio_rows_of(const AudioLatent& a, int64_t C) {
  const int64_t n = 2 * a.A;
  std::vector<float> rows(static_cast<size_t>(n * C));
  for (int64_t r = 0; r < n; ++r) audio_row(a.data.data(), C, a.A, r, rows.data() + r * C);
  return rows;
}

// rows = aug * rows + (1 - aug) * n (h3-model.md §2.7), n drawn in the rows' own shape
// and order (ComfyUI: torch.randn(rows.shape) after patchifying), so noise element i
// lands on row-major element i of the row matrix. PyTorch's fp32 tensor-scalar ops:
// both scalars rounded to fp32 (1 - aug formed in double first), the two products and
// the sum each rounded once. n: the caller's draw, else torch_cpu_randn(seed).
Status augment(std::vector<float>& rows, double aug, uint64_t seed, const std::vector<float>& given,
               const std::string& what) {
  if (!(aug < 1.0) || rows.empty()) return Status();
  if (!given.empty() && given.size() != rows.size())
    return make_error(ErrorCode::invalid_argument, what + " noise holds " + std::to_string(given.size()) +
                                                       " values, expected one per element of its rows (" +
                                                       std::to_string(rows.size()) + ")");
  const std::vector<float> drawn = given.empty() ? torch_cpu_randn(seed, static_cast<int64_t>(rows.size())) : std::vector<float>();
  const std::vector<float>& n = given.empty() ? drawn : given;
  const float a = static_cast<float>(aug), b = static_cast<float>(1.0 - aug);
  for (size_t i = 0; i < rows.size(); ++i) {
    const float x = a * rows[i];
    const float y = b * n[i];
    rows[i] = x + y;
  }
  return Status();
}
}  // namespace

Expected<EmbedInputs> EmbedInputs::prepare(const H3Config& cfg, const PackedLayout& layout, const Conditioning& cond,
                                           const TensorView& video, const TensorView& audio, float carry_bf16) {
  const ClipGeometry& g = cond.geometry;
  auto shape_is = [](const TensorView& v, std::initializer_list<int64_t> dims) {
    if (v.empty() || v.ndim != static_cast<int>(dims.size())) return false;
    int i = 0;
    for (int64_t d : dims)
      if (v.shape[static_cast<size_t>(i++)] != d) return false;
    for (int k = 0; k < v.ndim; ++k)
      if (v.stride[static_cast<size_t>(k)] < 0) return false;
    return v.dtype == DType::f32 || v.dtype == DType::bf16;
  };
  if (!shape_is(video, {cfg.latents_dim, g.T, g.Hl, g.Wl}))
    return make_error(ErrorCode::invalid_argument, "video input is " + video.shape_str() + ", expected f32|bf16 [" +
                                                       std::to_string(cfg.latents_dim) + ", " + std::to_string(g.T) + ", " +
                                                       std::to_string(g.Hl) + ", " + std::to_string(g.Wl) + "]");
  if (!shape_is(audio, {cfg.audio_latents_dim, 2, g.A}))
    return make_error(ErrorCode::invalid_argument, "audio input is " + audio.shape_str() + ", expected f32|bf16 [" +
                                                       std::to_string(cfg.audio_latents_dim) + ", 2, " + std::to_string(g.A) + "]");
  EmbedInputs e;
  e.cfg_ = cfg;
  e.cond_ = &cond;
  e.video_ = video;
  e.audio_ = audio;
  e.carry_ = carry_bf16;
  // Condition rows: the generator is reseeded identically for every condition (video:
  // seed, audio: seed + 1), so conditions of one shape get the same noise.
  const int64_t C = cfg.latents_dim, Ca = cfg.audio_latents_dim;
  // One condition's rows: video and audio patchified, then each augmented in row order.
  // A keyframe may carry audio only (ComfyUI's AddGuide with audio and no image): its
  // video rows are then empty, and so is a reference kind's missing stream.
  auto add = [&](std::vector<std::vector<float>>& vrows, std::vector<std::vector<float>>& arows,
                 const VideoLatent& lat_v, const AudioLatent& lat_a, const ConditionNoise& n,
                 const std::string& what) -> Status {
    vrows.push_back(video_rows_of(lat_v, C));
    LS_TRY(augment(vrows.back(), cond.vis_aug, cond.seed, n.video, what + " video"));
    arows.push_back(audio_rows_of(lat_a, Ca));
    return augment(arows.back(), cond.aud_aug, cond.seed + 1, n.audio, what + " audio");
  };
  for (size_t i = 0; i < cond.keyframes.size(); ++i) {
    const Keyframe& k = cond.keyframes[i];
    LS_TRY(add(e.key_video_, e.key_audio_, k.video, k.audio, k.noise, "keyframe " + std::to_string(i)));
  }
  for (size_t i = 0; i < cond.refs.size(); ++i) {
    const Reference& r = cond.refs[i];
    LS_TRY(add(e.ref_video_, e.ref_audio_, r.video, r.audio, r.noise, "reference " + std::to_string(i)));
  }
  (void)layout;
  return e;
}

void EmbedInputs::rows(const Segment& s, int64_t a, int64_t b, float* out) const {
  LS_CHECK(s.start <= a && a <= b && b <= s.stop);
  const int64_t w = width(s);
  const auto src = static_cast<size_t>(s.source);
  const std::vector<float>* cond_rows = nullptr;  // condition rows, already in packed order
  switch (s.kind) {
    case SegmentKind::target_video:
    case SegmentKind::target_audio:
    case SegmentKind::text: LS_CHECK_MSG(false, "EmbedInputs::rows: condition segments only"); return;
    case SegmentKind::cond_video: cond_rows = &key_video_[src]; break;
    case SegmentKind::cond_audio: cond_rows = &key_audio_[src]; break;
    case SegmentKind::ref_video: cond_rows = &ref_video_[src]; break;
    case SegmentKind::ref_audio: cond_rows = &ref_audio_[src]; break;
  }
  LS_CHECK(static_cast<int64_t>(cond_rows->size()) == s.rows() * w);
  std::copy(cond_rows->begin() + (a - s.start) * w, cond_rows->begin() + (b - s.start) * w, out);
}

}  // namespace ls::h3
