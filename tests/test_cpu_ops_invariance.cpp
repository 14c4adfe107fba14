// Batch invariance of the CPU ops, by memcmp (DESIGN.md §1):
//  - rows [a, b) computed alone give exactly the bytes of those rows of the full
//    computation (random slices, a one-row slice, the last row);
//  - GEMM column slices (the Q rows of a fused qkv weight alone, the K/V rows alone,
//    odd column windows) give the bytes of those columns of the full product;
//  - attention: any query slice gives identical bytes; kv_tile >= Mk is one tile;
//    different kv_tile values agree within tolerance (not bitwise);
//  - 1 thread, 3 threads and 7 threads give identical bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "test_cpu_ops_util.h"

namespace ls {
namespace {

using test::get;
using test::HostTensor;

std::unique_ptr<Backend>& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return b;
}

// compute(a, b, dst): writes rows [a, b) of the op's result into dst rows [a, b),
// starting from pristine inputs (in-place ops copy their input rows into dst first).
using RowCompute = std::function<void(int64_t a, int64_t b, const TensorView& dst)>;

std::vector<std::pair<int64_t, int64_t>> slices(int64_t M, uint64_t seed) {
  std::vector<std::pair<int64_t, int64_t>> s = {{0, 1}, {M - 1, M}, {0, M}};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 4; ++i) {
    std::uniform_int_distribution<int64_t> d(0, M);
    int64_t a = d(rng), b = d(rng);
    if (a > b) std::swap(a, b);
    if (a == b) b = std::min(M, a + 1), a = b - 1;
    s.emplace_back(a, b);
  }
  return s;
}

void expect_row_invariant(const char* what, int64_t M, DType t, int64_t width, const RowCompute& compute) {
  set_num_threads(0);
  HostTensor full(t, {M, width});
  compute(0, M, full);
  ASSERT_TRUE(full.guards_intact()) << what;
  ASSERT_GT(test::count_nonzero(full), 0) << what << ": all-zero output makes the comparison vacuous";
  for (auto [a, b] : slices(M, static_cast<uint64_t>(M * 131 + width))) {
    HostTensor part(t, {M, width});
    compute(a, b, part);
    ASSERT_TRUE(part.guards_intact()) << what;
    EXPECT_TRUE(test::same_bytes(part.view().slice_rows(a, b), full.view().slice_rows(a, b)))
        << what << ": rows [" << a << ", " << b << ") alone differ from the full computation";
  }
  for (int threads : {1, 3, 7}) {
    set_num_threads(threads);
    HostTensor again(t, {M, width});
    compute(0, M, again);
    EXPECT_TRUE(test::same_bytes(again, full)) << what << ": " << threads << " threads differ";
  }
  set_num_threads(0);
}

void copy_rows(const TensorView& src, const TensorView& dst, int64_t a, int64_t b) {
  ASSERT_TRUE(cpu()->copy(dst.slice_rows(a, b), src.slice_rows(a, b)).ok());
}

// ------------------------------------------------------------------------- GEMM
TEST(CpuInvariance, GemmRowsColumnsAndThreads) {
  for (DType xt : {DType::bf16, DType::f32}) {
    const int64_t M = 97, K = 300, I = 40, N = 3 * I;  // w: fused qkv weight [3I, K]
    std::mt19937_64 rng(1);
    HostTensor x(xt, {M, K}), w(DType::bf16, {N, K}), bias(DType::f32, {N});
    test::fill_uniform(x, rng, -1.0, 1.0);
    test::fill_uniform(w, rng, -1.0, 1.0);
    test::fill_uniform(bias, rng, -1.0, 1.0);
    ASSERT_GT(test::count_nonzero(x) * test::count_nonzero(w), 0);
    const DType ot = xt == DType::bf16 ? DType::bf16 : DType::f32;
    expect_row_invariant("gemm rows", M, ot, N, [&](int64_t a, int64_t b, const TensorView& dst) {
      ASSERT_TRUE(cpu()->gemm(x.view().slice_rows(a, b), w, &bias.view(), dst.slice_rows(a, b)).ok());
    });

    HostTensor full(ot, {M, N});
    ASSERT_TRUE(cpu()->gemm(x, w, &bias.view(), full).ok());
    // column windows: Q alone, K and V together, odd windows; each also on a row slice
    const std::pair<int64_t, int64_t> windows[] = {{0, I}, {I, 3 * I}, {5, 17}, {N - 1, N}, {1, N - 2}};
    for (auto [n0, n1] : windows) {
      for (auto [a, b] : {std::pair<int64_t, int64_t>{0, M}, {M - 1, M}, {10, 13}}) {
        HostTensor part(ot, {M, N});
        const TensorView bias_w = bias.view().slice_rows(n0, n1);
        ASSERT_TRUE(cpu()->gemm(x.view().slice_rows(a, b), w.view().slice_rows(n0, n1), &bias_w,
                                part.view().slice_rows(a, b).cols(n0, n1))
                        .ok());
        ASSERT_TRUE(part.guards_intact());
        EXPECT_TRUE(test::same_bytes(part.view().slice_rows(a, b).cols(n0, n1), full.view().slice_rows(a, b).cols(n0, n1)))
            << "gemm columns [" << n0 << ", " << n1 << ") rows [" << a << ", " << b << ")";
      }
    }
  }
}

TEST(CpuInvariance, GemmFewRowsSplitsColumnsWithoutChangingBits) {
  // M = 1..8 takes the column-parallel path; the same rows inside a big M take the
  // row-parallel path. Both must agree.
  const int64_t M = 64, K = 520, N = 301;
  std::mt19937_64 rng(2);
  HostTensor x(DType::bf16, {M, K}), w(DType::bf16, {N, K}), full(DType::bf16, {M, N});
  test::fill_uniform(x, rng, -1.0, 1.0);
  test::fill_uniform(w, rng, -1.0, 1.0);
  ASSERT_GT(test::count_nonzero(x) * test::count_nonzero(w), 0);
  ASSERT_TRUE(cpu()->gemm(x, w, nullptr, full).ok());
  for (int64_t rows = 1; rows <= 8; ++rows) {
    for (int threads : {1, 2, 5}) {
      set_num_threads(threads);
      HostTensor part(DType::bf16, {M, N});
      const int64_t a = M - rows;
      ASSERT_TRUE(cpu()->gemm(x.view().slice_rows(a, M), w, nullptr, part.view().slice_rows(a, M)).ok());
      EXPECT_TRUE(test::same_bytes(part.view().slice_rows(a, M), full.view().slice_rows(a, M)))
          << rows << " rows, " << threads << " threads";
    }
  }
  set_num_threads(0);
}

// ------------------------------------------------------------- token-wise ops
TEST(CpuInvariance, RmsNorm) {
  const int64_t M = 97, D = 517;
  std::mt19937_64 rng(3);
  HostTensor x(DType::bf16, {M, D}), w(DType::bf16, {D});
  test::fill_uniform(x, rng, -2.0, 2.0);
  test::fill_uniform(w, rng, 0.5, 1.5);
  expect_row_invariant("rms_norm", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    ASSERT_TRUE(cpu()->rms_norm(x.view().slice_rows(a, b), w, 1e-5f, dst.slice_rows(a, b)).ok());
  });
  expect_row_invariant("rms_norm in place", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    copy_rows(x, dst, a, b);
    ASSERT_TRUE(cpu()->rms_norm(dst.slice_rows(a, b), w, 1e-5f, dst.slice_rows(a, b)).ok());
  });
}

TEST(CpuInvariance, ModulateAndGatedAdd) {
  const int64_t M = 1025, D = 33, R = 6;
  std::mt19937_64 rng(4);
  HostTensor in(DType::bf16, {M, D}), y(DType::bf16, {M, D}), ada16(DType::bf16, {R, 6 * D}),
      ada32(DType::f32, {R, 6 * D}), rows(DType::i32, {M});
  test::fill_uniform(in, rng, -3.0, 3.0);
  test::fill_uniform(y, rng, -3.0, 3.0);
  test::fill_uniform(ada16, rng, -1.0, 1.0);
  test::fill_uniform(ada32, rng, -1.0, 1.0);
  test::fill_int(rows, rng, 0, static_cast<int>(R - 1));
  for (const HostTensor* ada : {&ada16, &ada32}) {
    const TensorView shift = ada->view().cols(0, D), scale = ada->view().cols(D, 2 * D), gate = ada->view().cols(2 * D, 3 * D);
    expect_row_invariant("modulate", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
      ASSERT_TRUE(cpu()->modulate(in.view().slice_rows(a, b), shift, scale, rows.view().slice_rows(a, b),
                                  dst.slice_rows(a, b)).ok());
    });
    if (ada->view().dtype == DType::f32) {
      expect_row_invariant("modulate f32", M, DType::f32, D, [&](int64_t a, int64_t b, const TensorView& dst) {
        ASSERT_TRUE(cpu()->modulate(in.view().slice_rows(a, b), shift, scale, rows.view().slice_rows(a, b),
                                    dst.slice_rows(a, b)).ok());
      });
    }
    expect_row_invariant("gated_add", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
      copy_rows(in, dst, a, b);
      ASSERT_TRUE(cpu()->gated_add(dst.slice_rows(a, b), y.view().slice_rows(a, b), gate,
                                   rows.view().slice_rows(a, b)).ok());
    });
  }
}

TEST(CpuInvariance, ElementwiseOps) {
  const int64_t M = 97, D = 131;
  std::mt19937_64 rng(5);
  HostTensor x(DType::bf16, {M, D}), y(DType::bf16, {M, D}), u(DType::bf16, {M, 2 * D}), xf(DType::f32, {M, D}),
      t(DType::f32, {M});
  test::fill_uniform(x, rng, -3.0, 3.0);
  test::fill_uniform(y, rng, -3.0, 3.0);
  test::fill_uniform(u, rng, -6.0, 6.0);
  test::fill_uniform(xf, rng, -6.0, 6.0);
  test::fill_uniform(t, rng, 0.0, 1.0);
  expect_row_invariant("add", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    copy_rows(x, dst, a, b);
    ASSERT_TRUE(cpu()->add(dst.slice_rows(a, b), y.view().slice_rows(a, b)).ok());
  });
  expect_row_invariant("swiglu", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    ASSERT_TRUE(cpu()->swiglu(u.view().slice_rows(a, b), dst.slice_rows(a, b)).ok());
  });
  expect_row_invariant("silu", M, DType::f32, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    copy_rows(xf, dst, a, b);
    ASSERT_TRUE(cpu()->silu(dst.slice_rows(a, b)).ok());
  });
  expect_row_invariant("time_embedding", M, DType::f32, 256, [&](int64_t a, int64_t b, const TensorView& dst) {
    ASSERT_TRUE(cpu()->time_embedding(t.view().slice_rows(a, b), dst.slice_rows(a, b)).ok());
  });
  expect_row_invariant("convert", M, DType::bf16, D, [&](int64_t a, int64_t b, const TensorView& dst) {
    ASSERT_TRUE(cpu()->convert(xf.view().slice_rows(a, b), dst.slice_rows(a, b)).ok());
  });
}

TEST(CpuInvariance, QkNormRope) {
  const int64_t M = 97, H = 3, Dh = 128, P = 48, I = H * Dh;
  std::mt19937_64 rng(6);
  HostTensor qkv(DType::bf16, {M, 3 * I}), w(DType::bf16, {Dh}), rope(DType::bf16, {M, P, 2});
  test::fill_uniform(qkv, rng, -3.0, 3.0);
  test::fill_uniform(w, rng, 0.5, 1.5);
  test::fill_uniform(rope, rng, -1.0, 1.0);
  // dst is a whole qkv buffer; the op runs in place on its K third (strided view).
  expect_row_invariant("qk_norm_rope", M, DType::bf16, 3 * I, [&](int64_t a, int64_t b, const TensorView& dst) {
    copy_rows(qkv, dst, a, b);
    const TensorView k = dst.slice_rows(a, b).cols(I, 2 * I).unflatten_last(H, Dh);
    ASSERT_TRUE(cpu()->qk_norm_rope(k, w, rope.view().slice_rows(a, b), 1e-5f).ok());
  });
}

// -------------------------------------------------------------------- attention
TEST(CpuInvariance, AttentionQuerySlicesAndThreads) {
  const int64_t M = 97, H = 2, Dh = 64, I = H * Dh;
  std::mt19937_64 rng(8);
  HostTensor qkv(DType::bf16, {M, 3 * I});
  test::fill_uniform(qkv, rng, -2.0, 2.0);
  const TensorView q = qkv.view().cols(0, I).unflatten_last(H, Dh);
  const TensorView k = qkv.view().cols(I, 2 * I).unflatten_last(H, Dh);
  const TensorView v = qkv.view().cols(2 * I, 3 * I).unflatten_last(H, Dh);
  for (int64_t tile : {int64_t{16}, int64_t{1024}}) {
    AttentionParams p;
    p.kv_tile = tile;
    expect_row_invariant("attention", M, DType::bf16, I, [&](int64_t a, int64_t b, const TensorView& dst) {
      ASSERT_TRUE(cpu()->attention(q.slice_rows(a, b), k, v, dst.slice_rows(a, b).unflatten_last(H, Dh), p).ok());
    });
  }
}

TEST(CpuInvariance, AttentionKvTiles) {
  const int64_t Mq = 33, Mk = 1025, H = 2, Dh = 32;
  std::mt19937_64 rng(9);
  HostTensor q(DType::bf16, {Mq, H, Dh}), k(DType::bf16, {Mk, H, Dh}), v(DType::bf16, {Mk, H, Dh});
  test::fill_uniform(q, rng, -3.0, 3.0);
  test::fill_uniform(k, rng, -3.0, 3.0);
  test::fill_uniform(v, rng, -1.0, 1.0);
  ASSERT_GT(test::count_nonzero(q) * test::count_nonzero(k) * test::count_nonzero(v), 0);
  auto run = [&](int64_t tile, HostTensor& out) {
    AttentionParams p;
    p.kv_tile = tile;
    ASSERT_TRUE(cpu()->attention(q, k, v, out, p).ok());
  };
  HostTensor one(DType::bf16, {Mq, H, Dh});
  run(Mk, one);
  ASSERT_GT(test::count_nonzero(one), 0);
  // kv_tile >= Mk is one tile: identical bytes
  for (int64_t tile : {Mk + 1, int64_t{4096}, std::numeric_limits<int64_t>::max() / 2}) {
    HostTensor o(DType::bf16, {Mq, H, Dh});
    run(tile, o);
    EXPECT_TRUE(test::same_bytes(o, one)) << "kv_tile " << tile;
  }
  // other tiles: within tolerance. The tiles only change which running max the
  // probabilities are rounded to bf16 against (relative 2^-9 each) and the fp32
  // rescaling, so outputs (|out| <= 1) stay within a few bf16 ulps: we allow 2^-7.
  double worst = 0.0;
  for (int64_t tile : {int64_t{1}, int64_t{16}, int64_t{100}, int64_t{512}, int64_t{1024}}) {
    HostTensor o(DType::bf16, {Mq, H, Dh});
    run(tile, o);
    for (int64_t i = 0; i < Mq * H * Dh; ++i) worst = std::max(worst, std::fabs(get(o, i) - get(one, i)));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -7));
  EXPECT_GT(worst, 0.0) << "tiles never changed a bit: the tiling is probably not exercised";
  std::printf("attention: max |out(kv_tile) - out(one tile)| = %.3g\n", worst);
}

}  // namespace
}  // namespace ls
