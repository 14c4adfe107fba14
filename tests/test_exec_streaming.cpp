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
