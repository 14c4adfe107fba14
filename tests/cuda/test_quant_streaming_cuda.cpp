// The plan-invariance property on quantised models (tests/quant_streaming_cases.h) on the
// GPU: int8 ConvRot, fp8 e4m3 (fp8 tensor cores on SM >= 8.9, the dequantising path below),
// int8 with quantised AdaLN linears, mixed formats per layer, blocks of different layouts
// (bf16 edge blocks, int8 and fp8 blocks) and --precision fp8: every
// residency, slicing, offload and budget plan gives the all-resident stock bytes on the same
// GPU (memcmp). Skips without a GPU.
#include "quant_streaming_cases.h"

using namespace ls;
using namespace ls::test::quant;

namespace {
bool have_gpu() { return make_backend("cuda").ok(); }
}  // namespace

TEST(CudaQuantStreaming, KnobsMatchResidentStock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (uint64_t seed = 1; seed <= 3; ++seed) check_knobs(seed, Kind::int8, 2, 8, "cuda");
  for (uint64_t seed = 5; seed <= 7; ++seed) check_knobs(seed, Kind::fp8, 2, 8, "cuda");
  check_knobs(9, Kind::int8_full, 2, 8, "cuda");
  check_knobs(10, Kind::mixed, 3, 8, "cuda");
  check_knobs(13, Kind::fp8_convert, 2, 8, "cuda");
  check_knobs(14, Kind::fp8_dynamic, 2, 8, "cuda");
  check_knobs(31, Kind::mixed_blocks, 6, 8, "cuda");  // bf16 edge blocks, an fp8 and an int8 block
}

TEST(CudaQuantStreaming, BudgetSweepsMatchAndFit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_budgets(21, Kind::int8, 3, 8, "cuda");
  check_budgets(22, Kind::fp8, 3, 8, "cuda");
  check_budgets(23, Kind::mixed, 3, 8, "cuda");
  check_budgets(34, Kind::mixed_blocks, 6, 8, "cuda");
}
