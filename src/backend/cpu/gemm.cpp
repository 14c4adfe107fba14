// CPU GEMM: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])   (PyTorch's F.linear)
//
// Per-element reduction order (depends only on K; docs/numerics.md §2):
//   acc[0..15] = +0
//   for k = 0, 1, ..., K-1 (K zero-padded to a multiple of 16):
//       acc[k % 16] = acc[k % 16] + fl32(x[m, k] * w[n, k])     (bf16 widened exactly)
//   s8[l] = acc[l] + acc[l+8]; s4[l] = s8[l] + s8[l+4]; s2[l] = s4[l] + s4[l+2];
//   sum = s2[0] + s2[1]
//   out[m, n] = round_out( sum + bias[n] )            (one rounding to bf16 or none for f32)
// Every operation is one IEEE fp32 multiply or add (no FMA). Nothing in that order
// depends on M, N, which rows or columns are present, the tile an element falls in, or
// the thread split, so a row slice or a column slice (e.g. the Q rows of a fused qkv
// weight alone) reproduces exactly the bytes of the full product.
//
// Speed: a register tile of kTileRows x kTileCols output elements, each with its 16
// lanes in two 8-wide registers (lo = lanes 0..7, hi = lanes 8..15), walks K in steps of
// 16, widening bf16 to fp32 on the fly (no packing, no allocation). Columns are walked
// in blocks of about kColBlockBytes of weights so a block stays in L2 while every row
// tile of the thread passes over it. Threads split rows (row tiles) when there are
// enough of them, otherwise output columns, so a small slice (M = 1..8) still uses all
// threads; the split never changes an element's arithmetic.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

constexpr int kTileRows = 2;  // register tile: rows of x
constexpr int kTileCols = 3;  // register tile: rows of w (output columns)
constexpr int64_t kColBlockBytes = 192 * 1024;

// res[r * CT + c] = sum_k xr[r][k] * wr[c][k] in the documented order (simd.h dot16_tile).
template <typename XT, typename WT, int RT, int CT>
void gemm_tile(const XT* const* xr, const WT* const* wr, int64_t K, float* res) {
  dot16_tile<RT, CT>(WidenRows<XT>{xr}, WidenRows<WT>{wr}, K, res);
}

template <typename XT, typename WT, int RT>
void gemm_tile_cols(int ct, const XT* const* xr, const WT* const* wr, int64_t K, float* res) {
  static_assert(kTileCols <= 4, "extend the switch");
  switch (ct) {
    case 1: gemm_tile<XT, WT, RT, 1>(xr, wr, K, res); return;
    case 2: if constexpr (kTileCols >= 2) { gemm_tile<XT, WT, RT, 2>(xr, wr, K, res); return; } break;
    case 3: if constexpr (kTileCols >= 3) { gemm_tile<XT, WT, RT, 3>(xr, wr, K, res); return; } break;
    case 4: if constexpr (kTileCols >= 4) { gemm_tile<XT, WT, RT, 4>(xr, wr, K, res); return; } break;
    default: break;
  }
  LS_CHECK_MSG(false, "gemm tile width out of range");
}

template <typename XT, typename WT>
void gemm_tile_any(int rt, int ct, const XT* const* xr, const WT* const* wr, int64_t K, float* res) {
  static_assert(kTileRows <= 4, "extend the switch");
  switch (rt) {
    case 1: gemm_tile_cols<XT, WT, 1>(ct, xr, wr, K, res); return;
    case 2: if constexpr (kTileRows >= 2) { gemm_tile_cols<XT, WT, 2>(ct, xr, wr, K, res); return; } break;
    case 3: if constexpr (kTileRows >= 3) { gemm_tile_cols<XT, WT, 3>(ct, xr, wr, K, res); return; } break;
    case 4: if constexpr (kTileRows >= 4) { gemm_tile_cols<XT, WT, 4>(ct, xr, wr, K, res); return; } break;
    default: break;
  }
  LS_CHECK_MSG(false, "gemm tile height out of range");
}

struct GemmArgs {
  const TensorView* x;
  const TensorView* w;
  const TensorView* bias;  // null: no bias
  const TensorView* out;
  int64_t M, N, K;
};

inline float load_bias(const TensorView* bias, int64_t n) {
  if (!bias) return 0.0f;
  if (bias->dtype == DType::f32) return static_cast<const float*>(bias->data)[n * bias->stride[0]];
  return widen_scalar<uint16_t>(static_cast<const uint16_t*>(bias->data)[n * bias->stride[0]]);
}

// Computes out[m0:m1, n0:n1].
template <typename XT, typename WT>
void gemm_block(const GemmArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t col_block = std::max<int64_t>(
      kTileCols, kColBlockBytes / std::max<int64_t>(1, a.K * static_cast<int64_t>(sizeof(WT))) / kTileCols * kTileCols);
  const bool out_bf16 = a.out->dtype == DType::bf16;
  for (int64_t nb = n0; nb < n1; nb += col_block) {
    const int64_t nb_end = std::min(n1, nb + col_block);
    for (int64_t m = m0; m < m1; m += kTileRows) {
      const int rt = static_cast<int>(std::min<int64_t>(kTileRows, m1 - m));
      const XT* xr[kTileRows];
      for (int r = 0; r < rt; ++r) xr[r] = row_ptr<const XT>(*a.x, m + r);
      for (int64_t n = nb; n < nb_end; n += kTileCols) {
        const int ct = static_cast<int>(std::min<int64_t>(kTileCols, nb_end - n));
        const WT* wr[kTileCols];
        for (int c = 0; c < ct; ++c) wr[c] = row_ptr<const WT>(*a.w, n + c);
        float res[kTileRows * kTileCols];
        gemm_tile_any<XT, WT>(rt, ct, xr, wr, a.K, res);
        for (int r = 0; r < rt; ++r) {
          for (int c = 0; c < ct; ++c) {
            const float v = res[r * ct + c] + load_bias(a.bias, n + c);
            if (out_bf16) row_ptr<uint16_t>(*a.out, m + r)[n + c] = f32_to_bf16(v);
            else row_ptr<float>(*a.out, m + r)[n + c] = v;
          }
        }
      }
    }
  }
}

template <typename XT, typename WT>
void gemm_parallel(const GemmArgs& a) {
  // Work of one tile-row or tile-column of the output, for the grain of parallel_for:
  // at least ~256 kFLOP per chunk so tiny products are not split into noise.
  constexpr int64_t kMinFlopsPerChunk = 1 << 18;
  const int64_t threads = num_threads();
  const int64_t row_tiles = (a.M + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (a.N + kTileCols - 1) / kTileCols;
  if (row_tiles >= 4 * threads || col_tiles < row_tiles) {
    const int64_t flops = std::max<int64_t>(1, 2 * kTileRows * a.N * a.K);
    parallel_for(row_tiles, std::max<int64_t>(1, kMinFlopsPerChunk / flops), [&](int64_t b, int64_t e) {
      gemm_block<XT, WT>(a, b * kTileRows, std::min(a.M, e * kTileRows), 0, a.N);
    });
  } else {
    const int64_t flops = std::max<int64_t>(1, 2 * kTileCols * a.M * a.K);
    parallel_for(col_tiles, std::max<int64_t>(1, kMinFlopsPerChunk / flops), [&](int64_t b, int64_t e) {
      gemm_block<XT, WT>(a, 0, a.M, b * kTileCols, std::min(a.N, e * kTileCols));
    });
  }
}

}  // namespace

Status cpu_op_gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) {
  LS_TRY(require_host("gemm", {&x, &w, bias, &out}));
  LS_CHECK_MSG(x.ndim == 2 && w.ndim == 2 && out.ndim == 2,
               "gemm wants x [M, K], w [N, K], out [M, N]; got " + x.shape_str() + ", " + w.shape_str() + ", " +
                   out.shape_str());
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  LS_CHECK_MSG(w.size(1) == K && out.size(0) == M && out.size(1) == N,
               "gemm shape mismatch: x " + x.shape_str() + ", w " + w.shape_str() + ", out " + out.shape_str());
  LS_CHECK_MSG(x.inner_contiguous() && w.inner_contiguous() && out.inner_contiguous(), "gemm: rows must be contiguous");
  if (bias) LS_CHECK_MSG(bias->ndim == 1 && bias->size(0) == N, "gemm bias must be [N]; got " + bias->shape_str());

  const bool out_ok = out.dtype == DType::bf16 || out.dtype == DType::f32;
  const bool bias_ok = !bias || bias->dtype == DType::f32 || bias->dtype == DType::bf16;
  const std::string got = std::string("x=") + dtype_name(x.dtype) + " w=" + dtype_name(w.dtype) +
                          " bias=" + (bias ? dtype_name(bias->dtype) : "none") + " out=" + dtype_name(out.dtype);
  constexpr const char* kSupported = "x/w bf16/bf16, f32/f32 or f32/bf16; bias none, f32 or bf16; out bf16 or f32";
  if (!out_ok || !bias_ok) return unsupported_dtypes("gemm", got, kSupported);

  GemmArgs a{&x, &w, bias, &out, M, N, K};
  if (M == 0 || N == 0) return Status();
  if (x.dtype == DType::bf16 && w.dtype == DType::bf16) gemm_parallel<uint16_t, uint16_t>(a);
  else if (x.dtype == DType::f32 && w.dtype == DType::f32) gemm_parallel<float, float>(a);
  else if (x.dtype == DType::f32 && w.dtype == DType::bf16) gemm_parallel<float, uint16_t>(a);
  else return unsupported_dtypes("gemm", got, kSupported);
  return Status();
}

}  // namespace ls::cpu
