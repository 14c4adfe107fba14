// Issue 13, the latent packing ops and what they enable (CPU; the CUDA kernels are
// checked against these in tests/cuda/test_pack_ops_cuda.cpp):
//  - each CPU op (Backend::pack_video_rows, pack_audio_rows, unpack_video_rows,
//    unpack_audio_rows) gives, by memcmp, the bytes of the host code it replaced
//    (EmbedInputs::prepare's rounding + video_patch_row / audio_row, and finish_outputs'
//    unpatchify / negate / mask / carry loops, restated below as they were), for row
//    ranges, strided and bf16 sources, f32 and bf16 outputs;
//  - the engine: strided / bf16 input views and in-place outputs (ForwardOutputs, the
//    device path; on the CPU backend "device" memory is host memory) give the bytes of
//    contiguous f32 inputs and host outputs;
//  - output_masks off: the unmasked velocities (masked = bf16(unmasked * pooled mask)),
//    the masks' per-row timesteps kept;
//  - audio-only keyframes (ComfyUI's AddGuide with audio and no image): layout by hand,
//    the plan-invariance property, and that the rows reach the output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/pack.h"
#include "core/dtype.h"
#include "exactness_util.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/embed.h"
#include "model/h3/layout.h"

using namespace ls;

namespace {

std::vector<float> randn(std::mt19937_64& rng, size_t n) { return test::randn(rng, n); }

template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- the replaced host code, restated ------------------------------------------------
// EmbedInputs::prepare (before issue 13): video_ = bf16(v); rows by video_patch_row.
std::vector<float> old_video_rows(const std::vector<float>& v, int64_t C, int64_t T, int64_t Hl, int64_t Wl) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(v[i]);
  const int64_t n = T * (Hl / 2) * (Wl / 2), w = 4 * C;
  std::vector<float> rows(static_cast<size_t>(n * w));
  for (int64_t k = 0; k < n; ++k) h3::video_patch_row(r.data(), C, T, Hl, Wl, k, rows.data() + k * w);
  return rows;
}
// audio_ = bf16(bf16(a) * carry); rows by audio_row.
std::vector<float> old_audio_rows(const std::vector<float>& a, int64_t C, int64_t A, float carry) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = round_bf16(round_bf16(a[i]) * carry);
  std::vector<float> rows(static_cast<size_t>(2 * A * C));
  for (int64_t k = 0; k < 2 * A; ++k) h3::audio_row(r.data(), C, A, k, rows.data() + k * C);
  return rows;
}
// finish_outputs (before issue 13), video: negate the bf16 rows, unpatchify, mask.
std::vector<float> old_video_out(std::vector<float> vout, const std::vector<float>& pm, int64_t C, int64_t T,
                                 int64_t Hl, int64_t Wl) {
  std::vector<float> video(static_cast<size_t>(C * T * Hl * Wl));
  for (auto& v : vout) v = -round_bf16(v);
  const int64_t rows = static_cast<int64_t>(vout.size()) / (4 * C);
  for (int64_t r = 0; r < rows; ++r) h3::video_unpatch_row(vout.data() + r * 4 * C, C, T, Hl, Wl, r, video.data());
  if (!pm.empty()) {
    const int64_t hp = Hl / 2, wp = Wl / 2, plane = T * Hl * Wl;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t y = 0; y < Hl; ++y)
          for (int64_t x = 0; x < Wl; ++x) {
            float& v = video[static_cast<size_t>(c * plane + (t * Hl + y) * Wl + x)];
            v = round_bf16(v * pm[static_cast<size_t>((t * hp + y / 2) * wp + x / 2)]);
          }
  }
  return video;
}
// ... audio: negate, unpack, mask, carry (ain = the bf16-rounded carried input).
std::vector<float> old_audio_out(std::vector<float> aout, const std::vector<float>& pm, int64_t C, int64_t A,
                                 bool carry_on, double s, float sigma_a_f32, const std::vector<float>& ain) {
  std::vector<float> audio(static_cast<size_t>(C * 2 * A));
  for (auto& v : aout) v = -round_bf16(v);
  for (int64_t r = 0; r < 2 * A; ++r) h3::audio_unrow(aout.data() + r * C, C, A, r, audio.data());
  if (!pm.empty())
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < 2 * A; ++i) {
        float& v = audio[static_cast<size_t>(c * 2 * A + i)];
        v = round_bf16(v * pm[static_cast<size_t>(i)]);
      }
  if (carry_on) {
    const auto one_minus_s = static_cast<float>(1.0 - s);
    const float coef = round_bf16(1.0f + static_cast<float>(s - 1.0) * sigma_a_f32);
    for (size_t i = 0; i < audio.size(); ++i) {
      const float t1 = round_bf16(one_minus_s * ain[i]);
      const float t2 = round_bf16(coef * audio[i]);
      audio[i] = round_bf16(t1 + t2);
    }
  }
  return audio;
}

std::vector<float> fractional_mask(std::mt19937_64& rng, size_t n) {
  std::vector<float> m(n);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) m[i] = i % 5 == 0 ? 0.0f : i % 7 == 0 ? 1.0f : std::ceil(u(rng) * 256.0f) / 256.0f;
  return m;
}

// A [C, T, H, W] latent stored as [T, W, C, H] (every stride non-trivial) and the view.
struct Strided {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  TensorView view(bool as_bf16, int64_t C, int64_t T, int64_t H, int64_t W) {
    TensorView v;
    v.data = as_bf16 ? static_cast<void*>(bf16.data()) : static_cast<void*>(f32.data());
    v.dtype = as_bf16 ? DType::bf16 : DType::f32;
    v.ndim = 4;
    v.shape = {C, T, H, W};
    v.stride = {H, W * C * H, 1, C * H};  // element (c, t, h, w) at ((t * W + w) * C + c) * H + h
    return v;
  }
};
Strided strided_copy(const std::vector<float>& lat, int64_t C, int64_t T, int64_t H, int64_t W) {
  Strided s;
  s.f32.resize(lat.size());
  for (int64_t c = 0; c < C; ++c)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          s.f32[static_cast<size_t>(((t * W + w) * C + c) * H + h)] = lat[static_cast<size_t>(((c * T + t) * H + h) * W + w)];
  s.bf16.resize(lat.size());
  for (size_t i = 0; i < lat.size(); ++i) s.bf16[i] = f32_to_bf16(s.f32[i]);
  return s;
}

}  // namespace

TEST(PackOps, VideoRowsAreTheHostCodesBytes) {
  std::mt19937_64 rng(11);
  const int64_t C = 3, T = 2, Hl = 4, Wl = 6, n = T * (Hl / 2) * (Wl / 2);
  const std::vector<float> lat = randn(rng, static_cast<size_t>(C * T * Hl * Wl));
  const std::vector<float> want = old_video_rows(lat, C, T, Hl, Wl);
  // Not vacuous: rounding changed values, the rows are a permutation.
  ASSERT_FALSE(same(want, lat));
  std::vector<float> got(want.size(), -7.0f);
  const TensorView v(const_cast<float*>(lat.data()), DType::f32, {C, T, Hl, Wl});
  // Two row ranges (a slice boundary inside the segment), also through the backend.
  auto be = make_cpu_backend();
  ASSERT_TRUE(cpu::cpu_op_pack_video_rows(v, 0, TensorView(got.data(), DType::f32, {5, 4 * C})).ok());
  ASSERT_TRUE(be->pack_video_rows(v, 5, TensorView(got.data() + 5 * 4 * C, DType::f32, {n - 5, 4 * C})).ok());
  EXPECT_TRUE(same(want, got));
  // Strided f32 and strided bf16 sources (bf16 holds bf16(lat): the op rounds f32 the same way).
  Strided s = strided_copy(lat, C, T, Hl, Wl);
  for (bool b : {false, true}) {
    std::vector<float> g2(want.size(), -7.0f);
    ASSERT_TRUE(cpu::cpu_op_pack_video_rows(s.view(b, C, T, Hl, Wl), 0, TensorView(g2.data(), DType::f32, {n, 4 * C})).ok());
    EXPECT_TRUE(same(want, g2)) << (b ? "bf16" : "f32") << " strided";
  }
}

TEST(PackOps, AudioRowsAreTheHostCodesBytes) {
  std::mt19937_64 rng(12);
  const int64_t C = 5, A = 7;
  const std::vector<float> lat = randn(rng, static_cast<size_t>(C * 2 * A));
  for (float carry : {1.0f, round_bf16(2.7182f)}) {
    const std::vector<float> want = old_audio_rows(lat, C, A, carry);
    std::vector<float> got(want.size(), -7.0f);
    const TensorView v(const_cast<float*>(lat.data()), DType::f32, {C, 2, A});
    ASSERT_TRUE(cpu::cpu_op_pack_audio_rows(v, carry, 0, TensorView(got.data(), DType::f32, {9, C})).ok());
    ASSERT_TRUE(cpu::cpu_op_pack_audio_rows(v, carry, 9, TensorView(got.data() + 9 * C, DType::f32, {2 * A - 9, C})).ok());
    EXPECT_TRUE(same(want, got)) << "carry " << carry;
    // A strided bf16 source: [C, 2, A] stored as [A, 2, C].
    std::vector<uint16_t> sb(lat.size());
    for (int64_t c = 0; c < C; ++c)
      for (int64_t ch = 0; ch < 2; ++ch)
        for (int64_t j = 0; j < A; ++j)
          sb[static_cast<size_t>((j * 2 + ch) * C + c)] = f32_to_bf16(lat[static_cast<size_t>((c * 2 + ch) * A + j)]);
    TensorView sv;
    sv.data = sb.data(), sv.dtype = DType::bf16, sv.ndim = 3, sv.shape = {C, 2, A, 0}, sv.stride = {1, C, 2 * C, 0};
    std::vector<float> g2(want.size(), -7.0f);
    ASSERT_TRUE(cpu::cpu_op_pack_audio_rows(sv, carry, 0, TensorView(g2.data(), DType::f32, {2 * A, C})).ok());
    EXPECT_TRUE(same(want, g2)) << "bf16 strided, carry " << carry;
  }
}

TEST(PackOps, UnpackVideoIsTheHostCodesBytes) {
  std::mt19937_64 rng(13);
  const int64_t C = 3, T = 2, Hl = 4, Wl = 6, n = T * (Hl / 2) * (Wl / 2);
  const std::vector<float> rows = randn(rng, static_cast<size_t>(n * 4 * C));
  const std::vector<float> pm = fractional_mask(rng, static_cast<size_t>(n));
  for (bool masked : {false, true}) {
    const std::vector<float> none;
    const std::vector<float> want = old_video_out(rows, masked ? pm : none, C, T, Hl, Wl);
    std::vector<float> got(want.size(), -7.0f);
    std::vector<uint16_t> got16(want.size(), 0x7fff);
    const TensorView out(got.data(), DType::f32, {C, T, Hl, Wl}), out16(got16.data(), DType::bf16, {C, T, Hl, Wl});
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 5}, {5, n}}) {
      const TensorView r(const_cast<float*>(rows.data()) + a * 4 * C, DType::f32, {b - a, 4 * C});
      const TensorView m = masked ? TensorView(const_cast<float*>(pm.data()) + a, DType::f32, {b - a}) : TensorView();
      ASSERT_TRUE(cpu::cpu_op_unpack_video_rows(r, m, a, out).ok());
      ASSERT_TRUE(cpu::cpu_op_unpack_video_rows(r, m, a, out16).ok());
    }
    EXPECT_TRUE(same(want, got)) << (masked ? "masked" : "unmasked");
    std::vector<uint16_t> want16(want.size());
    for (size_t i = 0; i < want.size(); ++i) want16[i] = f32_to_bf16(want[i]);
    EXPECT_TRUE(same(want16, got16)) << "bf16 output";
  }
  // Not vacuous: the mask changes values.
  EXPECT_FALSE(same(old_video_out(rows, pm, C, T, Hl, Wl), old_video_out(rows, {}, C, T, Hl, Wl)));
}

TEST(PackOps, UnpackAudioIsTheHostCodesBytes) {
  std::mt19937_64 rng(14);
  const int64_t C = 4, A = 6;
  const std::vector<float> rows = randn(rng, static_cast<size_t>(2 * A * C));
  const std::vector<float> src = randn(rng, static_cast<size_t>(C * 2 * A));
  const std::vector<float> pm = fractional_mask(rng, static_cast<size_t>(2 * A));
  const double s = 4.0;
  const float sigma_a = 0.61803f, carry = round_bf16(1.37f);
  std::vector<float> ain(src.size());
  for (size_t i = 0; i < src.size(); ++i) ain[i] = round_bf16(round_bf16(src[i]) * carry);
  for (int mode = 0; mode < 4; ++mode) {
    const bool masked = mode & 1, carried = mode & 2;
    const std::vector<float> want = old_audio_out(rows, masked ? pm : std::vector<float>{}, C, A, carried, s, sigma_a, ain);
    Backend::AudioCarryOut ca;
    ca.apply = carried;
    ca.carry = carry;
    ca.one_minus_s = static_cast<float>(1.0 - s);
    ca.coef = round_bf16(1.0f + static_cast<float>(s - 1.0) * sigma_a);
    ca.src = TensorView(const_cast<float*>(src.data()), DType::f32, {C, 2, A});
    std::vector<float> got(want.size(), -7.0f);
    const TensorView out(got.data(), DType::f32, {C, 2, A});
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 7}, {7, 2 * A}}) {
      const TensorView r(const_cast<float*>(rows.data()) + a * C, DType::f32, {b - a, C});
      const TensorView m = masked ? TensorView(const_cast<float*>(pm.data()) + a, DType::f32, {b - a}) : TensorView();
      ASSERT_TRUE(cpu::cpu_op_unpack_audio_rows(r, m, ca, a, out).ok());
    }
    EXPECT_TRUE(same(want, got)) << "mode " << mode;
  }
  EXPECT_FALSE(same(old_audio_out(rows, pm, C, A, true, s, sigma_a, ain), old_audio_out(rows, pm, C, A, false, s, sigma_a, ain)));
}

TEST(PackOps, BaseBackendRefusesWithUnsupported) {
  // A backend without the ops: the base implementation names the op (never a crash).
  struct Bare final : Backend {
    Device device() const override { return Device{}; }
    std::string name() const override { return "bare"; }
    MemoryResource& memory() override { return cpu_->memory(); }
    Status copy(const TensorView& d, const TensorView& s) override { return cpu_->copy(d, s); }
    Status synchronize() override { return Status(); }
    MemoryResource& pinned_host_memory() override { return cpu_->pinned_host_memory(); }
    Status copy_async(const TensorView& d, const TensorView& s, Queue q) override { return cpu_->copy_async(d, s, q); }
    Status signal(Queue, int) override { return Status(); }
    Status wait(Queue, int) override { return Status(); }
    Status host_wait(int) override { return Status(); }
    Status set_numerics(const Numerics&, const Diagnostics&) override { return Status(); }
    Numerics numerics() const override { return {}; }
    Diagnostics diagnostics() const override { return {}; }
    Status gemm(const TensorView&, const TensorView&, const TensorView*, const TensorView&) override { return Status(); }
    Status rms_norm(const TensorView&, const TensorView&, float, const TensorView&) override { return Status(); }
    Status modulate(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&) override {
      return Status();
    }
    Status gated_add(const TensorView&, const TensorView&, const TensorView&, const TensorView&) override { return Status(); }
    Status add(const TensorView&, const TensorView&) override { return Status(); }
    Status qk_norm_rope(const TensorView&, const TensorView&, const TensorView&, float) override { return Status(); }
    Status swiglu(const TensorView&, const TensorView&) override { return Status(); }
    Status silu(const TensorView&) override { return Status(); }
    Status time_embedding(const TensorView&, const TensorView&) override { return Status(); }
    Status convert(const TensorView&, const TensorView&) override { return Status(); }
    Status attention(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                     const AttentionParams&) override {
      return Status();
    }
    Expected<int64_t> count_nonfinite(const TensorView&) override { return int64_t{0}; }
    std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  } bare;
  float x[8] = {};
  const Status st = bare.pack_video_rows(TensorView(x, DType::f32, {2, 1, 2, 2}), 0, TensorView(x, DType::f32, {1, 8}));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::unsupported);
  EXPECT_NE(st.error().message.find("pack_video_rows"), std::string::npos);
}

// ---- the engine ----------------------------------------------------------------------

namespace {

struct Rig {
  h3::H3Config cfg;
  std::unique_ptr<h3::H3SyntheticSource> src;
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<exec::Engine> engine;
  exec::RefinedText text;
  test::Inputs in;
};

std::unique_ptr<Rig> rig(uint64_t seed, const h3::Conditioning& cond_for_inputs, h3::H3Config cfg) {
  std::mt19937_64 rng(seed);
  auto r = std::make_unique<Rig>();
  r->cfg = cfg;
  r->src = std::make_unique<h3::H3SyntheticSource>(r->cfg, seed);
  auto e = exec::Engine::create(*r->src, *r->be);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return nullptr;
  r->engine = std::move(*e);
  r->in = test::random_inputs(rng, r->cfg, cond_for_inputs);
  auto t = r->engine->refine_text(r->in.text_view(r->cfg, cond_for_inputs));
  EXPECT_TRUE(t.ok());
  if (!t.ok()) return nullptr;
  r->text = std::move(*t);
  return r;
}

exec::ForwardResult fwd(Rig& r, const h3::Conditioning& c, float sigma, const exec::PlanKnobs& k = {},
                        const TensorView* video = nullptr, const TensorView* audio = nullptr,
                        const exec::ForwardOutputs& out = {}) {
  auto p = exec::make_plan(r.cfg, c, k);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  if (!p.ok()) return {};
  auto res = r.engine->forward(c, r.text, video ? *video : r.in.video_view(r.cfg, c), audio ? *audio : r.in.audio_view(r.cfg, c),
                               sigma, *p, out);
  EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.error().message);
  return res.ok() ? std::move(*res) : exec::ForwardResult{};
}

h3::Conditioning all_modes_cond(std::mt19937_64& rng, const h3::H3Config& cfg) {
  h3::Conditioning c = test::clip(5, 64, 64, 5);
  c.geometry.A = 5;
  test::add_all_modes(rng, cfg, c);
  return c;
}

}  // namespace

TEST(PackEngine, InPlaceOutputsAndStridedBf16InputsGiveTheHostBytes) {
  std::mt19937_64 rng(21);
  h3::H3Config cfg = test::tiny_cfg(rng, false);
  h3::Conditioning c = all_modes_cond(rng, cfg);
  auto r = rig(21, c, cfg);
  ASSERT_TRUE(r);
  const h3::ClipGeometry& g = c.geometry;
  const int64_t C = cfg.latents_dim, Ca = cfg.audio_latents_dim;
  for (double scale : {4.0, 1.0}) {
    c.audio_scale = scale;
    SCOPED_TRACE("audio_scale " + std::to_string(scale));
    const exec::ForwardResult ref = fwd(*r, c, 0.8f);
    ASSERT_GT(test::sum_abs(ref.video), 0.0);
    ASSERT_GT(test::sum_abs(ref.audio), 0.0);
    // In-place outputs (the device path of run_final: masks through the slice buffer),
    // f32 and bf16, under a sliced final layer.
    exec::PlanKnobs k;
    k.final_chunk_tokens = 3;
    k.mlp_chunk_tokens = 7;
    std::vector<float> vo(ref.video.size(), -9.0f), ao(ref.audio.size(), -9.0f);
    exec::ForwardOutputs o{TensorView(vo.data(), DType::f32, {C, g.T, g.Hl, g.Wl}), TensorView(ao.data(), DType::f32, {Ca, 2, g.A})};
    const exec::ForwardResult a = fwd(*r, c, 0.8f, k, nullptr, nullptr, o);
    EXPECT_TRUE(same(ref.video, vo));
    EXPECT_TRUE(same(ref.audio, ao));
    EXPECT_TRUE(same(ref.video, a.video));
    EXPECT_TRUE(same(ref.audio, a.audio));
    std::vector<uint16_t> vb(ref.video.size()), ab(ref.audio.size());
    exec::ForwardOutputs ob{TensorView(vb.data(), DType::bf16, {C, g.T, g.Hl, g.Wl}), TensorView(ab.data(), DType::bf16, {Ca, 2, g.A})};
    const exec::ForwardResult b = fwd(*r, c, 0.8f, k, nullptr, nullptr, ob);
    std::vector<uint16_t> wv(ref.video.size()), wa(ref.audio.size());
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = f32_to_bf16(ref.video[i]);
    for (size_t i = 0; i < wa.size(); ++i) wa[i] = f32_to_bf16(ref.audio[i]);
    EXPECT_TRUE(same(wv, vb));
    EXPECT_TRUE(same(wa, ab));
    EXPECT_EQ(b.hash(), ref.hash());  // read back and widened: the same fp32 velocities
    // Strided f32 and bf16 inputs: the bytes of contiguous f32 inputs of the same values
    // (bf16 holds bf16(x), which the packing would round to anyway).
    Strided sv = strided_copy(r->in.video, C, g.T, g.Hl, g.Wl);
    std::vector<uint16_t> a16(r->in.audio.size());
    for (size_t i = 0; i < a16.size(); ++i) a16[i] = f32_to_bf16(r->in.audio[i]);
    const TensorView av16(a16.data(), DType::bf16, {Ca, 2, g.A});
    for (bool as_bf16 : {false, true}) {
      const TensorView vv = sv.view(as_bf16, C, g.T, g.Hl, g.Wl);
      const exec::ForwardResult s = fwd(*r, c, 0.8f, k, &vv, as_bf16 ? &av16 : nullptr);
      EXPECT_TRUE(same(ref.video, s.video)) << (as_bf16 ? "bf16" : "f32") << " strided video";
      EXPECT_TRUE(same(ref.audio, s.audio)) << (as_bf16 ? "bf16" : "f32") << " audio";
    }
  }
}

TEST(PackEngine, OutputsOfTheWrongShapeAreRefused) {
  std::mt19937_64 rng(22);
  h3::H3Config cfg = test::tiny_cfg(rng, false);
  h3::Conditioning c = test::clip(5, 64, 64, 3);
  auto r = rig(22, c, cfg);
  ASSERT_TRUE(r);
  auto p = exec::make_plan(cfg, c, {});
  ASSERT_TRUE(p.ok());
  std::vector<float> vo(1000);
  exec::ForwardOutputs o{TensorView(vo.data(), DType::f32, {cfg.latents_dim, 1, 2, 2}), TensorView()};
  auto res = r->engine->forward(c, r->text, r->in.video_view(cfg, c), r->in.audio_view(cfg, c), 0.5f, *p, o);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(res.error().message.find("video output"), std::string::npos) << res.error().message;
}

TEST(PackEngine, OutputMasksOffGivesTheUnmaskedVelocities) {
  std::mt19937_64 rng(23);
  h3::H3Config cfg = test::tiny_cfg(rng, false);
  h3::Conditioning c = test::clip(5, 64, 64, 4);
  c.geometry.A = 6;
  c.audio_scale = 1.0;  // _forward's output: no carry between the head and the masks
  const h3::ClipGeometry& g = c.geometry;
  c.video_mask.resize(static_cast<size_t>(g.T * g.Hl * g.Wl));
  for (size_t i = 0; i < c.video_mask.size(); ++i) c.video_mask[i] = std::uniform_real_distribution<float>(0, 1)(rng);
  c.audio_mask.resize(static_cast<size_t>(2 * g.A));
  for (size_t i = 0; i < c.audio_mask.size(); ++i) c.audio_mask[i] = i % 3 == 0 ? 1.0f : 0.2f + 0.1f * static_cast<float>(i);
  c.audio_mask[1] = 0.0f;
  auto r = rig(23, c, cfg);
  ASSERT_TRUE(r);
  const exec::ForwardResult masked = fwd(*r, c, 0.7f);
  h3::Conditioning off = c;
  off.output_masks = false;
  const exec::ForwardResult unmasked = fwd(*r, off, 0.7f);
  // masked = bf16(unmasked * m), m the pooled mask of the element's row.
  const std::vector<float> pv = h3::pooled_video_mask(c), pa = h3::pooled_audio_mask(c);
  bool fractional = false;
  for (float m : pv) fractional |= m > 0.0f && m < 1.0f;
  ASSERT_TRUE(fractional);
  const int64_t hp = g.Hl / 2, wp = g.Wl / 2, plane = g.T * g.Hl * g.Wl;
  std::vector<float> want_v(unmasked.video.size()), want_a(unmasked.audio.size());
  for (size_t i = 0; i < want_v.size(); ++i) {
    const int64_t e = static_cast<int64_t>(i) % plane, t = e / (g.Hl * g.Wl), y = (e / g.Wl) % g.Hl, x = e % g.Wl;
    want_v[i] = round_bf16(unmasked.video[i] * pv[static_cast<size_t>((t * hp + y / 2) * wp + x / 2)]);
  }
  for (size_t i = 0; i < want_a.size(); ++i) want_a[i] = round_bf16(unmasked.audio[i] * pa[i % static_cast<size_t>(2 * g.A)]);
  EXPECT_TRUE(same(want_v, masked.video));
  EXPECT_TRUE(same(want_a, masked.audio));
  EXPECT_FALSE(same(masked.video, unmasked.video));
  // The per-row timesteps still come from the masks: unmasked is not the mask-free run.
  h3::Conditioning nomask = c;
  nomask.video_mask.clear();
  nomask.audio_mask.clear();
  const exec::ForwardResult plain = fwd(*r, nomask, 0.7f);
  EXPECT_FALSE(same(plain.video, unmasked.video));
  EXPECT_FALSE(same(plain.audio, unmasked.audio));
  // And the in-place (device) path agrees.
  std::vector<float> vo(unmasked.video.size()), ao(unmasked.audio.size());
  exec::PlanKnobs k;
  k.final_chunk_tokens = 5;
  fwd(*r, off, 0.7f, k, nullptr, nullptr,
      exec::ForwardOutputs{TensorView(vo.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl}),
                           TensorView(ao.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A})});
  EXPECT_TRUE(same(vo, unmasked.video));
  EXPECT_TRUE(same(ao, unmasked.audio));
}

TEST(AudioOnlyKeyframe, LayoutByHand) {
  std::mt19937_64 rng(31);
  h3::H3Config cfg = test::tiny_cfg(rng, false);
  h3::Conditioning c = test::clip(5, 64, 64, 4);
  c.geometry.A = 5;
  c.aud_aug = 0.9;
  h3::Keyframe kf;
  kf.pixel_frame = 3;
  kf.audio = test::audio_latent(rng, cfg, 2);
  c.keyframes.push_back(kf);
  auto lay = h3::build_layout(cfg, c);
  ASSERT_TRUE(lay.ok()) << lay.error().message;
  const h3::ClipGeometry& g = c.geometry;
  // text | cond_audio (2 * 2 rows) | target audio | target video.
  ASSERT_EQ(lay->segments.size(), 4u);
  const h3::Segment& s = lay->segments[1];
  EXPECT_EQ(s.kind, h3::SegmentKind::cond_audio);
  EXPECT_EQ(s.start, g.text_tokens);
  EXPECT_EQ(s.rows(), 4);
  EXPECT_EQ(s.source, 0);
  EXPECT_EQ(lay->S, g.text_tokens + 4 + 2 * g.A + g.T * (g.Hl / 2) * (g.Wl / 2));
  // Positions: t = L + 5/3 * pixel_frame + j (no reference cursor), h 0, w the target
  // grid's extremes per stereo channel (those of the target audio rows).
  const double t0 = static_cast<double>(g.text_tokens) + 5.0 / 3.0 * 3.0;
  const h3::Segment& ta = lay->target_audio();
  for (int64_t ch = 0; ch < 2; ++ch)
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t row = s.start + ch * 2 + j;
      EXPECT_DOUBLE_EQ(lay->positions[static_cast<size_t>(3 * row)], t0 + static_cast<double>(j));
      EXPECT_EQ(lay->positions[static_cast<size_t>(3 * row + 1)], 0.0);
      EXPECT_EQ(lay->positions[static_cast<size_t>(3 * row + 2)],
                lay->positions[static_cast<size_t>(3 * (ta.start + ch * g.A) + 2)]);
    }
  // Timesteps: the condition audio pin max(t_a, aud_aug) with the audio tag.
  const h3::Timesteps ts = h3::layout_timesteps(*lay, c, 0.6f);
  const double want_t = std::max(ts.sig.t_a, 0.9);
  for (int64_t row = s.start; row < s.stop; ++row) {
    const int32_t m = ts.mod_rows[static_cast<size_t>(row)];
    EXPECT_EQ(m % 3, h3::kTagAudio);
    EXPECT_EQ(ts.unique_t[static_cast<size_t>(m / 3)], want_t);
  }
  // The same rows as a video+audio keyframe's audio rows, minus its video rows.
  h3::Conditioning both = c;
  both.keyframes[0].video = test::video_latent(rng, cfg, 1, g.Hl, g.Wl);
  auto lb = h3::build_layout(cfg, both);
  ASSERT_TRUE(lb.ok());
  const int64_t vrows = (g.Hl / 2) * (g.Wl / 2);
  ASSERT_EQ(lb->S, lay->S + vrows);
  for (int64_t row = g.text_tokens; row < lay->S; ++row)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(lay->positions[static_cast<size_t>(3 * row + k)], lb->positions[static_cast<size_t>(3 * (row + vrows) + k)]);
  // A keyframe with neither latent is refused.
  h3::Conditioning none = c;
  none.keyframes[0].audio = h3::AudioLatent{};
  auto ln = h3::build_layout(cfg, none);
  ASSERT_FALSE(ln.ok());
  EXPECT_NE(ln.error().message.find("neither a video nor an audio latent"), std::string::npos);
}

TEST(AudioOnlyKeyframe, PlansMatchStockAndTheRowsCount) {
  for (uint64_t seed : {41u, 42u, 43u}) {
    std::mt19937_64 rng(seed);
    h3::H3Config cfg = test::tiny_cfg(rng, true);
    h3::Conditioning c = test::clip(5, 64, 64, 3);
    c.geometry.A = 4;
    c.aud_aug = seed == 42 ? 0.5 : 1.0;  // 0.5: condition noise from the engine's generator
    c.sample_sigmas = {1.0f, 0.9f, 0.75f, 0.5f, 0.0f};
    h3::Keyframe kf;
    kf.pixel_frame = static_cast<int64_t>(seed % 5);
    kf.audio = test::audio_latent(rng, cfg, 3);
    c.keyframes.push_back(kf);
    h3::Keyframe vid;  // and an ordinary keyframe after it
    vid.pixel_frame = 4;
    vid.video = test::video_latent(rng, cfg, 1, c.geometry.Hl, c.geometry.Wl);
    if (seed == 43) c.keyframes.push_back(vid);
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + h3::h3_config_summary(cfg));
    auto r = rig(seed, c, cfg);
    ASSERT_TRUE(r);
    const exec::ForwardResult ref = fwd(*r, c, 0.8f);
    ASSERT_GT(test::sum_abs(ref.video), 0.0);
    auto stock = exec::make_plan(cfg, c, {});
    ASSERT_TRUE(stock.ok());
    const int64_t S = stock->sizes.S;
    for (int64_t sl : {int64_t{1}, int64_t{2}, S - 1, int64_t{5}}) {
      exec::PlanKnobs k;
      k.attn_chunk_tokens = sl;
      k.mlp_chunk_tokens = std::max<int64_t>(1, sl - 1);
      k.final_chunk_tokens = sl;
      const exec::ForwardResult p = fwd(*r, c, 0.8f, k);
      EXPECT_TRUE(same(ref.video, p.video)) << "slice " << sl;
      EXPECT_TRUE(same(ref.audio, p.audio)) << "slice " << sl;
    }
    // The keyframe's rows reach the output: without it (or with other audio) it changes.
    h3::Conditioning without = c;
    without.keyframes.erase(without.keyframes.begin());
    EXPECT_FALSE(same(ref.audio, fwd(*r, without, 0.8f).audio));
    h3::Conditioning moved = c;
    moved.keyframes[0].pixel_frame += 7;  // another time position
    EXPECT_FALSE(same(ref.audio, fwd(*r, moved, 0.8f).audio));
  }
}
