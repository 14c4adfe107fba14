// The attention tests' shared parity harness (test_attention_cudnn.cpp,
// test_attention_hopper.cpp, test_backend_ops.cpp): an fp64 reference attention, the
// relative L2 distance from it, one parity run (the GPU path within 2x the CPU
// reference's distance from fp64, DESIGN.md §4), its query-slice check, random q, k, v
// inputs and the streamed-keys chunking.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"

namespace ls::cudatest {

// fp64 reference: softmax(scale q k^T) v with scale = 1 / sqrt(Dh), no roundings.
// q, k, v contiguous [rows, H, Dh]; the result is f64 [Mq, H, Dh].
inline HostBuf attention_f64(const HostBuf& q, const HostBuf& k, const HostBuf& v, int64_t H, int64_t Dh) {
  const int64_t Mq = q.v.shape[0], Mk = k.v.shape[0];
  HostBuf out(DType::f64, {Mq, H, Dh});
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  std::vector<double> s(static_cast<size_t>(Mk)), qd(static_cast<size_t>(Dh)), o(static_cast<size_t>(Dh));
  std::vector<double> kd(static_cast<size_t>(k.n())), vd(static_cast<size_t>(v.n()));
  for (int64_t i = 0; i < k.n(); ++i) kd[static_cast<size_t>(i)] = k.get(i), vd[static_cast<size_t>(i)] = v.get(i);
  for (int64_t i = 0; i < Mq; ++i)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t e = 0; e < Dh; ++e) qd[static_cast<size_t>(e)] = q.get((i * H + h) * Dh + e);
      double mx = -INFINITY;
      for (int64_t j = 0; j < Mk; ++j) {
        double d = 0;
        for (int64_t e = 0; e < Dh; ++e) d += qd[static_cast<size_t>(e)] * kd[static_cast<size_t>((j * H + h) * Dh + e)];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, d * scale);
      }
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < Mk; ++j) {
        const double p = std::exp(s[static_cast<size_t>(j)] - mx);
        l += p;
        for (int64_t e = 0; e < Dh; ++e) o[static_cast<size_t>(e)] += p * vd[static_cast<size_t>((j * H + h) * Dh + e)];
      }
      for (int64_t e = 0; e < Dh; ++e) out.v.ptr<double>()[(i * H + h) * Dh + e] = o[static_cast<size_t>(e)] / l;
    }
  return out;
}

// sqrt(sum (got - ref)^2 / sum ref^2) over all elements (got any dtype, ref64 f64).
inline double rel_l2(const HostBuf& got, const HostBuf& ref64) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < got.n(); ++i) {
    const double r = ref64.v.ptr<const double>()[i], g = got.get(i);
    num += (g - r) * (g - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

struct AttentionCase {
  int64_t Mq, Mk, H, Dh, kv_tile;
  float qscale;  // the queries' scale: larger peaks the softmax
};

// One parity run's device inputs and output (the query-slice check reuses them).
struct AttentionParity {
  DevBuf dq, dkv, dout;
  TensorView dk, dv;  // strided column slices of dkv
  AttentionParams p;
  HostBuf got;
  double e_gpu = 0, e_cpu = 0;  // rel L2 vs fp64 of the device output and of the CPU reference
  bool ran = false;             // the device call ran (false after a fatal failure)
};

// The backend's attention (whatever path G->cuda runs now) on case c vs the CPU reference
// and fp64: q from `seed`, K and V strided column slices of one fused [Mk, 2 W] buffer
// from seed + 1 (as in the block). Checks the guard bytes around the output, NaN/inf
// agreement with the CPU reference, and the error within 2x the CPU reference's; prints
// both errors. `what` names the path in messages.
inline void attention_parity(Gpu* G, const AttentionCase& c, uint32_t seed, const std::string& what,
                             AttentionParity& r) {
  const int64_t W = c.H * c.Dh;
  HostBuf q = random_buf(DType::bf16, {c.Mq, c.H, c.Dh}, seed, c.qscale);
  HostBuf kv = random_buf(DType::bf16, {c.Mk, 2 * W}, seed + 1, 1.0f);
  HostBuf k(DType::bf16, {c.Mk, c.H, c.Dh}), v(DType::bf16, {c.Mk, c.H, c.Dh});
  for (int64_t j = 0; j < c.Mk; ++j) {
    std::memcpy(k.v.at(j), kv.v.at(j, 0), static_cast<size_t>(W * 2));
    std::memcpy(v.v.at(j), kv.v.at(j, W), static_cast<size_t>(W * 2));
  }
  r.p = AttentionParams{};
  r.p.kv_tile = c.kv_tile;
  HostBuf ref(DType::bf16, {c.Mq, c.H, c.Dh});
  ASSERT_TRUE(G->cpu->attention(q.v, k.v, v.v, ref.v, r.p).ok());
  HostBuf ref64 = attention_f64(q, k, v, c.H, c.Dh);
  r.dq = dev_from(G, q), r.dkv = dev_from(G, kv), r.dout = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
  r.dk = r.dkv.v.cols(0, W).unflatten_last(c.H, c.Dh), r.dv = r.dkv.v.cols(W, 2 * W).unflatten_last(c.H, c.Dh);
  Status s = G->cuda->attention(r.dq.v, r.dk, r.dv, r.dout.v, r.p);
  ASSERT_TRUE(s.ok()) << s.message();
  r.got = download(G, r.dout.v);
  r.ran = true;
  expect_guards(G, r.dout, what.c_str());
  expect_close(r.got, ref, 1 << 20, 1e30, (what + " (NaN/inf only)").c_str());
  r.e_gpu = rel_l2(r.got, ref64), r.e_cpu = rel_l2(ref, ref64);
  std::printf("  %s Mq=%lld Mk=%lld H=%lld Dh=%lld kv_tile=%lld: rel L2 vs fp64 %.3e cpu %.3e\n", what.c_str(),
              static_cast<long long>(c.Mq), static_cast<long long>(c.Mk), static_cast<long long>(c.H),
              static_cast<long long>(c.Dh), static_cast<long long>(c.kv_tile), r.e_gpu, r.e_cpu);
  EXPECT_LE(r.e_gpu, 2.0 * r.e_cpu + 1e-7) << what << " error above 2x the plain bf16 reference's";
}

// Query slices of the parity run (1 row, the last row, a middle range) give the rows of
// the whole call (memcmp), writing nothing outside their output.
inline void expect_query_slices_same(Gpu* G, const AttentionParity& r, const std::string& what) {
  const int64_t Mq = r.got.v.shape[0], H = r.got.v.shape[1], Dh = r.got.v.shape[2];
  std::vector<std::pair<int64_t, int64_t>> slices = {{0, 1}, {Mq - 1, Mq}};
  if (Mq > 2) slices.push_back({Mq / 3, Mq - Mq / 4});
  for (auto [a, b] : slices) {
    DevBuf o2 = dev_buf(G, DType::bf16, {b - a, H, Dh});
    ASSERT_TRUE(G->cuda->attention(r.dq.v.slice_rows(a, b), r.dk, r.dv, o2.v, r.p).ok());
    expect_guards(G, o2, (what + " (slice)").c_str());
    EXPECT_TRUE(same_bytes(download(G, o2.v), host_rows(r.got, a, b))) << what << " query rows " << a << ".." << b;
  }
}

// attention_parity, then its query slices, under a trace naming the case.
inline void check_attention_case(Gpu* G, const AttentionCase& c, uint32_t seed, const std::string& what,
                                 AttentionParity& r) {
  SCOPED_TRACE(what + " Mq=" + std::to_string(c.Mq) + " Mk=" + std::to_string(c.Mk) + " H=" + std::to_string(c.H) +
               " Dh=" + std::to_string(c.Dh) + " kv_tile=" + std::to_string(c.kv_tile));
  attention_parity(G, c, seed, what, r);
  if (!r.ran) return;
  expect_query_slices_same(G, r, what);
}

// Random bf16 q [Mq, H, Dh] (scale qscale, from `seed`), k and v [Mk, H, Dh] (seed + 1,
// seed + 2), on the device.
struct QkvInputs {
  HostBuf q, k, v;  // the uploads' sources, kept alive with the device copies
  DevBuf dq, dk, dv;
};
inline QkvInputs qkv_inputs(Gpu* G, int64_t Mq, int64_t Mk, int64_t H, int64_t Dh, uint32_t seed, float qscale) {
  QkvInputs in;
  in.q = random_buf(DType::bf16, {Mq, H, Dh}, seed, qscale);
  in.k = random_buf(DType::bf16, {Mk, H, Dh}, seed + 1, 1.0f);
  in.v = random_buf(DType::bf16, {Mk, H, Dh}, seed + 2, 1.0f);
  in.dq = dev_from(G, in.q), in.dk = dev_from(G, in.k), in.dv = dev_from(G, in.v);
  return in;
}

// Streamed keys (AttentionParams::state): the keys k, v fed in chunks of 3, 1 and the
// remaining tiles of p.kv_tile (the last one short), the fp32 merge state carried in
// `state`, the output written by the last chunk. The first failing call's Status.
inline Status attention_key_chunks(Gpu* G, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& state, const AttentionParams& p) {
  const int64_t bounds[] = {0, 3 * p.kv_tile, 4 * p.kv_tile, k.shape[0]};
  for (int c = 0; c < 3; ++c) {
    AttentionParams pc = p;
    pc.state = state;
    pc.state_in = c > 0;
    pc.finalize = c == 2;
    LS_TRY(G->cuda->attention(q, k.slice_rows(bounds[c], bounds[c + 1]), v.slice_rows(bounds[c], bounds[c + 1]), out,
                              pc));
  }
  return Status::ok_status();
}

// Inputs for timing at real sizes: a fused qkv [S, 3 H Dh] of 2048 random rows (seed 300)
// uploaded once and replicated on the device (the times do not depend on the values),
// q, k, v its head-strided column slices, and an output [S, H, Dh]. nullopt (and a
// failure) when the arena is too small or a copy fails.
struct TimingInputs {
  TensorView q, k, v, out;
};
inline std::optional<TimingInputs> timing_inputs(Gpu* G, int64_t S, int64_t H, int64_t Dh) {
  const int64_t I = H * Dh;
  auto qkv = G->arena->alloc(DType::bf16, {S, 3 * I}, "qkv");
  auto out = G->arena->alloc(DType::bf16, {S, H, Dh}, "out");
  if (!qkv.ok() || !out.ok()) {
    ADD_FAILURE() << "arena too small for S = " << S;
    return std::nullopt;
  }
  const int64_t seed_rows = 2048;
  HostBuf seed = random_buf(DType::bf16, {seed_rows, 3 * I}, 300, 1.0f);
  bool copied = G->cuda->copy(qkv->slice_rows(0, seed_rows), seed.v).ok();
  for (int64_t have = seed_rows; copied && have < S;) {
    const int64_t n = std::min(have, S - have);
    copied = G->cuda->copy(qkv->slice_rows(have, have + n), qkv->slice_rows(0, n)).ok();
    have += n;
  }
  if (!copied) {
    ADD_FAILURE() << "filling the timing inputs failed";
    return std::nullopt;
  }
  return TimingInputs{qkv->cols(0, I).unflatten_last(H, Dh), qkv->cols(I, 2 * I).unflatten_last(H, Dh),
                      qkv->cols(2 * I, 3 * I).unflatten_last(H, Dh), *out};
}

// Elements differing between device views x and y ([rows, H, Dh]), counted on the device.
inline uint64_t count_diff(Gpu* G, const TensorView& x, const TensorView& y) {
  HostBuf zero(DType::f64, {1});
  LS_CHECK(G->cuda->copy(G->counter, zero.v).ok());
  LS_CHECK(cuda::count_unequal(*G->cuda, x.flatten_last2(), y.flatten_last2(), G->counter).ok());
  return *download(G, G->counter).v.ptr<uint64_t>();
}

// A fused qkv [S, 3 H Dh] of random rows (seed) on the device, q, k, v its head-strided
// column slices (the block's layout), and two outputs [S, H, Dh]: a whole call's and
// its slices'. nullopt (and a failure) when the arena is too small.
struct SliceInputs {
  HostBuf host;  // the upload's source
  DevBuf qkv;
  TensorView q, k, v, full, part;
};
inline std::optional<SliceInputs> slice_inputs(Gpu* G, int64_t S, int64_t H, int64_t Dh, uint32_t seed) {
  const int64_t I = H * Dh;
  SliceInputs r;
  r.host = random_buf(DType::bf16, {S, 3 * I}, seed, 1.0f);
  r.qkv = dev_from(G, r.host);
  r.q = r.qkv.v.cols(0, I).unflatten_last(H, Dh), r.k = r.qkv.v.cols(I, 2 * I).unflatten_last(H, Dh),
  r.v = r.qkv.v.cols(2 * I, 3 * I).unflatten_last(H, Dh);
  auto full = G->arena->alloc(DType::bf16, {S, H, Dh}, "full");
  auto part = G->arena->alloc(DType::bf16, {S, H, Dh}, "part");
  if (!full.ok() || !part.ok()) {
    ADD_FAILURE() << "arena too small for S = " << S;
    return std::nullopt;
  }
  r.full = *full, r.part = *part;
  return r;
}

// H3 width (S = 12289 queries, 56 heads x 128, random rows from `seed`) under p: rows of
// the whole call differ from each other, and 4096-row slices, slices of 97 and of 1 row
// (first, last, middle) give its bytes (compared on the device). r: the inputs and
// outputs, for more checks.
inline void check_query_slices_h3(Gpu* G, const AttentionParams& p, uint32_t seed, std::optional<SliceInputs>& r) {
  const int64_t S = 12289;
  r = slice_inputs(G, S, 56, 128, seed);
  ASSERT_TRUE(r.has_value());
  const TensorView &q = r->q, &k = r->k, &v = r->v, &full = r->full, &part = r->part;
  Status s = G->cuda->attention(q, k, v, full, p);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(count_diff(G, full.slice_rows(0, 1), full.slice_rows(1, 2)), 0u) << "output rows should differ";
  for (int64_t a = 0; a < S; a += 4096) {
    const int64_t b = std::min(S, a + 4096);
    ASSERT_TRUE(G->cuda->attention(q.slice_rows(a, b), k, v, part.slice_rows(a, b), p).ok());
  }
  EXPECT_EQ(count_diff(G, full, part), 0u) << "4096-row slices";
  for (auto [a, b] : std::vector<std::pair<int64_t, int64_t>>{{5000, 5097}, {S - 97, S}, {S - 1, S}, {0, 1}, {777, 778}}) {
    ASSERT_TRUE(G->cuda->attention(q.slice_rows(a, b), k, v, part.slice_rows(a, b), p).ok());
    EXPECT_EQ(count_diff(G, full.slice_rows(a, b), part.slice_rows(a, b)), 0u) << "rows " << a << ".." << b;
  }
}

// Streamed keys vs one call, the case both attention paths check: Mq 2100 queries (scale
// 2), Mk 2900 keys (seeds 220-222), H heads of Dh, kv_tile 256. `whole` from one call,
// `parts` from attention_key_chunks with the fp32 state `state`; a, b their bytes. Checks
// that rows of the whole call differ and the guard bytes around `parts`.
struct StreamedKeys {
  QkvInputs in;
  AttentionParams p;
  DevBuf whole, parts;
  TensorView state;
  HostBuf a, b;
  bool ran = false;
};
inline void streamed_keys(Gpu* G, int64_t H, int64_t Dh, const std::string& what, StreamedKeys& r) {
  const int64_t Mq = 2100, Mk = 2900;
  r.in = qkv_inputs(G, Mq, Mk, H, Dh, 220, 2.0f);
  r.p = AttentionParams{};
  r.p.kv_tile = 256;
  const QkvInputs& in = r.in;
  r.whole = dev_buf(G, DType::bf16, {Mq, H, Dh}), r.parts = dev_buf(G, DType::bf16, {Mq, H, Dh});
  Status s = G->cuda->attention(in.dq.v, in.dk.v, in.dv.v, r.whole.v, r.p);
  ASSERT_TRUE(s.ok()) << s.message();
  auto state = G->arena->alloc(DType::f32, {Mq, H, Dh + kAttentionStateExtra}, "attention state");
  ASSERT_TRUE(state.ok());
  r.state = *state;
  s = attention_key_chunks(G, in.dq.v, in.dk.v, in.dv.v, r.parts.v, r.state, r.p);
  ASSERT_TRUE(s.ok()) << s.message();
  r.a = download(G, r.whole.v), r.b = download(G, r.parts.v);
  EXPECT_FALSE(same_bytes(host_rows(r.a, 0, 1), host_rows(r.a, 1, 2))) << "output rows should differ";
  expect_guards(G, r.parts, (what + " (streamed keys)").c_str());
  r.ran = true;
}

}  // namespace ls::cudatest
