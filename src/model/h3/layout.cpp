// Packed layout, positions and per-row timesteps (h3-model.md §2.3, §2.4).
#include "model/h3/layout.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

namespace ls::h3 {

const char* segment_kind_name(SegmentKind k) {
  switch (k) {
    case SegmentKind::text: return "text";
    case SegmentKind::cond_video: return "cond_video";
    case SegmentKind::cond_audio: return "cond_audio";
    case SegmentKind::ref_video: return "ref_video";
    case SegmentKind::ref_audio: return "ref_audio";
    case SegmentKind::target_audio: return "audio";
    case SegmentKind::target_video: return "video";
  }
  return "?";
}

// Pixel frames per latent frame k: 1, 4, 4, 4, 4 (k mod 5). One pixel frame at 24 fps
// is 5/3 t units (t unit = 1/40 s).
static constexpr int kFramesPerLatent[5] = {1, 4, 4, 4, 4};
static constexpr double kFrameT = 5.0 / 3.0;

std::vector<double> spatial_axis(int64_t d, int64_t Hl, int64_t Wl) {
  const double r = static_cast<double>(d) / std::sqrt(static_cast<double>(Hl) * static_cast<double>(Wl));
  const int64_t n = d / 2;
  std::vector<double> axis(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    axis[static_cast<size_t>(i)] = (static_cast<double>(i) * r / static_cast<double>(n) + (1.0 - r) / 2.0) * 32.0;
  return axis;
}

std::vector<double> video_frame_times(int64_t T, double origin) {
  std::vector<double> t(static_cast<size_t>(T));
  double cum = 0.0;  // exclusive cumsum of the spans, float64, in frame order
  for (int64_t k = 0; k < T; ++k) {
    t[static_cast<size_t>(k)] = origin + cum;
    cum += kFrameT * kFramesPerLatent[k % 5];
  }
  return t;
}

double video_span(int64_t T) {
  double cum = 0.0;
  for (int64_t k = 0; k < T; ++k) cum += kFrameT * kFramesPerLatent[k % 5];
  return cum;
}

namespace {

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, m)); }

Status check_video(const H3Config& cfg, const VideoLatent& v, const std::string& what, int64_t Hl, int64_t Wl) {
  if (v.T < 1 || v.Hl < 2 || v.Wl < 2 || v.Hl % 2 || v.Wl % 2)
    return bad(what + ": video latent needs T >= 1 and even Hl, Wl >= 2 (got T " + std::to_string(v.T) + ", " +
               std::to_string(v.Hl) + "x" + std::to_string(v.Wl) + ")");
  if (Hl > 0 && (v.Hl != Hl || v.Wl != Wl))
    return bad(what + ": latent is " + std::to_string(v.Hl) + "x" + std::to_string(v.Wl) + " but the target is " +
               std::to_string(Hl) + "x" + std::to_string(Wl));
  const int64_t want = cfg.latents_dim * v.T * v.Hl * v.Wl;
  if (static_cast<int64_t>(v.data.size()) != want)
    return bad(what + ": video latent holds " + std::to_string(v.data.size()) + " values, expected " +
               std::to_string(want) + " (fp32 [" + std::to_string(cfg.latents_dim) + ", T, Hl, Wl])");
  return Status();
}

Status check_audio(const H3Config& cfg, const AudioLatent& a, const std::string& what) {
  if (a.A < 1) return bad(what + ": audio latent needs A >= 1");
  const int64_t want = cfg.audio_latents_dim * 2 * a.A;
  if (static_cast<int64_t>(a.data.size()) != want)
    return bad(what + ": audio latent holds " + std::to_string(a.data.size()) + " values, expected " +
               std::to_string(want) + " (fp32 [" + std::to_string(cfg.audio_latents_dim) + ", 2, A])");
  return Status();
}

void put(std::vector<double>& pos, int64_t row, double t, double h, double w) {
  pos[static_cast<size_t>(3 * row)] = t;
  pos[static_cast<size_t>(3 * row + 1)] = h;
  pos[static_cast<size_t>(3 * row + 2)] = w;
}

// Video rows of a block at `origin`: t-major, then h, then w (row-major patch grid).
void video_positions(std::vector<double>& pos, int64_t row0, int64_t T, int64_t Hl, int64_t Wl, double origin) {
  const auto ts = video_frame_times(T, origin);
  const auto hs = spatial_axis(Hl, Hl, Wl);
  const auto ws = spatial_axis(Wl, Hl, Wl);
  int64_t r = row0;
  for (double t : ts)
    for (double h : hs)
      for (double w : ws) put(pos, r++, t, h, w);
}

// Audio rows at `origin`: channel 0 rows (t = origin + j, h 0, w = w_lo), then channel 1
// (w = w_hi): the stereo channels sit at the extreme w values of a video grid.
void audio_positions(std::vector<double>& pos, int64_t row0, int64_t A, double origin, double w_lo, double w_hi) {
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t j = 0; j < A; ++j) put(pos, row0 + c * A + j, origin + static_cast<double>(j), 0.0, c == 0 ? w_lo : w_hi);
}

}  // namespace

Expected<PackedLayout> build_layout(const H3Config& cfg, const Conditioning& cond, bool with_positions) {
  const ClipGeometry& g = cond.geometry;
  if (g.T < 1 || g.Hl < 2 || g.Wl < 2 || g.Hl % 2 || g.Wl % 2 || g.A < 1 || g.text_tokens < 0)
    return make_error(ErrorCode::invalid_argument,
                      "clip geometry needs T >= 1, even Hl and Wl, A >= 1, L >= 0 (got T " + std::to_string(g.T) +
                          ", " + std::to_string(g.Hl) + "x" + std::to_string(g.Wl) + ", A " + std::to_string(g.A) +
                          ", L " + std::to_string(g.text_tokens) + ")");
  if (!cond.text_token_tags.empty()) {
    if (static_cast<int64_t>(cond.text_token_tags.size()) != g.text_tokens)
      return make_error(ErrorCode::invalid_argument, "text_token_tags has " + std::to_string(cond.text_token_tags.size()) +
                                                         " entries but the text has " + std::to_string(g.text_tokens) + " tokens");
    for (int8_t t : cond.text_token_tags)
      if (t != 0 && t != 1) return make_error(ErrorCode::invalid_argument, "text_token_tags must be 0 (vision) or 1 (text)");
  }
  if (!cond.video_mask.empty() && static_cast<int64_t>(cond.video_mask.size()) != g.T * g.Hl * g.Wl)
    return make_error(ErrorCode::invalid_argument, "video mask holds " + std::to_string(cond.video_mask.size()) +
                                                       " values, expected fp32 [T, Hl, Wl] = " + std::to_string(g.T * g.Hl * g.Wl));
  if (!cond.audio_mask.empty() && static_cast<int64_t>(cond.audio_mask.size()) != 2 * g.A)
    return make_error(ErrorCode::invalid_argument, "audio mask holds " + std::to_string(cond.audio_mask.size()) +
                                                       " values, expected fp32 [2, A] = " + std::to_string(2 * g.A));
  if (!(cond.shift_video > 0) || !(cond.shift_audio > 0) || !(cond.audio_scale > 0))
    return make_error(ErrorCode::invalid_argument, "shifts and audio_scale must be positive");
  if (!(cond.vis_aug >= 0 && cond.vis_aug <= 1) || !(cond.aud_aug >= 0 && cond.aud_aug <= 1))
    return make_error(ErrorCode::invalid_argument, "vis_aug and aud_aug must be in [0, 1]");

  PackedLayout lay;
  lay.L = g.text_tokens;
  auto add = [&](SegmentKind kind, int64_t rows, int64_t source, int64_t T, int64_t Hl, int64_t Wl, int64_t A) {
    Segment s;
    s.kind = kind;
    s.start = lay.S;
    s.stop = lay.S + rows;
    s.source = source;
    s.T = T, s.Hl = Hl, s.Wl = Wl, s.A = A;
    lay.S += rows;
    if (rows > 0 || kind == SegmentKind::text) lay.segments.push_back(s);
  };
  add(SegmentKind::text, g.text_tokens, -1, 0, 0, 0, 0);
  for (size_t i = 0; i < cond.keyframes.size(); ++i) {
    const Keyframe& k = cond.keyframes[i];
    const std::string what = "keyframe " + std::to_string(i);
    // Audio-only keyframes (AddGuide with audio and no image) add only their audio rows.
    if (k.video.empty() && k.audio.empty())
      return make_error(ErrorCode::invalid_argument, what + " has neither a video nor an audio latent");
    if (!k.video.empty()) LS_TRY(check_video(cfg, k.video, what, g.Hl, g.Wl));
    if (k.pixel_frame < 0) return make_error(ErrorCode::invalid_argument, what + ": negative pixel frame");
    if (!k.video.empty())
      add(SegmentKind::cond_video, k.video.T * (g.Hl / 2) * (g.Wl / 2), static_cast<int64_t>(i), k.video.T, g.Hl, g.Wl, 0);
    if (!k.audio.empty()) {
      LS_TRY(check_audio(cfg, k.audio, what));
      add(SegmentKind::cond_audio, 2 * k.audio.A, static_cast<int64_t>(i), 0, 0, 0, k.audio.A);
    }
  }
  for (size_t i = 0; i < cond.refs.size(); ++i) {
    const Reference& r = cond.refs[i];
    const std::string what = "reference " + std::to_string(i);
    const bool has_v = r.kind != ReferenceKind::audio, has_a = r.kind == ReferenceKind::audio || r.kind == ReferenceKind::video_audio;
    if (has_v) {
      LS_TRY(check_video(cfg, r.video, what, 0, 0));
      if (r.kind == ReferenceKind::image && r.video.T != 1)
        return make_error(ErrorCode::invalid_argument, what + ": an image reference has T = 1 (got " + std::to_string(r.video.T) + ")");
    } else if (!r.video.empty()) {
      return make_error(ErrorCode::invalid_argument, what + ": an audio reference carries no video latent");
    }
    if (has_a) LS_TRY(check_audio(cfg, r.audio, what));
    else if (!r.audio.empty())
      return make_error(ErrorCode::invalid_argument, what + ": this reference kind carries no audio latent");
    // A video+audio reference: its audio rows, then its video rows.
    if (has_a) add(SegmentKind::ref_audio, 2 * r.audio.A, static_cast<int64_t>(i), 0, 0, 0, r.audio.A);
    if (has_v) add(SegmentKind::ref_video, r.video.T * (r.video.Hl / 2) * (r.video.Wl / 2), static_cast<int64_t>(i),
                   r.video.T, r.video.Hl, r.video.Wl, 0);
  }
  add(SegmentKind::target_audio, 2 * g.A, -1, 0, 0, 0, g.A);
  add(SegmentKind::target_video, g.T * (g.Hl / 2) * (g.Wl / 2), -1, g.T, g.Hl, g.Wl, 0);
  if (!with_positions) return lay;

  // ---- positions (float64) ----
  lay.positions.assign(static_cast<size_t>(3 * lay.S), 0.0);
  for (int64_t i = 0; i < lay.L; ++i) put(lay.positions, i, static_cast<double>(i), 0.0, 0.0);
  const auto target_w = spatial_axis(g.Wl, g.Hl, g.Wl);
  // References are walked from cursor L; each advances the cursor by its span.
  double cursor = static_cast<double>(lay.L);
  for (const Segment& s : lay.segments) {
    if (s.kind != SegmentKind::ref_video && s.kind != SegmentKind::ref_audio) continue;
    const Reference& r = cond.refs[static_cast<size_t>(s.source)];
    // A video+audio reference is two segments; place both at the same origin and
    // advance once, on its video segment (which comes second).
    if (s.kind == SegmentKind::ref_audio) {
      double w_lo = target_w.front(), w_hi = target_w.back();
      if (r.kind == ReferenceKind::video_audio) {  // pinned to its own w extremes
        const auto own_w = spatial_axis(r.video.Wl, r.video.Hl, r.video.Wl);
        w_lo = own_w.front(), w_hi = own_w.back();
      }
      audio_positions(lay.positions, s.start, s.A, cursor, w_lo, w_hi);
      if (r.kind == ReferenceKind::audio) cursor += static_cast<double>(r.audio.A);
    } else {
      video_positions(lay.positions, s.start, s.T, s.Hl, s.Wl, cursor);
      if (r.kind == ReferenceKind::image) cursor += 1.0;
      else if (r.kind == ReferenceKind::video) cursor += video_span(r.video.T);
      else cursor += std::max(static_cast<double>(r.audio.A), video_span(r.video.T));
    }
  }
  // Keyframes sit at cursor + 5/3 * pixel frame, on the target's grid.
  for (const Segment& s : lay.segments) {
    if (s.kind != SegmentKind::cond_video && s.kind != SegmentKind::cond_audio) continue;
    const Keyframe& k = cond.keyframes[static_cast<size_t>(s.source)];
    const double cond_t = cursor + kFrameT * static_cast<double>(k.pixel_frame);
    if (s.kind == SegmentKind::cond_video) video_positions(lay.positions, s.start, s.T, g.Hl, g.Wl, cond_t);
    else audio_positions(lay.positions, s.start, s.A, cond_t, target_w.front(), target_w.back());
  }
  audio_positions(lay.positions, lay.target_audio().start, g.A, cursor, target_w.front(), target_w.back());
  video_positions(lay.positions, lay.target_video().start, g.T, g.Hl, g.Wl, cursor);
  return lay;
}

// ---- sigma arithmetic -------------------------------------------------------------

double time_shift_sigma(double s, double f, double g) {
  const double b = s / (f + s * (1.0 - f));
  return g * b / (1.0 + (g - 1.0) * b);
}

float time_shift_sigma_f32(float s, float f, float g) {
  // PyTorch fp32 tensor ops with Python-float scalars (each scalar rounded to fp32,
  // each op rounded to fp32), in the order the formula is written.
  const float one_minus_f = static_cast<float>(1.0 - static_cast<double>(f));
  const float den = f + s * one_minus_f;
  const float b = s / den;
  const float g_minus_1 = static_cast<float>(static_cast<double>(g) - 1.0);
  return (g * b) / (1.0f + g_minus_1 * b);
}

SigmaInfo sigma_info(float sigma, const Conditioning& cond) {
  SigmaInfo si;
  const float ts = sigma * 1000.0f;               // timestep(sigma) = sigma * 1000 (fp32)
  si.sigma_v_f32 = std::max(ts / 1000.0f, 1e-6f);  // clamp(timestep / 1000, min 1e-6)
  si.sigma_v = static_cast<double>(si.sigma_v_f32);
  si.t_v = 1.0 - si.sigma_v;
  si.sigma_a = time_shift_sigma(si.sigma_v, cond.shift_video, cond.shift_audio);
  si.t_a = 1.0 - si.sigma_a;
  si.sigma_a_f32 = time_shift_sigma_f32(si.sigma_v_f32, static_cast<float>(cond.shift_video),
                                        static_cast<float>(cond.shift_audio));
  return si;
}

static float quantise_mask(float m) { return std::ceil(m * 256.0f) / 256.0f; }

std::vector<float> pooled_video_mask(const Conditioning& cond) {
  if (cond.video_mask.empty()) return {};
  const ClipGeometry& g = cond.geometry;
  const int64_t hp = g.Hl / 2, wp = g.Wl / 2;
  std::vector<float> out(static_cast<size_t>(g.T * hp * wp));
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t i = 0; i < hp; ++i)
      for (int64_t j = 0; j < wp; ++j) {
        float m = -INFINITY;
        for (int64_t p = 0; p < 2; ++p)
          for (int64_t q = 0; q < 2; ++q)
            m = std::max(m, cond.video_mask[static_cast<size_t>((t * g.Hl + 2 * i + p) * g.Wl + 2 * j + q)]);
        out[static_cast<size_t>((t * hp + i) * wp + j)] = quantise_mask(m);
      }
  return out;
}

std::vector<float> pooled_audio_mask(const Conditioning& cond) {
  std::vector<float> out(cond.audio_mask.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = quantise_mask(cond.audio_mask[i]);
  return out;
}

bool mask_generates_everywhere(const std::vector<float>& pooled) {
  // ComfyUI: (values >= 1.0 - 1e-3).all(), the scalar compared in fp32.
  const auto lim = static_cast<float>(1.0 - 1e-3);
  for (float m : pooled)
    if (!(m >= lim)) return false;
  return true;
}

namespace {
// Timestep of a masked row (ComfyUI's _forward): t = min(1 - m * sigma, pin) as fp32
// tensor ops on the fp32 mask value: fl32(1 - fl32(m * fl32(sigma))), then clamped at
// fl32(pin). pin = max(t_stream, 0.999) for video and max(t_stream, 1.0) = 1 for audio:
// the constants VISUAL_COND_TIMESTEP / AUDIO_COND_TIMESTEP, not vis_aug / aud_aug.
double masked_row_t(float m, double sigma, double pin) {
  const float x = m * static_cast<float>(sigma);
  const float t = 1.0f - x;
  return static_cast<double>(std::min(t, static_cast<float>(pin)));
}

// Per-row float64 timesteps.
std::vector<double> row_timesteps(const PackedLayout& lay, const Conditioning& cond, const SigmaInfo& si) {
  std::vector<double> t(static_cast<size_t>(lay.S));
  const double cond_v = std::max(si.t_v, cond.vis_aug), cond_a = std::max(si.t_a, cond.aud_aug);
  // A mask that generates everywhere (every pooled value 1) sets no per-row timesteps.
  std::vector<float> vmask = pooled_video_mask(cond), amask = pooled_audio_mask(cond);
  if (mask_generates_everywhere(vmask)) vmask.clear();
  if (mask_generates_everywhere(amask)) amask.clear();
  const double pin_v = std::max(si.t_v, 0.999), pin_a = std::max(si.t_a, 1.0);
  // ComfyUI's audio stream sigma here is 1 - t_a (float64), not sigma_a itself.
  const double sigma_a_rows = 1.0 - si.t_a;
  for (const Segment& s : lay.segments) {
    for (int64_t r = s.start; r < s.stop; ++r) {
      double v = si.t_v;
      switch (s.kind) {
        case SegmentKind::text: v = si.t_v; break;
        case SegmentKind::cond_video:
        case SegmentKind::ref_video: v = cond_v; break;
        case SegmentKind::cond_audio:
        case SegmentKind::ref_audio: v = cond_a; break;
        case SegmentKind::target_audio:
          v = si.t_a;
          if (!amask.empty()) v = masked_row_t(amask[static_cast<size_t>(r - s.start)], sigma_a_rows, pin_a);
          break;
        case SegmentKind::target_video:
          v = si.t_v;
          if (!vmask.empty()) v = masked_row_t(vmask[static_cast<size_t>(r - s.start)], si.sigma_v, pin_v);
          break;
      }
      t[static_cast<size_t>(r)] = v;
    }
  }
  return t;
}
}  // namespace

std::vector<double> distinct_timesteps(const PackedLayout& lay, const Conditioning& cond, float sigma) {
  const SigmaInfo si = sigma_info(sigma, cond);
  std::vector<double> t = row_timesteps(lay, cond, si);
  t.push_back(si.t_v);
  t.push_back(si.t_a);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

Timesteps layout_timesteps(const PackedLayout& lay, const Conditioning& cond, float sigma) {
  Timesteps ts;
  ts.sig = sigma_info(sigma, cond);
  const std::vector<double> t = row_timesteps(lay, cond, ts.sig);
  ts.unique_t = t;
  ts.unique_t.push_back(ts.sig.t_v);
  ts.unique_t.push_back(ts.sig.t_a);
  std::sort(ts.unique_t.begin(), ts.unique_t.end());
  ts.unique_t.erase(std::unique(ts.unique_t.begin(), ts.unique_t.end()), ts.unique_t.end());
  ts.mod_rows.resize(static_cast<size_t>(lay.S));
  ts.final_rows.resize(static_cast<size_t>(lay.S));
  for (const Segment& s : lay.segments) {
    for (int64_t r = s.start; r < s.stop; ++r) {
      const double v = t[static_cast<size_t>(r)];
      const auto idx = static_cast<int32_t>(std::lower_bound(ts.unique_t.begin(), ts.unique_t.end(), v) - ts.unique_t.begin());
      int tag = s.tag();
      // Vision tokens inside the text use the video modulation row.
      if (s.kind == SegmentKind::text && !cond.text_token_tags.empty())
        tag = cond.text_token_tags[static_cast<size_t>(r - s.start)] == 1 ? kTagText : kTagVideo;
      ts.mod_rows[static_cast<size_t>(r)] = idx * 3 + tag;
      ts.final_rows[static_cast<size_t>(r)] = idx;
    }
  }
  return ts;
}

std::vector<double> schedule_timesteps(const PackedLayout& lay, const Conditioning& cond,
                                       const std::vector<float>& sigmas) {
  std::vector<double> all;
  for (float s : sigmas) {
    if (!(s > 0.0f)) continue;  // the terminal 0 is never evaluated
    const auto t = distinct_timesteps(lay, cond, s);
    all.insert(all.end(), t.begin(), t.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace ls::h3
