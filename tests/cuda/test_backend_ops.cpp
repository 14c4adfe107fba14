// Parity harness: every CUDA op against the CPU reference backend (style-lessons §5),
// at awkward sizes (1, 97, 1025 rows), with guard bytes around every output, NaN and
// one-sided inf checks, error thresholds, and slice invariance by memcmp on the GPU
// (rows [a, b) alone give the bytes of the full computation). GEMM: M sweep and
// column slices at real H3 shapes; attention: error vs fp64 at most 2x the CPU's.
// Every test skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/alloc_fault.h"
#include "attention_test_util.h"
#include "cuda_test_util.h"

// The native kernel's parity and streaming tests (cuDNN: test_attention_cudnn).
[[maybe_unused]] const bool kNative = ls::cudatest::select_native_attention();

namespace ls::cudatest {
namespace {

const int64_t kRows[] = {1, 97, 1025};

// The row slices every invariance check uses: first row, last row, a middle range.
std::vector<std::pair<int64_t, int64_t>> slices_of(int64_t M) {
  std::vector<std::pair<int64_t, int64_t>> s = {{0, 1}, {M - 1, M}};
  if (M > 2) s.push_back({M / 3, M - M / 4});
  return s;
}

// ---- rms_norm ----------------------------------------------------------------------
TEST(CudaOps, RmsNorm) {
  LS_NEED_GPU();
  for (int64_t M : kRows) {
    const int64_t D = M == 1025 ? 200 : (M == 97 ? 5376 : 1001);
    HostBuf x = random_buf(DType::bf16, {M, D}, 1 + M, 2.0f, 0.5f), w = random_buf(DType::bf16, {D}, 2, 0.3f, 1.0f);
    HostBuf ref(DType::bf16, {M, D});
    ASSERT_TRUE(G->cpu->rms_norm(x.v, w.v, 1e-5f, ref.v).ok());
    DevBuf dx = dev_from(G, x), dw = dev_from(G, w), dout = dev_buf(G, DType::bf16, {M, D});
    ASSERT_TRUE(G->cuda->rms_norm(dx.v, dw.v, 1e-5f, dout.v).ok());
    HostBuf got = download(G, dout.v);
    expect_guards(G, dout, "rms_norm");
    expect_close(got, ref, 1, 0.0, "rms_norm");
    for (auto [a, b] : slices_of(M)) {
      DevBuf o2 = dev_buf(G, DType::bf16, {b - a, D});
      ASSERT_TRUE(G->cuda->rms_norm(dx.v.slice_rows(a, b), dw.v, 1e-5f, o2.v).ok());
      EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(got, a, b))) << "rms_norm rows " << a << ".." << b;
    }
    // In place gives the same bytes.
    ASSERT_TRUE(G->cuda->rms_norm(dx.v, dw.v, 1e-5f, dx.v).ok());
    EXPECT_TRUE(same_bytes(download(G, dx.v), got)) << "rms_norm in place";
  }
}

// ---- modulate / gated_add / add -----------------------------------------------------
TEST(CudaOps, ModulateAndGatedAdd) {
  LS_NEED_GPU();
  for (int64_t M : kRows) {
    for (DType tab : {DType::bf16, DType::f32}) {
      const int64_t D = M == 1025 ? 136 : 5376 / (M == 1 ? 1 : 4) + 3, R = 3;
      HostBuf in = random_buf(DType::bf16, {M, D}, 10 + M, 1.5f);
      HostBuf table = random_buf(tab, {R, 3 * D}, 11, 0.4f);  // [shift | scale | gate] like the AdaLN output
      HostBuf rows(DType::i32, {M});
      for (int64_t i = 0; i < M; ++i) rows.v.ptr<int32_t>()[i] = static_cast<int32_t>((i * 7) % R);
      TensorView hsh = table.v.cols(0, D), hsc = table.v.cols(D, 2 * D), hg = table.v.cols(2 * D, 3 * D);
      DevBuf din = dev_from(G, in), dtab = dev_from(G, table), drows = dev_from(G, rows);
      TensorView dsh = dtab.v.cols(0, D), dsc = dtab.v.cols(D, 2 * D), dg = dtab.v.cols(2 * D, 3 * D);
      for (DType od : {DType::bf16, DType::f32}) {
        if (od == DType::f32 && tab != DType::f32) {
          // The contract's f32 output takes f32 tables only: both backends refuse.
          DevBuf dout = dev_buf(G, od, {M, D});
          EXPECT_FALSE(G->cuda->modulate(din.v, dsh, dsc, drows.v, dout.v).ok());
          continue;
        }
        HostBuf ref(od, {M, D});
        ASSERT_TRUE(G->cpu->modulate(in.v, hsh, hsc, rows.v, ref.v).ok());
        DevBuf dout = dev_buf(G, od, {M, D});
        ASSERT_TRUE(G->cuda->modulate(din.v, dsh, dsc, drows.v, dout.v).ok());
        HostBuf got = download(G, dout.v);
        expect_guards(G, dout, "modulate");
        expect_close(got, ref, 0, 0.0, "modulate (same rounding points: exact)");
        for (auto [a, b] : slices_of(M)) {
          DevBuf o2 = dev_buf(G, od, {b - a, D});
          ASSERT_TRUE(G->cuda->modulate(din.v.slice_rows(a, b), dsh, dsc, drows.v.slice_rows(a, b), o2.v).ok());
          EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(got, a, b))) << "modulate rows " << a << ".." << b;
        }
      }
      // gated_add in place on a copy of `in`.
      HostBuf y = random_buf(DType::bf16, {M, D}, 20 + M, 3.0f);
      HostBuf ref = in;
      ASSERT_TRUE(G->cpu->gated_add(ref.v, y.v, hg, rows.v).ok());
      DevBuf dx = dev_from(G, in), dy = dev_from(G, y);
      ASSERT_TRUE(G->cuda->gated_add(dx.v, dy.v, dg, drows.v).ok());
      HostBuf got = download(G, dx.v);
      expect_guards(G, dx, "gated_add");
      expect_close(got, ref, 0, 0.0, "gated_add (fma, one rounding: exact)");
      for (auto [a, b] : slices_of(M)) {
        DevBuf x2 = dev_from(G, in);
        ASSERT_TRUE(G->cuda->gated_add(x2.v.slice_rows(a, b), dy.v.slice_rows(a, b), dg, drows.v.slice_rows(a, b)).ok());
        HostBuf g2 = download(G, x2.v);
        EXPECT_TRUE(same_bytes(host_rows(g2, a, b), host_rows(got, a, b))) << "gated_add rows " << a << ".." << b;
        EXPECT_TRUE(same_bytes(host_rows(g2, 0, a), host_rows(in, 0, a))) << "gated_add touched rows before " << a;
        EXPECT_TRUE(same_bytes(host_rows(g2, b, M), host_rows(in, b, M))) << "gated_add touched rows after " << b;
      }
      // add in place.
      HostBuf ref_add = in;
      ASSERT_TRUE(G->cpu->add(ref_add.v, y.v).ok());
      DevBuf dxa = dev_from(G, in);
      ASSERT_TRUE(G->cuda->add(dxa.v, dy.v).ok());
      expect_close(download(G, dxa.v), ref_add, 0, 0.0, "add (exact)");
      expect_guards(G, dxa, "add");
    }
  }
}

// ---- rms_norm_modulate (fused) ------------------------------------------------------
// The fused op against the CUDA two-op composition (memcmp: it must be the same bytes),
// against the CPU reference within the error the 1-ulp rms_norm parity allows once it
// has gone through modulate's rounding points, and CPU modulate of the CUDA rms_norm
// output (exact, the modulate parity), plus slices, in place, guards and a fallback.
TEST(CudaOps, RmsNormModulate) {
  LS_NEED_GPU();
  const float eps = 1e-5f;
  for (int64_t M : kRows) {
    for (int64_t D : {int64_t{5376}, int64_t{200}, int64_t{1001}}) {
      for (DType tab : {DType::bf16, DType::f32}) {
        const int64_t R = 5;
        const uint32_t seed = static_cast<uint32_t>(M * 7 + D + (tab == DType::f32 ? 1 : 0));
        HostBuf x = random_buf(DType::bf16, {M, D}, 30 + seed, 2.0f, 0.5f);
        HostBuf w = random_buf(DType::bf16, {D}, 31 + seed, 0.3f, 1.0f);
        HostBuf table = random_buf(tab, {R, 2 * D}, 32 + seed, 0.4f);  // [shift | scale]
        HostBuf rows(DType::i32, {M});
        std::mt19937 rng(33 + seed);
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(R - 1));
        for (int64_t i = 0; i < M; ++i) rows.v.ptr<int32_t>()[i] = pick(rng);
        const TensorView hsh = table.v.cols(0, D), hsc = table.v.cols(D, 2 * D);
        DevBuf dx = dev_from(G, x), dw = dev_from(G, w), dtab = dev_from(G, table), drows = dev_from(G, rows);
        const TensorView dsh = dtab.v.cols(0, D), dsc = dtab.v.cols(D, 2 * D);
        const std::string what = "rms_norm_modulate M=" + std::to_string(M) + " D=" + std::to_string(D) +
                                 (tab == DType::f32 ? " f32 tables" : " bf16 tables");

        DevBuf dout = dev_buf(G, DType::bf16, {M, D});
        ASSERT_TRUE(G->cuda->rms_norm_modulate(dx.v, dw.v, eps, dsh, dsc, drows.v, dout.v).ok()) << what;
        HostBuf got = download(G, dout.v);
        expect_guards(G, dout, what.c_str());

        // The CUDA composition: rms_norm into h, then modulate in place.
        DevBuf dh = dev_buf(G, DType::bf16, {M, D});
        ASSERT_TRUE(G->cuda->rms_norm(dx.v, dw.v, eps, dh.v).ok());
        HostBuf h_cuda = download(G, dh.v);
        ASSERT_TRUE(G->cuda->modulate(dh.v, dsh, dsc, drows.v, dh.v).ok());
        EXPECT_TRUE(same_bytes(got, download(G, dh.v))) << what << ": fused != rms_norm then modulate";

        // CPU modulate of the CUDA norm output: exact (modulate's parity is 0 ulp).
        HostBuf ref_mod(DType::bf16, {M, D});
        ASSERT_TRUE(G->cpu->modulate(h_cuda.v, hsh, hsc, rows.v, ref_mod.v).ok());
        EXPECT_TRUE(same_bytes(got, ref_mod)) << what << ": fused != CPU modulate of the CUDA norm";

        // The CPU reference (its default rms_norm_modulate, the composition). The norms
        // may differ by 1 ulp (rms_norm's parity); through modulate that becomes at most
        // |sc| * ulp(h) + 2 ulp(t) + 2 ulp(out) of the reference's values (t = bf16(h * sc);
        // each rounding adds half an ulp on either side, an ulp twice as large when the
        // two sides fall in different binades).
        HostBuf ref(DType::bf16, {M, D}), h_cpu(DType::bf16, {M, D});
        ASSERT_TRUE(G->cpu->rms_norm_modulate(x.v, w.v, eps, hsh, hsc, rows.v, ref.v).ok());
        ASSERT_TRUE(G->cpu->rms_norm(x.v, w.v, eps, h_cpu.v).ok());
        expect_close(h_cuda, h_cpu, 1, 0.0, "rms_norm inside rms_norm_modulate");
        auto ulp = [](double v) {  // bf16 unit in the last place of v
          int e;
          std::frexp(v, &e);
          return v == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, e - 8);
        };
        int64_t far = 0, nonzero = 0, differ = 0;
        for (int64_t m = 0; m < M; ++m) {
          const int64_t r = rows.v.ptr<const int32_t>()[m];
          for (int64_t d = 0; d < D; ++d) {
            const int64_t i = m * D + d;
            const float sc = round_bf16(1.0f + round_bf16(table.get(r * 2 * D + D + d)));
            const double hv = h_cpu.get(i), t = round_bf16(static_cast<float>(hv) * sc);
            const double bound = std::fabs(sc) * ulp(hv) + 2.0 * ulp(t) + 2.0 * ulp(ref.get(i));
            const double gv = got.get(i), rv = ref.get(i);
            nonzero += gv != 0.0;
            differ += gv != rv;
            if (!(std::fabs(gv - rv) <= bound)) ++far;  // NaN counts as far
          }
        }
        EXPECT_EQ(far, 0) << what << ": elements beyond the propagated 1-ulp norm parity";
        EXPECT_GT(nonzero, M * D / 2) << what << ": output mostly zero, the check would be vacuous";
        std::printf("%s: %lld of %lld elements differ from the CPU reference (all within bound)\n", what.c_str(),
                    static_cast<long long>(differ), static_cast<long long>(M * D));

        // Slice invariance: rows [a, b) alone give the full call's rows.
        for (auto [a, b] : slices_of(M)) {
          DevBuf o2 = dev_buf(G, DType::bf16, {b - a, D});
          ASSERT_TRUE(
              G->cuda->rms_norm_modulate(dx.v.slice_rows(a, b), dw.v, eps, dsh, dsc, drows.v.slice_rows(a, b), o2.v)
                  .ok());
          EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(got, a, b))) << what << " rows " << a << ".." << b;
          expect_guards(G, o2, "rms_norm_modulate slice");
        }
        // In place (out aliases x) gives the same bytes.
        DevBuf dxi = dev_from(G, x);
        ASSERT_TRUE(G->cuda->rms_norm_modulate(dxi.v, dw.v, eps, dsh, dsc, drows.v, dxi.v).ok());
        EXPECT_TRUE(same_bytes(download(G, dxi.v), got)) << what << " in place";
        expect_guards(G, dxi, "rms_norm_modulate in place");
      }
    }
  }
  // Outside the fused kernel (shift and scale of different dtypes): the composition,
  // whose modulate refuses the mix on CUDA; an f32 output: rms_norm refuses it.
  HostBuf x = random_buf(DType::bf16, {3, 64}, 40), w = random_buf(DType::bf16, {64}, 41, 0.3f, 1.0f);
  HostBuf t16 = random_buf(DType::bf16, {1, 64}, 42), t32 = random_buf(DType::f32, {1, 64}, 43);
  HostBuf rows(DType::i32, {3});
  DevBuf dx = dev_from(G, x), dw = dev_from(G, w), d16 = dev_from(G, t16), d32 = dev_from(G, t32);
  DevBuf drows = dev_from(G, rows), dout = dev_buf(G, DType::bf16, {3, 64}), dout32 = dev_buf(G, DType::f32, {3, 64});
  const Status mixed = G->cuda->rms_norm_modulate(dx.v, dw.v, 1e-5f, d16.v, d32.v, drows.v, dout.v);
  const Status mixed_ref = G->cuda->modulate(dout.v, d16.v, d32.v, drows.v, dout.v);
  EXPECT_EQ(mixed.ok(), mixed_ref.ok()) << "fallback is the composition";
  EXPECT_FALSE(G->cuda->rms_norm_modulate(dx.v, dw.v, 1e-5f, d32.v, d32.v, drows.v, dout32.v).ok());
}

// ---- qk_norm_rope -------------------------------------------------------------------
TEST(CudaOps, QkNormRope) {
  LS_NEED_GPU();
  for (int64_t M : kRows) {
    for (bool with_rope : {true, false}) {
      const int64_t H = M == 1025 ? 2 : 3, Dh = 128, P = 48;
      // q inside a fused [M, 3 * H * Dh] buffer: row stride 3 H Dh, head stride Dh.
      HostBuf qkv = random_buf(DType::bf16, {M, 3 * H * Dh}, 30 + M, 1.7f);
      HostBuf w = random_buf(DType::bf16, {Dh}, 31, 0.2f, 1.0f);
      HostBuf rope(DType::bf16, {M, P, 2});
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < P; ++j) {
          const float ang = static_cast<float>(m) * std::pow(10000.0f, -static_cast<float>(j % 16) / 16.0f);
          rope.set((m * P + j) * 2, std::cos(ang));
          rope.set((m * P + j) * 2 + 1, std::sin(ang));
        }
      HostBuf ref = qkv;
      TensorView hq = ref.v.cols(H * Dh, 2 * H * Dh).unflatten_last(H, Dh);  // the K third
      ASSERT_TRUE(G->cpu->qk_norm_rope(hq, w.v, with_rope ? rope.v : TensorView(), 1e-5f).ok());
      DevBuf d = dev_from(G, qkv), dw = dev_from(G, w), dr = dev_from(G, rope);
      TensorView dq = d.v.cols(H * Dh, 2 * H * Dh).unflatten_last(H, Dh);
      ASSERT_TRUE(G->cuda->qk_norm_rope(dq, dw.v, with_rope ? dr.v : TensorView(), 1e-5f).ok());
      HostBuf got = download(G, d.v);
      expect_guards(G, d, "qk_norm_rope");
      expect_close(got, ref, 1, 0.0, "qk_norm_rope");
      for (auto [a, b] : slices_of(M)) {
        DevBuf d2 = dev_from(G, qkv);
        TensorView q2 = d2.v.cols(H * Dh, 2 * H * Dh).unflatten_last(H, Dh).slice_rows(a, b);
        ASSERT_TRUE(G->cuda->qk_norm_rope(q2, dw.v, with_rope ? dr.v.slice_rows(a, b) : TensorView(), 1e-5f).ok());
        HostBuf g2 = download(G, d2.v);
        EXPECT_TRUE(same_bytes(host_rows(g2, a, b), host_rows(got, a, b))) << "qk_norm_rope rows " << a << ".." << b;
      }
    }
  }
}

// ---- swiglu / silu / time_embedding -----------------------------------------------
TEST(CudaOps, SwigluSiluTimeEmbedding) {
  LS_NEED_GPU();
  for (int64_t M : kRows) {
    const int64_t F = M == 1025 ? 72 : 1435;
    HostBuf u = random_buf(DType::bf16, {M, 2 * F}, 40 + M, 3.0f);
    HostBuf ref(DType::bf16, {M, F});
    ASSERT_TRUE(G->cpu->swiglu(u.v, ref.v).ok());
    DevBuf du = dev_from(G, u), dout = dev_buf(G, DType::bf16, {M, F});
    ASSERT_TRUE(G->cuda->swiglu(du.v, dout.v).ok());
    HostBuf got = download(G, dout.v);
    expect_guards(G, dout, "swiglu");
    expect_close(got, ref, 1, 0.0, "swiglu");
    for (auto [a, b] : slices_of(M)) {
      DevBuf o2 = dev_buf(G, DType::bf16, {b - a, F});
      ASSERT_TRUE(G->cuda->swiglu(du.v.slice_rows(a, b), o2.v).ok());
      EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(got, a, b))) << "swiglu rows " << a << ".." << b;
    }

    HostBuf x = random_buf(DType::f32, {M, 257}, 50 + M, 4.0f);
    HostBuf xs = x;
    ASSERT_TRUE(G->cpu->silu(xs.v).ok());
    DevBuf dx = dev_from(G, x);
    ASSERT_TRUE(G->cuda->silu(dx.v).ok());
    expect_close(download(G, dx.v), xs, 4, 1e-30, "silu");
    expect_guards(G, dx, "silu");

    HostBuf t(DType::f32, {M});
    for (int64_t i = 0; i < M; ++i) t.set(i, static_cast<float>(i + 1) / static_cast<float>(M + 1));
    HostBuf te(DType::f32, {M, 256});
    ASSERT_TRUE(G->cpu->time_embedding(t.v, te.v).ok());
    DevBuf dt = dev_from(G, t), dte = dev_buf(G, DType::f32, {M, 256});
    ASSERT_TRUE(G->cuda->time_embedding(dt.v, dte.v).ok());
    expect_close(download(G, dte.v), te, 8, 2e-7, "time_embedding");
    expect_guards(G, dte, "time_embedding");
  }
}

// ---- convert ------------------------------------------------------------------------
TEST(CudaOps, Convert) {
  LS_NEED_GPU();
  const DType types[] = {DType::f32, DType::bf16, DType::f16, DType::f8e4m3};
  for (int64_t M : kRows) {
    const int64_t N = M == 1025 ? 33 : 301;
    HostBuf src32 = random_buf(DType::f32, {M, N}, 60 + M, 100.0f);
    src32.set(0, std::nanf(""));
    if (M > 1) {
      src32.set(1, INFINITY);
      src32.set(2, -1e-30f);
      src32.set(3, 70000.0f);
    }
    for (DType from : types) {
      HostBuf src(from, {M, N});
      ASSERT_TRUE(G->cpu->convert(src32.v, src.v).ok());
      DevBuf ds = dev_from(G, src);
      for (DType to : types) {
        HostBuf ref(to, {M, N});
        ASSERT_TRUE(G->cpu->convert(src.v, ref.v).ok());
        DevBuf dd = dev_buf(G, to, {M, N});
        ASSERT_TRUE(G->cuda->convert(ds.v, dd.v).ok());
        HostBuf got = download(G, dd.v);
        EXPECT_TRUE(same_bytes(got, ref)) << "convert " << dtype_name(from) << " -> " << dtype_name(to) << " M=" << M;
        expect_guards(G, dd, "convert");
      }
    }
  }
}

// ---- gemm parity ----------------------------------------------------------------------
struct GemmCase {
  int64_t M, N, K;
  DType x, w, out;
  int bias;  // 0 none, 1 f32, 2 bf16
};

TEST(CudaOps, GemmParity) {
  LS_NEED_GPU();
  const GemmCase cases[] = {
      {1, 96, 5376, DType::bf16, DType::bf16, DType::bf16, 1},   {97, 200, 320, DType::bf16, DType::bf16, DType::bf16, 0},
      {1025, 64, 96, DType::bf16, DType::bf16, DType::f32, 2},   {97, 72, 1000, DType::bf16, DType::bf16, DType::f32, 0},
      {97, 136, 256, DType::f32, DType::f32, DType::f32, 1},     {1, 96, 5376, DType::f32, DType::f32, DType::f32, 1},
      {97, 96, 512, DType::f32, DType::bf16, DType::f32, 1},     {1025, 32, 200, DType::f32, DType::bf16, DType::f32, 0},
      {5, 40, 24, DType::bf16, DType::bf16, DType::bf16, 2},
  };
  for (const GemmCase& c : cases) {
    SCOPED_TRACE("gemm M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " " +
                 dtype_name(c.x) + "x" + dtype_name(c.w) + "->" + dtype_name(c.out) + " bias " + std::to_string(c.bias));
    HostBuf x = random_buf(c.x, {c.M, c.K}, 70 + static_cast<uint32_t>(c.K), 1.0f);
    HostBuf w = random_buf(c.w, {c.N, c.K}, 71 + static_cast<uint32_t>(c.N), 0.05f);
    HostBuf bias = random_buf(c.bias == 2 ? DType::bf16 : DType::f32, {c.N}, 72, 0.5f);
    HostBuf ref(c.out, {c.M, c.N});
    ASSERT_TRUE(G->cpu->gemm(x.v, w.v, c.bias ? &bias.v : nullptr, ref.v).ok());
    DevBuf dx = dev_from(G, x), dw = dev_from(G, w), db = dev_from(G, bias), dout = dev_buf(G, c.out, {c.M, c.N});
    Status s = G->cuda->gemm(dx.v, dw.v, c.bias ? &db.v : nullptr, dout.v);
    ASSERT_TRUE(s.ok()) << s.message();
    HostBuf got = download(G, dout.v);
    expect_guards(G, dout, "gemm");
    if (c.out == DType::bf16) {
      expect_close(got, ref, 1, 0.0, "gemm bf16 out");
    } else {
      // fp32 sums in different orders: |diff| <= 4 sqrt(K) 2^-24 sum_k |x_k w_k| (+ bias ulp).
      int64_t far = 0;
      for (int64_t m = 0; m < c.M; ++m)
        for (int64_t n = 0; n < c.N; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < c.K; ++k) mag += std::fabs(static_cast<double>(x.get(m * c.K + k)) * w.get(n * c.K + k));
          if (c.bias) mag += std::fabs(bias.get(n));
          const double tol = 4.0 * std::sqrt(static_cast<double>(c.K)) * std::ldexp(1.0, -24) * mag;
          const double a = got.get(m * c.N + n), b = ref.get(m * c.N + n);
          if (!(std::fabs(a - b) <= tol)) ++far;
        }
      EXPECT_EQ(far, 0) << "gemm f32 out beyond the fp32 reordering bound";
    }
  }
}

// ---- gemm: pinned algorithm, M sweep and column slices at real H3 shapes ------------
TEST(CudaOps, GemmPinnedSliceInvariance) {
  LS_NEED_GPU();
  struct Shape {
    const char* name;
    int64_t N, K;
    bool bias;
    int64_t col_split;  // column slices [0, s), [s, 2s), [2s, N) (0: none)
  };
  const Shape shapes[] = {{"qkv", 21504, 5376, false, 7168},
                          {"out_proj", 5376, 7168, false, 0},
                          {"fc1", 28672, 5376, false, 14336},
                          {"fc2", 5376, 14336, false, 0},
                          {"bias_bf16_1000", 1000, 1000, true, 328}};
  constexpr int64_t kFull = 4096;
  for (const Shape& sh : shapes) {
    Arena::Scope scope(*G->arena);
    SCOPED_TRACE(sh.name);
    HostBuf x = random_buf(DType::bf16, {kFull, sh.K}, 80, 1.0f);
    HostBuf w = random_buf(DType::bf16, {sh.N, sh.K}, 81, 0.02f);
    HostBuf bias = random_buf(DType::f32, {sh.N}, 82, 0.5f);
    DevBuf dx = dev_from(G, x), dw = dev_from(G, w), db = dev_from(G, bias);
    const TensorView* bp = sh.bias ? &db.v : nullptr;
    auto full = G->arena->alloc(DType::bf16, {kFull, sh.N}, "full");
    auto part = G->arena->alloc(DType::bf16, {kFull, sh.N}, "part");
    ASSERT_TRUE(full.ok() && part.ok());
    ASSERT_TRUE(G->cuda->gemm(dx.v, dw.v, bp, *full).ok());
    std::printf("  %s pinned: %s\n", sh.name, cuda::describe_pinned_gemm(*G->cuda, dx.v, dw.v, bp, *full).c_str());
    HostBuf zero(DType::f64, {1});
    ASSERT_TRUE(G->cuda->copy(G->counter, zero.v).ok());
    // Every M from 1 to 1024, then a sweep to kFull, each at a varying row offset.
    std::vector<int64_t> ms;
    for (int64_t m = 1; m <= 1024; ++m) ms.push_back(m);
    for (int64_t m : {1025, 1100, 1536, 2000, 2047, 2048, 3000, 4000, 4095, 4096}) ms.push_back(m);
    for (int64_t m : ms) {
      const int64_t a = (m * 7919) % (kFull - m + 1);
      TensorView o = part->slice_rows(0, m);
      Status s = G->cuda->gemm(dx.v.slice_rows(a, a + m), dw.v, bp, o);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_TRUE(cuda::count_unequal(*G->cuda, o, full->slice_rows(a, a + m), G->counter).ok());
    }
    HostBuf cnt = download(G, G->counter);
    EXPECT_EQ(*cnt.v.ptr<uint64_t>(), 0u) << "elements differing between M-sliced and full GEMM";
    // Column slices: rows [c0, c1) of the weight alone (e.g. the Q rows of a fused qkv weight).
    if (sh.col_split > 0) {
      ASSERT_TRUE(G->cuda->copy(G->counter, zero.v).ok());
      const int64_t cuts[] = {0, sh.col_split, 2 * sh.col_split, sh.N};
      for (int i = 0; i < 3; ++i) {
        const int64_t c0 = cuts[i], c1 = cuts[i + 1];
        for (int64_t m : {1, 7, 333, 4096}) {
          TensorView bs = db.v;
          if (sh.bias) bs = db.v.slice_rows(c0, c1);
          auto o = G->arena->alloc(DType::bf16, {m, c1 - c0}, "cols");
          ASSERT_TRUE(o.ok());
          Status s = G->cuda->gemm(dx.v.slice_rows(0, m), dw.v.slice_rows(c0, c1), sh.bias ? &bs : nullptr, *o);
          ASSERT_TRUE(s.ok()) << s.message();
          ASSERT_TRUE(cuda::count_unequal(*G->cuda, *o, full->slice_rows(0, m).cols(c0, c1), G->counter).ok());
          // Also into a strided destination (the column range of a wide buffer).
          TensorView od = part->slice_rows(0, m).cols(c0, c1);
          ASSERT_TRUE(G->cuda->gemm(dx.v.slice_rows(0, m), dw.v.slice_rows(c0, c1), sh.bias ? &bs : nullptr, od).ok());
          ASSERT_TRUE(cuda::count_unequal(*G->cuda, od, full->slice_rows(0, m).cols(c0, c1), G->counter).ok());
        }
      }
      HostBuf c2 = download(G, G->counter);
      EXPECT_EQ(*c2.v.ptr<uint64_t>(), 0u) << "elements differing between column-sliced and full GEMM";
    }
  }
}

// ---- attention ----------------------------------------------------------------------
// fp64 reference attention_f64 and rel_l2: attention_test_util.h (shared with the cuDNN and
// hopper tests).

TEST(CudaOps, AttentionParity) {
  LS_NEED_GPU();
  const AttentionCase cases[] = {{97, 1025, 2, 128, 1024, 1.0f}, {1, 1, 2, 128, 1024, 1.0f},
                                 {1025, 97, 1, 128, 64, 3.0f},   {97, 1025, 2, 128, 100, 3.0f},
                                 {97, 300, 3, 64, 128, 2.0f},    {33, 77, 2, 32, 1024, 1.0f}};
  for (const AttentionCase& c : cases) {
    AttentionParity r;
    check_attention_case(G, c, 90, "attention", r);  // and its query slices: the same bytes
  }
}

// The kernel variants (warps per CTA, m-tiles per warp) are a speed knob only: every
// variant must give the same bytes (same per-row arithmetic).
TEST(CudaOps, AttentionVariantsAgree) {
  LS_NEED_GPU();
  for (int64_t Dh : {128, 64, 32}) {
    const int64_t Mq = 1025, Mk = 2049, H = 2, W = H * Dh;
    HostBuf q = random_buf(DType::bf16, {Mq, H, Dh}, 96, 2.0f);
    HostBuf kv = random_buf(DType::bf16, {Mk, 2 * W}, 97, 1.0f);
    DevBuf dq = dev_from(G, q), dkv = dev_from(G, kv);
    TensorView dk = dkv.v.cols(0, W).unflatten_last(H, Dh), dv = dkv.v.cols(W, 2 * W).unflatten_last(H, Dh);
    AttentionParams p;
    p.kv_tile = 1000;  // blocks clipped at tile ends too
    HostBuf first;
    bool have_first = false;
    for (const char* variant : {"4x1", "8x1", "4x2"}) {
      const ScopedNumerics variant_numerics(*G->cuda, attention_numerics("native", variant));
      ASSERT_TRUE(variant_numerics.status().ok()) << variant_numerics.status().message();
      ASSERT_EQ(G->cuda->numerics().native_variant, variant);
      DevBuf o = dev_buf(G, DType::bf16, {Mq, H, Dh});
      ASSERT_TRUE(G->cuda->attention(dq.v, dk, dv, o.v, p).ok());
      HostBuf got = download(G, o.v);
      expect_guards(G, o, "attention variant");
      if (!have_first) {
        first = got;
        have_first = true;
      }
      EXPECT_TRUE(same_bytes(got, first)) << "variant " << variant << " Dh " << Dh << " differs from 4x1";
      for (auto [a, b] : slices_of(Mq)) {
        DevBuf o2 = dev_buf(G, DType::bf16, {b - a, H, Dh});
        ASSERT_TRUE(G->cuda->attention(dq.v.slice_rows(a, b), dk, dv, o2.v, p).ok());
        EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(first, a, b)))
            << "variant " << variant << " query rows " << a << ".." << b;
      }
    }
  }
}

// Real H3 width: 56 heads x 128 in a fused qkv buffer, query slices at 8192-token scale.
TEST(CudaOps, AttentionQuerySliceInvarianceLarge) {
  LS_NEED_GPU();
  const int64_t S = 12289;
  const std::optional<SliceInputs> in = slice_inputs(G, S, 56, 128, 95);
  ASSERT_TRUE(in.has_value());
  const TensorView &q = in->q, &k = in->k, &v = in->v;
  const TensorView *full = &in->full, *part = &in->part;
  AttentionParams p;
  ASSERT_TRUE(G->cuda->attention(q, k, v, *full, p).ok());
  for (int64_t a = 0; a < S; a += 8192) {
    const int64_t b = std::min(S, a + 8192);
    ASSERT_TRUE(G->cuda->attention(q.slice_rows(a, b), k, v, part->slice_rows(a, b), p).ok());
  }
  ASSERT_TRUE(G->cuda->attention(q.slice_rows(S - 1, S), k, v, part->slice_rows(S - 1, S), p).ok());
  EXPECT_EQ(count_diff(G, *full, *part), 0u);
}

// cuda_ext.h: pinned host buffer, side stream and events (for the streaming executor).
TEST(CudaOps, ExtensionWrappers) {
  LS_NEED_GPU();
  const int dev = cuda::device_index(*G->cuda);
  ASSERT_GE(dev, 0);
  EXPECT_EQ(cuda::device_index(*G->cpu), -1);
  ASSERT_NE(cuda::compute_stream(*G->cuda), nullptr);
  const int64_t n = 1 << 20;
  auto pinned = cuda::PinnedHostBuffer::create(static_cast<size_t>(n) * 4);
  ASSERT_TRUE(pinned.ok()) << pinned.error().message;
  float* hp = static_cast<float*>((*pinned)->data());
  for (int64_t i = 0; i < n; ++i) hp[i] = static_cast<float>(i % 977) - 300.0f;
  auto dst = G->arena->alloc(DType::f32, {n}, "ext dst");
  ASSERT_TRUE(dst.ok());
  cuda::Stream side(dev);
  cuda::Event start(dev, true), done(dev, true);
  start.record(side.get());
  ASSERT_EQ(cudaMemcpyAsync(dst->data, hp, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, side.get()),
            cudaSuccess);
  done.record(side.get());
  done.wait_on(cuda::compute_stream(*G->cuda));  // the compute stream waits for the copy
  HostBuf back = download(G, *dst);               // queued on the compute stream
  EXPECT_EQ(std::memcmp(back.v.data, hp, static_cast<size_t>(n) * 4), 0);
  done.synchronize();
  EXPECT_GE(cuda::Event::elapsed_ms(start, done), 0.0f);
}

TEST(CudaOps, GemmWithoutWorkspaceFailsCleanly) {
  LS_NEED_GPU();
  auto b = make_backend("cuda");
  ASSERT_TRUE(b.ok());
  auto x = G->arena->alloc(DType::bf16, {4, 64}, "x");
  auto w = G->arena->alloc(DType::bf16, {8, 64}, "w");
  auto o = G->arena->alloc(DType::bf16, {4, 8}, "o");
  Status s = (*b)->gemm(*x, *w, nullptr, *o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("set_workspace"), std::string::npos) << s.message();
}

// ---- count_nonfinite ---------------------------------------------------------------
// The CUDA count against the CPU reference on the same bytes, for views of one buffer:
// contiguous (the 16-byte vector path), row slices, column slices at odd offsets
// (unaligned: the scalar path), head-strided, 4-D, an innermost stride of 2, a scalar,
// zero-size views, and a large buffer (grid-stride over many items). Bit patterns:
// every NaN class and both infinities, plus the finite extremes (largest finite,
// smallest subnormal, -0) that must not count. The padding around the interior view is
// all NaN, so a kernel reading outside its view is caught.
namespace nonfinite {

std::vector<uint32_t> nonfinite_bits(DType t) {
  if (t == DType::bf16) return {0x7fc0, 0xffc0, 0x7f81, 0x7fff, 0xffff, 0x7f80, 0xff80};
  if (t == DType::f16) return {0x7e00, 0xfe00, 0x7c01, 0x7fff, 0x7c00, 0xfc00};
  return {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0x7f800000u, 0xff800000u};
}
std::vector<uint32_t> finite_bits(DType t) {
  if (t == DType::bf16) return {0x7f7f, 0xff7f, 0x0080, 0x0001, 0x8001, 0x0000, 0x8000};
  if (t == DType::f16) return {0x7bff, 0xfbff, 0x0400, 0x0001, 0x8000};
  return {0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x00000001u, 0x80000000u};
}
void put(HostBuf& h, int64_t i, uint32_t bits) {
  if (h.v.elem_size() == 2) {
    const auto b = static_cast<uint16_t>(bits);
    std::memcpy(static_cast<char*>(h.v.data) + i * 2, &b, 2);
  } else {
    std::memcpy(static_cast<char*>(h.v.data) + i * 4, &bits, 4);
  }
}
// The same geometry over the device copy of a host buffer.
TensorView on_device(const TensorView& host_view, const HostBuf& host, const TensorView& dev) {
  TensorView d = host_view;
  d.data = static_cast<char*>(dev.data) + (static_cast<char*>(host_view.data) - static_cast<char*>(host.v.data));
  d.device = dev.device;
  return d;
}

}  // namespace nonfinite

TEST(CudaOps, CountNonfinite) {
  LS_NEED_GPU();
  using namespace nonfinite;
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t M = 1027, H = 3, Dh = 40, P = 4;  // [M + 2, H, Dh + 2P] with a NaN frame
    HostBuf full(t, {M + 2, H, Dh + 2 * P});
    const std::vector<uint32_t> nf = nonfinite_bits(t), fin = finite_bits(t);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::uniform_int_distribution<int> coin(0, 199);
    int64_t planted = 0;
    for (int64_t r = 0; r < M + 2; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < Dh + 2 * P; ++c) {
          const int64_t i = (r * H + h) * (Dh + 2 * P) + c;
          const bool inside = r >= 1 && r <= M && c >= P && c < P + Dh;
          if (!inside) put(full, i, nf[static_cast<size_t>(i) % nf.size()]);
          else if (coin(rng) == 0) put(full, i, nf[static_cast<size_t>(planted++) % nf.size()]);
          else if (coin(rng) == 1) put(full, i, fin[static_cast<size_t>(i) % fin.size()]);
          else full.set(i, nd(rng));
        }
    ASSERT_GT(planted, 100);
    auto dev = G->arena->alloc(t, {M + 2, H, Dh + 2 * P}, "nonfinite buffer");
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(G->cuda->copy(*dev, full.v).ok());
    TensorView interior = full.v.slice_rows(1, M + 1).cols(P, P + Dh);  // [M, H, Dh], strided
    TensorView every_other = interior;  // innermost stride 2 over the head dim
    every_other.shape[2] = Dh / 2;
    every_other.stride[2] = 2;
    TensorView four = interior;  // [M, H, 2, Dh/2]
    four.ndim = 4;
    four.shape = {M, H, 2, Dh / 2};
    four.stride = {interior.stride[0], interior.stride[1], Dh / 2, 1};
    TensorView scalar = interior;
    scalar.ndim = 0;
    const std::vector<std::pair<std::string, TensorView>> views = {
        {"whole buffer (contiguous)", full.v},
        {"interior", interior},
        {"interior row 0", interior.slice_rows(0, 1)},
        {"interior last row", interior.slice_rows(M - 1, M)},
        {"interior middle rows", interior.slice_rows(M / 3, M - M / 4)},
        {"odd columns", interior.cols(1, Dh - 2)},
        {"one column", interior.cols(7, 8)},
        {"rows of the whole buffer", full.v.slice_rows(5, 600)},
        {"innermost stride 2", every_other},
        {"4-D", four},
        {"scalar", scalar},
        {"zero rows", interior.slice_rows(3, 3)},
    };
    for (const auto& [what, hv] : views) {
      auto want = G->cpu->count_nonfinite(hv);
      ASSERT_TRUE(want.ok()) << what << ": " << want.error().message;
      auto got = G->cuda->count_nonfinite(on_device(hv, full, *dev));
      ASSERT_TRUE(got.ok()) << what << ": " << got.error().message;
      EXPECT_EQ(*got, *want) << what << " " << hv.shape_str();
    }
    EXPECT_GT(*G->cpu->count_nonfinite(interior), 0);
    EXPECT_EQ(*G->cuda->count_nonfinite(full.v.slice_rows(0, 0)), 0);  // host view, but empty: 0
  }
  // Large contiguous buffers: the vector path (2^22 elements) and an odd length.
  for (DType t : {DType::bf16, DType::f32}) {
    for (int64_t n : {int64_t{1} << 22, (int64_t{1} << 22) + 3}) {
      HostBuf h(t, {n});
      for (int64_t i = 0; i < n; ++i) h.set(i, static_cast<float>(i % 1001) - 500.0f);
      const auto nf = nonfinite_bits(t);
      for (int64_t i = 0; i < n; i += 4099) put(h, i, nf[static_cast<size_t>(i) % nf.size()]);
      put(h, n - 1, nf[0]);
      auto d = G->arena->alloc(t, {n}, "large nonfinite buffer");
      ASSERT_TRUE(d.ok());
      ASSERT_TRUE(G->cuda->copy(*d, h.v).ok());
      const int64_t want = *G->cpu->count_nonfinite(h.v);
      ASSERT_GT(want, 1000);
      EXPECT_EQ(*G->cuda->count_nonfinite(*d), want) << dtype_name(t) << " n " << n;
    }
  }
  // Refusals: a host view with elements, an integer dtype.
  HostBuf host(DType::f32, {16});
  EXPECT_EQ(G->cuda->count_nonfinite(host.v).error().code, ErrorCode::unsupported);
  auto i32 = G->arena->alloc(DType::i32, {16}, "i32");
  ASSERT_TRUE(i32.ok());
  EXPECT_EQ(G->cuda->count_nonfinite(*i32).error().code, ErrorCode::unsupported);
}

// core/alloc_fault.h on the CUDA resources: the armed allocation fails with
// out_of_memory (device memory, pinned host memory, PinnedHostBuffer), the next succeeds,
// and the live-block count returns to where it was.
TEST(CudaOps, AllocationFaultHook) {
  LS_NEED_GPU();
  const int64_t live = ls::testing::live_allocations();
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which);
    ls::testing::arm_allocation_fault(1);
    if (which == 2) {
      auto p = cuda::PinnedHostBuffer::create(1 << 20);
      ASSERT_FALSE(p.ok());
      EXPECT_EQ(p.error().code, ErrorCode::out_of_memory) << p.error().message;
      auto q = cuda::PinnedHostBuffer::create(1 << 20);
      ASSERT_TRUE(q.ok()) << q.error().message;
      EXPECT_EQ(ls::testing::live_allocations(), live + 1);
      continue;
    }
    MemoryResource& res = which == 0 ? G->cuda->memory() : G->cuda->pinned_host_memory();
    auto p = res.allocate(1 << 20);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error().code, ErrorCode::out_of_memory) << p.error().message;
    EXPECT_NE(p.error().message.find("injected"), std::string::npos) << p.error().message;
    auto q = res.allocate(1 << 20);
    ASSERT_TRUE(q.ok()) << q.error().message;
    EXPECT_EQ(ls::testing::live_allocations(), live + 1);
    res.deallocate(*q, 1 << 20);
  }
  ls::testing::arm_allocation_fault(0);
  EXPECT_EQ(ls::testing::live_allocations(), live);
  EXPECT_EQ(ls::testing::allocations_seen(), 0);
}

TEST(CudaOps, OutOfMemoryIsAStatus) {
  LS_NEED_GPU();
  auto r = G->cuda->memory().allocate(1ull << 50);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory) << r.error().message;
  auto ok = G->cuda->memory().allocate(1 << 20);  // the device still works afterwards
  ASSERT_TRUE(ok.ok());
  G->cuda->memory().deallocate(*ok, 1 << 20);
}

}  // namespace
}  // namespace ls::cudatest
