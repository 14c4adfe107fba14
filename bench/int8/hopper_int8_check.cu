// Standalone check and benchmark of the Hopper INT8 attention kernel (issue 26,
// src/backend/cuda/attention_hopper_int8.cu), until the backend's INT8 dispatch and the CPU
// reference of record (helper int8) land. Built by bench/int8/build.sh (nvcc, sm_90a).
//
//   hopper_int8_check check             small cases: kernel vs this file's host restatement
//                                       of the arithmetic, error vs float64, memcmp
//                                       invariance (query slices, streamed chunks,
//                                       configurations, kv_tile); exit 1 on a failure
//   hopper_int8_check bench S H [reps]  S queries = S keys, H heads x 128: the INT8 kernel
//                                       (every configuration) and the bf16 Hopper kernel
//                                       side by side, TOP/s on 4 S^2 H 128, plus sampled
//                                       rows against the host restatement and float64
// Output: human lines and one JSON object per measurement ("json: {...}").
//
// The host restatement uses exp2f where the kernel uses ex2.approx.ftz, so the two may
// differ where a p lands within an ulp of a rounding boundary of p * 255: the check bounds
// that (max |diff| relative to the row's max |out|), it does not expect equal bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/attention_hopper_int8.cuh"
// The contract's element arithmetic (helper int8's header): with it, configuration 7 is
// checked for equal bytes against the contract's fold restated below.
#if __has_include("backend/int8_attention_math.h")
#include "backend/int8_attention_math.h"
#define HOPPER8_HAVE_I8A 1
#endif

#ifdef HOPPER8_WITH_BF16
#include "backend/cuda/attention_hopper.cuh"
#include "backend/cuda/cuda_common.cuh"
#endif

using ls::cuda::Int8AttentionCall;

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

constexpr int D = 128;

float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The rotation of the spec, in the kernel's op order: signs, then butterflies (a, b) ->
// (a + b, a - b) at strides 1, 2, ..., 64.
void rotate(float* x) {
  for (int c = 0; c < D; ++c)
    if (ls::cuda::int8_negative_sign(c)) x[c] = -x[c];
  for (int s = 1; s < D; s <<= 1)
    for (int i = 0; i < D; ++i)
      if ((i & s) == 0) {
        const float a = x[i], b = x[i + s];
        x[i] = a + b;
        x[i + s] = a - b;
      }
}
float quant_row(const float* x, int8_t* x8) {
  float amax = 0.0f;
  for (int c = 0; c < D; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float s = std::max(amax * (1.0f / 127.0f), 1e-30f);
  for (int c = 0; c < D; ++c) {
    const float r = std::rint(x[c] / s);
    x8[c] = static_cast<int8_t>(std::min(std::max(r, -127.0f), 127.0f));
  }
  return s;
}

struct Problem {
  int64_t Mq = 0, Mk = 0, H = 0, pitch = 0;
  std::vector<uint16_t> q, k, v;  // bf16 [M, H, 128]
  std::vector<int8_t> q8, k8, v8t, v8p;  // v8p: V^T with keys permuted in groups of 16
  std::vector<float> sq, sk, sv;
};

// A counter-based approximate normal(0, 1) (Irwin-Hall of four 16-bit uniforms): fast and
// the same for any thread count.
float approx_normal(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>((z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48));
  return (u / 65536.0f - 2.0f) * 1.7320508f;
}

// bf16 inputs: normal(0, 1) with four outlier channels in K (x 4, + 6), as issue 26's
// measurement describes ("four outlier channels in K").
void make_inputs(Problem& P, uint64_t seed) {
  P.q.resize(P.Mq * P.H * D);
  P.k.resize(P.Mk * P.H * D);
  P.v.resize(P.Mk * P.H * D);
  const int64_t nq = static_cast<int64_t>(P.q.size()), nk = static_cast<int64_t>(P.k.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nq; ++i) P.q[i] = f2bf(approx_normal(seed, i));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nk; ++i) {
    const int c = static_cast<int>(i % D);
    float x = approx_normal(seed + 1, i);
    if (c == 3 || c == 17 || c == 64 || c == 100) x = 4.0f * x + 6.0f;
    P.k[i] = f2bf(x);
    P.v[i] = f2bf(approx_normal(seed + 2, i));
  }
}

// The spec's preparation of K and V (all keys) and the kernel's Q quantisation, on the host.
void prepare(Problem& P) {
  const int64_t H = P.H, Mk = P.Mk, Mq = P.Mq;
  P.pitch = (Mk + 15) / 16 * 16;
  P.k8.assign(Mk * H * D, 0);
  P.sk.assign(Mk * H, 0.0f);
  P.v8t.assign(H * D * P.pitch, 0);
  P.sv.assign(H * D, 0.0f);
  P.q8.assign(Mq * H * D, 0);
  P.sq.assign(Mq * H, 0.0f);
#pragma omp parallel for schedule(dynamic)
  for (int64_t h = 0; h < H; ++h) {
    float kmax[D], kmin[D], vabs[D], mu[D];
    for (int c = 0; c < D; ++c) {
      kmax[c] = -INFINITY;
      kmin[c] = INFINITY;
      vabs[c] = 0.0f;
    }
    for (int64_t j = 0; j < Mk; ++j)
      for (int c = 0; c < D; ++c) {
        const float x = bf2f(P.k[(j * H + h) * D + c]);
        kmax[c] = std::max(kmax[c], x);
        kmin[c] = std::min(kmin[c], x);
        vabs[c] = std::max(vabs[c], std::fabs(bf2f(P.v[(j * H + h) * D + c])));
      }
    for (int c = 0; c < D; ++c) {
      const float sum = kmax[c] + kmin[c];
      mu[c] = 0.5f * sum;
      P.sv[h * D + c] = std::max(vabs[c] * (1.0f / 127.0f), 1e-30f);
    }
    float x[D];
    for (int64_t j = 0; j < Mk; ++j) {
      for (int c = 0; c < D; ++c) x[c] = bf2f(P.k[(j * H + h) * D + c]) - mu[c];
      rotate(x);
      P.sk[j * H + h] = quant_row(x, &P.k8[(j * H + h) * D]);
      for (int c = 0; c < D; ++c) {
        const float r = std::rint(bf2f(P.v[(j * H + h) * D + c]) / P.sv[h * D + c]);
        P.v8t[(h * D + c) * P.pitch + j] = static_cast<int8_t>(std::min(std::max(r, -127.0f), 127.0f));
      }
    }
    for (int64_t i = 0; i < Mq; ++i) {
      for (int c = 0; c < D; ++c) x[c] = bf2f(P.q[(i * H + h) * D + c]);
      rotate(x);
      P.sq[i * H + h] = quant_row(x, &P.q8[(i * H + h) * D]);
    }
  }
  P.v8p.assign(P.v8t.size(), 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < H * D; ++r)
    for (int64_t j = 0; j < P.pitch; ++j) {
      const int64_t key = j / 16 * 16 + ls::cuda::int8_v8t_key_at(static_cast<int>(j % 16));
      P.v8p[r * P.pitch + j] = key < Mk ? P.v8t[r * P.pitch + key] : 0;
    }
}

// The kernel's arithmetic for one (query, head), exp2f for ex2.approx (file comment).
void ref_int8_row(const Problem& P, int64_t i, int64_t h, int64_t kv_tile, bool lazy, float scale, float* out) {
  const int64_t H = P.H, Mk = P.Mk;
  const float kc = (scale * 1.4426950408889634f) * (1.0f / 128.0f);
  const float c = P.sq[i * H + h] * kc;
  float m = -INFINITY, F[D] = {}, Fl = 0.0f;
  int64_t I[D] = {}, Il = 0;
  const int8_t* q8 = &P.q8[(i * H + h) * D];
  const int64_t kv = std::min(kv_tile, Mk);
  int64_t tile_start = 0;
  std::vector<float> t(128);
  for (int64_t b = 0; b < Mk;) {
    if (b - tile_start >= kv) tile_start += kv;
    const int64_t e = std::min({b + 128, tile_start + kv, Mk});
    float mx = -INFINITY;
    for (int64_t j = b; j < e; ++j) {
      const int8_t* k8 = &P.k8[(j * H + h) * D];
      int32_t d = 0;
      for (int cc = 0; cc < D; ++cc) d += static_cast<int32_t>(q8[cc]) * k8[cc];
      t[j - b] = static_cast<float>(d) * P.sk[j * H + h];
      mx = std::max(mx, t[j - b]);
    }
    const float m_new = std::max(m, mx * c);
    const float alpha = m == -INFINITY ? 0.0f : std::exp2(m - m_new);
    const bool forced = (b - tile_start) % (128 * 256) == 0;
    if (!lazy || forced || alpha != 1.0f) {
      for (int cc = 0; cc < D; ++cc) {
        F[cc] = (F[cc] + static_cast<float>(I[cc])) * alpha;
        I[cc] = 0;
      }
      Fl = (Fl + static_cast<float>(Il)) * alpha;
      Il = 0;
    }
    m = m_new;
    for (int64_t j = b; j < e; ++j) {
      const float p = std::exp2(std::fma(t[j - b], c, -m_new));
      const int p8 = static_cast<int>(fbits(std::fma(p, 255.0f, 12582912.0f)) & 0xFFu);
      Il += p8;
      for (int cc = 0; cc < D; ++cc) I[cc] += p8 * static_cast<int32_t>(P.v8t[(h * D + cc) * P.pitch + j]);
    }
    b = e;
  }
  const float L = Fl + static_cast<float>(Il);
  for (int cc = 0; cc < D; ++cc) {
    const float A = F[cc] + static_cast<float>(I[cc]);
    out[cc] = (A * P.sv[h * D + cc]) / L;
  }
}

#ifdef HOPPER8_HAVE_I8A
// docs/int8-attention.md §4 (kv_tile 128), with i8a's exp2: configuration 7 must equal it.
void ref_contract_row(const Problem& P, int64_t i, int64_t h, float scale, uint16_t* out) {
  const int64_t H = P.H, Mk = P.Mk;
  const float cs = (scale * 1.4426950408889634f) * (1.0f / 128.0f);
  const float a = P.sq[i * H + h] * cs;
  float m = -INFINITY, acc[D] = {}, l = 0.0f;
  const int8_t* q8 = &P.q8[(i * H + h) * D];
  std::vector<float> sj(128);
  for (int64_t b = 0; b < Mk; b += 128) {
    const int64_t e = std::min(b + 128, Mk);
    float mx = -INFINITY;
    for (int64_t j = b; j < e; ++j) {
      const int8_t* k8 = &P.k8[(j * H + h) * D];
      int32_t d = 0;
      for (int c = 0; c < D; ++c) d += static_cast<int32_t>(q8[c]) * k8[c];
      sj[j - b] = (a * P.sk[j * H + h]) * static_cast<float>(d);
      mx = std::max(mx, sj[j - b]);
    }
    const float m_new = std::max(m, mx);
    const float alpha = m == -INFINITY ? 0.0f : ls::i8a::exp2e(m - m_new);
    int32_t lt = 0, ot[D] = {};
    for (int64_t j = b; j < e; ++j) {
      const int p8 = ls::i8a::p8(sj[j - b] - m_new);
      lt += p8;
      for (int c = 0; c < D; ++c) ot[c] += p8 * static_cast<int32_t>(P.v8t[(h * D + c) * P.pitch + j]);
    }
    l = l * alpha + static_cast<float>(lt);
    for (int c = 0; c < D; ++c) acc[c] = acc[c] * alpha + static_cast<float>(ot[c]);
    m = m_new;
  }
  for (int c = 0; c < D; ++c) out[c] = f2bf((acc[c] * P.sv[h * D + c]) / l);
}
#endif

// Exact attention (float64) on the bf16 inputs.
void ref_f64_row(const Problem& P, int64_t i, int64_t h, double scale, double* out) {
  const int64_t H = P.H;
  std::vector<double> s(P.Mk);
  double mx = -INFINITY;
  for (int64_t j = 0; j < P.Mk; ++j) {
    double d = 0;
    for (int c = 0; c < D; ++c) d += static_cast<double>(bf2f(P.q[(i * H + h) * D + c])) * bf2f(P.k[(j * H + h) * D + c]);
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  double l = 0;
  for (int c = 0; c < D; ++c) out[c] = 0;
  for (int64_t j = 0; j < P.Mk; ++j) {
    const double p = std::exp(s[j] - mx);
    l += p;
    for (int c = 0; c < D; ++c) out[c] += p * bf2f(P.v[(j * H + h) * D + c]);
  }
  for (int c = 0; c < D; ++c) out[c] /= l;
}

struct Dev {
  uint16_t *q = nullptr, *out = nullptr;
  int8_t *k8 = nullptr, *v8t = nullptr, *v8p = nullptr;
  float *sk = nullptr, *sv = nullptr, *state = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

Dev upload(const Problem& P) {
  Dev d;
  CK(cudaMalloc(&d.q, P.q.size() * 2));
  CK(cudaMalloc(&d.out, P.q.size() * 2));
  CK(cudaMalloc(&d.k8, P.k8.size()));
  CK(cudaMalloc(&d.v8t, P.v8t.size()));
  CK(cudaMalloc(&d.v8p, P.v8p.size()));
  CK(cudaMemcpy(d.v8p, P.v8p.data(), P.v8p.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d.sk, P.sk.size() * 4));
  CK(cudaMalloc(&d.sv, P.sv.size() * 4));
  CK(cudaMalloc(&d.state, static_cast<size_t>(P.Mq * P.H * (D + 8)) * 4));
  d.scratch_bytes = ls::cuda::attention_hopper_int8_scratch_bytes(P.Mq, P.Mk, P.H);
  CK(cudaMalloc(&d.scratch, d.scratch_bytes));
  CK(cudaMemcpy(d.q, P.q.data(), P.q.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.k8, P.k8.data(), P.k8.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.v8t, P.v8t.data(), P.v8t.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sk, P.sk.data(), P.sk.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sv, P.sv.data(), P.sv.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// One call over queries [q0, q1) and keys [k0, k1) (a chunk), into out rows [q0, q1).
Int8AttentionCall make_call(const Problem& P, const Dev& d, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                            int64_t kv_tile, bool perm = false) {
  Int8AttentionCall c;
  c.q = d.q + q0 * P.H * D;
  c.q_row_stride = P.H * D;
  c.q_head_stride = D;
  c.k8 = d.k8 + k0 * P.H * D;
  c.k8_row_stride = P.H * D;
  c.sk = d.sk + k0 * P.H;
  c.v8t = (perm ? d.v8p : d.v8t) + k0;
  c.v8t_keys_permuted = perm;
  c.v8t_key_pitch = P.pitch;
  c.sv = d.sv;
  c.out = d.out + q0 * P.H * D;
  c.out_row_stride = P.H * D;
  c.out_head_stride = D;
  c.Mq = q1 - q0;
  c.Mk = k1 - k0;
  c.H = P.H;
  c.kv_tile = kv_tile;
  c.state = d.state + q0 * P.H * (D + 8);
  c.scratch = d.scratch;
  c.scratch_bytes = d.scratch_bytes;
  return c;
}

void run_or_die(const Int8AttentionCall& c, int config) {
  const std::string e = ls::cuda::attention_hopper_int8(c, nullptr, config);
  if (!e.empty()) {
    std::fprintf(stderr, "attention_hopper_int8: %s\n", e.c_str());
    std::exit(2);
  }
}

std::vector<uint16_t> download(const Problem& P, const Dev& d) {
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> o(P.q.size());
  CK(cudaMemcpy(o.data(), d.out, o.size() * 2, cudaMemcpyDeviceToHost));
  return o;
}

int g_failures = 0;
void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

struct Err {
  double max_abs = 0, sum_sq = 0, ref_sq = 0;
  void add(double x, double r) {
    max_abs = std::max(max_abs, std::fabs(x - r));
    sum_sq += (x - r) * (x - r);
    ref_sq += r * r;
  }
  double rel_l2() const { return std::sqrt(sum_sq / std::max(ref_sq, 1e-300)); }
};

// Compares rows (sampled or all) of a GPU output with the host restatement and float64.
void compare(const Problem& P, const std::vector<uint16_t>& out, int64_t kv_tile, bool lazy, int64_t row_step,
             const std::string& name, bool check) {
  const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
  Err vs_host, gpu_f64, host_f64;
  double worst_rel = 0;
  int64_t differ = 0, total = 0;
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int64_t i = 0; i < P.Mq; i += row_step)
    for (int64_t h = 0; h < P.H; ++h) rows.push_back({i, h});
  const int64_t nr = static_cast<int64_t>(rows.size());
  std::vector<float> R(nr * D);
  std::vector<double> FF(nr * D);
#pragma omp parallel for schedule(dynamic)
  for (int64_t n = 0; n < nr; ++n) {
    ref_int8_row(P, rows[n].first, rows[n].second, kv_tile, lazy, scale, &R[n * D]);
    ref_f64_row(P, rows[n].first, rows[n].second, scale, &FF[n * D]);
  }
  for (int64_t n = 0; n < nr; ++n) {
    {
      const int64_t i = rows[n].first, h = rows[n].second;
      const float* r = &R[n * D];
      const double* f = &FF[n * D];
      double rowmax = 0;
      for (int c = 0; c < D; ++c) rowmax = std::max(rowmax, std::fabs(static_cast<double>(r[c])));
      for (int c = 0; c < D; ++c) {
        const float g = bf2f(out[(i * P.H + h) * D + c]);
        const float hb = bf2f(f2bf(r[c]));
        vs_host.add(g, hb);
        gpu_f64.add(g, f[c]);
        host_f64.add(hb, f[c]);
        worst_rel = std::max(worst_rel, std::fabs(static_cast<double>(g) - hb) / std::max(rowmax, 1e-30));
        differ += fbits(g) != fbits(hb);
        ++total;
      }
    }
  }
  std::printf("%s: vs host restatement: %lld of %lld values differ, max |diff| %.3g (%.3g of the row's max), "
              "rel L2 %.3g; vs float64: gpu rel L2 %.4g max %.4g, host rel L2 %.4g max %.4g\n",
              name.c_str(), static_cast<long long>(differ), static_cast<long long>(total), vs_host.max_abs, worst_rel,
              vs_host.rel_l2(), gpu_f64.rel_l2(), gpu_f64.max_abs, host_f64.rel_l2(), host_f64.max_abs);
  std::printf("json: {\"case\": \"%s\", \"values\": %lld, \"differ_from_host\": %lld, \"max_rel_diff_host\": %.4g, "
              "\"gpu_rel_l2_f64\": %.5g, \"gpu_max_abs_f64\": %.5g, \"host_rel_l2_f64\": %.5g, \"host_max_abs_f64\": %.5g}\n",
              name.c_str(), static_cast<long long>(total), static_cast<long long>(differ), worst_rel, gpu_f64.rel_l2(),
              gpu_f64.max_abs, host_f64.rel_l2(), host_f64.max_abs);
  if (check) {
    // exp2f vs ex2.approx moves a p8 by one now and then: a few 1e-3 of the row's scale.
    expect(worst_rel < 2e-2, name + ": within 2e-2 of the row's max of the host restatement");
    expect(gpu_f64.rel_l2() < 1.5 * host_f64.rel_l2() + 1e-4, name + ": error vs float64 as the host restatement's");
  }
}

int check() {
  struct Case {
    int64_t Mq, Mk, H, kv_tile;
  };
  const Case cases[] = {{300, 1000, 3, 256}, {257, 2048, 2, 8192}, {130, 777, 2, 112}};
  for (const Case& cs : cases) {
    Problem P;
    P.Mq = cs.Mq;
    P.Mk = cs.Mk;
    P.H = cs.H;
    make_inputs(P, 1234 + cs.Mq);
    prepare(P);
    Dev d = upload(P);
    const std::string tag = "Mq" + std::to_string(cs.Mq) + "_Mk" + std::to_string(cs.Mk) + "_H" +
                            std::to_string(cs.H) + "_kv" + std::to_string(cs.kv_tile);
    // Configurations 0, 1, 3 (2 is 0 with 3 stages: timed at full size and checked there),
    // both V^T layouts: {0, 1, 3} one family (lazy), 4 another (per-block); the layout
    // moves no bit (integer sums are exact in any order).
    const int cfgs[] = {0, 1, 3, 4};
    constexpr int kNC = 4;
    std::vector<std::vector<uint16_t>> outs;  // [config index][layout]
    for (int perm = 0; perm < 2; ++perm)
      for (int cfg : cfgs) {
        CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
        run_or_die(make_call(P, d, 0, P.Mq, 0, P.Mk, cs.kv_tile, perm != 0), cfg);
        outs.push_back(download(P, d));
      }
    compare(P, outs[0], cs.kv_tile, true, 1, tag + "_lazy", true);
    compare(P, outs[3], cs.kv_tile, false, 1, tag + "_perblock", true);
    for (int n = 0; n < 2 * kNC; ++n) {
      const int ref = cfgs[n % kNC] == 4 ? 3 : 0;
      if (n != ref)
        expect(outs[n] == outs[ref], tag + ": configuration " + std::to_string(cfgs[n % kNC]) +
                                         (n >= kNC ? " permuted V" : "") + " = configuration " +
                                         std::to_string(cfgs[ref]) + " (memcmp)");
    }
    const std::vector<uint16_t> out_lazy = outs[0], out_pb = outs[3];
    // Query slices at odd points: the same bytes.
    for (int cfg : {0, 4})
      for (int perm = 0; perm < 2; ++perm) {
        CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
        const int64_t cut[] = {0, 77, std::min<int64_t>(P.Mq, 203), P.Mq};
        for (int s = 0; s < 3; ++s)
          if (cut[s + 1] > cut[s]) run_or_die(make_call(P, d, cut[s], cut[s + 1], 0, P.Mk, cs.kv_tile, perm != 0), cfg);
        expect(download(P, d) == (cfg == 0 ? out_lazy : out_pb),
               tag + ": query slices 0/77/203 = one call (memcmp), configuration " + std::to_string(cfg) +
                   (perm ? " permuted V" : ""));
      }
    // Streamed keys: chunks of whole kv_tiles (where the tile is a multiple of 16 keys).
    if (cs.kv_tile < P.Mk) {
      for (int cfg : {0, 4})
        for (int perm = 0; perm < 2; ++perm) {
          CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
          int64_t k0 = 0;
          while (k0 < P.Mk) {
            const int64_t k1 = std::min(P.Mk, k0 + cs.kv_tile * (k0 == 0 ? 1 : 2));
            Int8AttentionCall c = make_call(P, d, 0, P.Mq, k0, k1, cs.kv_tile, perm != 0);
            c.state_in = k0 > 0;
            c.finalize = k1 == P.Mk;
            run_or_die(c, cfg);
            k0 = k1;
          }
          expect(download(P, d) == (cfg == 0 ? out_lazy : out_pb),
                 tag + ": streamed chunks = one call (memcmp), configuration " + std::to_string(cfg) +
                     (perm ? " permuted V" : ""));
        }
    }
#ifdef HOPPER8_HAVE_I8A
    // Configuration 7 (the contract's arithmetic, kv_tile 128): the same bytes as the
    // contract restated on the host, for both V^T layouts, query slices and streamed chunks.
    {
      std::vector<uint16_t> ref(P.q.size());
      const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
#pragma omp parallel for schedule(dynamic)
      for (int64_t n = 0; n < P.Mq * P.H; ++n) ref_contract_row(P, n / P.H, n % P.H, scale, &ref[n * D]);
      for (int perm = 0; perm < 2; ++perm) {
        CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
        run_or_die(make_call(P, d, 0, P.Mq, 0, P.Mk, 128, perm != 0), 7);
        const std::vector<uint16_t> o = download(P, d);
        int64_t differ = 0;
        for (size_t n = 0; n < o.size(); ++n) differ += o[n] != ref[n];
        std::printf("%s contract: %lld of %zu values differ from the host restatement\n", tag.c_str(),
                    static_cast<long long>(differ), o.size());
        expect(differ == 0, tag + ": configuration 7" + (perm ? " permuted V" : "") +
                                " = the contract on the host (bytes)");
        CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
        const int64_t cut[] = {0, 77, std::min<int64_t>(P.Mq, 203), P.Mq};
        for (int sl = 0; sl < 3; ++sl)
          if (cut[sl + 1] > cut[sl]) run_or_die(make_call(P, d, cut[sl], cut[sl + 1], 0, P.Mk, 128, perm != 0), 7);
        expect(download(P, d) == o, tag + ": configuration 7 query slices = one call (memcmp)");
        CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
        for (int64_t k0 = 0; k0 < P.Mk;) {
          const int64_t k1 = std::min(P.Mk, k0 + 256);
          Int8AttentionCall c = make_call(P, d, 0, P.Mq, k0, k1, 128, perm != 0);
          c.state_in = k0 > 0;
          c.finalize = k1 == P.Mk;
          run_or_die(c, 7);
          k0 = k1;
        }
        expect(download(P, d) == o, tag + ": configuration 7 streamed chunks of 256 keys = one call (memcmp)");
      }
    }
#endif
    // kv_tile: per-block flushing is the same for every multiple of 128; lazy flushing
    // also flushes at tile starts (other bits, still within the bound).
    if (cs.kv_tile % 128 == 0) {
      CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
      run_or_die(make_call(P, d, 0, P.Mq, 0, P.Mk, 128), 4);
      expect(download(P, d) == out_pb, tag + ": per-block, kv_tile 128 = kv_tile " + std::to_string(cs.kv_tile) + " (memcmp)");
      CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
      run_or_die(make_call(P, d, 0, P.Mq, 0, P.Mk, 128), 0);
      const bool same = download(P, d) == out_lazy;
      std::printf("info %s: lazy, kv_tile 128 %s kv_tile %lld\n", tag.c_str(), same ? "=" : "!=",
                  static_cast<long long>(cs.kv_tile));
    }
    CK(cudaFree(d.q));
    CK(cudaFree(d.out));
    CK(cudaFree(d.k8));
    CK(cudaFree(d.v8t));
    CK(cudaFree(d.v8p));
    CK(cudaFree(d.sk));
    CK(cudaFree(d.sv));
    CK(cudaFree(d.state));
    CK(cudaFree(d.scratch));
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  return g_failures ? 1 : 0;
}

int bench(int64_t S, int64_t H, int reps) {
  Problem P;
  P.Mq = P.Mk = S;
  P.H = H;
  std::printf("preparing S=%lld H=%lld on the host...\n", static_cast<long long>(S), static_cast<long long>(H));
  std::fflush(stdout);
  make_inputs(P, 42);
  prepare(P);
  Dev d = upload(P);
  const double ops = 4.0 * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(H) * D;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int64_t kv_tile = 8192;
  std::vector<uint16_t> out0, out_cfg0;
  #ifdef HOPPER8_HAVE_I8A
  const int bench_cfgs[][2] = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {2, 0}, {4, 1}, {7, 1}, {10, 1}};
#else
  const int bench_cfgs[][2] = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {2, 0}, {4, 1}, {10, 1}};
#endif  // {config, permuted V}
  for (const auto& bc : bench_cfgs) {
    const int cfg = bc[0];
    const bool perm = bc[1] != 0;
    const Int8AttentionCall c = make_call(P, d, 0, S, 0, S, cfg == 7 ? 128 : kv_tile, perm);
    run_or_die(c, cfg);  // warm-up
    CK(cudaDeviceSynchronize());
    float best = 1e30f, sum = 0;
    for (int r = 0; r < reps; ++r) {
      CK(cudaEventRecord(e0));
      run_or_die(c, cfg);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
      sum += ms;
    }
    std::printf("int8 config %d%s: best %.2f ms mean %.2f ms -> %.0f TOP/s (best), %.0f (mean)\n", cfg, perm ? " permuted V" : "", best, sum / reps,
                ops / (best * 1e-3) / 1e12, ops / (sum / reps * 1e-3) / 1e12);
    std::printf("json: {\"kernel\": \"hopper_int8\", \"config\": %d, \"v8t_keys_permuted\": %s, \"S\": %lld, \"H\": %lld, \"kv_tile\": %lld, "
                "\"reps\": %d, \"best_ms\": %.3f, \"mean_ms\": %.3f, \"tops_best\": %.1f, \"tops_mean\": %.1f}\n",
                cfg, perm ? "true" : "false", static_cast<long long>(S), static_cast<long long>(H),
                static_cast<long long>(kv_tile), reps, best,
                sum / reps, ops / (best * 1e-3) / 1e12, ops / (sum / reps * 1e-3) / 1e12);
    std::fflush(stdout);
    if (perm && cfg == 0) out_cfg0 = download(P, d);
    if (perm && (cfg == 2 || cfg == 4)) {
      const std::vector<uint16_t> o = download(P, d);
      if (cfg == 2) out0 = o;
      compare(P, o, kv_tile, cfg == 2, S / 4, "S" + std::to_string(S) + (cfg == 2 ? "_lazy" : "_perblock") + "_sampled",
              false);
    }
  }
  // Query slices of 16384 (the engine's slicing) give the one call's bytes.
  {
    expect(out0 == out_cfg0, "full size: configuration 2 = configuration 0 (memcmp), permuted V");
    CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
    for (int64_t a = 0; a < S; a += 16384) run_or_die(make_call(P, d, a, std::min(S, a + 16384), 0, S, kv_tile, true), 2);
    expect(download(P, d) == out0, "full size: 16384-query slices = one call (memcmp), configuration 2 permuted V");
    CK(cudaMemset(d.out, 0xFF, P.q.size() * 2));
    int64_t k0 = 0;
    while (k0 < S) {
      const int64_t k1 = std::min(S, k0 + 4 * kv_tile);
      Int8AttentionCall c = make_call(P, d, 0, S, k0, k1, kv_tile, true);
      c.state_in = k0 > 0;
      c.finalize = k1 == S;
      run_or_die(c, 2);
      k0 = k1;
    }
    expect(download(P, d) == out0, "full size: streamed chunks of 4 kv_tiles = one call (memcmp), configuration 2 permuted V");
  }
#ifdef HOPPER8_WITH_BF16
  {
    ls::cuda::CudaContext ctx;
    ctx.device = 0;
    int optin = 0;
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    ctx.max_smem_optin = static_cast<size_t>(optin);
    uint16_t *k = nullptr, *v = nullptr;
    CK(cudaMalloc(&k, P.k.size() * 2));
    CK(cudaMalloc(&v, P.v.size() * 2));
    CK(cudaMemcpy(k, P.k.data(), P.k.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, P.v.data(), P.v.size() * 2, cudaMemcpyHostToDevice));
    ls::TensorView tq(d.q, ls::DType::bf16, {S, H, D}), tk(k, ls::DType::bf16, {S, H, D}),
        tv(v, ls::DType::bf16, {S, H, D}), to(d.out, ls::DType::bf16, {S, H, D});
    ls::AttentionParams ap;
    ap.kv_tile = kv_tile;
    auto st = ls::cuda::attention_hopper(ctx, tq, tk, tv, to, ap);
    if (!st.ok()) {
      std::printf("bf16 hopper: %s\n", st.message().c_str());
    } else {
      CK(cudaDeviceSynchronize());
      float best = 1e30f, sum = 0;
      for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(e0));
        (void)ls::cuda::attention_hopper(ctx, tq, tk, tv, to, ap);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
        sum += ms;
      }
      std::printf("bf16 hopper (schedule %d): best %.2f ms mean %.2f ms -> %.0f TFLOP/s (best), %.0f (mean)\n",
                  ls::cuda::attention_hopper_schedule(), best, sum / reps, ops / (best * 1e-3) / 1e12,
                  ops / (sum / reps * 1e-3) / 1e12);
      std::printf("json: {\"kernel\": \"hopper_bf16\", \"S\": %lld, \"H\": %lld, \"kv_tile\": %lld, \"reps\": %d, "
                  "\"best_ms\": %.3f, \"mean_ms\": %.3f, \"tflops_best\": %.1f, \"tflops_mean\": %.1f}\n",
                  static_cast<long long>(S), static_cast<long long>(H), static_cast<long long>(kv_tile), reps, best,
                  sum / reps, ops / (best * 1e-3) / 1e12, ops / (sum / reps * 1e-3) / 1e12);
      // Error of the bf16 kernel on the same sampled rows, for context.
      const std::vector<uint16_t> o = download(P, d);
      Err e;
      const float scale = static_cast<float>(1.0 / std::sqrt(128.0));
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < S; i += S / 4) rows.push_back(i);
      const int64_t nr = static_cast<int64_t>(rows.size());
      std::vector<double> FF(nr * H * D);
#pragma omp parallel for schedule(dynamic)
      for (int64_t n = 0; n < nr * H; ++n) ref_f64_row(P, rows[n / H], n % H, scale, &FF[n * D]);
      for (int64_t n = 0; n < nr * H; ++n)
        for (int c = 0; c < D; ++c) e.add(bf2f(o[(rows[n / H] * H + n % H) * D + c]), FF[n * D + c]);
      std::printf("json: {\"case\": \"S%lld_bf16_hopper_sampled\", \"gpu_rel_l2_f64\": %.5g, \"gpu_max_abs_f64\": %.5g}\n",
                  static_cast<long long>(S), e.rel_l2(), e.max_abs);
    }
  }
#endif
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return check();
  if (mode == "bench") {
    const int64_t S = argc > 2 ? std::atoll(argv[2]) : 111274;
    const int64_t H = argc > 3 ? std::atoll(argv[3]) : 56;
    const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
    return bench(S, H, reps);
  }
  std::fprintf(stderr, "usage: %s check | bench [S H reps]\n", argv[0]);
  return 2;
}
