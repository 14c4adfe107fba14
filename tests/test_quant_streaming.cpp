// The plan-invariance property on quantised models, CPU backend (tests/quant_streaming_cases.h;
// the GPU's in tests/cuda/test_quant_streaming_cuda.cpp).
#include "quant_streaming_cases.h"

using namespace ls;
using namespace ls::test::quant;

TEST(QuantStreaming, Int8KnobsMatchResidentStock) {
  for (uint64_t seed = 1; seed <= 4; ++seed) check_knobs(seed, Kind::int8, 2, 8, "cpu");
}
TEST(QuantStreaming, Fp8KnobsMatchResidentStock) {
  for (uint64_t seed = 5; seed <= 8; ++seed) check_knobs(seed, Kind::fp8, 2, 8, "cpu");
}
TEST(QuantStreaming, Int8FullKnobsMatchResidentStock) { check_knobs(9, Kind::int8_full, 2, 8, "cpu"); }
TEST(QuantStreaming, MixedKnobsMatchResidentStock) {
  for (uint64_t seed = 10; seed <= 12; ++seed) check_knobs(seed, Kind::mixed, 3, 8, "cpu");
}
TEST(QuantStreaming, Fp8ConvertKnobsMatchResidentStock) {
  check_knobs(13, Kind::fp8_convert, 2, 8, "cpu");
  check_knobs(14, Kind::fp8_dynamic, 2, 8, "cpu");
}
TEST(QuantStreaming, BudgetSweepsMatchAndFit) {
  check_budgets(21, Kind::int8, 3, 8, "cpu");
  check_budgets(22, Kind::fp8, 3, 8, "cpu");
  check_budgets(23, Kind::mixed, 3, 8, "cpu");
}
