#include "model/h3/embed.h"

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
// r = aug * r + (1 - aug) * n with PyTorch's fp32 tensor-scalar ops: both scalars
// rounded to fp32 (1 - aug formed in double first), two products and the sum rounded.
std::vector<float> augment(const std::vector<float>& lat, double aug, uint64_t seed) {
  if (!(aug < 1.0)) return lat;
  const std::vector<float> n = torch_cpu_randn(seed, static_cast<int64_t>(lat.size()));
  const float a = static_cast<float>(aug), b = static_cast<float>(1.0 - aug);
  std::vector<float> out(lat.size());
  for (size_t i = 0; i < lat.size(); ++i) {
    const float x = a * lat[i];
    const float y = b * n[i];
    out[i] = x + y;
  }
  return out;
}
}  // namespace

Expected<EmbedInputs> EmbedInputs::prepare(const H3Config& cfg, const PackedLayout& layout, const Conditioning& cond,
                                           const TensorView& video, const TensorView& audio, float carry_bf16) {
  const ClipGeometry& g = cond.geometry;
  auto shape_is = [](const TensorView& v, std::initializer_list<int64_t> dims) {
    if (v.ndim != static_cast<int>(dims.size())) return false;
    int i = 0;
    for (int64_t d : dims)
      if (v.shape[static_cast<size_t>(i++)] != d) return false;
    return v.is_contiguous() && v.dtype == DType::f32 && v.device.kind == DeviceKind::cpu;
  };
  if (!shape_is(video, {cfg.latents_dim, g.T, g.Hl, g.Wl}))
    return make_error(ErrorCode::invalid_argument, "video input is " + video.shape_str() + ", expected contiguous host f32 [" +
                                                       std::to_string(cfg.latents_dim) + ", " + std::to_string(g.T) + ", " +
                                                       std::to_string(g.Hl) + ", " + std::to_string(g.Wl) + "]");
  if (!shape_is(audio, {cfg.audio_latents_dim, 2, g.A}))
    return make_error(ErrorCode::invalid_argument, "audio input is " + audio.shape_str() + ", expected contiguous host f32 [" +
                                                       std::to_string(cfg.audio_latents_dim) + ", 2, " + std::to_string(g.A) + "]");
  EmbedInputs e;
  e.cfg_ = cfg;
  e.cond_ = &cond;
  const float* v = video.ptr<float>();
  e.video_.resize(static_cast<size_t>(video.numel()));
  for (size_t i = 0; i < e.video_.size(); ++i) e.video_[i] = round_bf16(v[i]);
  const float* a = audio.ptr<float>();
  e.audio_.resize(static_cast<size_t>(audio.numel()));
  for (size_t i = 0; i < e.audio_.size(); ++i) e.audio_[i] = round_bf16(round_bf16(a[i]) * carry_bf16);
  // Condition latents: the generator is reseeded identically for every condition latent
  // (video: seed, audio: seed + 1).
  for (const Keyframe& k : cond.keyframes) {
    e.key_video_.push_back(augment(k.video.data, cond.vis_aug, cond.seed));
    e.key_audio_.push_back(augment(k.audio.data, cond.aud_aug, cond.seed + 1));
  }
  for (const Reference& r : cond.refs) {
    e.ref_video_.push_back(augment(r.video.data, cond.vis_aug, cond.seed));
    e.ref_audio_.push_back(augment(r.audio.data, cond.aud_aug, cond.seed + 1));
  }
  (void)layout;
  return e;
}

void EmbedInputs::rows(const Segment& s, int64_t a, int64_t b, float* out) const {
  LS_CHECK(s.start <= a && a <= b && b <= s.stop && s.kind != SegmentKind::text);
  const int64_t w = width(s);
  const auto src = static_cast<size_t>(s.source);
  const float* lat = nullptr;
  switch (s.kind) {
    case SegmentKind::target_video: lat = video_.data(); break;
    case SegmentKind::target_audio: lat = audio_.data(); break;
    case SegmentKind::cond_video: lat = key_video_[src].data(); break;
    case SegmentKind::cond_audio: lat = key_audio_[src].data(); break;
    case SegmentKind::ref_video: lat = ref_video_[src].data(); break;
    case SegmentKind::ref_audio: lat = ref_audio_[src].data(); break;
    case SegmentKind::text: break;
  }
  for (int64_t r = a; r < b; ++r) {
    if (s.is_video()) video_patch_row(lat, cfg_.latents_dim, s.T, s.Hl, s.Wl, r - s.start, out + (r - a) * w);
    else audio_row(lat, cfg_.audio_latents_dim, s.A, r - s.start, out + (r - a) * w);
  }
}

}  // namespace ls::h3
