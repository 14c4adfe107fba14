// The CUDA quantised linears (src/backend/cuda/linear_quant.cu) against the CPU reference
// (src/backend/cpu/linear_quant.cpp) and against themselves:
//  - int8_convrot: CPU vs CUDA memcmp for M in {1, 7, 97, 1000} at several (K, N, G), with
//    bias, the fused swiglu input (K = 14336: the > 48 KiB shared-memory path) and an H3
//    width K = 5376; rows across several row chunks (N = 28672 makes the chunk 1408 rows);
//  - fp8_e4m3: row invariance on CUDA (memcmp between the whole call and slices of it, one
//    row included) with static and dynamic activation scales, and the distance to the CPU
//    (printed; bounded, not bitwise: the tensor cores' sum order is not the CPU's dot16);
//  - rows that are not 16-byte aligned (the quantisers' scalar-load paths): int8 vs the CPU
//    bitwise, the fp8 activation codes and scales vs the host quantiser bitwise;
//  - outputs written inside their views only (guard bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/linear_quant_math.h"
#include "backend/cuda/linear_quant_bench.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace ls {
namespace {

using cudatest::DevBuf;
using cudatest::HostBuf;

HostBuf bf16_input(int64_t M, int64_t W, uint32_t seed, float sd) {
  HostBuf h(DType::bf16, {M, W});
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (int64_t i = 0; i < h.n(); ++i) h.set(i, nd(rng) * ((i % 53 == 5) ? 30.0f : 1.0f));  // outlier channels
  return h;
}
HostBuf i8_weight(int64_t N, int64_t K, uint32_t seed) {
  HostBuf h(DType::i8, {N, K});
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  auto* p = h.v.ptr<int8_t>();
  for (int64_t i = 0; i < h.n(); ++i) p[i] = static_cast<int8_t>(d(rng));
  return h;
}
HostBuf e4m3_weight(int64_t N, int64_t K, uint32_t seed) {
  HostBuf h(DType::f8e4m3, {N, K});
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 50.0f);
  auto* p = h.v.ptr<uint8_t>();
  for (int64_t i = 0; i < h.n(); ++i) p[i] = f32_to_f8e4m3(nd(rng));
  return h;
}
HostBuf f32_vec(int64_t n, uint32_t seed, float lo, float hi) {
  HostBuf h(DType::f32, {n});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < n; ++i) h.set(i, d(rng));
  return h;
}

// A contiguous device copy (weights, scales: aligned arena pieces).
TensorView dev_contiguous(cudatest::Gpu* G, const HostBuf& h) {
  auto p = G->arena->alloc_bytes(static_cast<size_t>(h.n() * h.v.elem_size()), "linear test tensor");
  LS_CHECK(p.ok());
  TensorView v = TensorView::contiguous(*p, h.v.dtype, h.v.shape.data(), h.v.ndim, G->cuda->device());
  LS_CHECK(G->cuda->copy(v, h.v).ok());
  return v;
}

struct Problem {
  int64_t M, N, K, G;
  bool swiglu;
  int bias;  // 0 none, 1 f32, 2 bf16
  bool fp8 = false;
  bool dynamic = false;
  float input_scale = 1.0f;
};

struct Prepared {
  HostBuf x, w, scale, bias;
  LinearWeight hw;  // host weight (CPU backend)
  LinearWeight dw;  // device weight
  DevBuf dx;
  TensorView dbias;
  bool has_bias = false;
};

Prepared prepare(cudatest::Gpu* G, const Problem& p, uint32_t seed) {
  Prepared r;
  r.x = bf16_input(p.M, p.swiglu ? 2 * p.K : p.K, seed, p.fp8 ? 4.0f : 1.0f);
  r.w = p.fp8 ? e4m3_weight(p.N, p.K, seed + 1) : i8_weight(p.N, p.K, seed + 1);
  r.scale = p.fp8 ? f32_vec(1, seed + 2, 0.004f, 0.006f) : f32_vec(p.N, seed + 2, 1e-3f, 2e-2f);
  r.hw.format = p.fp8 ? WeightFormat::fp8_e4m3 : WeightFormat::int8_convrot;
  r.hw.w = r.w.v;
  r.hw.scale = r.scale.v;
  r.hw.group = p.G;
  r.hw.input_scale = p.input_scale;
  r.hw.dynamic_act = p.dynamic;
  r.dw = r.hw;
  r.dw.w = dev_contiguous(G, r.w);
  r.dw.scale = dev_contiguous(G, r.scale);
  r.dx = cudatest::dev_from(G, r.x);
  if (p.bias) {
    r.has_bias = true;
    r.bias = p.bias == 1 ? f32_vec(p.N, seed + 3, -2.0f, 2.0f) : bf16_input(1, p.N, seed + 3, 1.0f);
    if (p.bias == 2) {  // [1, N] -> [N]
      r.bias.v.ndim = 1;
      r.bias.v.shape[0] = p.N;
      r.bias.v.stride[0] = 1;
    }
    r.dbias = dev_contiguous(G, r.bias);
  }
  return r;
}

HostBuf run_cpu(cudatest::Gpu* G, const Problem& p, Prepared& r) {
  HostBuf out(DType::bf16, {p.M, p.N});
  LinearOptions o;
  o.swiglu_input = p.swiglu;
  Status s = G->cpu->linear(r.x.v, r.hw, r.has_bias ? &r.bias.v : nullptr, out.v, o);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// Rows [a, b) on CUDA into a guarded device buffer; returns the device view.
DevBuf run_cuda(cudatest::Gpu* G, const Problem& p, Prepared& r, int64_t a, int64_t b) {
  DevBuf out = cudatest::dev_buf(G, DType::bf16, {b - a, p.N});
  LinearOptions o;
  o.swiglu_input = p.swiglu;
  Status s = G->cuda->linear(r.dx.v.slice_rows(a, b), r.dw, r.has_bias ? &r.dbias : nullptr, out.v, o);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

int64_t count_diff(cudatest::Gpu* G, const TensorView& x, const TensorView& y) {
  HostBuf a = cudatest::download(G, x), b = cudatest::download(G, y);
  int64_t n = 0;
  for (int64_t i = 0; i < a.n(); ++i) n += a.v.ptr<uint16_t>()[i] != b.v.ptr<uint16_t>()[i];
  return n;
}

TEST(LinearQuantCuda, Int8MatchesCpuBitwise) {
  LS_NEED_GPU();
  const Problem cases[] = {
      {1, 384, 512, 256, false, 0},  {7, 384, 512, 256, false, 1},   {97, 200, 768, 64, false, 2},
      {1000, 384, 512, 256, false, 1}, {97, 256, 1024, 256, true, 0}, {7, 130, 14336, 256, true, 1},
      {1000, 512, 5376, 256, false, 0}, {1, 64, 5376, 256, true, 2},
      // K = 260 (G = 4: 4-byte rows) and N = 33 (accumulator rows padded): IMMA at a small
      // alignment or the dp4a fallback, the same exact sums either way
      {97, 33, 260, 4, false, 1},
      // every FHT split of the quantiser (linear_quant.cu): G = 16 (strides 1, 4 in registers
      // only), G = 1024 / 4096 (three / four shared-memory stages), a swiglu input at G = 64
      {50, 96, 1024, 16, false, 1}, {13, 100, 2048, 1024, true, 2}, {5, 64, 4096, 4096, false, 0},
      {33, 72, 768, 64, true, 1},
  };
  uint32_t seed = 1;
  for (const Problem& p : cases) {
    Arena::Scope scope(*G->arena);
    Prepared r = prepare(G, p, seed++);
    HostBuf want = run_cpu(G, p, r);
    DevBuf got = run_cuda(G, p, r, 0, p.M);
    HostBuf g = cudatest::download(G, got.v);
    int64_t diff = 0;
    for (int64_t i = 0; i < want.n(); ++i) diff += want.v.ptr<uint16_t>()[i] != g.v.ptr<uint16_t>()[i];
    EXPECT_EQ(diff, 0) << "M " << p.M << " N " << p.N << " K " << p.K << " G " << p.G << " swiglu " << p.swiglu
                       << " bias " << p.bias << ": " << diff << " of " << want.n() << " outputs differ";
    cudatest::expect_guards(G, got, "int8 linear");
    double ss = 0;
    for (int64_t i = 0; i < g.n(); ++i) ss += std::fabs(g.get(i));
    EXPECT_GT(ss, 0.0) << "all-zero output";
  }
}

// Rows that are not 16-byte aligned (row stride K + 17 elements, the view one element in):
// the quantisers' scalar-load paths, int8 against the CPU bitwise and the fp8 activation
// codes and scales against the host quantiser (linear_quant_math.h) bitwise.
TEST(LinearQuantCuda, UnalignedRowsMatchCpuBitwise) {
  LS_NEED_GPU();
  const Problem cases[] = {{37, 64, 512, 256, false, 1}, {9, 48, 1024, 16, true, 0}, {21, 40, 260, 4, false, 2}};
  uint32_t seed = 900;
  for (const Problem& p : cases) {
    Arena::Scope scope(*G->arena);
    Prepared r = prepare(G, p, seed++);
    const int64_t W = p.swiglu ? 2 * p.K : p.K;
    HostBuf wide = bf16_input(p.M, W + 1, seed++, 1.0f);
    DevBuf dwide = cudatest::dev_from(G, wide);
    r.x = wide;  // the CPU reads the same strided view
    Prepared rc = r;
    rc.x.v = r.x.v.cols(1, W + 1);
    HostBuf want = run_cpu(G, p, rc);
    DevBuf out = cudatest::dev_buf(G, DType::bf16, {p.M, p.N});
    LinearOptions o;
    o.swiglu_input = p.swiglu;
    const TensorView xd = dwide.v.cols(1, W + 1);
    ASSERT_NE(reinterpret_cast<uintptr_t>(xd.data) % 8, 0u);  // really unaligned
    ASSERT_TRUE(G->cuda->linear(xd, r.dw, r.has_bias ? &r.dbias : nullptr, out.v, o).ok());
    HostBuf got = cudatest::download(G, out.v);
    EXPECT_EQ(0, std::memcmp(want.v.data, got.v.data, static_cast<size_t>(want.n() * 2)))
        << "int8 unaligned M " << p.M << " K " << p.K << " G " << p.G;
  }
  // fp8 activation codes: static scale 1, static 0.25, dynamic; aligned and unaligned rows.
  for (int variant = 0; variant < 6; ++variant) {
    Arena::Scope scope(*G->arena);
    const int64_t M = 29, K = 1024 + 16 * variant;
    const bool dynamic = variant % 3 == 2, unaligned = variant >= 3;
    const float input_scale = variant % 3 == 1 ? 0.25f : 1.0f;
    // [M, K + 8] in a guarded buffer: rows K + 24 elements apart (16-byte multiples), so the
    // view at column 0 takes the 16-byte-load path and the one at column 1 the scalar one.
    HostBuf wide = bf16_input(M, K + 8, 1000 + static_cast<uint32_t>(variant), 4.0f);
    DevBuf dwide = cudatest::dev_from(G, wide);
    const TensorView xh = unaligned ? wide.v.cols(1, K + 1) : wide.v.cols(0, K);
    const TensorView xd = unaligned ? dwide.v.cols(1, K + 1) : dwide.v.cols(0, K);
    LinearWeight w;
    w.format = WeightFormat::fp8_e4m3;
    w.w = TensorView(nullptr, DType::f8e4m3, {8, K}, G->cuda->device());
    w.input_scale = input_scale;
    w.dynamic_act = dynamic;
    auto qd = G->arena->alloc(DType::f8e4m3, {M, K}, "q");
    auto rd = G->arena->alloc(DType::f32, {M}, "rs");
    ASSERT_TRUE(qd.ok() && rd.ok());
    ASSERT_TRUE(cuda::bench_quant_activations(*G->cuda, xd, w, false, *qd, *rd).ok());
    HostBuf q = cudatest::download(G, *qd), rs = cudatest::download(G, *rd);
    int64_t bad = 0;
    for (int64_t m = 0; m < M; ++m) {
      const auto* row = static_cast<const uint16_t*>(xh.data) + m * xh.stride[0];
      float s = input_scale;
      if (dynamic) {
        float mx = 0.0f;
        for (int64_t k = 0; k < K; ++k) mx = lq::max_nan_ignoring(mx, lq::abs(lq::bf16_widen(row[k])));
        s = lq::lq_fp8_dynamic_scale(mx);
      }
      bad += std::memcmp(&s, static_cast<const float*>(rs.v.data) + m, 4) != 0;
      for (int64_t k = 0; k < K; ++k)
        bad += q.v.ptr<uint8_t>()[m * K + k] != lq::lq_fp8_quant(lq::bf16_widen(row[k]), s);
    }
    EXPECT_EQ(bad, 0) << "fp8 quantiser variant " << variant;
  }
}

TEST(LinearQuantCuda, Int8RowChunksAndSlices) {
  LS_NEED_GPU();
  // N = 28672 (H3's fc1 width), K = 256: the chunk is 1408 rows (linear_quant.cu chunk_rows:
  // 160 MiB / (K + 16 + 4 N), a multiple of 128), so M = 3000 spans three.
  const Problem p{3000, 28672, 256, 256, false, 1};
  Prepared r = prepare(G, p, 77);
  DevBuf full = run_cuda(G, p, r, 0, p.M);
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 1}, {1, 1407}, {1407, 1409}, {1000, 3000}, {2999, 3000}}) {
    DevBuf part = run_cuda(G, p, r, a, b);
    EXPECT_EQ(count_diff(G, part.v, full.v.slice_rows(a, b)), 0) << "rows " << a << ".." << b;
  }
  // and rows 1400..1420 (across the first chunk boundary) equal the CPU's
  Problem q = p;
  q.M = 20;
  Prepared rc = r;
  rc.x.v = r.x.v.slice_rows(1400, 1420);
  HostBuf want = run_cpu(G, q, rc);
  HostBuf got = cudatest::download(G, full.v.slice_rows(1400, 1420));
  EXPECT_EQ(0, std::memcmp(want.v.data, got.v.data, static_cast<size_t>(want.n() * 2)));
}

TEST(LinearQuantCuda, Fp8RowInvarianceAndDistanceToCpu) {
  LS_NEED_GPU();
  const Problem cases[] = {
      {1, 384, 512, 0, false, 0, true, false, 1.0f},     {7, 384, 512, 0, false, 1, true, false, 1.0f},
      {97, 256, 1024, 0, false, 0, true, true, 1.0f},    {1000, 384, 512, 0, false, 1, true, false, 0.25f},
      {1000, 512, 5376, 0, false, 0, true, true, 1.0f},
  };
  uint32_t seed = 300;
  for (const Problem& p : cases) {
    Arena::Scope scope(*G->arena);
    Prepared r = prepare(G, p, seed++);
    DevBuf full = run_cuda(G, p, r, 0, p.M);
    cudatest::expect_guards(G, full, "fp8 linear");
    // row invariance: slices, single rows
    const int64_t cuts[] = {0, 1, p.M / 3, p.M / 3 + 1, p.M};
    for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
      const int64_t a = cuts[i], b = cuts[i + 1];
      if (a >= b) continue;
      DevBuf part = run_cuda(G, p, r, a, b);
      EXPECT_EQ(count_diff(G, part.v, full.v.slice_rows(a, b)), 0)
          << "fp8 M " << p.M << " K " << p.K << " rows " << a << ".." << b;
    }
    // distance to the CPU reference (same quantised inputs, another fp32 sum order)
    HostBuf want = run_cpu(G, p, r);
    HostBuf got = cudatest::download(G, full.v);
    double num = 0, den = 0, worst = 0;
    int64_t differ = 0;
    for (int64_t i = 0; i < want.n(); ++i) {
      const double a = got.get(i), b = want.get(i);
      num += (a - b) * (a - b);
      den += b * b;
      worst = std::max(worst, std::fabs(a - b) / std::max(1e-3, std::fabs(b)));
      differ += got.v.ptr<uint16_t>()[i] != want.v.ptr<uint16_t>()[i];
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("fp8 M %lld N %lld K %lld%s: CUDA vs CPU rel L2 %.3g, max rel %.3g, %lld of %lld outputs differ\n",
                static_cast<long long>(p.M), static_cast<long long>(p.N), static_cast<long long>(p.K),
                p.dynamic ? " dynamic" : "", rel, worst, static_cast<long long>(differ),
                static_cast<long long>(want.n()));
    EXPECT_LT(rel, 4e-3);  // a couple of bf16 roundings at most
    EXPECT_GT(den, 0.0);
  }
}

}  // namespace
}  // namespace ls
