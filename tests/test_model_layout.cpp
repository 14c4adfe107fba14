// Layout, positions, timesteps and input-row facts from h3-model.md (§2.2-2.8,
// Appendix B), tested on the functions directly (no forward).
#include <gtest/gtest.h>

#include <cmath>

#include "model/h3/embed.h"
#include "model/h3/layout.h"
#include "model/h3/rope.h"
#include "model/h3/torch_random.h"

using namespace ls;
using namespace ls::h3;

namespace {
Conditioning t2va(int64_t frames, int64_t w, int64_t h, int64_t L) {
  Conditioning c;
  auto g = clip_geometry(frames, w, h, L);
  EXPECT_TRUE(g.ok());
  c.geometry = *g;
  return c;
}
const double* pos(const PackedLayout& l, int64_t row) { return &l.positions[static_cast<size_t>(3 * row)]; }
}  // namespace

TEST(ModelLayout, AppendixBVideoTimeOffsets) {
  const double expect[] = {0, 1.666667, 8.333333, 15, 21.666667, 28.333333, 30, 36.666667, 43.333333, 50, 56.666667, 58.333333};
  const auto t = video_frame_times(12, 0.0);
  ASSERT_EQ(t.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(t[i], expect[i], 5e-7) << i;
  // With the cursor L added.
  const auto t500 = video_frame_times(3, 500.0);
  EXPECT_DOUBLE_EQ(t500[0], 500.0);
  EXPECT_NEAR(t500[2], 508.333333, 5e-7);
}

TEST(ModelLayout, SpatialAxes) {
  // 1024x1024: Hl = Wl = 64 -> 0, 1, ..., 31.
  const auto a = spatial_axis(64, 64, 64);
  ASSERT_EQ(a.size(), 32u);
  for (size_t i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(a[i], static_cast<double>(i));
  // 1344x768: Hl 48, Wl 84: h = 3.905137 + 1.007905 i (24 values), w = -5.166010 ... 36.158105 (42 values).
  const auto h = spatial_axis(48, 48, 84), w = spatial_axis(84, 48, 84);
  ASSERT_EQ(h.size(), 24u);
  ASSERT_EQ(w.size(), 42u);
  EXPECT_NEAR(h[0], 3.905137, 5e-7);
  EXPECT_NEAR(h[1] - h[0], 1.007905, 5e-7);
  EXPECT_NEAR(w.front(), -5.166010, 5e-7);
  EXPECT_NEAR(w.back(), 36.158105, 5e-7);
}

// [3rd-party] 1344x768x345 t2va, L = 500: S = 104,466, segments text / audio / video,
// mod rows (0,500,1), (500,1650,5), (1650,104466,0); final rows video 0, audio 1.
TEST(ModelLayout, Example1344x768x345) {
  H3Config cfg;
  const Conditioning c = t2va(345, 1344, 768, 500);
  EXPECT_EQ(c.geometry.T, 102);
  EXPECT_EQ(c.geometry.Hl, 48);
  EXPECT_EQ(c.geometry.Wl, 84);
  EXPECT_EQ(c.geometry.A, 575);
  auto lay = build_layout(cfg, c);
  ASSERT_TRUE(lay.ok()) << lay.error().message;
  EXPECT_EQ(lay->S, 104466);
  ASSERT_EQ(lay->segments.size(), 3u);
  EXPECT_EQ(lay->segments[0].kind, SegmentKind::text);
  EXPECT_EQ(lay->segments[0].start, 0);
  EXPECT_EQ(lay->segments[0].stop, 500);
  EXPECT_EQ(lay->segments[1].kind, SegmentKind::target_audio);
  EXPECT_EQ(lay->segments[1].start, 500);
  EXPECT_EQ(lay->segments[1].stop, 1650);
  EXPECT_EQ(lay->segments[2].kind, SegmentKind::target_video);
  EXPECT_EQ(lay->segments[2].start, 1650);
  EXPECT_EQ(lay->segments[2].stop, 104466);
  EXPECT_EQ(lay->target_rows(), 104466 - 500);
  const Timesteps ts = layout_timesteps(*lay, c, 0.8f);
  ASSERT_EQ(ts.unique_t.size(), 2u);  // t_v < t_a
  for (int64_t r = 0; r < lay->S; ++r) {
    const int32_t want = r < 500 ? 1 : r < 1650 ? 5 : 0;
    ASSERT_EQ(ts.mod_rows[static_cast<size_t>(r)], want) << "row " << r;
  }
  EXPECT_EQ(ts.final_rows[1000], 1);
  EXPECT_EQ(ts.final_rows[2000], 0);
  // Positions: text (i, 0, 0); audio channel 0 at w_axis[0], channel 1 at w_axis[last]; video at origin L.
  EXPECT_EQ(pos(*lay, 7)[0], 7.0);
  EXPECT_EQ(pos(*lay, 7)[2], 0.0);
  const auto w = spatial_axis(84, 48, 84), h = spatial_axis(48, 48, 84);
  EXPECT_EQ(pos(*lay, 500)[0], 500.0);
  EXPECT_EQ(pos(*lay, 500)[2], w.front());
  EXPECT_EQ(pos(*lay, 500 + 575 + 3)[0], 503.0);
  EXPECT_EQ(pos(*lay, 500 + 575 + 3)[2], w.back());
  EXPECT_EQ(pos(*lay, 1650)[0], 500.0);
  EXPECT_EQ(pos(*lay, 1650)[1], h[0]);
  EXPECT_EQ(pos(*lay, 1650)[2], w[0]);
  // Second latent frame, row 1 of the patch grid, column 2.
  const int64_t r = 1650 + 24 * 42 + 42 + 2;
  EXPECT_NEAR(pos(*lay, r)[0], 500 + 5.0 / 3.0, 1e-12);
  EXPECT_EQ(pos(*lay, r)[1], h[1]);
  EXPECT_EQ(pos(*lay, r)[2], w[2]);
}

TEST(ModelLayout, FifteenSecondsOneMegapixel) {
  H3Config cfg;
  auto lay = build_layout(cfg, t2va(362, 1024, 1024, 500), false);
  ASSERT_TRUE(lay.ok());
  EXPECT_EQ(lay->S, 111274);
}

TEST(ModelLayout, SigmaOneGivesOneTimestep) {
  H3Config cfg;
  const Conditioning c = t2va(22, 64, 64, 4);
  auto lay = build_layout(cfg, c);
  ASSERT_TRUE(lay.ok());
  EXPECT_EQ(layout_timesteps(*lay, c, 1.0f).unique_t.size(), 1u);  // t_v = t_a = 0
  EXPECT_EQ(layout_timesteps(*lay, c, 0.5f).unique_t.size(), 2u);
}

TEST(ModelLayout, SigmaArithmetic) {
  // Schedules of §6.2: video 0.923077 <-> audio 0.75, video 0.8 <-> audio 0.5 (shift 12 -> 3).
  EXPECT_NEAR(time_shift_sigma(12.0 / 13.0, 12, 3), 0.75, 1e-12);
  EXPECT_NEAR(time_shift_sigma(0.8, 12, 3), 0.5, 1e-12);
  EXPECT_NEAR(time_shift_sigma_f32(0.8f, 12.0f, 3.0f), 0.5f, 1e-6f);
  Conditioning c;
  const SigmaInfo s = sigma_info(0.8f, c);
  EXPECT_EQ(s.sigma_v_f32, (0.8f * 1000.0f) / 1000.0f);
  EXPECT_EQ(s.t_v, 1.0 - static_cast<double>(s.sigma_v_f32));
  EXPECT_NEAR(s.t_a, 0.5, 1e-6);
  EXPECT_EQ(sigma_info(0.0f, c).sigma_v_f32, 1e-6f);  // clamp
}

TEST(ModelLayout, KeyframesReferencesOrderAndTimes) {
  H3Config cfg;
  Conditioning c = t2va(22, 64, 64, 6);  // T = 7, Hl = Wl = 4, A = 37
  Keyframe first, last;
  first.pixel_frame = 0;
  first.video.T = 1, first.video.Hl = 4, first.video.Wl = 4;
  first.video.data.assign(static_cast<size_t>(24 * 16), 0.5f);
  last = first;
  last.pixel_frame = 21;
  last.audio.A = 2;
  last.audio.data.assign(32 * 2 * 2, 0.25f);
  c.keyframes = {first, last};
  Reference img;
  img.kind = ReferenceKind::image;
  img.video.T = 1, img.video.Hl = 2, img.video.Wl = 6;
  img.video.data.assign(static_cast<size_t>(24 * 12), 1.0f);
  c.refs = {img};
  auto lay = build_layout(cfg, c);
  ASSERT_TRUE(lay.ok()) << lay.error().message;
  std::vector<SegmentKind> kinds;
  for (const auto& s : lay->segments) kinds.push_back(s.kind);
  const std::vector<SegmentKind> want = {SegmentKind::text,      SegmentKind::cond_video,   SegmentKind::cond_video,
                                         SegmentKind::cond_audio, SegmentKind::ref_video,    SegmentKind::target_audio,
                                         SegmentKind::target_video};
  EXPECT_EQ(kinds, want);
  // Cursor = L + 1 (one image reference): keyframe 0 at 7, keyframe 1 at 7 + 5/3 * 21 = 42.
  EXPECT_EQ(pos(*lay, lay->segments[1].start)[0], 7.0);
  EXPECT_NEAR(pos(*lay, lay->segments[2].start)[0], 7.0 + 35.0, 1e-12);
  EXPECT_NEAR(pos(*lay, lay->segments[3].start)[0], 42.0, 1e-12);
  EXPECT_EQ(pos(*lay, lay->segments[4].start)[0], 6.0);  // the reference at cursor L
  EXPECT_EQ(pos(*lay, lay->target_audio().start)[0], 7.0);
  EXPECT_EQ(pos(*lay, lay->target_video().start)[0], 7.0);
  // The reference's own spatial grid (2 x 6 latent): r_w = 6 / sqrt(12).
  const auto rw = spatial_axis(6, 2, 6);
  EXPECT_EQ(pos(*lay, lay->segments[4].start + 1)[2], rw[1]);
  // Condition rows use max(t, 0.999) (video) / max(t_a, 1.0) (audio), tags 0 / 2.
  const Timesteps ts = layout_timesteps(*lay, c, 0.5f);
  ASSERT_EQ(ts.unique_t.size(), 4u);  // t_v, t_a, 0.999, 1.0
  EXPECT_EQ(ts.unique_t[2], 0.999);
  EXPECT_EQ(ts.unique_t[3], 1.0);
  EXPECT_EQ(ts.mod_rows[static_cast<size_t>(lay->segments[1].start)], 2 * 3 + 0);
  EXPECT_EQ(ts.mod_rows[static_cast<size_t>(lay->segments[3].start)], 3 * 3 + 2);
}

TEST(ModelLayout, MasksAndTextTags) {
  H3Config cfg;
  Conditioning c = t2va(5, 64, 32, 3);  // T = 2, Hl 2, Wl 4, A = 8
  c.text_token_tags = {1, 0, 1};
  c.video_mask.assign(static_cast<size_t>(2 * 2 * 4), 0.0f);
  c.video_mask[1] = 0.3f;  // patch (0, 0) of frame 0: amax 0.3 -> ceil(0.3 * 256) / 256
  c.audio_mask.assign(16, 1.0f);
  const auto pooled = pooled_video_mask(c);
  ASSERT_EQ(pooled.size(), 4u);
  EXPECT_EQ(pooled[0], std::ceil(0.3f * 256.0f) / 256.0f);
  EXPECT_EQ(pooled[1], 0.0f);
  auto lay = build_layout(cfg, c);
  ASSERT_TRUE(lay.ok());
  const Timesteps ts = layout_timesteps(*lay, c, 0.5f);
  // Vision token in the text uses the video row of t_v.
  EXPECT_EQ(ts.mod_rows[1] % 3, 0);
  EXPECT_EQ(ts.mod_rows[0] % 3, 1);
  EXPECT_EQ(ts.mod_rows[1] / 3, ts.mod_rows[0] / 3);
  // Masked rows as ComfyUI computes them, fp32 tensor ops on the pooled value:
  // min(fl32(1 - fl32(m * sigma)), fl32(max(t_v, 0.999))). Masked-out rows (m = 0) sit at
  // fl32(0.999), not at 0.999 itself; an audio mask of all ones sets no per-row t (t_a).
  const auto& vs = lay->target_video();
  EXPECT_EQ(ts.unique_t[static_cast<size_t>(ts.final_rows[static_cast<size_t>(vs.start + 1)])],
            static_cast<double>(0.999f));
  const float m = pooled[0];
  EXPECT_EQ(ts.unique_t[static_cast<size_t>(ts.final_rows[static_cast<size_t>(vs.start)])],
            static_cast<double>(std::min(1.0f - m * 0.5f, 0.999f)));
  EXPECT_EQ(ts.unique_t[static_cast<size_t>(ts.final_rows[static_cast<size_t>(lay->target_audio().start)])], ts.sig.t_a);
  // The audio mask multiplies as pooled_audio_mask: quantised, one value per row.
  c.audio_mask[3] = 0.3f;
  EXPECT_EQ(pooled_audio_mask(c)[3], std::ceil(0.3f * 256.0f) / 256.0f);
  EXPECT_FALSE(mask_generates_everywhere(pooled_audio_mask(c)));
  c.audio_mask[3] = 0.9995f;  // quantises to 1: generates everywhere again
  EXPECT_TRUE(mask_generates_everywhere(pooled_audio_mask(c)));
}

TEST(ModelLayout, BadConditioningIsAnError) {
  H3Config cfg;
  Conditioning c = t2va(5, 64, 64, 3);
  c.video_mask.assign(3, 1.0f);
  auto l = build_layout(cfg, c);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("video mask"), std::string::npos);
  c.video_mask.clear();
  Keyframe k;
  k.video.T = 1, k.video.Hl = 2, k.video.Wl = 2;  // wrong size vs the 4x4 target
  k.video.data.assign(24 * 4, 0.f);
  c.keyframes = {k};
  l = build_layout(cfg, c);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("keyframe 0"), std::string::npos);
}

TEST(ModelLayout, PatchifyRoundTrip) {
  const int64_t C = 3, T = 2, Hl = 4, Wl = 6;
  std::vector<float> lat(static_cast<size_t>(C * T * Hl * Wl));
  for (size_t i = 0; i < lat.size(); ++i) lat[i] = static_cast<float>(i + 1);
  // Row (t 1, i 1, j 2), feature 4c + 2p + q = lat[c, t, 2i + p, 2j + q].
  std::vector<float> row(static_cast<size_t>(4 * C));
  const int64_t r = (1 * 2 + 1) * 3 + 2;
  video_patch_row(lat.data(), C, T, Hl, Wl, r, row.data());
  EXPECT_EQ(row[4 * 2 + 2 * 1 + 0], lat[static_cast<size_t>(((2 * T + 1) * Hl + 3) * Wl + 4)]);
  std::vector<float> back(lat.size(), 0.f);
  for (int64_t k = 0; k < T * (Hl / 2) * (Wl / 2); ++k) {
    video_patch_row(lat.data(), C, T, Hl, Wl, k, row.data());
    video_unpatch_row(row.data(), C, T, Hl, Wl, k, back.data());
  }
  EXPECT_EQ(back, lat);
  // Audio rows are channel-major: row ch * A + j.
  std::vector<float> a(static_cast<size_t>(C * 2 * 5)), ar(static_cast<size_t>(C));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  audio_row(a.data(), C, 5, 5 + 3, ar.data());
  EXPECT_EQ(ar[2], a[static_cast<size_t>((2 * 2 + 1) * 5 + 3)]);
}

TEST(ModelLayout, RopeTable) {
  // Pair j uses axis j / len, frequency inv[j % len]; (cos, sin) rounded to bf16.
  std::vector<double> p = {3.0, 1.5, -2.25};
  const float inv[2] = {1.0f, 0.1f};
  std::vector<uint16_t> t(6 * 2);
  rope_table_rows(p, inv, 2, 0, 1, t.data());
  EXPECT_EQ(t[2 * 0], f32_to_bf16(std::cos(3.0f)));
  EXPECT_EQ(t[2 * 3 + 1], f32_to_bf16(std::sin(1.5f * 0.1f)));
  EXPECT_EQ(t[2 * 4], f32_to_bf16(std::cos(-2.25f)));
}

// torch.manual_seed(0): torch.randn(5) = [1.5410, -0.2934, -2.1788, 0.5684, -1.0845] (small
// path, double Box-Muller); torch.randn(4, 4) starts [-1.1258, -1.1524, -0.2506, -0.4339, 0.8487].
TEST(ModelLayout, TorchCpuRandn) {
  const auto a = torch_cpu_randn(0, 5);
  const float ea[] = {1.5410f, -0.2934f, -2.1788f, 0.5684f, -1.0845f};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(a[static_cast<size_t>(i)], ea[i], 1e-4f);
  const auto b = torch_cpu_randn(0, 16);
  const float eb[] = {-1.1258f, -1.1524f, -0.2506f, -0.4339f, 0.8487f, 0.6920f, -0.3160f, -2.1152f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(b[static_cast<size_t>(i)], eb[i], 1e-4f);
}
