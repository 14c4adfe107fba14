// Issue 13 on the GPU: the CUDA latent packing ops give the CPU reference's bytes
// (memcmp) for strided f32 / bf16 sources, row ranges, masks, the audio carry and f32 /
// bf16 outputs (sentinel guards around the row buffers); and the engine with its target
// latents on the device (strided, bf16) and device outputs gives the bytes of host
// latents and host outputs, on a sliced plan. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/pack.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "exactness_util.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"

using namespace ls;
using namespace ls::cudatest;

namespace {

// A host byte buffer copied to the device as-is; views of any layout over it.
struct Raw {
  TensorView dev;  // u8 [bytes]
};
Raw upload_raw(Gpu* G, const void* data, size_t bytes) {
  auto a = G->arena->alloc(DType::u8, {static_cast<int64_t>(bytes)}, "raw");
  LS_CHECK(a.ok());
  Raw r{a.value()};
  LS_CHECK(G->cuda->copy(r.dev, TensorView(const_cast<void*>(data), DType::u8, {static_cast<int64_t>(bytes)})).ok());
  return r;
}
std::vector<uint8_t> download_raw(Gpu* G, const TensorView& dev, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  LS_CHECK(G->cuda->copy(TensorView(out.data(), DType::u8, {static_cast<int64_t>(bytes)}),
                         TensorView(dev.data, DType::u8, {static_cast<int64_t>(bytes)}, dev.device))
               .ok());
  LS_CHECK(G->cuda->synchronize().ok());
  return out;
}
TensorView with_layout(void* data, DType t, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride,
                       Device d) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[static_cast<size_t>(i++)] = s;
  i = 0;
  for (int64_t s : stride) v.stride[static_cast<size_t>(i++)] = s;
  v.device = d;
  return v;
}
std::vector<float> randn(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  return test::randn(rng, n);
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

}  // namespace

TEST(PackOpsCuda, PackVideoRowsMatchesCpu) {
  LS_NEED_GPU();
  const int64_t C = 24, T = 3, H = 6, W = 8, n = T * (H / 2) * (W / 2);
  // [C, T, H, W] stored as [T, W, C, H]: every stride non-trivial.
  const std::vector<float> st = randn(1, static_cast<size_t>(C * T * H * W));
  const std::vector<uint16_t> st16 = to_bf16(st);
  for (bool bf16 : {false, true}) {
    const void* host = bf16 ? static_cast<const void*>(st16.data()) : st.data();
    const DType dt = bf16 ? DType::bf16 : DType::f32;
    const TensorView hv = with_layout(const_cast<void*>(host), dt, {C, T, H, W}, {H, W * C * H, 1, C * H}, Device{});
    Raw raw = upload_raw(G, host, st.size() * (bf16 ? 2 : 4));
    const TensorView dv = with_layout(raw.dev.data, dt, {C, T, H, W}, {H, W * C * H, 1, C * H}, raw.dev.device);
    HostBuf want(DType::f32, {n, 4 * C});
    ASSERT_TRUE(cpu::cpu_op_pack_video_rows(hv, 0, want.v).ok());
    DevBuf got = dev_buf(G, DType::f32, {n, 4 * C});
    const int64_t cut = 7;  // two row ranges
    ASSERT_TRUE(G->cuda->pack_video_rows(dv, 0, got.v.slice_rows(0, cut)).ok());
    ASSERT_TRUE(G->cuda->pack_video_rows(dv, cut, got.v.slice_rows(cut, n)).ok());
    HostBuf g = download(G, got.v);
    EXPECT_EQ(std::memcmp(g.bytes.data(), want.bytes.data(), static_cast<size_t>(n * 4 * C * 4)), 0) << (bf16 ? "bf16" : "f32");
    expect_guards(G, got, "pack_video_rows");
  }
}

TEST(PackOpsCuda, PackAudioRowsMatchesCpu) {
  LS_NEED_GPU();
  const int64_t C = 32, A = 37;
  const std::vector<float> st = randn(2, static_cast<size_t>(C * 2 * A));  // stored [A, 2, C]
  const std::vector<uint16_t> st16 = to_bf16(st);
  for (bool bf16 : {false, true})
    for (float carry : {1.0f, round_bf16(3.1f)}) {
      const void* host = bf16 ? static_cast<const void*>(st16.data()) : st.data();
      const DType dt = bf16 ? DType::bf16 : DType::f32;
      const TensorView hv = with_layout(const_cast<void*>(host), dt, {C, 2, A}, {1, C, 2 * C}, Device{});
      Raw raw = upload_raw(G, host, st.size() * (bf16 ? 2 : 4));
      const TensorView dv = with_layout(raw.dev.data, dt, {C, 2, A}, {1, C, 2 * C}, raw.dev.device);
      HostBuf want(DType::f32, {2 * A, C});
      ASSERT_TRUE(cpu::cpu_op_pack_audio_rows(hv, carry, 0, want.v).ok());
      DevBuf got = dev_buf(G, DType::f32, {2 * A, C});
      ASSERT_TRUE(G->cuda->pack_audio_rows(dv, carry, 0, got.v.slice_rows(0, 40)).ok());
      ASSERT_TRUE(G->cuda->pack_audio_rows(dv, carry, 40, got.v.slice_rows(40, 2 * A)).ok());
      HostBuf g = download(G, got.v);
      EXPECT_EQ(std::memcmp(g.bytes.data(), want.bytes.data(), static_cast<size_t>(2 * A * C * 4)), 0)
          << (bf16 ? "bf16" : "f32") << " carry " << carry;
      expect_guards(G, got, "pack_audio_rows");
    }
}

TEST(PackOpsCuda, UnpackRowsMatchCpu) {
  LS_NEED_GPU();
  const int64_t C = 24, T = 2, H = 6, W = 4, n = T * (H / 2) * (W / 2), Ca = 32, A = 19;
  HostBuf vrows = random_buf(DType::f32, {n, 4 * C}, 3, 3.0f);
  HostBuf arows = random_buf(DType::f32, {2 * A, Ca}, 4, 3.0f);
  HostBuf vmask(DType::f32, {n}), amask(DType::f32, {2 * A});
  for (int64_t i = 0; i < n; ++i) vmask.set(i, static_cast<float>((i * 37) % 257) / 256.0f);
  for (int64_t i = 0; i < 2 * A; ++i) amask.set(i, i % 4 == 0 ? 1.0f : static_cast<float>((i * 11) % 256) / 256.0f);
  const std::vector<float> src = randn(5, static_cast<size_t>(Ca * 2 * A));
  DevBuf dvr = dev_from(G, vrows), dar = dev_from(G, arows), dvm = dev_from(G, vmask), dam = dev_from(G, amask);
  Raw dsrc = upload_raw(G, src.data(), src.size() * 4);
  for (DType od : {DType::f32, DType::bf16})
    for (bool masked : {false, true}) {
      SCOPED_TRACE(std::string(od == DType::f32 ? "f32" : "bf16") + (masked ? " masked" : ""));
      // video
      HostBuf want(od, {C, T, H, W});
      ASSERT_TRUE(cpu::cpu_op_unpack_video_rows(vrows.v, masked ? vmask.v : TensorView(), 0, want.v).ok());
      auto out = G->arena->alloc(od, {C, T, H, W}, "video out");
      ASSERT_TRUE(out.ok());
      for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 5}, {5, n}})
        ASSERT_TRUE(G->cuda->unpack_video_rows(dvr.v.slice_rows(a, b), masked ? dvm.v.slice_rows(a, b) : TensorView(), a,
                                               *out)
                        .ok());
      HostBuf g = download(G, *out);
      EXPECT_EQ(std::memcmp(g.bytes.data(), want.bytes.data(), static_cast<size_t>(g.n() * dtype_size(od))), 0) << "video";
      // audio, with and without the carry
      for (bool carried : {false, true}) {
        Backend::AudioCarryOut ca;
        ca.apply = carried;
        ca.carry = round_bf16(1.7f);
        ca.one_minus_s = -3.0f;
        ca.coef = round_bf16(1.0f + 3.0f * 0.42f);
        ca.src = TensorView(const_cast<float*>(src.data()), DType::f32, {Ca, 2, A});
        HostBuf wa(od, {Ca, 2, A});
        ASSERT_TRUE(cpu::cpu_op_unpack_audio_rows(arows.v, masked ? amask.v : TensorView(), ca, 0, wa.v).ok());
        ca.src = TensorView(dsrc.dev.data, DType::f32, {Ca, 2, A}, dsrc.dev.device);
        auto ao = G->arena->alloc(od, {Ca, 2, A}, "audio out");
        ASSERT_TRUE(ao.ok());
        for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 11}, {11, 2 * A}})
          ASSERT_TRUE(G->cuda->unpack_audio_rows(dar.v.slice_rows(a, b), masked ? dam.v.slice_rows(a, b) : TensorView(), ca,
                                                 a, *ao)
                          .ok());
        HostBuf ga = download(G, *ao);
        EXPECT_EQ(std::memcmp(ga.bytes.data(), wa.bytes.data(), static_cast<size_t>(ga.n() * dtype_size(od))), 0)
            << "audio, carry " << carried;
      }
    }
}

// The engine: device latents (strided bf16 video, f32 audio) and device outputs give the
// bytes of host latents and host outputs.
TEST(PackEngineCuda, DeviceLatentsAndOutputsGiveTheHostBytes) {
  LS_NEED_GPU();
  std::mt19937_64 rng(77);
  h3::H3Config cfg = test::tiny_cfg(rng, false);
  h3::Conditioning c = test::clip(5, 64, 64, 5);
  c.geometry.A = 6;
  test::add_all_modes(rng, cfg, c);  // masks, keyframe, references, augmentation
  h3::H3SyntheticSource src(cfg, 77);
  auto be = make_backend("cuda");
  ASSERT_TRUE(be.ok()) << be.error().message;
  auto engine = exec::Engine::create(src, **be);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  test::Inputs in = test::random_inputs(rng, cfg, c);
  // bf16-exact video values, so a bf16 device copy holds the same inputs.
  for (auto& x : in.video) x = round_bf16(x);
  auto text = (*engine)->refine_text(in.text_view(cfg, c));
  ASSERT_TRUE(text.ok());
  const h3::ClipGeometry& g = c.geometry;
  const int64_t C = cfg.latents_dim, Ca = cfg.audio_latents_dim;
  auto arena = Arena::create((*be)->memory(), 64ull << 20);
  ASSERT_TRUE(arena.ok());
  exec::PlanKnobs k;
  k.kv_tile = (*be)->numerics().kv_tile;
  k.mlp_chunk_tokens = 5;
  k.attn_chunk_tokens = 7;
  k.final_chunk_tokens = 3;
  auto plan = exec::make_plan(cfg, c, k);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  for (double scale : {4.0, 1.0}) {
    c.audio_scale = scale;
    SCOPED_TRACE("audio_scale " + std::to_string(scale));
    auto ref = (*engine)->forward(c, *text, in.video_view(cfg, c), in.audio_view(cfg, c), 0.8f, *plan);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    ASSERT_GT(test::sum_abs(ref->video), 0.0);
    // Video on the device as bf16 [C, T, H, W] stored [T, W, C, H]; audio f32 contiguous.
    std::vector<uint16_t> vst(in.video.size());
    for (int64_t cc = 0; cc < C; ++cc)
      for (int64_t t = 0; t < g.T; ++t)
        for (int64_t h = 0; h < g.Hl; ++h)
          for (int64_t w = 0; w < g.Wl; ++w)
            vst[static_cast<size_t>(((t * g.Wl + w) * C + cc) * g.Hl + h)] =
                f32_to_bf16(in.video[static_cast<size_t>(((cc * g.T + t) * g.Hl + h) * g.Wl + w)]);
    Arena::Scope scope(**arena);
    auto vraw = (*arena)->alloc(DType::bf16, {static_cast<int64_t>(vst.size())}, "video in");
    auto araw = (*arena)->alloc(DType::f32, {Ca, 2, g.A}, "audio in");
    auto vout = (*arena)->alloc(DType::bf16, {C, g.T, g.Hl, g.Wl}, "video out");
    auto aout = (*arena)->alloc(DType::f32, {Ca, 2, g.A}, "audio out");
    ASSERT_TRUE(vraw.ok() && araw.ok() && vout.ok() && aout.ok());
    ASSERT_TRUE((*be)->copy(*vraw, TensorView(vst.data(), DType::bf16, {static_cast<int64_t>(vst.size())})).ok());
    ASSERT_TRUE((*be)->copy(*araw, in.audio_view(cfg, c)).ok());
    const TensorView vdev = with_layout(vraw->data, DType::bf16, {C, g.T, g.Hl, g.Wl},
                                        {g.Hl, g.Wl * C * g.Hl, 1, C * g.Hl}, vraw->device);
    auto dres = (*engine)->forward(c, *text, vdev, *araw, 0.8f, *plan, exec::ForwardOutputs{*vout, *aout});
    ASSERT_TRUE(dres.ok()) << dres.error().message;
    EXPECT_EQ(dres->hash(), ref->hash());
    EXPECT_TRUE(test::same_bytes(dres->video, ref->video));
    EXPECT_TRUE(test::same_bytes(dres->audio, ref->audio));
    std::vector<uint8_t> vb = download_raw(G, *vout, ref->video.size() * 2);
    std::vector<uint16_t> want16 = to_bf16(ref->video);
    EXPECT_EQ(std::memcmp(vb.data(), want16.data(), vb.size()), 0) << "device video output";
    std::vector<uint8_t> ab = download_raw(G, *aout, ref->audio.size() * 4);
    EXPECT_EQ(std::memcmp(ab.data(), ref->audio.data(), ab.size()), 0) << "device audio output";
  }
}
