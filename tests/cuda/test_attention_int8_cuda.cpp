// CUDA INT8 attention against the CPU reference (docs/int8-attention.md, contract v4), for
// BOTH p8 paths (the fast ex2 byte the device check picks, and the threshold table forced by
// cuda::set_int8_p8_path) and BOTH kernels:
// the portable one (attention_int8.cu, forced by cuda::set_int8_attention_kernel) and what
// the backend runs by default (on an sm_90 GPU of a build with the Hopper kernels, the Hopper
// kernel attention_hopper_int8.cu for head counts that are multiples of 4; asserted), in its
// persistent and its one-CTA-per-item ("hopper-grid") launches. The key statistics, the
// prepared keys (k8, sk: contract v4's scale per key group, v8t), the V-scale table vs and
// the attention output are the CPU's BYTES (every op is IEEE-defined, the integer sums exact,
// the fold in the CPU's order at kv_tile 128); and the CUDA results are plan-invariant: query
// slicings (1-row slices, a last slice of 1 row), streamed key chunks carrying the state,
// chunks prepared on their own (whole 128-key tiles, contract v4), all memcmp-equal to one
// call. Huge scores (|sT| >= 4096: v3's score form for those rows, v4's one FFMA for the
// others of the warp) give the CPU's bytes too. Contract v3's statistics blocks of 4,096 keys: the MultiBlock cases
// (3 blocks, V's amplitude different per block so that rho_b is far from 1) check statistics
// merged from slices that cross block boundaries, prepares in pieces that cross a boundary,
// the acc rescale where a tile starts a block (inside a call, and at a call's first key), and
// the refusal of a call that crosses a boundary from a first key off the 128-key tile grid.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ext.h"
#include "backend/int8_attention_math.h"
#include "core/arena.h"
#include "core/dtype.h"

namespace ls {
namespace {

struct Env {
  std::unique_ptr<Backend> cpu, cuda;
  std::unique_ptr<Arena> arena;
};

Env* env() {
  static Env* e = []() -> Env* {
    Numerics n;
    n.attention = AttentionAlgorithm::int8;
    auto c = make_backend("cuda", n, {});
    if (!c.ok()) return nullptr;
    auto* r = new Env;
    r->cuda = std::move(*c);
    r->cpu = make_cpu_backend();
    EXPECT_TRUE(r->cpu->set_numerics(n, {}).ok());
    auto a = Arena::create(r->cuda->memory(), 2ull << 30);
    if (!a.ok()) return nullptr;
    r->arena = std::move(*a);
    return r;
  }();
  return e;
}

#define NEED_GPU()                                           \
  Env* E = env();                                            \
  if (E == nullptr) GTEST_SKIP() << "no CUDA device here";   \
  Arena::Scope scope_(*E->arena)

std::vector<uint8_t> host_bytes(const TensorView& t) {
  std::vector<uint8_t> b(static_cast<size_t>(t.numel() * t.elem_size()));
  TensorView h = TensorView::contiguous(b.data(), t.dtype, t.shape.data(), t.ndim);
  LS_CHECK(env()->cuda->copy(h, t).ok());
  return b;
}
std::vector<uint8_t> cpu_bytes(const TensorView& t) {
  std::vector<uint8_t> b(static_cast<size_t>(t.numel() * t.elem_size()));
  TensorView h = TensorView::contiguous(b.data(), t.dtype, t.shape.data(), t.ndim);
  LS_CHECK(env()->cpu->copy(h, t).ok());
  return b;
}

// bf16 [n, H, 128] on host and device; K with two outlier channels (offset 12). With
// block_amplitudes, row r is scaled by 1, 3, 0.25 for statistics blocks 0, 1, 2 (mod 3) of
// r / 4096: V's scales then differ per block (rho_b = sv_{b-1} / sv_b near 1/3 and 12), so a
// missing or misplaced rescale of acc changes the output.
struct Pair {
  std::vector<uint16_t> host;
  TensorView h, d;
};
Pair make(int64_t n, int64_t H, uint32_t seed, bool outliers, bool block_amplitudes = false) {
  Pair p;
  p.host.resize(static_cast<size_t>(n * H * 128));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float amplitude[3] = {1.0f, 3.0f, 0.25f};
  for (size_t i = 0; i < p.host.size(); ++i) {
    const int64_t c = static_cast<int64_t>(i % 128), row = static_cast<int64_t>(i) / (H * 128);
    const float a = block_amplitudes ? amplitude[(row / kInt8StatBlock) % 3] : 1.0f;
    p.host[i] = f32_to_bf16(a * (nd(rng) + (outliers && (c == 1 || c == 67) ? 12.0f : 0.0f)));
  }
  p.h = TensorView(p.host.data(), DType::bf16, {n, H, 128});
  auto d = env()->arena->alloc(DType::bf16, {n, H, 128}, "test bf16");
  LS_CHECK(d.ok());
  p.d = *d;
  LS_CHECK(env()->cuda->copy(p.d, p.h).ok());
  return p;
}

// Huge scores with near-ties (contract v4, docs/int8-attention.md §4.4), built in the rotated
// domain as tests/test_attention_int8.cpp's make_huge_scores (R = H D, R^-1 = D H / 128):
// key 2i has rotated row 2 (127 (e_0 + .. + e_63) + delta_i e_m), key 2i + 1 its negation (K's
// centre is 0), delta_i = i % 11 - 5, m = 65 + h % 63; query r has f_r (127 (e_0 + .. + e_63) +
// beta_r e_m), f_r = 128, 2^-6, -128 by row, beta_r 1..3. So k8 = +-(127 x 64, delta), q8 =
// (127 x 64, beta), d = +-(16129 64 + beta delta): rows of |sT| ~ 2.6e5 (log2 units; v3's form
// there) with keys 0.25 beta units apart (many p8 between 1 and 254 in a tile), and rows of
// ordinary scores (|sT| ~ 30, the one-FFMA form) in the same warps: a kernel takes both forms
// per row there. On the CPU the one-FFMA form at every |sT| changes many of these outputs
// (test_attention_int8: HugeScoresEqualTheScalarStatement).
std::pair<Pair, Pair> make_huge(int64_t Mq, int64_t Mk, int64_t H) {
  const auto upload = [&](int64_t rows, const auto& scale, const auto& y1) {
    Pair p;
    p.host.resize(static_cast<size_t>(rows * H * 128));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t m = 65 + h % 63;
        for (int64_t c = 0; c < 128; ++c) {
          const double hm = (std::popcount(static_cast<uint64_t>(m & c)) % 2) != 0 ? -1.0 : 1.0;
          const double y = (c % 64 == 0 ? 127.0 * 64.0 : 0.0) + hm * y1(r);
          const double sign = i8a::negative_sign(static_cast<int>(c)) ? -1.0 : 1.0;
          p.host[static_cast<size_t>((r * H + h) * 128 + c)] = f32_to_bf16(static_cast<float>(scale(r) * sign * y / 128.0));
        }
      }
    p.h = TensorView(p.host.data(), DType::bf16, {rows, H, 128});
    auto d = env()->arena->alloc(DType::bf16, {rows, H, 128}, "test bf16");
    LS_CHECK(d.ok());
    p.d = *d;
    LS_CHECK(env()->cuda->copy(p.d, p.h).ok());
    return p;
  };
  const double f[3] = {128.0, 0x1p-6, -128.0};
  Pair q = upload(
      Mq, [&](int64_t r) { return f[r % 3]; }, [](int64_t r) { return static_cast<double>(1 + r % 3); });
  Pair k = upload(
      Mk, [](int64_t j) { return j % 2 == 0 ? 2.0 : -2.0; }, [](int64_t j) { return static_cast<double>((j / 2) % 11 - 5); });
  return {std::move(q), std::move(k)};
}

// The prepared keys of a whole sequence of n keys (k0 = 0) on host and device, with the
// sequence's statistics f32 [2 + NB, H, 128] and V-scale table f32 [NB, 2, H, 128]
// (NB = int8_stat_blocks(n)).
struct Keys {
  std::vector<uint8_t> host;
  Int8Keys h, d;
  TensorView hstats, dstats;
  std::vector<float> hs, hv;
};
Keys keys_for(int64_t n, int64_t H) {
  Keys k;
  const int64_t bytes = int8_keys_bytes(n, H, 128), NB = int8_stat_blocks(n);
  k.host.assign(static_cast<size_t>(bytes + 256), 0);
  void* hb = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(k.host.data()) + 255) / 256 * 256);
  k.hv.assign(static_cast<size_t>(NB * 2 * H * 128), 0.0f);
  k.h = int8_keys_view(hb, n, H, 128, Device{}, TensorView(k.hv.data(), DType::f32, {NB, 2, H, 128}));
  auto d = env()->arena->alloc(DType::u8, {bytes}, "test keys");
  auto dv = env()->arena->alloc(DType::f32, {NB, 2, H, 128}, "test V scales");
  LS_CHECK(d.ok() && dv.ok());
  k.d = int8_keys_view(d->data, n, H, 128, d->device, *dv);
  k.hs.assign(static_cast<size_t>((2 + NB) * H * 128), 0.0f);
  k.hstats = TensorView(k.hs.data(), DType::f32, {2 + NB, H, 128});
  auto s = env()->arena->alloc(DType::f32, {2 + NB, H, 128}, "test stats");
  LS_CHECK(s.ok());
  k.dstats = *s;
  return k;
}

// A device buffer for the prepared keys [k0, k0 + n) of a sequence whose V-scale table is vs
// (int8 K/V offload's chunk buffers).
Int8Keys chunk_keys(int64_t n, int64_t H, const TensorView& vs, int64_t k0) {
  auto d = env()->arena->alloc(DType::u8, {int8_keys_bytes(n, H, 128)}, "test chunk keys");
  LS_CHECK(d.ok());
  return int8_keys_view(d->data, n, H, 128, d->device, vs, k0);
}

// A device V-scale table of NB blocks filled with NaN (0xFF bytes): a row a prepare does not
// write stays NaN, and NaN would reach any output that read it.
TensorView poisoned_vs(int64_t NB, int64_t H) {
  auto d = env()->arena->alloc(DType::f32, {NB, 2, H, 128}, "test poisoned V scales");
  LS_CHECK(d.ok());
  std::vector<uint8_t> ff(static_cast<size_t>(NB * 2 * H * 128 * 4), 0xFF);
  LS_CHECK(env()->cuda->copy(*d, TensorView(ff.data(), DType::f32, {NB, 2, H, 128})).ok());
  return *d;
}

// Outputs (bf16 bytes) equal, and more than min_nonzero of them nonzero (the test can fail).
void expect_same_outputs(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int64_t min_nonzero,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t differ = 0, nonzero = 0;
  for (size_t i = 0; i + 1 < got.size(); i += 2) {
    differ += std::memcmp(&got[i], &want[i], 2) != 0;
    nonzero += (got[i] | (got[i + 1] & 0x7f)) != 0;
  }
  EXPECT_EQ(differ, 0) << what << ": of " << got.size() / 2 << " outputs";
  EXPECT_GT(nonzero, min_nonzero) << what;
}

std::vector<uint8_t> v8t_rows(const Int8Keys& k, bool device) {  // the n used bytes of every (h, c) row
  const int64_t H = k.v8t.size(0), n = k.v8t.size(2);
  TensorView rows(k.v8t.data, DType::i8, {H * 128, n}, k.v8t.device);
  rows.stride[0] = k.v8t.stride[1];
  std::vector<uint8_t> b(static_cast<size_t>(H * 128 * n));
  TensorView h(b.data(), DType::i8, {H * 128, n});
  LS_CHECK((device ? env()->cuda : env()->cpu)->copy(h, rows).ok());
  return b;
}

AttentionParams tile128() {
  AttentionParams p;
  p.kv_tile = 128;
  return p;
}
// The call over keys [c0, c1) of a streamed sequence of Mk keys: kv_tile 128, the fp32 state
// carried in `state` (read after the first call, written until the last, which finalises).
AttentionParams chunk_call(const TensorView& state, int64_t c0, int64_t c1, int64_t Mk) {
  AttentionParams p = tile128();
  p.state = state;
  p.state_in = c0 > 0;
  p.finalize = c1 == Mk;
  return p;
}

// The kernel under test, "auto" (the backend's choice) or "portable", and the p8 path,
// "auto" (the once-per-device check's choice: ex2 on the H200) or "table" (forced).
using KernelPath = std::tuple<std::string, std::string>;
class Int8Kernel : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    if (env() != nullptr) {
      ASSERT_TRUE(cuda::set_int8_attention_kernel(*env()->cuda, std::get<0>(GetParam())).ok());
      ASSERT_TRUE(cuda::set_int8_p8_path(*env()->cuda, std::get<1>(GetParam())).ok());
    }
  }
  void TearDown() override {
    if (env() != nullptr) {
      ASSERT_TRUE(cuda::set_int8_attention_kernel(*env()->cuda, "auto").ok());
      ASSERT_TRUE(cuda::set_int8_p8_path(*env()->cuda, "auto").ok());
    }
  }
};

// Contract v2's p8: the check scans every pattern once per device; on the H200 (whose ex2 the
// table was measured on) it must find 0 mismatches and pick the fast path; the table path
// must be exact on every device. The hook forces the table and "auto" gives the check's
// choice back.
TEST(Int8AttentionCuda, P8CheckSelectsEx2OnTheH200) {
  NEED_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, cuda::device_index(*E->cuda)), cudaSuccess);
  const std::string path = cuda::int8_p8_path(*E->cuda);
  std::printf("[ info ] %s: p8 check %s\n", prop.name, cuda::int8_p8_check_summary(*E->cuda).c_str());
  EXPECT_TRUE(path == "ex2" || path == "table") << path;
  // The table path (the fast byte corrected against the thresholds) equals the binary
  // search on every pattern, from the fast byte and from guesses 3 steps off: exact anywhere.
  EXPECT_NE(cuda::int8_p8_check_summary(*E->cuda).find("table path 0 mismatches"), std::string::npos)
      << cuda::int8_p8_check_summary(*E->cuda);
  if (std::string(prop.name).find("H200") != std::string::npos) {
    EXPECT_EQ(path, "ex2");
  }
  ASSERT_TRUE(cuda::set_int8_p8_path(*E->cuda, "table").ok());
  EXPECT_EQ(cuda::int8_p8_path(*E->cuda), "table");
  ASSERT_TRUE(cuda::set_int8_p8_path(*E->cuda, "auto").ok());
  EXPECT_EQ(cuda::int8_p8_path(*E->cuda), path);
  EXPECT_FALSE(cuda::set_int8_p8_path(*E->cuda, "ex2").ok());
}

// The Hopper kernel is what auto runs on an sm_90 GPU of a build that has it (so the "auto"
// cases below with H % 4 == 0 test it there), and the hook gives the portable one.
TEST(Int8AttentionCuda, AutoRunsTheHopperKernelOnSm90) {
  NEED_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, cuda::device_index(*E->cuda)), cudaSuccess);
#ifdef LAYERSTREAM_HOPPER_ATTENTION
  const bool hopper = prop.major == 9 && prop.minor == 0;
#else
  const bool hopper = false;
#endif
  EXPECT_EQ(cuda::int8_attention_kernel(*E->cuda), hopper ? "hopper" : "portable") << prop.name;
  ASSERT_TRUE(cuda::set_int8_attention_kernel(*E->cuda, "portable").ok());
  EXPECT_EQ(cuda::int8_attention_kernel(*E->cuda), "portable");
  ASSERT_TRUE(cuda::set_int8_attention_kernel(*E->cuda, "hopper-grid").ok());
  EXPECT_EQ(cuda::int8_attention_kernel(*E->cuda), hopper ? "hopper" : "portable");
  ASSERT_TRUE(cuda::set_int8_attention_kernel(*E->cuda, "auto").ok());
  EXPECT_FALSE(cuda::set_int8_attention_kernel(*E->cuda, "fast").ok());
  std::printf("[ info ] %s: attention int8 runs the %s kernel\n", prop.name, cuda::int8_attention_kernel(*E->cuda).c_str());
}

// Statistics and prepare of all of k, v (k0 = 0) on both backends: the device's statistics,
// k8, sk, vs and v8t are the CPU reference's bytes.
void prepare_both(const Pair& k, const Pair& v, Keys& K) {
  Env* E = env();
  ASSERT_TRUE(E->cpu->int8_key_stats(k.h, v.h, K.hstats, 0, true).ok());
  ASSERT_TRUE(E->cpu->int8_prepare(k.h, v.h, K.hstats, K.h).ok());
  ASSERT_TRUE(E->cuda->int8_key_stats(k.d, v.d, K.dstats, 0, true).ok());
  ASSERT_TRUE(E->cuda->int8_prepare(k.d, v.d, K.dstats, K.d).ok());
  EXPECT_EQ(host_bytes(K.dstats), cpu_bytes(K.hstats)) << "statistics";
  EXPECT_EQ(host_bytes(K.d.k8), cpu_bytes(K.h.k8)) << "k8";
  EXPECT_EQ(host_bytes(K.d.sk), cpu_bytes(K.h.sk)) << "sk";
  EXPECT_EQ(host_bytes(K.d.vs), cpu_bytes(K.h.vs)) << "vs";
  EXPECT_EQ(v8t_rows(K.d, true), v8t_rows(K.h, false)) << "v8t";
}

TEST_P(Int8Kernel, EqualsTheCpuReferenceBytes) {
  NEED_GPU();
  // H % 4 == 0 reaches the Hopper kernel under auto on sm_90; H = 2, 3, 1 the portable one.
  for (const auto& [Mq, Mk, H] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {97, 1025, 2}, {64, 300, 3}, {1, 1, 1}, {97, 1025, 4}, {300, 700, 8}, {1, 1, 4}, {130, 129, 4}, {257, 2000, 12}}) {
    SCOPED_TRACE("Mq " + std::to_string(Mq) + " Mk " + std::to_string(Mk) + " H " + std::to_string(H));
    Pair q = make(Mq, H, 1, true), k = make(Mk, H, 2, true), v = make(Mk, H, 3, false);
    Keys K = keys_for(Mk, H);
    ASSERT_NO_FATAL_FAILURE(prepare_both(k, v, K));
    std::vector<uint16_t> oh(static_cast<size_t>(Mq * H * 128));
    TensorView out_h(oh.data(), DType::bf16, {Mq, H, 128});
    ASSERT_TRUE(E->cpu->attention_int8(q.h, K.h, out_h, tile128()).ok());
    auto od = E->arena->alloc(DType::bf16, {Mq, H, 128}, "out");
    ASSERT_TRUE(od.ok());
    ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d, *od, tile128()).ok());
    const std::vector<uint8_t> got = host_bytes(*od), want = cpu_bytes(out_h);
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); i += 2) differ += std::memcmp(&got[i], &want[i], 2) != 0;
    EXPECT_EQ(differ, 0) << "of " << got.size() / 2 << " outputs";
    int64_t nonzero = 0;
    for (uint16_t x : oh) nonzero += (x & 0x7fff) != 0;
    EXPECT_GT(nonzero, Mq * H * 64);
  }
}

// Contract v4's score at huge scores (make_huge: |sT| >= 4096 in two rows of three, ordinary
// rows in the same warps): v3's form for the rows of |sT| >= 4096, the one-FFMA form for the
// others, so a warp takes both forms per row. The CPU's bytes, for one call and for streamed
// chunks of 256 keys carrying the state; every output finite. H 2: the portable kernel; H 4:
// the Hopper one under auto on sm_90.
TEST_P(Int8Kernel, HugeScoresEqualTheCpuReferenceBytes) {
  NEED_GPU();
  for (const auto& [Mq, Mk, H] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{200, 700, 2}, {200, 700, 4}, {130, 129, 4}}) {
    SCOPED_TRACE("Mq " + std::to_string(Mq) + " Mk " + std::to_string(Mk) + " H " + std::to_string(H));
    auto [q, k] = make_huge(Mq, Mk, H);
    Pair v = make(Mk, H, 53, false);
    Keys K = keys_for(Mk, H);
    ASSERT_NO_FATAL_FAILURE(prepare_both(k, v, K));
    std::vector<uint16_t> oh(static_cast<size_t>(Mq * H * 128));
    TensorView out_h(oh.data(), DType::bf16, {Mq, H, 128});
    ASSERT_TRUE(E->cpu->attention_int8(q.h, K.h, out_h, tile128()).ok());
    const std::vector<uint8_t> want = cpu_bytes(out_h);
    int64_t finite = 0;
    for (uint16_t x : oh) finite += (x & 0x7f80) != 0x7f80;
    EXPECT_EQ(finite, Mq * H * 128) << "CPU outputs finite";
    auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "out");
    auto st = E->arena->alloc(DType::f32, {Mq, H, 128 + kAttentionStateExtra}, "state");
    ASSERT_TRUE(o.ok() && st.ok());
    ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d, *o, tile128()).ok());
    expect_same_outputs(host_bytes(*o), want, Mq * H * 64, "one call");
    for (int64_t c0 = 0; c0 < Mk; c0 += 256) {
      const int64_t c1 = std::min(Mk, c0 + 256);
      const AttentionParams p = chunk_call(*st, c0, c1, Mk);
      ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d.slice(c0, c1), *o, p).ok());
    }
    expect_same_outputs(host_bytes(*o), want, Mq * H * 64, "chunks of 256");
  }
}

TEST_P(Int8Kernel, SlicingsAndStreamedChunksGiveTheSameBytes) {
  NEED_GPU();
  for (const int64_t H : {int64_t{2}, int64_t{4}}) {
    SCOPED_TRACE("H " + std::to_string(H));
    const int64_t Mq = 200, Mk = 700;
    Pair q = make(Mq, H, 11, true), k = make(Mk, H, 12, true), v = make(Mk, H, 13, false);
    Keys K = keys_for(Mk, H);
    ASSERT_TRUE(E->cuda->int8_key_stats(k.d.slice_rows(0, 300), v.d.slice_rows(0, 300), K.dstats, 0, true).ok());
    ASSERT_TRUE(E->cuda->int8_key_stats(k.d.slice_rows(300, Mk), v.d.slice_rows(300, Mk), K.dstats, 300, false).ok());
    ASSERT_TRUE(E->cuda->int8_prepare(k.d, v.d, K.dstats, K.d).ok());
    auto ref = E->arena->alloc(DType::bf16, {Mq, H, 128}, "ref");
    ASSERT_TRUE(ref.ok());
    ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d, *ref, tile128()).ok());
    const std::vector<uint8_t> want = host_bytes(*ref);
    {  // Prepared in pieces into slices of one buffer (int8 K/V offload's prepare walk, whose
       // pieces are whole 128-key tiles, contract v4): the one-call prepare's bytes, every part.
      Keys P = keys_for(Mk, H);
      for (const int64_t a : {int64_t{0}, int64_t{256}, int64_t{512}}) {
        const int64_t b = std::min(Mk, a + 256);
        ASSERT_TRUE(E->cuda->int8_prepare(k.d.slice_rows(a, b), v.d.slice_rows(a, b), K.dstats, P.d.slice(a, b)).ok());
      }
      EXPECT_EQ(host_bytes(P.d.k8), host_bytes(K.d.k8)) << "prepare in pieces: k8";
      EXPECT_EQ(host_bytes(P.d.sk), host_bytes(K.d.sk)) << "prepare in pieces: sk";
      const auto v8t_rows = [&](const Int8Keys& x) {  // [H 128, n] rows of stride ld (copy takes row strides)
        TensorView t(x.v8t.data, DType::i8, {H * 128, Mk}, x.v8t.device);
        t.stride[0] = x.v8t.stride[1];
        return t;
      };
      EXPECT_EQ(host_bytes(v8t_rows(P.d)), host_bytes(v8t_rows(K.d))) << "prepare in pieces: v8t";
      EXPECT_EQ(host_bytes(P.d.vs), host_bytes(K.d.vs)) << "prepare in pieces: vs";
    }
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 199, 200}, std::vector<int64_t>{0, 1, 2, 3, 64, 65, 200}}) {
      auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "sliced");
      ASSERT_TRUE(o.ok());
      for (size_t i = 0; i + 1 < cuts.size(); ++i)
        ASSERT_TRUE(E->cuda->attention_int8(q.d.slice_rows(cuts[i], cuts[i + 1]), K.d,
                                            o->slice_rows(cuts[i], cuts[i + 1]), tile128())
                        .ok());
      EXPECT_EQ(host_bytes(*o), want) << "query slicing";
    }
    for (const int64_t chunk : {int64_t{128}, int64_t{256}, int64_t{512}}) {
      auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "chunked");
      auto st = E->arena->alloc(DType::f32, {Mq, H, 128 + kAttentionStateExtra}, "state");
      ASSERT_TRUE(o.ok() && st.ok());
      for (int64_t c0 = 0; c0 < Mk; c0 += chunk) {
        const int64_t c1 = std::min(Mk, c0 + chunk);
        // Each chunk prepared into its own buffer (the offload path: keys from c0, the
        // sequence's V-scale table) and, alternately, a slice of the one prepared set.
        const Int8Keys part = chunk_keys(c1 - c0, H, K.d.vs, c0);
        ASSERT_TRUE(E->cuda->int8_prepare(k.d.slice_rows(c0, c1), v.d.slice_rows(c0, c1), K.dstats, part).ok());
        const AttentionParams p = chunk_call(*st, c0, c1, Mk);
        const Int8Keys use = (c0 / chunk) % 2 == 0 ? part : K.d.slice(c0, c1);
        ASSERT_TRUE(E->cuda->attention_int8(q.d, use, *o, p).ok());
      }
      EXPECT_EQ(host_bytes(*o), want) << "chunks of " << chunk;
    }
  }
}

// ---- contract v3: several statistics blocks ------------------------------------------------

// The key ranges of single calls checked against the CPU: [4096, 8192) starts block 1 with no
// state (acc = 0 rescaled by rho_1 at the first tile, then its own block only), [4112, 4400)
// a first key off the tile grid inside block 1 (no rescale), [3072, Mk) crossing blocks 1 and
// 2 from a first key on the grid (rescales at its tiles 8 and 40).
std::vector<std::pair<int64_t, int64_t>> sub_ranges(int64_t Mk) { return {{4096, 8192}, {4112, 4400}, {3072, Mk}}; }

// The CPU reference of one multi-block shape, once per process (every kernel and p8 path of
// the parameterised test compares against it; the inputs are the same seeds).
struct CpuRef {
  std::vector<uint8_t> stats, k8, sk, v8t, vs, out;
  std::vector<std::vector<uint8_t>> sub;  // outputs over sub_ranges(Mk)
};
const CpuRef& cpu_reference(int64_t Mq, int64_t Mk, int64_t H, const Pair& q, const Pair& k, const Pair& v) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, CpuRef> cache;
  const auto key = std::make_tuple(Mq, Mk, H);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  Env* E = env();
  Keys K = keys_for(Mk, H);
  CpuRef r;
  LS_CHECK(E->cpu->int8_key_stats(k.h, v.h, K.hstats, 0, true).ok());
  LS_CHECK(E->cpu->int8_prepare(k.h, v.h, K.hstats, K.h).ok());
  r.stats = cpu_bytes(K.hstats);
  r.k8 = cpu_bytes(K.h.k8);
  r.sk = cpu_bytes(K.h.sk);
  r.v8t = v8t_rows(K.h, false);
  r.vs = cpu_bytes(K.h.vs);
  std::vector<uint16_t> oh(static_cast<size_t>(Mq * H * 128));
  const TensorView out_h(oh.data(), DType::bf16, {Mq, H, 128});
  LS_CHECK(E->cpu->attention_int8(q.h, K.h, out_h, tile128()).ok());
  r.out = cpu_bytes(out_h);
  for (const auto& [a, b] : sub_ranges(Mk)) {
    LS_CHECK(E->cpu->attention_int8(q.h, K.h.slice(a, b), out_h, tile128()).ok());
    r.sub.push_back(cpu_bytes(out_h));
  }
  return cache.emplace(key, std::move(r)).first->second;
}

// Three statistics blocks (Mk 9,000 and 8,300; H 4 and 12: the Hopper kernel under auto and
// hopper-grid on sm_90, the portable one when forced), V's amplitude x1 / x3 / x0.25 per
// block. Every result is the CPU reference's bytes. Where acc is rescaled (a tile whose
// absolute first key is 4096 or 8192): the one call (tiles 32 and 64), the query slicings,
// the streamed chunks of 1,536 (inside the calls [3072, 4608) and [7680, 9216)) and of 4,096
// keys (at the first tile of the calls from 4096 and 8192, on a loaded state), and the single
// calls [4096, 8192) and [3072, Mk). The statistics, the prepare in pieces and the refusal
// check the blocks' bookkeeping.
TEST_P(Int8Kernel, MultiBlockEqualsTheCpuReferenceBytes) {
  NEED_GPU();
  for (const auto& [Mq, Mk, H] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{130, 9000, 4}, {257, 8300, 12}}) {
    SCOPED_TRACE("Mq " + std::to_string(Mq) + " Mk " + std::to_string(Mk) + " H " + std::to_string(H));
    const int64_t NB = int8_stat_blocks(Mk), HD = H * 128, min_nonzero = Mq * HD / 2;
    ASSERT_EQ(NB, 3);
    Pair q = make(Mq, H, 41, true), k = make(Mk, H, 42, true), v = make(Mk, H, 43, false, /*block_amplitudes=*/true);
    const CpuRef& R = cpu_reference(Mq, Mk, H, q, k, v);
    Keys K = keys_for(Mk, H);
    ASSERT_EQ(K.d.vs.size(0), 3);
    // One call: statistics, prepared keys, V-scale table, output.
    ASSERT_TRUE(E->cuda->int8_key_stats(k.d, v.d, K.dstats, 0, true).ok());
    ASSERT_TRUE(E->cuda->int8_prepare(k.d, v.d, K.dstats, K.d).ok());
    EXPECT_EQ(host_bytes(K.dstats), R.stats) << "statistics";
    EXPECT_EQ(host_bytes(K.d.k8), R.k8) << "k8";
    EXPECT_EQ(host_bytes(K.d.sk), R.sk) << "sk";
    EXPECT_EQ(v8t_rows(K.d, true), R.v8t) << "v8t";
    EXPECT_EQ(host_bytes(K.d.vs), R.vs) << "vs";
    {  // rho_1, rho_2 far from 1 in most channels (about 1/3 and 12): the rescale matters
      std::vector<float> vs(R.vs.size() / 4);
      std::memcpy(vs.data(), R.vs.data(), R.vs.size());
      for (int64_t b = 0; b < NB; ++b) {
        int64_t far = 0;
        for (int64_t i = 0; i < HD; ++i) far += std::fabs(vs[static_cast<size_t>((2 * b + 1) * HD + i)] - 1.0f) > 0.5f;
        if (b == 0) EXPECT_EQ(far, 0) << "rho_0 = 1";
        else EXPECT_GT(far, HD / 2) << "rho_" << b;
      }
    }
    auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "out");
    auto st = E->arena->alloc(DType::f32, {Mq, H, 128 + kAttentionStateExtra}, "state");
    ASSERT_TRUE(o.ok() && st.ok());
    ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d, *o, tile128()).ok());
    expect_same_outputs(host_bytes(*o), R.out, min_nonzero, "one call");
    // Statistics merged from slices that cross block boundaries (4096 inside [4000, 4200),
    // 8192 inside [4200, 8200)), reset by the first slice only, in two orders.
    for (const std::vector<std::pair<int64_t, int64_t>>& slices :
         {std::vector<std::pair<int64_t, int64_t>>{{0, 300}, {300, 4000}, {4000, 4200}, {4200, 8200}, {8200, Mk}},
          std::vector<std::pair<int64_t, int64_t>>{{4000, 4200}, {0, 4000}, {8200, Mk}, {4200, 8200}}}) {
      auto sb = E->arena->alloc(DType::f32, {2 + NB, H, 128}, "sliced stats");
      ASSERT_TRUE(sb.ok());
      for (size_t i = 0; i < slices.size(); ++i) {
        const auto [a, b] = slices[i];
        ASSERT_TRUE(E->cuda->int8_key_stats(k.d.slice_rows(a, b), v.d.slice_rows(a, b), *sb, a, i == 0).ok());
      }
      EXPECT_EQ(host_bytes(*sb), R.stats) << "statistics in slices from " << slices[0].first;
    }
    {  // Prepared in pieces into slices of one buffer (contract v4: each piece whole 128-key
       // tiles, its key groups complete, but for the sequence's last): pieces [3968, 4224) and
       // [4224, 8320) cross the boundaries 4096 and 8192 (two blocks' V scales in one piece).
      Keys P = keys_for(Mk, H);
      const std::vector<int64_t> cuts{0, 3968, 4224, std::min<int64_t>(8320, Mk / 128 * 128), Mk};  // 8192 where Mk < 8320
      for (size_t i = 0; i + 1 < cuts.size(); ++i)
        ASSERT_TRUE(E->cuda->int8_prepare(k.d.slice_rows(cuts[i], cuts[i + 1]), v.d.slice_rows(cuts[i], cuts[i + 1]),
                                          K.dstats, P.d.slice(cuts[i], cuts[i + 1]))
                        .ok());
      EXPECT_EQ(host_bytes(P.d.k8), R.k8) << "prepare in pieces: k8";
      EXPECT_EQ(host_bytes(P.d.sk), R.sk) << "prepare in pieces: sk";
      EXPECT_EQ(v8t_rows(P.d, true), R.v8t) << "prepare in pieces: v8t";
      EXPECT_EQ(host_bytes(P.d.vs), R.vs) << "prepare in pieces: vs";
    }
    // Query slicings (every slice crosses all three blocks: rescaled at tiles 32 and 64).
    {
      const std::vector<int64_t> cuts{0, 1, 64, 65, Mq};
      auto os = E->arena->alloc(DType::bf16, {Mq, H, 128}, "sliced");
      ASSERT_TRUE(os.ok());
      for (size_t i = 0; i + 1 < cuts.size(); ++i)
        ASSERT_TRUE(E->cuda->attention_int8(q.d.slice_rows(cuts[i], cuts[i + 1]), K.d,
                                            os->slice_rows(cuts[i], cuts[i + 1]), tile128())
                        .ok());
      expect_same_outputs(host_bytes(*os), R.out, min_nonzero, "query slicing");
    }
    // Streamed chunks carrying the state: even chunks prepared into their own buffers with
    // their own V-scale table (NaN where that chunk's prepare wrote nothing: the calls read
    // only the rows of their own blocks), odd chunks slices of the one prepared set (k0 moved
    // by Int8Keys::slice). 1,536: the rescale inside the calls [3072, 4608) and [7680, Mk);
    // 4,096: at the first tile of the calls [4096, 8192) and [8192, Mk).
    for (const int64_t chunk : {int64_t{1536}, int64_t{4096}}) {
      const TensorView pv = poisoned_vs(NB, H);
      for (int64_t c0 = 0; c0 < Mk; c0 += chunk) {
        const int64_t c1 = std::min(Mk, c0 + chunk);
        Int8Keys use = K.d.slice(c0, c1);
        EXPECT_EQ(use.k0, c0);
        if ((c0 / chunk) % 2 == 0) {
          use = chunk_keys(c1 - c0, H, pv, c0);
          ASSERT_TRUE(E->cuda->int8_prepare(k.d.slice_rows(c0, c1), v.d.slice_rows(c0, c1), K.dstats, use).ok());
        }
        const AttentionParams p = chunk_call(*st, c0, c1, Mk);
        ASSERT_TRUE(E->cuda->attention_int8(q.d, use, *o, p).ok());
      }
      expect_same_outputs(host_bytes(*o), R.out, min_nonzero, "chunks of " + std::to_string(chunk));
    }
    // Single calls over key ranges of the sequence (sub_ranges) = the CPU's calls.
    const auto ranges = sub_ranges(Mk);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [a, b] = ranges[i];
      ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d.slice(a, b), *o, tile128()).ok());
      expect_same_outputs(host_bytes(*o), R.sub[i], min_nonzero,
                          "keys [" + std::to_string(a) + ", " + std::to_string(b) + ")");
    }
    // Keys crossing a block boundary from a first key off the 128-key grid: refused, as on
    // the CPU (tiles would straddle the boundary).
    const Status s = E->cuda->attention_int8(q.d, K.d.slice(4000, 4208), *o, tile128());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(s.message().find("statistics block"), std::string::npos) << s.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Int8Kernel,
                         ::testing::Combine(::testing::Values(std::string("auto"), std::string("hopper-grid"),
                                                              std::string("portable")),
                                            ::testing::Values(std::string("auto"), std::string("table"))),
                         [](const ::testing::TestParamInfo<KernelPath>& i) {
                           std::string k = std::get<0>(i.param);
                           for (char& c : k) c = c == '-' ? '_' : c;
                           return k + "_p8" + std::get<1>(i.param);
                         });

// The two kernels and the two p8 paths give each other's bytes at a size with many 128-key
// tiles, a partial last tile and a partial last query block (H = 12: the Hopper kernel under
// auto on sm_90). 17 query tiles x 12 heads = 204 (query tile, head) items, more than the
// H200's 132 SMs, so the persistent Hopper grid (auto) takes one or two items per CTA and its
// ring and ping-pong run on from one item into the next; "hopper-grid" launches a CTA per
// item. Last, auto again in streamed chunks of 1,536 keys carrying the state (each CTA's
// items then start from a loaded state). Mk = 4,100: two statistics blocks (contract v3),
// the last tile (keys 4096..4099) entering block 1 (acc rescaled by rho_1), in the chunked
// run inside the call of keys [3072, 4100).
TEST(Int8AttentionCuda, HopperAndPortableKernelsAndP8PathsGiveTheSameBytes) {
  NEED_GPU();
  const int64_t Mq = 2100, Mk = 4100, H = 12;
  ASSERT_EQ(int8_stat_blocks(Mk), 2);
  Pair q = make(Mq, H, 21, true), k = make(Mk, H, 22, true), v = make(Mk, H, 23, false);
  Keys K = keys_for(Mk, H);
  ASSERT_TRUE(E->cuda->int8_key_stats(k.d, v.d, K.dstats, 0, true).ok());
  ASSERT_TRUE(E->cuda->int8_prepare(k.d, v.d, K.dstats, K.d).ok());
  std::vector<std::vector<uint8_t>> outs;
  for (const char* kernel : {"portable", "auto", "hopper-grid"})
    for (const char* path : {"table", "auto"}) {
      auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "out");
      ASSERT_TRUE(o.ok());
      ASSERT_TRUE(cuda::set_int8_attention_kernel(*E->cuda, kernel).ok());
      ASSERT_TRUE(cuda::set_int8_p8_path(*E->cuda, path).ok());
      ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d, *o, tile128()).ok());
      outs.push_back(host_bytes(*o));
    }
  ASSERT_TRUE(cuda::set_int8_attention_kernel(*E->cuda, "auto").ok());
  ASSERT_TRUE(cuda::set_int8_p8_path(*E->cuda, "auto").ok());
  {
    auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "chunked");
    auto st = E->arena->alloc(DType::f32, {Mq, H, 128 + kAttentionStateExtra}, "state");
    ASSERT_TRUE(o.ok() && st.ok());
    for (int64_t c0 = 0; c0 < Mk; c0 += 1536) {
      const int64_t c1 = std::min(Mk, c0 + 1536);
      const AttentionParams p = chunk_call(*st, c0, c1, Mk);
      ASSERT_TRUE(E->cuda->attention_int8(q.d, K.d.slice(c0, c1), *o, p).ok());
    }
    outs.push_back(host_bytes(*o));
  }
  const std::vector<uint8_t>& y = outs[0];  // portable, table
  for (size_t w = 1; w < outs.size(); ++w) {
    const std::vector<uint8_t>& x = outs[w];
    int64_t differ = 0, nonzero = 0;
    for (size_t i = 0; i < x.size(); i += 2) {
      differ += std::memcmp(&x[i], &y[i], 2) != 0;
      nonzero += (x[i] | (x[i + 1] & 0x7f)) != 0;
    }
    EXPECT_EQ(differ, 0) << "run " << w << " (portable/auto/hopper-grid table/auto, then auto chunked) of "
                         << x.size() / 2 << " outputs";
    EXPECT_GT(nonzero, Mq * H * 64);
  }
}

// The Hopper kernel's q8 cache (docs/int8-attention.md §7a): a non-final call of a streamed
// sequence leaves each query row's q8 and scale in out and marks the row in the state; the
// sequence's later calls read them instead of quantising Q again. Trusted only within one
// sequence and only from a Hopper-written mark: a new sequence with other queries on the
// same state and out buffers (the marks of the last one still there), and sequences that
// switch between the portable and the Hopper kernel call to call, give their one-call bytes.
TEST(Int8AttentionCuda, Q8CacheIsTrustedOnlyWithinASequence) {
  NEED_GPU();
  const int64_t Mq = 300, Mk = 700, H = 4;  // H % 4 == 0: the Hopper kernel under auto on sm_90
  Pair qa = make(Mq, H, 31, true), qb = make(Mq, H, 32, true), k = make(Mk, H, 33, true), v = make(Mk, H, 34, false);
  Keys K = keys_for(Mk, H);
  ASSERT_TRUE(E->cuda->int8_key_stats(k.d, v.d, K.dstats, 0, true).ok());
  ASSERT_TRUE(E->cuda->int8_prepare(k.d, v.d, K.dstats, K.d).ok());
  const auto one_call = [&](const Pair& q) {
    auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "one call");
    LS_CHECK(o.ok());
    LS_CHECK(E->cuda->attention_int8(q.d, K.d, *o, tile128()).ok());
    return host_bytes(*o);
  };
  const std::vector<uint8_t> want_a = one_call(qa), want_b = one_call(qb);
  EXPECT_NE(want_a, want_b);
  auto o = E->arena->alloc(DType::bf16, {Mq, H, 128}, "out");
  auto st = E->arena->alloc(DType::f32, {Mq, H, 128 + kAttentionStateExtra}, "state");
  ASSERT_TRUE(o.ok() && st.ok());
  // kernels[c]: the kernel of chunk call c (256-key chunks: 3 calls).
  const auto sequence = [&](const Pair& q, const std::vector<const char*>& kernels) {
    for (int64_t c = 0, c0 = 0; c0 < Mk; ++c, c0 += 256) {
      const int64_t c1 = std::min(Mk, c0 + 256);
      LS_CHECK(cuda::set_int8_attention_kernel(*E->cuda, kernels[static_cast<size_t>(c)]).ok());
      const AttentionParams p = chunk_call(*st, c0, c1, Mk);
      LS_CHECK(E->cuda->attention_int8(q.d, K.d.slice(c0, c1), *o, p).ok());
    }
    LS_CHECK(cuda::set_int8_attention_kernel(*E->cuda, "auto").ok());
    return host_bytes(*o);
  };
  EXPECT_EQ(sequence(qa, {"auto", "auto", "auto"}), want_a) << "q8 cache within a sequence";
  EXPECT_EQ(sequence(qb, {"auto", "auto", "auto"}), want_b) << "a new sequence on the same buffers";
  EXPECT_EQ(sequence(qa, {"portable", "auto", "auto"}), want_a) << "portable first, then Hopper";
  EXPECT_EQ(sequence(qb, {"auto", "portable", "auto"}), want_b) << "the portable kernel between Hopper calls";
  EXPECT_EQ(sequence(qa, {"auto", "hopper-grid", "portable"}), want_a) << "Hopper launches, then portable";
}

TEST(Int8AttentionCuda, Refusals) {
  NEED_GPU();
  EXPECT_EQ(E->cuda->numerics().attention, AttentionAlgorithm::int8);
  EXPECT_EQ(E->cuda->numerics().kv_tile, 128);
  Numerics n;
  n.attention = AttentionAlgorithm::int8;
  n.kv_tile = 1024;
  auto b = make_backend("cuda", n, {});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("kv_tile must be 128"), std::string::npos) << b.error().message;
  n.kv_tile = 0;
  auto c = make_backend("cuda", n, {});
  ASSERT_TRUE(c.ok());
  const Status s = (*c)->set_model_head_dim(64);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("head dim 64"), std::string::npos) << s.message();
  // A negative scale would put x above kP8Top, where the fast p8 byte wraps: refused before
  // any tensor is read (i8a::scale_ok, as on the CPU).
  AttentionParams neg = tile128();
  neg.scale = -0.5f;
  const Status sc = E->cuda->attention_int8(TensorView{}, Int8Keys{}, TensorView{}, neg);
  ASSERT_FALSE(sc.ok());
  EXPECT_EQ(sc.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(sc.message().find("scale must be positive"), std::string::npos) << sc.message();
}

}  // namespace
}  // namespace ls
