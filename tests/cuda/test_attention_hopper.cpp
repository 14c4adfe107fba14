// The Hopper attention kernel (src/backend/cuda/attention_hopper.cu, numerics attention
// hopper): error vs an fp64 reference (attention_test_util.h) within 2x the CPU
// reference's (DESIGN.md §4) at awkward sizes, query slices (1 row, 97 rows, a last
// slice of 1 row, 4096-row slices at H3 width) give the bytes of the whole call
// (memcmp), streamed keys (p.state) give the bytes of one call, every kv_tile that is a
// multiple of the key block (128; 176 for configurations 7, 8) gives the same bytes, the
// same checks for the kernel configurations with arithmetic of their own and for the
// cluster configurations, the speed-only configurations give equal bytes, other head
// dims and unknown configurations are a clear Status, and a TFLOP/s table (hopper, cudnn,
// native side by side) at S = 111274, 56 x 128. Skips without a GPU, or where the build
// or the device has no Hopper kernel (set_numerics says why).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <iterator>
#include <vector>

#include "backend/cuda/attention_cudnn.cuh"
#include "backend/cuda/attention_hopper.cuh"
#include "attention_test_util.h"
#include "cuda_test_util.h"

namespace ls::cudatest {
namespace {

// Selects attention hopper for the scope (with the default kv_tile unless given).
#define LS_NEED_HOPPER()                                                              \
  LS_NEED_GPU();                                                                      \
  const ScopedNumerics hopper_(*G->cuda, attention_numerics("hopper"));               \
  if (!hopper_.status().ok()) GTEST_SKIP() << hopper_.status().message()

struct Case {
  int64_t Mq, Mk, H, kv_tile;
  float qscale;
};
constexpr int64_t kDh = 128;

// Launches kernel configuration `schedule` for the scope (attention_hopper.cu lists them).
class ScopedSchedule {
 public:
  explicit ScopedSchedule(int schedule) : keep_(cuda::attention_hopper_schedule()) {
    cuda::set_attention_hopper_schedule(schedule);
  }
  ~ScopedSchedule() { cuda::set_attention_hopper_schedule(keep_); }
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  int keep_;
};

// The configurations with arithmetic of their own (each a fixed function of the inputs,
// kv_tile and Mk): 6 the first form (exp2f), 7 blocks of 176 keys, 16-18 a quarter, a
// third and half of the exponentials by the FMA-pipe polynomial. The default is tested
// by every other test.
constexpr int kOwnBitsSchedules[] = {6, 7, 16, 17, 18};
// Clusters of 2 CTAs sharing K and V (TMA multicast): the default's bits, checked here
// for odd CTA counts (a padding CTA past Mq), slices and streamed keys as well.
constexpr int kClusterSchedules[] = {20, 23};

// Parity vs the CPU reference and fp64, with K and V as strided column slices of one
// fused buffer (as in the block), guard bytes around the output, and query slices of
// 1 row, the last row and a middle range (memcmp against the whole call).
void check_case(Gpu* G, const Case& c) {
  SCOPED_TRACE("hopper attention Mq=" + std::to_string(c.Mq) + " Mk=" + std::to_string(c.Mk) + " H=" +
               std::to_string(c.H) + " kv_tile=" + std::to_string(c.kv_tile));
  AttentionParity r;
  check_attention_case(G, AttentionCase{c.Mq, c.Mk, c.H, kDh, c.kv_tile, c.qscale}, 190, "hopper attention", r);
  if (!r.ran) return;
  if (c.Mk > 1) {  // one key: out = v exactly, on every path
    EXPECT_GT(r.e_cpu, 0.0) << "the reference should carry bf16 rounding error (inputs trivial?)";
  }
  if (c.Mq > 1) {
    EXPECT_FALSE(same_bytes(host_rows(r.got, 0, 1), host_rows(r.got, 1, 2))) << "output rows should differ";
  }
}

TEST(HopperAttention, Parity) {
  LS_NEED_HOPPER();
  const Case cases[] = {
      {97, 1025, 2, 1024, 1.0f},   // two tiles, the second of 1 key; one CTA of 97 rows
      {1, 1, 2, 1024, 1.0f},       // one query, one key
      {1025, 300, 3, 8192, 3.0f},  // 9 CTAs, the last of 1 row; a short last block
      {97, 1025, 2, 100, 3.0f},    // kv_tile 100: blocks of 100 keys, never straddling a tile
      {200, 2000, 2, 1000, 2.0f},  // kv_tile 1000: blocks of 128 and a short one per tile
      {130, 4096, 1, 8192, 8.0f},  // peaked softmax (large scores): the running max moves
  };
  for (const Case& c : cases) check_case(G, c);
}

// The same parity and query-slice checks for the configurations whose bits differ from
// the default's.
TEST(HopperAttention, ParityOtherConfigurations) {
  LS_NEED_HOPPER();
  const Case cases[] = {
      {97, 1025, 2, 1024, 1.0f},   // two tiles, the second of 1 key
      {1025, 300, 3, 8192, 3.0f},  // 9 CTAs, the last of 1 row; a short last block
      {200, 2000, 2, 1000, 2.0f},  // short blocks at each kv_tile's end
      {130, 4096, 1, 8192, 8.0f},  // peaked softmax: the running max moves
  };
  std::vector<int> schedules(std::begin(kOwnBitsSchedules), std::end(kOwnBitsSchedules));
  schedules.insert(schedules.end(), std::begin(kClusterSchedules), std::end(kClusterSchedules));
  for (int schedule : schedules) {
    SCOPED_TRACE("schedule " + std::to_string(schedule));
    std::printf("  schedule %d\n", schedule);
    const ScopedSchedule use(schedule);
    for (const Case& c : cases) check_case(G, c);
  }
}

// The blocks are [128 i, 128 i + 128) for every kv_tile that is a multiple of 128, so
// those kv_tiles give the same bytes; 100 gives other blocks (and other bytes).
TEST(HopperAttention, KvTileMultiplesOf128SameBytes) {
  LS_NEED_HOPPER();
  const int64_t Mq = 300, Mk = 3000, H = 2;
  const QkvInputs in = qkv_inputs(G, Mq, Mk, H, kDh, 230, 3.0f);
  const DevBuf &dq = in.dq, &dk = in.dk, &dv = in.dv;
  // One call per kv_tile, in order, under the schedule in force: the first three (multiples
  // of the key block) give the same bytes, the fourth walks other blocks.
  const auto check_tiles = [&](const std::string& what, const std::vector<int64_t>& tiles,
                               std::vector<HostBuf>& outs) {
    for (int64_t kv_tile : tiles) {
      DevBuf o = dev_buf(G, DType::bf16, {Mq, H, kDh});
      AttentionParams p;
      p.kv_tile = kv_tile;
      Status s = G->cuda->attention(dq.v, dk.v, dv.v, o.v, p);
      ASSERT_TRUE(s.ok()) << "kv_tile " << kv_tile << ": " << s.message();
      outs.push_back(download(G, o.v));
    }
    ASSERT_EQ(outs.size(), 4u);
    for (size_t i : {1, 2})
      EXPECT_TRUE(same_bytes(outs[0], outs[i])) << what << "kv_tile " << tiles[0] << " vs " << tiles[i];
    EXPECT_FALSE(same_bytes(outs[0], outs[3]))
        << what << "kv_tile " << tiles[3] << " walks other blocks and should round differently";
  };
  std::vector<HostBuf> outs, outs176;
  check_tiles("", {128, 1024, 8192, 100}, outs);
  // Blocks of 176 keys (configuration 7): multiples of 176 agree; 1000 (5 blocks of 176
  // and one of 120 per tile) walks other blocks.
  const ScopedSchedule use(7);
  check_tiles("176-key blocks: ", {176, 1760, 8800, 1000}, outs176);
  ASSERT_TRUE(outs.size() == 4u && outs176.size() == 4u);
  EXPECT_FALSE(same_bytes(outs176[0], outs[0])) << "176-key blocks should round differently from 128-key blocks";
}

// H3 width (56 heads x 128) in a fused qkv buffer: slices of 4096, 97 and 1 rows give
// the bytes of the whole call (compared on the device).
TEST(HopperAttention, QuerySliceInvarianceH3) {
  LS_NEED_HOPPER();
  AttentionParams p;
  p.kv_tile = G->cuda->default_kv_tile();
  std::optional<SliceInputs> r;
  check_query_slices_h3(G, p, 195, r);
  if (::testing::Test::HasFatalFailure()) return;
  const TensorView &q = r->q, &k = r->k, &v = r->v;
  const TensorView *full = &r->full, *part = &r->part;
  // The hopper kernel is its own algorithm: its bytes differ from the native kernel's.
  {
    const ScopedNumerics native(*G->cuda, attention_numerics("native"));
    ASSERT_TRUE(native.status().ok());
    ASSERT_TRUE(G->cuda->attention(q.slice_rows(0, 97), k, v, part->slice_rows(0, 97), p).ok());
  }
  EXPECT_NE(count_diff(G, full->slice_rows(0, 97), part->slice_rows(0, 97)), 0u)
      << "hopper gave the native kernel's bytes: is the hopper path reached at all?";
}

// Streamed keys (AttentionParams::state): the keys fed in chunks of whole tiles, the fp32
// state carried in p.state, give the bytes of one call over all keys, also for a query
// slice of one row.
void check_streamed_keys(Gpu* G) {
  const int64_t H = 3;
  StreamedKeys r;
  streamed_keys(G, H, kDh, "hopper attention", r);
  if (!r.ran) return;
  EXPECT_TRUE(same_bytes(r.a, r.b)) << "streamed keys differ from one call";
  // One query row, streamed.
  DevBuf one = dev_buf(G, DType::bf16, {1, H, kDh});
  const Status s = attention_key_chunks(G, r.in.dq.v.slice_rows(1500, 1501), r.in.dk.v, r.in.dv.v, one.v,
                                        r.state.slice_rows(0, 1), r.p);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(same_bytes(download(G, one.v), host_rows(r.a, 1500, 1501))) << "one streamed query row";
}

TEST(HopperAttention, StreamedKeysSameBytes) {
  LS_NEED_HOPPER();
  check_streamed_keys(G);  // the default configuration
  std::vector<int> schedules(std::begin(kOwnBitsSchedules), std::end(kOwnBitsSchedules));
  schedules.insert(schedules.end(), std::begin(kClusterSchedules), std::end(kClusterSchedules));
  for (int schedule : schedules) {
    SCOPED_TRACE("schedule " + std::to_string(schedule));
    const ScopedSchedule use(schedule);
    check_streamed_keys(G);
  }
}

// The speed-only knobs (ping-pong on named barriers or free-running, softmax under or
// after the GEMMs, 2 or 3 stages, Q from registers or shared memory) give the same bytes
// (alone or in clusters of 2 CTAs sharing K and V)
// within each family of equal arithmetic: {0-5, 13, 20-23} (128-key blocks, MUFU exponentials),
// {7, 8} (176-key blocks), {16, 19} (a quarter of the exponentials by the polynomial).
TEST(HopperAttention, SchedulesSameBytes) {
  LS_NEED_HOPPER();
  const int64_t Mq = 1000, Mk = 5000, H = 4;
  const QkvInputs in = qkv_inputs(G, Mq, Mk, H, kDh, 240, 2.0f);
  const DevBuf &dq = in.dq, &dk = in.dk, &dv = in.dv;
  const auto run = [&](int schedule) {
    const ScopedSchedule use(schedule);
    DevBuf o = dev_buf(G, DType::bf16, {Mq, H, kDh});
    AttentionParams p;
    p.kv_tile = 1000;
    Status s = G->cuda->attention(dq.v, dk.v, dv.v, o.v, p);
    EXPECT_TRUE(s.ok()) << s.message();
    return download(G, o.v);
  };
  const std::vector<std::vector<int>> families = {{1, 0, 2, 3, 4, 5, 13, 20, 21, 22, 23}, {7, 8}, {16, 19}};
  std::vector<HostBuf> firsts;
  for (const std::vector<int>& family : families) {
    const HostBuf first = run(family[0]);
    EXPECT_FALSE(same_bytes(host_rows(first, 0, 1), host_rows(first, 1, 2))) << "output rows should differ";
    for (size_t i = 1; i < family.size(); ++i)
      EXPECT_TRUE(same_bytes(first, run(family[i]))) << "schedule " << family[i] << " differs from " << family[0];
    firsts.push_back(first);
  }
  for (size_t i = 1; i < firsts.size(); ++i)
    EXPECT_FALSE(same_bytes(firsts[0], firsts[i])) << "family " << i << " should have arithmetic of its own";
}

// An unknown configuration number is a Status, not a silent fallback.
TEST(HopperAttention, UnknownScheduleIsAStatus) {
  LS_NEED_HOPPER();
  HostBuf q = random_buf(DType::bf16, {4, 2, kDh}, 9, 1.0f);
  DevBuf dq = dev_from(G, q), dout = dev_buf(G, DType::bf16, {4, 2, kDh});
  const ScopedSchedule use(99);
  const Status s = G->cuda->attention(dq.v, dq.v, dq.v, dout.v, AttentionParams{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("configuration 99"), std::string::npos) << s.message();
}

TEST(HopperAttention, OtherHeadDimsAreAStatus) {
  LS_NEED_HOPPER();
  HostBuf q = random_buf(DType::bf16, {4, 2, 64}, 7, 1.0f);
  DevBuf dq = dev_from(G, q), dout = dev_buf(G, DType::bf16, {4, 2, 64});
  const Status s = G->cuda->attention(dq.v, dq.v, dq.v, dout.v, AttentionParams{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
  EXPECT_NE(s.message().find("head_dim 64"), std::string::npos) << s.message();
}

// Throughput at H3 size, the three algorithms side by side at each one's default kv_tile
// (cuDNN with the workspace it needs), non-causal, one call over all S queries and in
// the query slices the planner uses (LAYERSTREAM_HOPPER_BENCH_SLICE rows, default 16384).
// Prints a table; LAYERSTREAM_HOPPER_BENCH_JSON=path also writes it as JSON.
TEST(HopperAttention, ThroughputH3) {
  LS_NEED_HOPPER();
  const int64_t H = 56;
  const int64_t S = std::getenv("LAYERSTREAM_HOPPER_BENCH_S") ? std::atoll(std::getenv("LAYERSTREAM_HOPPER_BENCH_S")) : 111274;
  const int64_t slice =
      std::getenv("LAYERSTREAM_HOPPER_BENCH_SLICE") ? std::atoll(std::getenv("LAYERSTREAM_HOPPER_BENCH_SLICE")) : 16384;
  const std::optional<TimingInputs> inputs = timing_inputs(G, S, H, kDh);
  ASSERT_TRUE(inputs.has_value());
  const TensorView &q = inputs->q, &k = inputs->k, &v = inputs->v;
  const TensorView* out = &inputs->out;
  const double flops = 4.0 * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(H * kDh);
  std::string json = "{\"S\": " + std::to_string(S) + ", \"H\": 56, \"Dh\": 128, \"causal\": false, \"slice\": " +
                     std::to_string(slice) + ", \"runs\": [";
  bool first = true;
  std::printf("  %-11s %8s %8s %10s %10s\n", "algo", "kv_tile", "slice", "ms", "TFLOP/s");
  // LAYERSTREAM_HOPPER_BENCH_SCHEDULES=1,0,...: the hopper schedules to time
  // (attention_hopper.cu; the default schedule alone when unset).
  const int keep_schedule = cuda::attention_hopper_schedule();
  std::vector<std::string> names;
  if (const char* list = std::getenv("LAYERSTREAM_HOPPER_BENCH_SCHEDULES")) {
    std::string l = list;
    for (size_t at = 0; at <= l.size();) {
      const size_t comma = std::min(l.find(',', at), l.size());
      names.push_back("hopper-s" + l.substr(at, comma - at));
      at = comma + 1;
    }
  } else {
    names.push_back("hopper");
  }
  names.push_back("cudnn");
  names.push_back("native");
  for (const std::string& label : names) {
    const char* name = label.c_str();
    const bool hopper = label.rfind("hopper", 0) == 0;
    const char* path = hopper ? "hopper" : name;
    cuda::set_attention_hopper_schedule(label.rfind("hopper-s", 0) == 0 ? std::atoi(name + 8) : keep_schedule);
    Numerics n = attention_numerics(path);
    const ScopedNumerics use(*G->cuda, n);
    if (!use.status().ok()) {
      std::printf("  %-11s unavailable: %s\n", name, use.status().message().c_str());
      continue;
    }
    TensorView ws_keep = G->workspace;
    std::optional<TensorView> ws;
    if (std::string(path) == "cudnn") {
      const auto bytes = static_cast<int64_t>(std::max(G->cuda->workspace_bytes(), cuda::attention_cudnn_workspace_bytes(H, kDh)));
      auto w = G->arena->alloc(DType::u8, {bytes}, "cudnn attention workspace");
      ASSERT_TRUE(w.ok());
      ws = *w;
      ASSERT_TRUE(G->cuda->set_workspace(*ws).ok());
    }
    AttentionParams p;
    p.kv_tile = G->cuda->default_kv_tile();
    // A hopper schedule other than the default: the sliced run only (fewer device seconds).
    const bool variant = label.rfind("hopper-s", 0) == 0 && std::atoi(name + 8) != keep_schedule;
    for (int64_t sl : {S, slice}) {
      if (variant && sl == S && S != slice) continue;
      auto run = [&] {
        for (int64_t a = 0; a < S; a += sl) {
          const int64_t b = std::min(S, a + sl);
          LS_CHECK(G->cuda->attention(q.slice_rows(a, b), k, v, out->slice_rows(a, b), p).ok());
        }
      };
      run();  // warm-up (cuDNN plan build)
      ASSERT_TRUE(G->cuda->synchronize().ok());
      const int reps = 3;
      std::vector<double> ts;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        ASSERT_TRUE(G->cuda->synchronize().ok());
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      const double t = ts[reps / 2];
      std::printf("  %-11s %8lld %8lld %10.1f %10.1f\n", name, static_cast<long long>(p.kv_tile),
                  static_cast<long long>(sl), t * 1e3, flops / t / 1e12);
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s{\"algorithm\": \"%s\", \"kv_tile\": %lld, \"slice\": %lld, \"ms\": %.3f, \"tflops\": %.1f}",
                    first ? "" : ", ", name, static_cast<long long>(p.kv_tile), static_cast<long long>(sl), t * 1e3,
                    flops / t / 1e12);
      json += buf;
      first = false;
    }
    if (ws) {
      ASSERT_TRUE(G->cuda->set_workspace(ws_keep).ok());
    }
  }
  cuda::set_attention_hopper_schedule(keep_schedule);
  json += "]}\n";
  if (const char* path = std::getenv("LAYERSTREAM_HOPPER_BENCH_JSON")) {
    if (FILE* f = std::fopen(path, "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
}

}  // namespace
}  // namespace ls::cudatest
