// CPU quantised linears: Backend::linear for int8_convrot ("LS-int8") and fp8_e4m3
// (backend.h; docs/numerics.md "Quantised linears"; comfyui-and-quantized-weights.md §2.6, §3.1).
//
// int8_convrot, per row r of x (the element arithmetic is linear_quant_math.h, shared with CUDA):
//   a      = x[r]  (or with swiglu_input a[k] = lq_swiglu(g[k], u[k]), g, u the halves of x[r])
//   v      = hadamard_f32 of each group of G values of a (core/hadamard.h), fp32, unrounded
//   sx[r]  = lq_int8_scale(max |v|)            (max ignores NaN)
//   q[k]   = lq_int8_quant(v[k], bf16(sx[r]))
//   acc    = sum_k q[k] * w[n, k] in int32     (exact, so the order is free)
//   out    = bf16(lq_int8_epilogue(acc, sx[r], sw[n]) (+ bias[n]))
// fp8_e4m3, per row r:
//   s_a    = w.input_scale, or lq_fp8_dynamic_scale(max |x[r]|) with w.dynamic_act
//   q[k]   = lq_fp8_quant(x[r, k], s_a)        (e4m3, nearest even, saturating)
//   acc    = dot16 of the decoded values (docs/numerics.md §1: 16 lane sums over k, then the
//            fixed tree); each product of two e4m3 values is exact in fp32, so only the sum
//            order matters, and it depends on K alone
//   out    = bf16(fl32(acc * fl32(s_a * s_w)) (+ bias[n]))
//
// Work and scratch: the rows are processed in tiles of R = clamp(64 KiB / K, 1, 16) rows;
// a tile's quantised rows (R * K bytes) and scales live in a fixed stack buffer, as every
// CPU op keeps its scratch (docs/numerics.md §10), so the CPU backend needs no workspace
// and no call allocates. The FHT runs twice per row (once for the absmax, once to
// quantise), so only 2 * G floats of FHT scratch are needed instead of a K-float row; it is
// O(K log G) next to the O(N K) dot products. Threads split row tiles when there are at
// least 2 per thread, otherwise output columns; in the column split every task quantises
// the (few) rows itself. Nothing in any of that changes a bit: a row's quantisation reads
// only that row, the int32 sums are exact, and the fp8 sums run the dot16 order per output.
#include "backend/cpu/linear_quant.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/linear_quant_math.h"
#include "backend/cpu/simd.h"
#include "core/hadamard.h"
#include "core/thread_pool.h"

namespace ls::cpu {
namespace {

constexpr int64_t kTileBytes = 64 * 1024;  // quantised rows of one tile
constexpr int64_t kMaxTileRows = 16;
constexpr int64_t kColBlockBytes = 192 * 1024;  // weight bytes walked per column block (L2)

int64_t tile_rows(int64_t K) { return std::clamp<int64_t>(kTileBytes / std::max<int64_t>(1, K), 1, kMaxTileRows); }

struct QuantTile {
  alignas(64) uint8_t q[kTileBytes];  // R rows of K bytes: int8 or e4m3 codes
  float sx[kMaxTileRows];             // int8: sx[r]; fp8: s_a[r]
};

struct Args {
  const TensorView* x;
  const LinearWeight* w;
  const TensorView* bias;
  const TensorView* out;
  bool swiglu;
  int64_t M, N, K;
};

inline float bias_at(const TensorView* bias, int64_t n) {
  if (!bias) return 0.0f;
  if (bias->dtype == DType::f32) return static_cast<const float*>(bias->data)[n * bias->stride[0]];
  return lq::bf16_widen(static_cast<const uint16_t*>(bias->data)[n * bias->stride[0]]);
}
inline float scale_at(const TensorView& s, int64_t n) {
  const float* p = static_cast<const float*>(s.data);
  return s.numel() == 1 ? p[0] : p[n];
}

// ---- int8: quantise one row -----------------------------------------------------------
// The input of the FHT for elements [k0, k0 + G) of row xr.
inline void load_group(const uint16_t* xr, bool swiglu, int64_t K, int64_t k0, int64_t G, float* v) {
  if (swiglu) {
    const uint16_t* g = xr + k0;
    const uint16_t* u = xr + K + k0;
    for (int64_t i = 0; i < G; ++i) v[i] = lq::lq_swiglu(lq::bf16_widen(g[i]), lq::bf16_widen(u[i]));
  } else {
    for (int64_t i = 0; i < G; ++i) v[i] = lq::bf16_widen(xr[k0 + i]);
  }
}

void quantise_int8_row(const uint16_t* xr, bool swiglu, int64_t K, int64_t G, int8_t* q, float* sx_out) {
  alignas(32) float buf[2 * kMaxHadamardGroup];
  float* v = buf;
  float* tmp = buf + G;
  float m = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += G) {
    load_group(xr, swiglu, K, k0, G, v);
    hadamard_f32(v, tmp, G);
    for (int64_t i = 0; i < G; ++i) m = lq::max_nan_ignoring(m, lq::abs(v[i]));
  }
  const float sx = lq::lq_int8_scale(m);
  const float d = lq::round_bf16(sx);
  for (int64_t k0 = 0; k0 < K; k0 += G) {
    load_group(xr, swiglu, K, k0, G, v);
    hadamard_f32(v, tmp, G);
    for (int64_t i = 0; i < G; ++i) q[k0 + i] = lq::lq_int8_quant(v[i], d);
  }
  *sx_out = sx;
}

// ---- int8: exact int32 dot products of an RT x CT register tile -------------------------
template <int RT, int CT>
void dot_i8_tile(const int8_t* const* xr, const int8_t* const* wr, int64_t K, int32_t* res) {
  int64_t k = 0;
  int32_t acc[RT][CT] = {};
#if defined(__AVX2__)
  __m256i va[RT][CT];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) va[r][c] = _mm256_setzero_si256();
  for (; k + 16 <= K; k += 16) {
    __m256i wv[CT];
    for (int c = 0; c < CT; ++c)
      wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[c] + k)));
    for (int r = 0; r < RT; ++r) {
      const __m256i xv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr[r] + k)));
      // products <= 2^14 in magnitude, pair sums <= 2^15: exact in int32
      for (int c = 0; c < CT; ++c) va[r][c] = _mm256_add_epi32(va[r][c], _mm256_madd_epi16(xv, wv[c]));
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) {
      alignas(32) int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), va[r][c]);
      for (int l = 0; l < 8; ++l) acc[r][c] += lanes[l];
    }
#endif
  for (; k < K; ++k)
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < CT; ++c) acc[r][c] += static_cast<int32_t>(xr[r][k]) * static_cast<int32_t>(wr[c][k]);
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CT; ++c) res[r * CT + c] = acc[r][c];
}

// ---- fp8: decode and the dot16 order ---------------------------------------------------
struct E4m3Table {
  alignas(64) float v[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) v[i] = lq::lq_e4m3_to_f32(static_cast<uint8_t>(i));
  }
};
const E4m3Table& e4m3_table() {
  static const E4m3Table t;
  return t;
}

// Eight e4m3 codes decoded to fp32 lanes (exact).
inline F8 f8_load_e4m3(const float* lut, const uint8_t* p) {
#if defined(__AVX2__)
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_i32gather_ps(lut, idx, 4)};
#else
  alignas(32) float t[8];
  for (int l = 0; l < 8; ++l) t[l] = lut[p[l]];
  return f8_load(t);
#endif
}

// Rows of e4m3 codes decoded through the table (exact; code 0 decodes to +0, the padding).
struct E4m3Rows {
  const float* lut;
  const uint8_t* const* rows;
  F8 load8(int i, int64_t k) const { return f8_load_e4m3(lut, rows[i] + k); }
  void tail16(int i, int64_t k, int64_t n, float* buf) const {
    for (int64_t l = 0; l < 16; ++l) buf[l] = l < n ? lut[rows[i][k + l]] : 0.0f;
  }
};

// res[r * CT + c] = dot16 over k of dec(xr[r][k]) * dec(wr[c][k]) (simd.h dot16_tile).
template <int RT, int CT>
void dot_f8_tile(const float* lut, const uint8_t* const* xr, const uint8_t* const* wr, int64_t K, float* res) {
  dot16_tile<RT, CT>(E4m3Rows{lut, xr}, E4m3Rows{lut, wr}, K, res);
}

void quantise_fp8_row(const uint16_t* xr, int64_t K, float input_scale, bool dynamic, uint8_t* q, float* sa_out) {
  float sa = input_scale;
  if (dynamic) {
    float m = 0.0f;
    for (int64_t k = 0; k < K; ++k) m = lq::max_nan_ignoring(m, lq::abs(lq::bf16_widen(xr[k])));
    sa = lq::lq_fp8_dynamic_scale(m);
  }
  for (int64_t k = 0; k < K; ++k) q[k] = lq::lq_fp8_quant(lq::bf16_widen(xr[k]), sa);
  *sa_out = sa;
}

// ---- the tiles --------------------------------------------------------------------------
constexpr int kRT = 2;  // register tile rows (int8 and fp8)
constexpr int kCT = 4;  // int8 register tile columns
constexpr int kCTf = 3;  // fp8 register tile columns (two F8 accumulators each)

template <int RT, int CT, typename Fn>
void dispatch_tile(int rt, int ct, Fn&& fn) {
  // fn.template operator()<R, C>() for the runtime tile size (rt <= RT, ct <= CT).
  static_assert(RT == 2 && CT <= 4, "extend the switch");
  auto cols = [&]<int R>() {
    switch (ct) {
      case 1: fn.template operator()<R, 1>(); return;
      case 2: fn.template operator()<R, 2>(); return;
      case 3: fn.template operator()<R, 3>(); return;
      default:
        if constexpr (CT >= 4) fn.template operator()<R, 4>();
        return;
    }
  };
  if (rt == 1) cols.template operator()<1>();
  else cols.template operator()<2>();
}

// Quantises rows [m0, m1) (at most tile_rows(K)) of x into t.
void quantise_tile(const Args& a, int64_t m0, int64_t m1, QuantTile& t) {
  const LinearWeight& w = *a.w;
  for (int64_t m = m0; m < m1; ++m) {
    const uint16_t* xr = row_ptr<const uint16_t>(*a.x, m);
    uint8_t* q = t.q + (m - m0) * a.K;
    if (w.format == WeightFormat::int8_convrot)
      quantise_int8_row(xr, a.swiglu, a.K, w.group, reinterpret_cast<int8_t*>(q), &t.sx[m - m0]);
    else
      quantise_fp8_row(xr, a.K, w.input_scale, w.dynamic_act, q, &t.sx[m - m0]);
  }
}

// out[m0:m1, n0:n1] from a quantised tile of rows [m0, m1).
void compute_tile(const Args& a, const QuantTile& t, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const LinearWeight& w = *a.w;
  const bool i8 = w.format == WeightFormat::int8_convrot;
  const int ct_max = i8 ? kCT : kCTf;
  const int64_t col_block = std::max<int64_t>(ct_max, kColBlockBytes / std::max<int64_t>(1, a.K) / ct_max * ct_max);
  const float* lut = e4m3_table().v;
  const float sw_tensor = i8 ? 0.0f : scale_at(w.scale, 0);
  for (int64_t nb = n0; nb < n1; nb += col_block) {
    const int64_t nb_end = std::min(n1, nb + col_block);
    for (int64_t m = m0; m < m1; m += kRT) {
      const int rt = static_cast<int>(std::min<int64_t>(kRT, m1 - m));
      const uint8_t* xr[kRT];
      for (int r = 0; r < rt; ++r) xr[r] = t.q + (m + r - m0) * a.K;
      for (int64_t n = nb; n < nb_end; n += ct_max) {
        const int ct = static_cast<int>(std::min<int64_t>(ct_max, nb_end - n));
        const uint8_t* wr[kCT];
        for (int c = 0; c < ct; ++c) wr[c] = row_ptr<const uint8_t>(w.w, n + c);
        if (i8) {
          int32_t res[kRT * kCT];
          const int8_t* xi[kRT];
          const int8_t* wi[kCT];
          for (int r = 0; r < rt; ++r) xi[r] = reinterpret_cast<const int8_t*>(xr[r]);
          for (int c = 0; c < ct; ++c) wi[c] = reinterpret_cast<const int8_t*>(wr[c]);
          dispatch_tile<kRT, kCT>(rt, ct, [&]<int R, int C>() { dot_i8_tile<R, C>(xi, wi, a.K, res); });
          for (int r = 0; r < rt; ++r) {
            const float sx = t.sx[m + r - m0];
            uint16_t* o = row_ptr<uint16_t>(*a.out, m + r);
            for (int c = 0; c < ct; ++c) {
              float y = lq::lq_int8_epilogue(res[r * ct + c], sx, scale_at(w.scale, n + c));
              if (a.bias) y = lq::add(y, bias_at(a.bias, n + c));
              o[n + c] = lq::bf16_bits(y);
            }
          }
        } else {
          float res[kRT * kCTf];
          dispatch_tile<kRT, kCTf>(rt, ct, [&]<int R, int C>() { dot_f8_tile<R, C>(lut, xr, wr, a.K, res); });
          for (int r = 0; r < rt; ++r) {
            const float s = lq::mul(t.sx[m + r - m0], sw_tensor);  // fl32(s_a * s_w)
            uint16_t* o = row_ptr<uint16_t>(*a.out, m + r);
            for (int c = 0; c < ct; ++c) {
              float y = lq::mul(res[r * ct + c], s);
              if (a.bias) y = lq::add(y, bias_at(a.bias, n + c));
              o[n + c] = lq::bf16_bits(y);
            }
          }
        }
      }
    }
  }
}

void run(const Args& a) {
  const int64_t R = tile_rows(a.K);
  const int64_t row_tiles = (a.M + R - 1) / R;
  const int64_t threads = num_threads();
  if (row_tiles >= 2 * threads) {
    // grain: about 2^20 multiply-adds per chunk, so small problems are not split into noise
    const int64_t per_tile = std::max<int64_t>(1, R * a.N * a.K);
    parallel_for(row_tiles, std::max<int64_t>(1, (int64_t{1} << 20) / per_tile), [&](int64_t b, int64_t e) {
      QuantTile t;
      for (int64_t i = b; i < e; ++i) {
        const int64_t m0 = i * R, m1 = std::min(a.M, m0 + R);
        quantise_tile(a, m0, m1, t);
        compute_tile(a, t, m0, m1, 0, a.N);
      }
    });
  } else {
    // Few rows: split the output columns; every task quantises the rows itself (the same
    // bits every time), at least 64 columns per task.
    parallel_for(a.N, 64, [&](int64_t n0, int64_t n1) {
      QuantTile t;
      for (int64_t m0 = 0; m0 < a.M; m0 += R) {
        const int64_t m1 = std::min(a.M, m0 + R);
        quantise_tile(a, m0, m1, t);
        compute_tile(a, t, m0, m1, n0, n1);
      }
    });
  }
}

}  // namespace

Status cpu_op_linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                     const LinearOptions& opts) {
  if (w.format == WeightFormat::bf16) {
    if (opts.swiglu_input)
      return make_error(ErrorCode::unsupported,
                        "cpu linear: a fused swiglu input is implemented for int8_convrot only; for bf16 weights run "
                        "swiglu first");
    return cpu_op_gemm(x, w.w, bias, out);
  }
  LS_TRY(require_host("linear", {&x, &w.w, &w.scale, bias, &out}));
  int64_t K = 0;
  LS_TRY(check_linear_quant_args("cpu", x, w, bias, out, opts, &K));
  Args a{&x, &w, bias, &out, opts.swiglu_input, x.size(0), w.w.size(0), K};
  if (a.M == 0 || a.N == 0) return Status();
  run(a);
  return Status();
}

}  // namespace ls::cpu
