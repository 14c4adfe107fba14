// The CUDA backend's streaming pieces (issue 5: weight streaming, K/V offload, residual
// offload), each checked exactly:
//  - chunked attention with an fp32 state (AttentionParams::state): keys fed in chunks
//    of whole kv_tiles give the bytes of one call over all keys (memcmp), for every
//    kernel variant and head_dim 32/64/128, any Mq (a ragged last CTA), query slices
//    with their own states, and at a real size (Mq 4096, Mk 16384, H 8, Dh 128);
//    the fp32 state itself round-trips (tile by tile == one call); a non-final chunk
//    leaves out untouched; the error cases; the result stays within the attention
//    tolerance of the CPU reference (error vs fp64 at most 2x the CPU's); under
//    attention cudnn (the backend's numerics) the chunks give the cuDNN path's one-call bytes;
//  - pinned_host_memory + copy_async on the transfer queue + fences: H2D, compute,
//    D2H ordered only by fences, and the executor's double-buffer loop (50 rounds,
//    every round's result checked).
// Every test skips when no CUDA device is present. Failure messages name the case,
// the chunking and the kernel variant, so a failing run explains itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "attention_state_cases.h"
#include "attention_test_util.h"
#include "backend/cuda/attention_cudnn.cuh"
#include "cuda_test_util.h"

// The native kernel's parity and streaming tests (cuDNN: test_attention_cudnn).
[[maybe_unused]] const bool kNative = ls::cudatest::select_native_attention();

namespace ls::cudatest {
namespace {

struct StateCase {
  int64_t Mq, Mk, H, Dh, kv_tile;
};

std::string case_name(const StateCase& c) {
  return "Mq " + std::to_string(c.Mq) + " Mk " + std::to_string(c.Mk) + " H " + std::to_string(c.H) + " Dh " +
         std::to_string(c.Dh) + " kv_tile " + std::to_string(c.kv_tile);
}

std::string chunks_str(const std::vector<int64_t>& t) {
  std::string s = "chunks of {";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? ", " : "") + std::to_string(t[i]);
  return s + "} tiles (last entry repeats, 0 = all the rest)";
}

// The shape set of tests/test_attention_state.cpp with head_dim 32/64/128 (the
// kernel's), plus query counts that leave the last CTA (64 queries for 4x1, 128 for
// 4x2 and 8x1) partly empty.
const StateCase kCases[] = {
    {1, 37, 1, 32, 8},      // Mq = 1, Mk not a multiple of kv_tile
    {5, 100, 2, 64, 16},    // odd Mq, ragged last tile
    {7, 96, 3, 128, 32},    // Mk a multiple of kv_tile
    {33, 257, 2, 64, 64},   // one key past the last whole tile
    {3, 61, 2, 32, 4},      // tiny tiles
    {4, 700, 1, 32, 300},   // tiles longer than the kernel's 64-key blocks, not a multiple of 64
    {2, 20, 2, 32, 1},      // kv_tile = 1: every key a tile
    {64, 1000, 2, 128, 256},
    {97, 1025, 2, 128, 100},
    {129, 520, 3, 64, 128},
};
const std::vector<std::vector<int64_t>> kChunkings = {{1}, {2}, {3}, {1, 3, 2}, {0}};
const char* const kVariants[] = {"4x1", "8x1", "4x2"};

// Runs the shared backend's native kernel in variant v for a scope (null: the default
// variant), as numerics (Numerics::native_variant), restoring the old settings after.
struct VariantScope : ScopedNumerics {
  explicit VariantScope(const char* v) : ScopedNumerics(*gpu()->cuda, attention_numerics("native", v)) {
    LS_CHECK_MSG(status().ok(), "VariantScope: " + status().message());
  }
};

// Inputs of a case on host and device: q [Mq, H, Dh]; k and v as head-strided column
// slices of one fused [Mk, 2 H Dh] buffer (the layout the block produces).
struct AttnInputs {
  HostBuf q, kv, k, v;  // host k, v contiguous copies (for the CPU and fp64 references)
  DevBuf dq, dkv;
  TensorView dk, dv;
};

AttnInputs make_inputs(Gpu* G, const StateCase& c, uint32_t seed) {
  AttnInputs in;
  const int64_t W = c.H * c.Dh;
  in.q = random_buf(DType::bf16, {c.Mq, c.H, c.Dh}, seed, 2.0f);  // scores of a few units
  in.kv = random_buf(DType::bf16, {c.Mk, 2 * W}, seed + 1, 1.0f);
  in.k = HostBuf(DType::bf16, {c.Mk, c.H, c.Dh});
  in.v = HostBuf(DType::bf16, {c.Mk, c.H, c.Dh});
  for (int64_t j = 0; j < c.Mk; ++j) {
    std::memcpy(in.k.v.at(j), in.kv.v.at(j, 0), static_cast<size_t>(W * 2));
    std::memcpy(in.v.v.at(j), in.kv.v.at(j, W), static_cast<size_t>(W * 2));
  }
  in.dq = dev_from(G, in.q);
  in.dkv = dev_from(G, in.kv);
  in.dk = in.dkv.v.cols(0, W).unflatten_last(c.H, c.Dh);
  in.dv = in.dkv.v.cols(W, 2 * W).unflatten_last(c.H, c.Dh);
  return in;
}

// A contiguous device state f32 [Mq, H, Dh + 8] with every byte set to `fill`.
TensorView device_state(Gpu* G, int64_t Mq, int64_t H, int64_t Dh, uint8_t fill) {
  auto st = G->arena->alloc(DType::f32, {Mq, H, Dh + kAttentionStateExtra}, "attention state");
  LS_CHECK(st.ok());
  HostBuf h(DType::f32, {Mq, H, Dh + kAttentionStateExtra});
  std::memset(h.bytes.data(), fill, h.bytes.size());
  upload_to(G, *st, h);
  return *st;
}

// Feeds keys [0, Mk) of (k, v) in chunks of chunk_tiles[i] tiles (last entry repeats;
// 0 = all the rest) through `state`; only the final call writes out.
Status run_chunked(Backend& b, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& state, int64_t kv_tile, const std::vector<int64_t>& chunk_tiles) {
  const int64_t Mk = k.shape[0];
  int64_t c0 = 0;
  for (size_t i = 0; c0 < Mk; ++i) {
    const int64_t tiles = chunk_tiles[std::min(i, chunk_tiles.size() - 1)];
    const int64_t c1 = tiles > 0 ? std::min(Mk, c0 + tiles * kv_tile) : Mk;
    AttentionParams p;
    p.kv_tile = kv_tile;
    p.state = state;
    p.state_in = c0 > 0;
    p.finalize = c1 == Mk;
    Status s = b.attention(q, k.slice_rows(c0, c1), v.slice_rows(c0, c1), out, p);
    if (!s.ok())
      return make_error(s.error().code, "chunk [" + std::to_string(c0) + ", " + std::to_string(c1) + "): " + s.message());
    c0 = c1;
  }
  return Status();
}

// The rel L2 distance of `got` from the fp64 reference (attention_test_util.h) of q, k, v.
double rel_l2_vs_f64(const HostBuf& got, const HostBuf& q, const HostBuf& k, const HostBuf& v) {
  return rel_l2(got, attention_f64(q, k, v, q.v.shape[1], q.v.shape[2]));
}

// The bytes of one call over all keys, with the default variant (nullopt after a
// reported failure).
std::optional<HostBuf> one_call(Gpu* G, const AttnInputs& in, const StateCase& c) {
  VariantScope dflt(nullptr);
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  DevBuf whole = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
  const Status s = G->cuda->attention(in.dq.v, in.dk, in.dv, whole.v, p);
  if (!s.ok()) {
    ADD_FAILURE() << case_name(c) << ": " << s.message();
    return std::nullopt;
  }
  return download(G, whole.v);
}

// ---- chunked attention: bytes of one call -------------------------------------------
TEST(CudaStreaming, ChunkedAttentionEqualsOneCall) {
  LS_NEED_GPU();
  for (const StateCase& c : kCases) {
    Arena::Scope scope(*G->arena);
    AttnInputs in = make_inputs(G, c, static_cast<uint32_t>(c.Mq * 7 + c.Mk));
    const std::optional<HostBuf> whole = one_call(G, in, c);
    ASSERT_TRUE(whole.has_value());
    const HostBuf& ref = *whole;
    for (const char* variant : kVariants) {
      VariantScope vs(variant);
      for (const auto& tiles : kChunkings) {
        Arena::Scope inner(*G->arena);
        DevBuf out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
        const TensorView state = device_state(G, c.Mq, c.H, c.Dh, 0x7F);
        Status s = run_chunked(*G->cuda, in.dq.v, in.dk, in.dv, out.v, state, c.kv_tile, tiles);
        ASSERT_TRUE(s.ok()) << case_name(c) << ", " << chunks_str(tiles) << ", variant " << variant << ": "
                            << s.message();
        EXPECT_TRUE(same_bytes(download(G, out.v), ref))
            << case_name(c) << ", " << chunks_str(tiles) << ", variant " << variant
            << ": chunked output differs from one call over all keys (default variant)";
        expect_guards(G, out, "chunked attention out");
      }
    }
  }
}

// Within the attention tolerance of the CPU reference: the chunked CUDA result's error
// vs fp64 is at most 2x that of the CPU backend (same bound as CudaOps.AttentionParity),
// and the CPU's own chunked result is its one-call result.
TEST(CudaStreaming, ChunkedAttentionWithinToleranceOfCpu) {
  LS_NEED_GPU();
  for (const StateCase& c : kCases) {
    Arena::Scope scope(*G->arena);
    AttnInputs in = make_inputs(G, c, static_cast<uint32_t>(c.Mq + c.Mk * 3));
    AttentionParams p;
    p.kv_tile = c.kv_tile;
    HostBuf cpu_whole(DType::bf16, {c.Mq, c.H, c.Dh}), cpu_chunked(DType::bf16, {c.Mq, c.H, c.Dh});
    ASSERT_TRUE(G->cpu->attention(in.q.v, in.k.v, in.v.v, cpu_whole.v, p).ok());
    HostBuf cpu_state(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
    Status cs = run_chunked(*G->cpu, in.q.v, in.k.v, in.v.v, cpu_chunked.v, cpu_state.v, c.kv_tile, {2});
    ASSERT_TRUE(cs.ok()) << case_name(c) << " cpu: " << cs.message();
    EXPECT_TRUE(same_bytes(cpu_chunked, cpu_whole)) << case_name(c) << ": cpu chunked differs from cpu one call";

    DevBuf out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
    const TensorView state = device_state(G, c.Mq, c.H, c.Dh, 0);
    Status s = run_chunked(*G->cuda, in.dq.v, in.dk, in.dv, out.v, state, c.kv_tile, {2});
    ASSERT_TRUE(s.ok()) << case_name(c) << ": " << s.message();
    const HostBuf got = download(G, out.v);
    expect_close(got, cpu_whole, 1 << 20, 1e30, "chunked attention vs cpu (NaN/inf only)");
    const double e_gpu = rel_l2_vs_f64(got, in.q, in.k, in.v), e_cpu = rel_l2_vs_f64(cpu_whole, in.q, in.k, in.v);
    std::printf("  chunked attention %s: rel L2 vs fp64 cuda %.3e cpu %.3e\n", case_name(c).c_str(), e_gpu, e_cpu);
    // The 2x bound is a statistical statement: applied where the output has enough
    // elements (>= 4096) for the two errors to be stable; smaller cases are printed.
    if (c.Mq * c.H * c.Dh >= 4096) {
      EXPECT_LE(e_gpu, 2.0 * e_cpu + 1e-7) << case_name(c) << ": chunked cuda attention error above 2x the cpu's";
    }
  }
}

// Query slices (1, 3, 7, ... rows, straddling CTA boundaries), each with its own slice of
// the state and its own chunking, give the rows of the one whole call.
TEST(CudaStreaming, ChunkedAttentionQuerySlices) {
  LS_NEED_GPU();
  for (const StateCase& c : kCases) {
    Arena::Scope scope(*G->arena);
    AttnInputs in = make_inputs(G, c, static_cast<uint32_t>(c.Mq * 5 + c.H));
    const std::optional<HostBuf> whole = one_call(G, in, c);
    ASSERT_TRUE(whole.has_value());
    DevBuf out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
    const TensorView state = device_state(G, c.Mq, c.H, c.Dh, 0);
    int64_t a = 0, n = 1;
    for (size_t i = 0; a < c.Mq; ++i) {
      const int64_t b = std::min(c.Mq, a + n);
      Status s = run_chunked(*G->cuda, in.dq.v.slice_rows(a, b), in.dk, in.dv, out.v.slice_rows(a, b),
                             state.slice_rows(a, b), c.kv_tile, kChunkings[i % 3]);
      ASSERT_TRUE(s.ok()) << case_name(c) << " rows " << a << ".." << b << ": " << s.message();
      a = b;
      n = 2 * n + 1;
    }
    EXPECT_TRUE(same_bytes(download(G, out.v), *whole))
        << case_name(c) << ": query slices with their own states differ from one call";
    expect_guards(G, out, "query-sliced chunked attention");
  }
}

// Stricter than the bf16 output: the fp32 state (m, the 4 unreduced partial sums, acc)
// after feeding whole tiles one at a time equals, byte for byte, the state of one
// non-final call over the same keys. Both start from the same fill, so the unused
// floats compare too. A non-final chunk leaves out untouched.
TEST(CudaStreaming, StateRoundTripAndOutUntouched) {
  LS_NEED_GPU();
  for (const StateCase& c : kCases) {
    const int64_t tiles = c.Mk / c.kv_tile;
    if (tiles < 2) continue;
    Arena::Scope scope(*G->arena);
    AttnInputs in = make_inputs(G, c, 3);
    const int64_t keys = tiles * c.kv_tile;
    DevBuf out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
    const HostBuf out_before = download(G, out.v);
    const TensorView one = device_state(G, c.Mq, c.H, c.Dh, 0x33), chunked = device_state(G, c.Mq, c.H, c.Dh, 0x33);
    AttentionParams p;
    p.kv_tile = c.kv_tile;
    p.finalize = false;
    p.state = one;
    ASSERT_TRUE(G->cuda->attention(in.dq.v, in.dk.slice_rows(0, keys), in.dv.slice_rows(0, keys), out.v, p).ok());
    p.state = chunked;
    for (int64_t t = 0; t < tiles; ++t) {
      p.state_in = t > 0;
      const int64_t a = t * c.kv_tile, b = a + c.kv_tile;
      ASSERT_TRUE(G->cuda->attention(in.dq.v, in.dk.slice_rows(a, b), in.dv.slice_rows(a, b), out.v, p).ok());
    }
    const HostBuf h1 = download(G, one), h2 = download(G, chunked);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < h1.n(); ++i)
      if (std::memcmp(h1.bytes.data() + 4 * i, h2.bytes.data() + 4 * i, 4) != 0) {
        if (first < 0) first = i;
        ++differ;
      }
    const int64_t W = c.Dh + kAttentionStateExtra;
    EXPECT_EQ(differ, 0) << case_name(c) << ": " << differ << " state floats differ between " << tiles
                         << " one-tile chunks and one call; first at query " << (first / W / c.H) << " head "
                         << (first / W % c.H) << " float " << (first % W) << " (acc [0, Dh), m Dh, l partials Dh+1..4)";
    // Something was stored: m of query 0 head 0 is finite.
    EXPECT_TRUE(std::isfinite(h1.get(c.Dh))) << case_name(c) << ": state m not stored";
    EXPECT_TRUE(same_bytes(download(G, out.v), out_before)) << case_name(c) << ": a non-final chunk wrote out";
    expect_guards(G, out, "non-final chunk out");
  }
}

// Under attention cudnn (numerics), calls with a state take the cuDNN path too (it
// keeps its own fp32 state), so K/V offload leaves that path's bits unchanged: chunked
// output equals the cuDNN one-call output. Skips when the build or machine has no
// usable cuDNN engine (tests/cuda/test_attention_cudnn covers that path in depth).
TEST(CudaStreaming, ChunkedAttentionUnderCudnnSelection) {
  LS_NEED_GPU();
  const StateCase c{97, 1025, 2, 128, 100};
  AttnInputs in = make_inputs(G, c, 21);
  const auto ws_bytes = static_cast<int64_t>(cuda::attention_cudnn_workspace_bytes(c.H, c.Dh));
  auto ws = G->arena->alloc(DType::u8, {std::max<int64_t>(ws_bytes, G->workspace.numel())}, "cudnn workspace");
  ASSERT_TRUE(ws.ok());
  ASSERT_TRUE(G->cuda->set_workspace(*ws).ok());
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  DevBuf whole = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh}), out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
  const TensorView state = device_state(G, c.Mq, c.H, c.Dh, 0);
  Status one, chunked;
  {
    const ScopedNumerics use_cudnn(*G->cuda, attention_numerics("cudnn"));
    one = use_cudnn.status();
    if (one.ok()) one = G->cuda->attention(in.dq.v, in.dk, in.dv, whole.v, p);
    if (one.ok()) chunked = run_chunked(*G->cuda, in.dq.v, in.dk, in.dv, out.v, state, c.kv_tile, {3});
  }
  ASSERT_TRUE(G->cuda->set_workspace(G->workspace).ok());
  if (!one.ok()) GTEST_SKIP() << "no usable cuDNN attention here: " << one.message();
  ASSERT_TRUE(chunked.ok()) << "cuDNN path with a state: " << chunked.message();
  EXPECT_TRUE(same_bytes(download(G, out.v), download(G, whole.v)))
      << "with attention cudnn, chunks of 3 tiles differ from the cuDNN one call (K/V offload would "
         "change bits on that path)";
}

// Real size: Mq 4096, Mk 16384, H 8, Dh 128, kv_tile 1024, chunks of 4096 keys (the
// K/V offload pattern), compared on the device (count_unequal).
TEST(CudaStreaming, ChunkedAttentionLarge) {
  LS_NEED_GPU();
  const int64_t Mq = 4096, Mk = 16384, H = 8, Dh = 128, W = H * Dh, tile = 1024, chunk = 4096;
  HostBuf q = random_buf(DType::bf16, {Mq, W}, 31, 1.0f);
  HostBuf kv = random_buf(DType::bf16, {Mk, 2 * W}, 32, 1.0f);
  DevBuf dq = dev_from(G, q), dkv = dev_from(G, kv);
  const TensorView tq = dq.v.unflatten_last(H, Dh);
  const TensorView dk = dkv.v.cols(0, W).unflatten_last(H, Dh), dv = dkv.v.cols(W, 2 * W).unflatten_last(H, Dh);
  auto full = G->arena->alloc(DType::bf16, {Mq, H, Dh}, "full");
  auto part = G->arena->alloc(DType::bf16, {Mq, H, Dh}, "chunked");
  ASSERT_TRUE(full.ok() && part.ok());
  const TensorView state = device_state(G, Mq, H, Dh, 0);
  AttentionParams p;
  p.kv_tile = tile;
  ASSERT_TRUE(G->cuda->attention(tq, dk, dv, *full, p).ok());
  Status s = run_chunked(*G->cuda, tq, dk, dv, *part, state, tile, {chunk / tile});
  ASSERT_TRUE(s.ok()) << s.message();
  HostBuf zero(DType::f64, {1});
  ASSERT_TRUE(G->cuda->copy(G->counter, zero.v).ok());
  ASSERT_TRUE(cuda::count_unequal(*G->cuda, full->flatten_last2(), part->flatten_last2(), G->counter).ok());
  const HostBuf cnt = download(G, G->counter);
  EXPECT_EQ(*cnt.v.ptr<uint64_t>(), 0u)
      << "Mq 4096 Mk 16384 H 8 Dh 128 kv_tile 1024: elements differing between 4 chunks of 4096 keys and one call";
  // Not vacuous: the output is not all zeros.
  const HostBuf head = download(G, full->slice_rows(0, 1));
  double ss = 0;
  for (int64_t i = 0; i < head.n(); ++i) ss += static_cast<double>(head.get(i)) * head.get(i);
  EXPECT_GT(ss, 0.0);
}

TEST(CudaStreaming, AttentionStateErrors) {
  LS_NEED_GPU();
  const StateCase c{3, 64, 2, 32, 16};
  AttnInputs in = make_inputs(G, c, 41);
  DevBuf out = dev_buf(G, DType::bf16, {c.Mq, c.H, c.Dh});
  const TensorView state = device_state(G, c.Mq, c.H, c.Dh, 0);
  const auto call = [&](const AttentionParams& p, int64_t keys) {
    return G->cuda->attention(in.dq.v, in.dk.slice_rows(0, keys), in.dv.slice_rows(0, keys), out.v, p);
  };
  const int64_t Wd = c.Dh + kAttentionStateExtra;
  auto dev = [&](DType t, std::initializer_list<int64_t> dims) {
    auto v = G->arena->alloc(t, dims, "bad state");
    LS_CHECK(v.ok());
    return *v;
  };
  HostBuf host_state(DType::f32, {c.Mq, c.H, Wd});
  test::expect_state_refusals(call, state, c.kv_tile,
                              {
                                  {dev(DType::f32, {c.Mq, c.H, Wd - 1}), "narrow"},
                                  {dev(DType::f32, {c.Mq + 1, c.H, Wd}), "extra row"},
                                  {dev(DType::f32, {c.Mq, c.H + 1, Wd}), "extra head"},
                                  {dev(DType::bf16, {c.Mq, c.H, Wd}), "bf16"},
                                  {dev(DType::f32, {c.Mq, c.H * Wd}), "2-d"},
                                  {dev(DType::f32, {c.Mq, c.H, 2 * Wd}).cols(0, Wd), "strided rows"},
                                  {host_state.v, "host memory"},
                              });
  expect_guards(G, out, "attention error cases");
}

// ---- pinned memory, queues, fences ---------------------------------------------------
TEST(CudaStreaming, PinnedMemoryCopyAsyncAndFences) {
  LS_NEED_GPU();
  MemoryResource& pinned = G->cuda->pinned_host_memory();
  EXPECT_EQ(pinned.device(), Device{}) << "pinned memory is host memory";
  // An impossible request fails with a Status naming the size, and nothing breaks.
  auto huge = pinned.allocate(size_t{1} << 60);
  ASSERT_FALSE(huge.ok()) << "cudaHostAlloc of 1 EiB succeeded?";
  EXPECT_NE(huge.error().message.find(std::to_string(size_t{1} << 60)), std::string::npos) << huge.error().message;
  std::printf("  expected failure: %s\n", huge.error().message.c_str());

  const int64_t M = 1025, D = 3001;  // odd sizes; rows of 6002 bytes
  auto harena = Arena::create(pinned, 4 * Arena::aligned_bytes(static_cast<size_t>(M * D * 2)));
  ASSERT_TRUE(harena.ok()) << harena.error().message;
  auto hx = (*harena)->alloc(DType::bf16, {M, D}, "pinned x");
  auto hy = (*harena)->alloc(DType::bf16, {M, D}, "pinned y");
  auto hout = (*harena)->alloc(DType::bf16, {M, D}, "pinned out");
  ASSERT_TRUE(hx.ok() && hy.ok() && hout.ok());
  const HostBuf x = random_buf(DType::bf16, {M, D}, 51, 3.0f), y = random_buf(DType::bf16, {M, D}, 52, 1.0f);
  std::memcpy(hx->data, x.v.data, static_cast<size_t>(M * D * 2));
  std::memcpy(hy->data, y.v.data, static_cast<size_t>(M * D * 2));
  std::memset(hout->data, 0, static_cast<size_t>(M * D * 2));
  HostBuf ref = x;
  ASSERT_TRUE(G->cpu->add(ref.v, y.v).ok());

  DevBuf dx = dev_buf(G, DType::bf16, {M, D}), dy = dev_buf(G, DType::bf16, {M, D});
  ASSERT_TRUE(G->cuda->synchronize().ok());  // the sentinel uploads are done
  // H2D on transfer (row-strided destinations), signal; compute waits, adds, signals;
  // transfer waits, D2H, signals; the host waits on that fence only.
  ASSERT_TRUE(G->cuda->copy_async(dx.v, *hx, Queue::transfer).ok());
  ASSERT_TRUE(G->cuda->copy_async(dy.v, *hy, Queue::transfer).ok());
  ASSERT_TRUE(G->cuda->signal(Queue::transfer, 0).ok());
  ASSERT_TRUE(G->cuda->wait(Queue::compute, 0).ok());
  ASSERT_TRUE(G->cuda->add(dx.v, dy.v).ok());
  ASSERT_TRUE(G->cuda->signal(Queue::compute, 1).ok());
  ASSERT_TRUE(G->cuda->wait(Queue::transfer, 1).ok());
  ASSERT_TRUE(G->cuda->copy_async(*hout, dx.v, Queue::transfer).ok());
  ASSERT_TRUE(G->cuda->signal(Queue::transfer, 2).ok());
  ASSERT_TRUE(G->cuda->host_wait(2).ok());
  EXPECT_EQ(std::memcmp(hout->data, ref.v.data, static_cast<size_t>(M * D * 2)), 0)
      << "H2D (transfer) -> add (compute) -> D2H (transfer) ordered by fences 0, 1, 2 gave wrong bytes";
  expect_guards(G, dx, "copy_async destination");

  // synchronize() drains the transfer queue too; copy_async on compute is ordered
  // with the compute queue's ops.
  std::memset(hout->data, 0, static_cast<size_t>(M * D * 2));
  ASSERT_TRUE(G->cuda->copy_async(*hout, dy.v, Queue::transfer).ok());
  ASSERT_TRUE(G->cuda->synchronize().ok());
  EXPECT_EQ(std::memcmp(hout->data, y.v.data, static_cast<size_t>(M * D * 2)), 0)
      << "synchronize() returned before a transfer-queue copy finished";
  ASSERT_TRUE(G->cuda->copy_async(dx.v, *hx, Queue::compute).ok());
  ASSERT_TRUE(G->cuda->add(dx.v, dy.v).ok());
  ASSERT_TRUE(G->cuda->copy_async(*hout, dx.v, Queue::compute).ok());
  ASSERT_TRUE(G->cuda->signal(Queue::compute, 3).ok());
  ASSERT_TRUE(G->cuda->host_wait(3).ok());
  EXPECT_EQ(std::memcmp(hout->data, ref.v.data, static_cast<size_t>(M * D * 2)), 0)
      << "copy_async on the compute queue is not ordered with compute ops";
}

TEST(CudaStreaming, UnsignalledFenceIsANoOp) {
  LS_NEED_GPU();
  auto fresh = make_backend("cuda");  // a backend whose fences were never signalled
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  for (int f : {0, Backend::kFences - 1}) {
    EXPECT_TRUE((*fresh)->wait(Queue::compute, f).ok());
    EXPECT_TRUE((*fresh)->wait(Queue::transfer, f).ok());
    EXPECT_TRUE((*fresh)->host_wait(f).ok());
  }
  EXPECT_TRUE((*fresh)->synchronize().ok()) << "waiting on never-signalled fences must not block or fail";
}

// The executor's double buffer: two device slots; round i loads chunk i (pinned) into
// slot i % 2 on the transfer queue while compute works on the other slot; compute uses
// the slot (y = base + w three times, into a per-slot result), then the transfer queue
// writes the result back to pinned memory. Fences: loaded[s] (transfer -> compute),
// used[s] (compute -> transfer: the slot may be refilled, the result may be read).
// Every round's result is checked, so a missing wait (a slot refilled while in use, a
// result read before it is written) shows up as a wrong round.
TEST(CudaStreaming, DoubleBufferPingPong) {
  LS_NEED_GPU();
  const int kRounds = 50;
  const int64_t R = 512, D = 2048, n = R * D;  // 2 MiB per chunk: long enough copies to overlap
  const size_t bytes = static_cast<size_t>(n * 2);
  auto harena = Arena::create(G->cuda->pinned_host_memory(), 2 * kRounds * Arena::aligned_bytes(bytes));
  ASSERT_TRUE(harena.ok()) << harena.error().message;
  std::vector<TensorView> w(kRounds), res(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    auto a = (*harena)->alloc(DType::bf16, {R, D}, "pinned chunk");
    auto b = (*harena)->alloc(DType::bf16, {R, D}, "pinned result");
    ASSERT_TRUE(a.ok() && b.ok());
    w[static_cast<size_t>(i)] = *a;
    res[static_cast<size_t>(i)] = *b;
    uint16_t* p = a->ptr<uint16_t>();
    // Small integers that differ per round: bf16 holds them exactly.
    for (int64_t e = 0; e < n; ++e) p[e] = f32_to_bf16(static_cast<float>((e * 7 + i * 13) % 61 - 30));
    std::memset(b->data, 0xEE, bytes);
  }
  const HostBuf base = random_buf(DType::bf16, {R, D}, 61, 4.0f);
  DevBuf dbase = dev_from(G, base);
  DevBuf slot[2] = {dev_buf(G, DType::bf16, {R, D}), dev_buf(G, DType::bf16, {R, D})};
  DevBuf out[2] = {dev_buf(G, DType::bf16, {R, D}), dev_buf(G, DType::bf16, {R, D})};
  ASSERT_TRUE(G->cuda->synchronize().ok());
  const int loaded[2] = {4, 5}, used[2] = {6, 7}, done = 8;
  for (int i = 0; i < kRounds; ++i) {
    const int s = i % 2;
    const size_t ui = static_cast<size_t>(i);
    // transfer: slot s and out s are free once compute finished round i - 2 (the D2H
    // of round i - 2 is earlier on this queue), then load chunk i.
    ASSERT_TRUE(G->cuda->wait(Queue::transfer, used[s]).ok());
    ASSERT_TRUE(G->cuda->copy_async(slot[s].v, w[ui], Queue::transfer).ok());
    ASSERT_TRUE(G->cuda->signal(Queue::transfer, loaded[s]).ok());
    // compute: out s = base + w_i + w_i + w_i (rounded to bf16 after each add).
    ASSERT_TRUE(G->cuda->wait(Queue::compute, loaded[s]).ok());
    ASSERT_TRUE(G->cuda->copy_async(out[s].v, dbase.v, Queue::compute).ok());
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(G->cuda->add(out[s].v, slot[s].v).ok());
    ASSERT_TRUE(G->cuda->signal(Queue::compute, used[s]).ok());
    // transfer: write the result back once compute is done with it.
    ASSERT_TRUE(G->cuda->wait(Queue::transfer, used[s]).ok());
    ASSERT_TRUE(G->cuda->copy_async(res[ui], out[s].v, Queue::transfer).ok());
  }
  ASSERT_TRUE(G->cuda->signal(Queue::transfer, done).ok());
  ASSERT_TRUE(G->cuda->host_wait(done).ok());
  int bad_rounds = 0;
  for (int i = 0; i < kRounds; ++i) {
    HostBuf ref = base;
    HostBuf wi(DType::bf16, {R, D});
    std::memcpy(wi.v.data, w[static_cast<size_t>(i)].data, bytes);
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(G->cpu->add(ref.v, wi.v).ok());
    if (std::memcmp(res[static_cast<size_t>(i)].data, ref.v.data, bytes) != 0) {
      ++bad_rounds;
      ADD_FAILURE() << "double buffer round " << i << " (slot " << i % 2
                    << "): result differs from base + 3 x chunk " << i
                    << " (a fence wait is missing: slot refilled in use, or result read early)";
    }
  }
  EXPECT_EQ(bad_rounds, 0);
  for (int s = 0; s < 2; ++s) {
    expect_guards(G, slot[s], "double buffer slot");
    expect_guards(G, out[s], "double buffer result");
  }
}

}  // namespace
}  // namespace ls::cudatest
