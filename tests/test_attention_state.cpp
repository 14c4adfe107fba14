// Chunked attention with an fp32 state on the CPU backend (AttentionParams::state,
// backend.h; DESIGN.md §1.2, K/V offload): the keys fed in consecutive chunks of whole
// kv_tiles, each call carrying the running (m, l, acc) of every (query, head) in the
// state, must give exactly the bytes of one call over all keys (memcmp), for any
// chunking, any Mq and any query slicing; non-final chunks leave `out` untouched; the
// malformed settings fail with invalid_argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "attention_state_cases.h"
#include "backend/backend.h"
#include "test_cpu_ops_util.h"

namespace ls {
namespace {

using test::HostTensor;

Backend* cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return b.get();
}

struct StateCase {
  int64_t Mq, Mk, H, Dh, kv_tile;
};

std::string case_name(const StateCase& c) {
  return test::sizes_name({{"Mq", c.Mq}, {"Mk", c.Mk}, {"H", c.H}, {"Dh", c.Dh}, {"tile", c.kv_tile}});
}

void PrintTo(const StateCase& c, std::ostream* os) { *os << case_name(c); }

// q, k, v of one case, taken as head-strided column slices of fused [M, 3, H, Dh]-like
// buffers (the layout of the block's qkv projection), so strided views are exercised.
struct Inputs {
  Inputs(const StateCase& c, uint64_t seed)
      : qbuf(DType::bf16, {c.Mq, 3 * c.H * c.Dh}), kvbuf(DType::bf16, {c.Mk, 3 * c.H * c.Dh}) {
    std::mt19937_64 rng(seed);
    // Scores of a few units: a peaked softmax whose running max moves between tiles.
    test::fill_uniform(qbuf, rng, -2.0, 2.0);
    test::fill_uniform(kvbuf, rng, -2.0, 2.0);
    const int64_t I = c.H * c.Dh;
    q = qbuf.view().cols(0, I).unflatten_last(c.H, c.Dh);
    k = kvbuf.view().cols(I, 2 * I).unflatten_last(c.H, c.Dh);
    v = kvbuf.view().cols(2 * I, 3 * I).unflatten_last(c.H, c.Dh);
  }
  HostTensor qbuf, kvbuf;
  TensorView q, k, v;
};

// Feeds keys [0, Mk) in chunks of chunk_tiles[i] tiles (the last entry repeats; 0 =
// all remaining keys; the final chunk is whatever is left), carrying `state`; out is
// written by the final call only.
void run_chunked(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const TensorView& state, int64_t kv_tile, const std::vector<int64_t>& chunk_tiles,
                 int* calls = nullptr) {
  const int64_t Mk = k.size(0);
  int64_t c0 = 0;
  size_t i = 0;
  int n = 0;
  while (c0 < Mk) {
    const int64_t tiles = chunk_tiles[std::min(i, chunk_tiles.size() - 1)];
    int64_t c1 = tiles > 0 ? c0 + tiles * kv_tile : Mk;
    if (c1 > Mk) c1 = Mk;
    AttentionParams p;
    p.kv_tile = kv_tile;
    p.state = state;
    p.state_in = c0 > 0;
    p.finalize = c1 == Mk;
    const Status s = cpu()->attention(q, k.slice_rows(c0, c1), v.slice_rows(c0, c1), out, p);
    ASSERT_TRUE(s.ok()) << "chunk [" << c0 << ", " << c1 << "): " << s.message();
    c0 = c1;
    ++i;
    ++n;
  }
  if (calls) *calls = n;
}

std::string chunks_str(const std::vector<int64_t>& t) {
  std::string s = "{";
  for (int64_t x : t) s += std::to_string(x) + " ";
  return s + "} tiles per chunk";
}

class AttentionState : public ::testing::TestWithParam<StateCase> {};

TEST_P(AttentionState, ChunkedEqualsOneCallBitForBit) {
  const StateCase c = GetParam();
  Inputs in(c, static_cast<uint64_t>(c.Mq * 131 + c.Mk * 7 + c.H * 3 + c.Dh + c.kv_tile));
  ASSERT_GT(test::count_nonzero(in.q), c.Mq * c.H * c.Dh / 2);
  ASSERT_GT(test::count_nonzero(in.k), c.Mk * c.H * c.Dh / 2);
  ASSERT_GT(test::count_nonzero(in.v), c.Mk * c.H * c.Dh / 2);

  HostTensor whole(DType::bf16, {c.Mq, c.H, c.Dh});
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  ASSERT_TRUE(cpu()->attention(in.q, in.k, in.v, whole, p).ok());
  ASSERT_GT(test::count_nonzero(whole), 0);

  const std::vector<std::vector<int64_t>> chunkings = {
      {1}, {2}, {3}, {1, 3, 2}, {0},  // 1, 2, 3 tiles per chunk; 1, 3, 2, 2, ...; one chunk with state
  };
  for (const auto& tiles : chunkings) {
    HostTensor out(DType::bf16, {c.Mq, c.H, c.Dh});
    HostTensor state(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
    int calls = 0;
    run_chunked(in.q, in.k, in.v, out, state, c.kv_tile, tiles, &calls);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(test::same_bytes(out, whole)) << case_name(c) << ", " << chunks_str(tiles) << " (" << calls
                                              << " calls): chunked output differs from one call over all keys";
    EXPECT_TRUE(out.guards_intact() && state.guards_intact()) << "write outside out or state";
  }
}

TEST_P(AttentionState, QuerySlicesWithTheirOwnStates) {
  // Each query slice carries its own slice of states; slices of 1 row, odd rows and
  // the rest, each chunked differently, must give the rows of the one whole call.
  const StateCase c = GetParam();
  Inputs in(c, static_cast<uint64_t>(c.Mq * 17 + c.Mk + c.kv_tile));
  HostTensor whole(DType::bf16, {c.Mq, c.H, c.Dh});
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  ASSERT_TRUE(cpu()->attention(in.q, in.k, in.v, whole, p).ok());

  HostTensor out(DType::bf16, {c.Mq, c.H, c.Dh});
  HostTensor state(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  const std::vector<std::vector<int64_t>> chunkings = {{1}, {2}, {3}};
  int64_t a = 0, slice = 1;
  size_t n = 0;
  while (a < c.Mq) {
    const int64_t b = std::min(c.Mq, a + slice);
    run_chunked(in.q.slice_rows(a, b), in.k, in.v, out.view().slice_rows(a, b), state.view().slice_rows(a, b),
                c.kv_tile, chunkings[n % chunkings.size()]);
    if (HasFatalFailure()) return;
    a = b;
    slice = slice * 2 + 1;  // 1, 3, 7, ... rows
    ++n;
  }
  EXPECT_TRUE(test::same_bytes(out, whole)) << case_name(c) << ": query-sliced chunked output differs";
}

TEST_P(AttentionState, StateAfterChunksEqualsStateOfOneCall) {
  // Stricter than the bf16 output: the fp32 state after the tiles [0, n*kv_tile) fed
  // tile by tile equals, byte for byte, the state of one non-final call over them.
  const StateCase c = GetParam();
  const int64_t tiles = c.Mk / c.kv_tile;
  if (tiles < 2) GTEST_SKIP() << "fewer than two whole tiles";
  Inputs in(c, 11);
  const int64_t keys = tiles * c.kv_tile;
  HostTensor out(DType::bf16, {c.Mq, c.H, c.Dh});
  HostTensor one(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  HostTensor chunked(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  p.finalize = false;
  p.state = one;
  ASSERT_TRUE(cpu()->attention(in.q, in.k.slice_rows(0, keys), in.v.slice_rows(0, keys), out, p).ok());
  p.state = chunked;
  for (int64_t t = 0; t < tiles; ++t) {
    p.state_in = t > 0;
    const int64_t a = t * c.kv_tile, b = a + c.kv_tile;
    ASSERT_TRUE(cpu()->attention(in.q, in.k.slice_rows(a, b), in.v.slice_rows(a, b), out, p).ok());
  }
  ASSERT_GT(test::count_nonzero(one), 0);
  EXPECT_EQ(std::memcmp(one.data(), chunked.data(), one.bytes()), 0)
      << case_name(c) << ": the fp32 state after " << tiles << " one-tile chunks differs from one call's";
}

TEST_P(AttentionState, NonFinalChunkLeavesOutUntouched) {
  const StateCase c = GetParam();
  if (c.Mk < c.kv_tile) GTEST_SKIP() << "no whole tile to feed as a non-final chunk";
  Inputs in(c, 5);
  HostTensor out(DType::bf16, {c.Mq, c.H, c.Dh});
  std::memset(out.data(), 0x5C, out.bytes());
  std::vector<uint8_t> before(static_cast<const uint8_t*>(out.data()),
                              static_cast<const uint8_t*>(out.data()) + out.bytes());
  HostTensor state(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  AttentionParams p;
  p.kv_tile = c.kv_tile;
  p.state = state;
  p.finalize = false;
  ASSERT_TRUE(cpu()->attention(in.q, in.k.slice_rows(0, c.kv_tile), in.v.slice_rows(0, c.kv_tile), out, p).ok());
  EXPECT_EQ(std::memcmp(before.data(), out.data(), out.bytes()), 0) << "a non-final chunk wrote out";
  EXPECT_GT(test::count_nonzero(state), 0) << "a non-final chunk saved no state";
  EXPECT_TRUE(state.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, AttentionState,
    ::testing::Values(StateCase{1, 37, 1, 32, 8},      // Mq = 1, Mk not a multiple of kv_tile
                      StateCase{5, 100, 2, 64, 16},    // odd Mq, ragged last tile
                      StateCase{7, 96, 3, 128, 32},    // Mk a multiple of kv_tile
                      StateCase{33, 257, 2, 64, 64},   // one key past the last whole tile
                      StateCase{3, 61, 2, 40, 4},      // Dh not a multiple of 16, tiny tiles
                      StateCase{4, 700, 1, 32, 300},   // tiles longer than the op's score chunk
                      StateCase{2, 20, 2, 32, 1},      // kv_tile = 1: every key a tile
                      StateCase{64, 1000, 2, 128, 256}),
    [](const ::testing::TestParamInfo<StateCase>& i) { return case_name(i.param); });

TEST(AttentionStateErrors, MalformedSettingsAreInvalidArgument) {
  const StateCase c{3, 64, 2, 32, 16};
  Inputs in(c, 9);
  HostTensor out(DType::bf16, {c.Mq, c.H, c.Dh});
  HostTensor state(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  const auto call = [&](const AttentionParams& p, int64_t keys) {
    return cpu()->attention(in.q, in.k.slice_rows(0, keys), in.v.slice_rows(0, keys), out, p);
  };
  HostTensor narrow(DType::f32, {c.Mq, c.H, c.Dh + kAttentionStateExtra - 1});
  HostTensor wrong_rows(DType::f32, {c.Mq + 1, c.H, c.Dh + kAttentionStateExtra});
  HostTensor wrong_heads(DType::f32, {c.Mq, c.H + 1, c.Dh + kAttentionStateExtra});
  HostTensor bf16_state(DType::bf16, {c.Mq, c.H, c.Dh + kAttentionStateExtra});
  HostTensor flat(DType::f32, {c.Mq, c.H * (c.Dh + kAttentionStateExtra)});
  HostTensor wide(DType::f32, {c.Mq, c.H, 2 * (c.Dh + kAttentionStateExtra)});
  test::expect_state_refusals(call, state, c.kv_tile,
                              {{narrow.view(), "narrow"},
                               {wrong_rows.view(), "extra row"},
                               {wrong_heads.view(), "extra head"},
                               {bf16_state.view(), "bf16"},
                               {flat.view(), "2-d"},
                               {wide.view().cols(0, c.Dh + kAttentionStateExtra), "strided rows"}});
  EXPECT_TRUE(state.guards_intact() && out.guards_intact());
}

}  // namespace
}  // namespace ls
