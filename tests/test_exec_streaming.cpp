// Weight streaming, K/V offload and residual offload never change an output bit, and
// stay within the budget plan's device bytes: on the CPU backend (every queue is
// synchronous there, so this checks the executor's bookkeeping: slots, chunk walks,
// state carrying, residual slices). The same cases run on the GPU in
// tests/cuda/test_exec_streaming_cuda.cpp, where the queues really overlap.
#include "streaming_cases.h"

using namespace ls;

TEST(ExecStreaming, KnobsMatchResidentStock) {
  for (uint64_t seed = 1; seed <= 8; ++seed) test::check_streaming_knobs(seed, "cpu", 3, false, 12);
}

TEST(ExecStreaming, WideConfigKnobs) { test::check_streaming_knobs(101, "cpu", 2, true, 8); }

// The same cases with a transfer queue that lags (deferred_transfer_backend.h): its
// copies run only when a fence wait needs them, so a missing wait (a slice reading rows
// before they land, a K/V chunk attended before its load, a buffer overwritten while a
// copy out still has to read it) changes bytes and fails the memcmp.
TEST(ExecStreaming, DeferredTransferQueueKnobs) {
  for (uint64_t seed = 1; seed <= 6; ++seed) test::check_streaming_knobs(seed, "cpu-deferred", 3, false, 12);
  test::check_streaming_knobs(101, "cpu-deferred", 2, true, 8);
}

TEST(ExecStreaming, DeferredTransferQueueBudgets) {
  for (uint64_t seed = 11; seed <= 13; ++seed) test::check_streaming_budgets(seed, "cpu-deferred", 3, false, 12);
  test::check_streaming_knobs(31, "cpu-deferred", 2, false, 10, /*all_modes=*/true);
}

TEST(ExecStreaming, BudgetSweepMatchesAndFits) {
  for (uint64_t seed = 11; seed <= 14; ++seed) test::check_streaming_budgets(seed, "cpu", 3, false, 12);
}

// Every input mode beyond t2va (partial masks, keyframe and references at augmentation
// 0.5, caller-drawn and generated condition noise, a PDD bank of 4 on both heads) under
// residency x offload x slices, and under every budget plan.
TEST(ExecStreaming, InputModesKnobs) {
  for (uint64_t seed = 31; seed <= 33; ++seed) test::check_streaming_knobs(seed, "cpu", 2, false, 12, /*all_modes=*/true);
}

TEST(ExecStreaming, InputModesBudgetSweep) { test::check_streaming_budgets(41, "cpu", 2, false, 10, /*all_modes=*/true); }

// Attention int8 (docs/int8-attention.md §6): the statistics over pass-1 slices, the prepare
// (once resident; per chunk, through the host, with K/V offload) and the int8 chunks of
// pass 2 give the stock run's bytes under every knob and budget; the deferred transfer
// queue checks the fences of the prepare walk.
TEST(ExecStreaming, Int8KnobsMatchResidentStock) {
  for (uint64_t seed = 1; seed <= 4; ++seed) test::check_streaming_knobs(seed, "cpu", 3, false, 12, false, /*int8=*/true);
  test::check_streaming_knobs(101, "cpu", 2, true, 8, false, /*int8=*/true);
}

TEST(ExecStreaming, Int8DeferredTransferQueue) {
  for (uint64_t seed = 1; seed <= 3; ++seed)
    test::check_streaming_knobs(seed, "cpu-deferred", 3, false, 12, false, /*int8=*/true);
  test::check_streaming_budgets(11, "cpu-deferred", 3, false, 10, false, /*int8=*/true);
  // The wide case: S ~ 1,100 rows in chunks of kv_tile rows, so the prepare walk reuses each
  // int8 chunk buffer while an earlier chunk's copy out may still be held back.
  test::check_streaming_knobs(101, "cpu-deferred", 2, true, 8, false, /*int8=*/true);
}

TEST(ExecStreaming, Int8BudgetSweepAndInputModes) {
  for (uint64_t seed = 11; seed <= 12; ++seed) test::check_streaming_budgets(seed, "cpu", 3, false, 10, false, /*int8=*/true);
  test::check_streaming_knobs(31, "cpu", 2, false, 10, /*all_modes=*/true, /*int8=*/true);
}

// [int8 attention] K/V offload over several statistics blocks (kInt8StatBlock keys, contract
// v3): the prepare walk computes each block's K, V into the bf16 scratch (one block), takes
// its statistics and prepares its segments into the chunks they belong to, attending the
// first query slice to a chunk once its last segment is prepared. One block at tiny width,
// S > 4,096 (two statistics blocks): the default int8 chunk (all keys in one chunk: two
// segments), 1,024-key chunks (a block in four chunks, and a chunk across the boundary
// where S's chunks do not divide it) and 4,608-key chunks (block 0 plus 512 keys of block 1,
// then the rest), the latter with residual offload, on the CPU and the deferred transfer
// queue; every run gives the stock run's bytes.
TEST(ExecStreaming, Int8OffloadPreparesBlocksAcrossChunks) {
  for (const char* device : {"cpu", "cpu-deferred"}) {
    SCOPED_TRACE(device);
    std::unique_ptr<Backend> be = test::streaming_backend(device);
    ASSERT_TRUE(be);
    Numerics n = be->numerics();
    n.attention = AttentionAlgorithm::int8;
    n.kv_tile = 0;
    ASSERT_TRUE(be->set_numerics(n, be->diagnostics()).ok());
    std::mt19937_64 rng(7);
    test::StreamingCase c;
    c.cfg = test::tiny_cfg(rng, /*vary=*/false);
    c.cfg.num_layers = 1;
    c.cfg.refiner_layers = 0;
    c.cfg.head_dim = 32;
    c.src = std::make_unique<h3::H3SyntheticSource>(c.cfg, 7);
    c.cond = test::clip(226, 256, 256, 16);
    c.in = test::random_inputs(rng, c.cfg, c.cond);
    c.kv_tile = kInt8DefaultKvTile;
    exec::Plan stock;
    test::StreamingRun ref;
    ASSERT_TRUE(test::stock_run(*c.src, c, *be, stock, ref));
    const int64_t S = stock.sizes.S;
    ASSERT_GT(S, kInt8StatBlock + 512) << "the clip must give two statistics blocks";
    ASSERT_LT(S, exec::kInt8DefaultKvChunkKeys);
    // cpu: the default chunk; the deferred queue: both chunkings, the second with the residual
    // offloaded too (five forwards in all: the stock runs are the costly part).
    const bool deferred = std::string(device) == "cpu-deferred";
    for (const int64_t chunk_rows : {int64_t{0}, int64_t{1024}, int64_t{4608}}) {
      if (deferred != (chunk_rows == 4608)) continue;
      for (const bool res_off : {false, true}) {
        if (res_off != (deferred && chunk_rows != 0)) continue;
        exec::PlanKnobs k;
        k.kv_tile = c.kv_tile;
        k.int8_attention = true;
        k.kv_offload = true;
        k.kv_chunk_rows = chunk_rows;
        k.residual_offload = res_off;
        k.attn_chunk_tokens = S / 2 + 1;
        k.mlp_chunk_tokens = S / 2 + 1;
        auto p = exec::make_plan(c.cfg, c.cond, k);
        ASSERT_TRUE(p.ok()) << p.error().message;
        EXPECT_EQ(p->kv_chunk, chunk_rows == 0 ? S : chunk_rows);
        const test::StreamingRun got = test::run_streaming(c, *be, exec::Residency{}, *p);
        test::expect_same(ref, got, "S " + std::to_string(S) + ", chunk " + std::to_string(p->kv_chunk) +
                                        (res_off ? ", residual offloaded" : ""));
        if (got.ok) {
          EXPECT_EQ(got.r.report.pcie_kv_bytes,
                    2 * static_cast<uint64_t>(S) * static_cast<uint64_t>(2 * c.cfg.inner() + 4 * c.cfg.heads));
        }
      }
    }
    test::expect_deferred(*be);
  }
}
