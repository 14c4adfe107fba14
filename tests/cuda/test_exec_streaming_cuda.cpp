// The streaming cases of tests/streaming_cases.h on the GPU, where the transfer queue
// really overlaps the compute queue: weight slots with and without prefetch, K/V
// offload chunks double-buffered on the transfer queue with the attention state
// carried across chunks (pass 1 attending the first query slice against each chunk
// while it is copied out), residual offload with its two slice buffers on the transfer
// queue, and every budget plan from the minimum up give the bytes of the all-resident
// stock run on the same GPU (memcmp), and the device bytes the engine held stay within
// the plan. Here a transfer copy can also run too EARLY (a missing compute -> transfer
// wait), the race the CPU's deferred transfer queue cannot show. Skips without a GPU.
#include "streaming_cases.h"

using namespace ls;

namespace {
bool have_gpu() { return make_backend("cuda").ok(); }
}  // namespace

TEST(CudaExecStreaming, KnobsMatchResidentStock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 1; seed <= 6; ++seed) test::check_streaming_knobs(seed, "cuda", 3, false, 10);
}

TEST(CudaExecStreaming, WideConfigKnobs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 101; seed <= 103; ++seed) test::check_streaming_knobs(seed, "cuda", 3, true, 10);
}

TEST(CudaExecStreaming, BudgetSweepMatchesAndFits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 11; seed <= 13; ++seed) test::check_streaming_budgets(seed, "cuda", 3, false, 10);
  test::check_streaming_budgets(201, "cuda", 3, true, 10);
}

// Masks, keyframe and references at augmentation 0.5, a PDD bank of 4 on both heads.
TEST(CudaExecStreaming, InputModesKnobsAndBudgets) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 31; seed <= 33; ++seed) test::check_streaming_knobs(seed, "cuda", 2, false, 10, /*all_modes=*/true);
  test::check_streaming_knobs(131, "cuda", 2, true, 8, /*all_modes=*/true);
  test::check_streaming_budgets(41, "cuda", 2, false, 10, /*all_modes=*/true);
}

// Attention int8 at head dim 128 (the CUDA kernels' only one) and kv_tile 128: statistics
// over pass-1 slices, the prepare (once, or per chunk through the host with K/V offload),
// int8 chunks streamed in pass 2: every knob and budget gives the stock run's bytes.
TEST(CudaExecStreaming, Int8KnobsAndBudgets) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 1; seed <= 3; ++seed) test::check_streaming_knobs(seed, "cuda", 3, false, 10, false, /*int8=*/true);
  test::check_streaming_knobs(101, "cuda", 2, true, 8, false, /*int8=*/true);
  test::check_streaming_budgets(11, "cuda", 3, false, 8, false, /*int8=*/true);
}
