// The plan-invariance property on quantised models, CPU backend (tests/quant_streaming_cases.h;
// the GPU's in tests/cuda/test_quant_streaming_cuda.cpp).
#include "quant_streaming_cases.h"

#include "exec/budget_plan.h"
#include "exec/weights.h"
#include "model/h3/checkpoint.h"

#include <cstring>

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

// Blocks of different layouts (the _skip_edges files: bf16 edge blocks; here also an fp8
// block): every residency, both slot counts, every slicing and offload give the resident
// stock bytes. Before per-block slot layouts, the weight store aborted on such a model
// ("block 2 differs in layout from block 0").
TEST(QuantStreaming, MixedBlockLayoutsKnobsMatchResidentStock) {
  for (uint64_t seed = 31; seed <= 33; ++seed) check_knobs(seed, Kind::mixed_blocks, 6, 8, "cpu");
}
TEST(QuantStreaming, MixedBlockLayoutsBudgetSweepMatchesAndFits) { check_budgets(34, Kind::mixed_blocks, 6, 10, "cpu"); }

// The weight store and the planner count the same bytes on a mixed-layout model: resident
// blocks at their own sizes, slots of the largest streamed block, each streamed block
// copied with its own bytes, pinned copies of the streamed blocks' own bytes.
TEST(QuantStreaming, MixedBlockLayoutsWeightBytesMatchThePlanner) {
  auto be = make_backend("cpu");
  ASSERT_TRUE(be.ok());
  ls::test::StreamingCase c = quant_case(35, Kind::mixed_blocks, 6, false);
  const int64_t L = c.cfg.num_layers;
  const exec::WeightTally w = exec::tally_weights(c.src->specs());
  ASSERT_EQ(w.blocks.size(), static_cast<size_t>(L));
  // Not vacuous: three different block sizes (bf16 edges, fp8 block 2, int8 block 3).
  std::set<uint64_t> sizes(w.blocks.begin(), w.blocks.end());
  EXPECT_EQ(sizes.size(), 3u);
  EXPECT_EQ(w.blocks[0], w.block);
  EXPECT_LT(w.blocks[3], w.blocks[0]);
  exec::PlanKnobs k;
  k.kv_tile = c.kv_tile;
  auto plan = exec::make_plan(c.cfg, c.cond, k);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  for (int64_t slots : {1, 2}) {
    for (int64_t R = 0; R <= L; ++R) {
      SCOPED_TRACE("resident " + std::to_string(R) + ", slots " + std::to_string(slots));
      exec::Residency res;
      res.resident_blocks = R;
      res.slots = slots;
      res.release_source = false;
      if (R == L) continue;  // the CPU backend's all-resident path uses the host views as they are
      auto ws = exec::WeightStore::create(*c.src, **be, res, (*be)->memory());
      ASSERT_TRUE(ws.ok()) << ws.error().message;
      exec::BudgetOptions bo = ls::test::budget_options(c, **be);
      bo.prefetch = slots == 2;
      bo.modulation_rows = 0;
      auto d = exec::device_peak(c.cfg, c.cond, bo, R, *plan);
      ASSERT_TRUE(d.ok()) << d.error().message;
      EXPECT_EQ((*ws)->device_bytes(), d->resident_weight_bytes + d->slot_bytes);
      EXPECT_EQ((*ws)->slot_bytes(), w.slot_block_bytes(R, L));
      EXPECT_EQ((*ws)->pinned_host_bytes(), w.streamed_block_bytes(R, L));
      EXPECT_EQ(d->host_pinned_bytes, w.streamed_block_bytes(R, L));
      // One forward's block walk copies every streamed block once, its own bytes.
      ASSERT_TRUE((*ws)->begin_forward().ok());
      for (int64_t i = 0; i < L; ++i) {
        auto g = (*ws)->acquire_block(i);
        ASSERT_TRUE(g.ok());
        const TensorView qkv = (*g)(h3::h3_block_key(i, "attn.qkv_proj.weight"));
        const TensorView want = c.src->get(h3::h3_block_key(i, "attn.qkv_proj.weight"));
        ASSERT_EQ(qkv.dtype, want.dtype);
        ASSERT_EQ(qkv.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(qkv.data, want.data, static_cast<size_t>(want.nbytes())), 0) << "block " << i;
        ASSERT_TRUE((*ws)->release_block(i).ok());
      }
      ASSERT_TRUE((*be)->synchronize().ok());
      EXPECT_EQ((*ws)->forward_copy_bytes(), w.streamed_block_bytes(R, L));
    }
  }
}

// The planner on a mixed-layout model: the resident bytes are the blocks' own, and a
// budget between the uniform over-estimate (every block counted at the largest block's
// size) and the true total keeps every block resident.
TEST(QuantStreaming, MixedBlockLayoutsPlannerCountsEachBlock) {
  ls::test::StreamingCase c = quant_case(36, Kind::mixed_blocks, 6, false);
  auto be = make_backend("cpu");
  ASSERT_TRUE(be.ok());
  const exec::BudgetOptions bo = ls::test::budget_options(c, **be);
  const exec::WeightTally w = exec::tally_weights(c.src->specs());
  const int64_t L = c.cfg.num_layers;
  auto hi = exec::plan_total_budget(c.cfg, c.cond, ~0ull, bo);
  ASSERT_TRUE(hi.ok()) << hi.error().message;
  ASSERT_EQ(hi->resident_blocks, L);
  EXPECT_EQ(hi->resident_weight_bytes, w.nonblock + w.resident_block_bytes(L));
  EXPECT_LT(w.resident_block_bytes(L), static_cast<uint64_t>(L) * w.block);
  auto fits = exec::plan_total_budget(c.cfg, c.cond, hi->predicted_peak_bytes, bo);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  EXPECT_EQ(fits->resident_blocks, L) << fits->describe();
  // One block streamed (R = L - 1, a bf16 edge block): one slot of its bytes.
  for (int64_t R = 0; R < L; ++R) {
    auto d = exec::device_peak(c.cfg, c.cond, bo, R, hi->activations);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->slot_bytes, static_cast<uint64_t>(d->slots) * w.slot_block_bytes(R, L));
    EXPECT_EQ(d->resident_weight_bytes, w.nonblock + w.resident_block_bytes(R));
  }
}
