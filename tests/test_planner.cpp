// The one memory planner (exec/planner.h): each mode gives exactly what its internal
// planner gives (make_plan, plan_for_budget, plan_total_budget), the device peak by
// component adds up in every mode and equals the budget plan's in the total mode, the
// minimum of each mode plans and one byte less is refused naming it, weight bytes come
// from the tensor table by role (a quantised table counts as held), residency is
// checked, and the front-ends' paths (api::Session, sample::plan_generation) are the
// planner's.
#include <gtest/gtest.h>

#include <limits>

#include "api/session.h"
#include "backend/backend.h"
#include "core/arena.h"
#include "description_util.h"
#include "exactness_util.h"
#include "exec/planner.h"
#include "sample/generate.h"

using namespace ls;
using namespace ls::exec;

namespace {

constexpr uint64_t GiB = 1ull << 30;

h3::Conditioning clip_15s_1mp() { return test::clip(362, 1024, 1024, 500); }  // S = 111,274

PlanRequest request(const h3::H3Config& cfg, const h3::Conditioning& cond, MemoryMode mode, uint64_t budget = 0) {
  PlanRequest q;
  q.cfg = &cfg;
  q.cond = &cond;
  q.mode = mode;
  q.budget_bytes = budget;
  q.sigmas = {0.8f};
  q.device = test::cuda_profile();
  return q;
}

void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.attn_slice, b.attn_slice);
  EXPECT_EQ(a.mlp_slice, b.mlp_slice);
  EXPECT_EQ(a.final_slice, b.final_slice);
  EXPECT_EQ(a.kv_tile, b.kv_tile);
  EXPECT_EQ(a.kv_offload, b.kv_offload);
  EXPECT_EQ(a.residual_offload, b.residual_offload);
  EXPECT_EQ(a.kv_chunk, b.kv_chunk);
  EXPECT_EQ(a.predicted_peak_bytes, b.predicted_peak_bytes);
  EXPECT_EQ(a.describe(), b.describe());
}

// The components add up, whatever the mode.
void expect_peak_adds_up(const PlanResult& r, int64_t L) {
  const DevicePeak& d = r.peak;
  EXPECT_EQ(d.activation_bytes, r.plan.predicted_peak_bytes);
  EXPECT_EQ(d.steps_peak_bytes,
            d.resident_weight_bytes + d.slot_bytes + d.modulation_table_bytes + d.activation_bytes + d.workspace_bytes);
  EXPECT_EQ(d.precompute_peak_bytes, d.resident_weight_bytes + d.slot_bytes + d.modulation_table_bytes +
                                         d.workspace_bytes + d.precompute_scratch_bytes);
  EXPECT_EQ(d.text_peak_bytes, d.resident_weight_bytes + d.slot_bytes + d.workspace_bytes + d.text_phase_extra_bytes);
  EXPECT_EQ(d.predicted_peak_bytes, std::max({d.steps_peak_bytes, d.text_peak_bytes, d.precompute_peak_bytes}));
  EXPECT_EQ(d.slot_bytes, static_cast<uint64_t>(d.slots) * d.block_bytes);
  EXPECT_EQ(d.slots == 0, d.resident_blocks == L);
  EXPECT_GE(d.host_pinned_bytes, static_cast<uint64_t>(L - d.resident_blocks) * d.block_bytes);
}

// The bytes an out_of_budget message names: "... budget that works is 2.1 GiB (2254... bytes".
long long named_minimum(const std::string& message) {
  const auto at = message.find("budget that works is ");
  if (at == std::string::npos) return -1;
  const auto lp = message.find('(', at), sp = message.find(" bytes", lp);
  if (lp == std::string::npos || sp == std::string::npos) return -1;
  return std::stoll(message.substr(lp + 1, sp - lp - 1));
}

}  // namespace

// Total budget mode: plan_total_budget's choice, its peak by component, its minimum.
TEST(Planner, TotalBudgetModeIsTheBudgetPlanner) {
  const h3::H3Config cfg;
  const h3::Conditioning cond = clip_15s_1mp();
  BudgetOptions o = budget_options_for(test::cuda_profile());
  o.modulation_rows = *modulation_rows_for(cfg, cond, {0.8f});
  int kinds[3] = {0, 0, 0};  // all resident / streamed / offloaded
  for (uint64_t budget : {48 * GiB, 12 * GiB, 8 * GiB, 4 * GiB, 3 * GiB}) {
    auto r = plan_memory(request(cfg, cond, MemoryMode::total_budget, budget));
    ASSERT_TRUE(r.ok()) << r.error().message;
    auto bp = plan_total_budget(cfg, cond, budget, o);
    ASSERT_TRUE(bp.ok());
    ASSERT_TRUE(r->budget.has_value());
    EXPECT_EQ(r->budget->describe(), bp->describe());
    expect_same_plan(r->plan, bp->activations);
    EXPECT_EQ(r->residency.resident_blocks, bp->resident_blocks);
    // Two slots, but at 3 GiB the planner gives the second slot's bytes to the slices
    // (BudgetOptions::adaptive_slots; BudgetPlan.OneSlotWhereItExposesLess).
    EXPECT_EQ(r->residency.slots, budget == 3 * GiB ? 1 : 2);
    EXPECT_EQ(r->residency.slots, bp->prefetch ? 2 : 1);
    EXPECT_EQ(r->peak.predicted_peak_bytes, bp->predicted_peak_bytes);
    EXPECT_EQ(r->peak.resident_weight_bytes, bp->resident_weight_bytes);
    EXPECT_EQ(r->peak.modulation_table_bytes, bp->modulation_table_bytes);
    EXPECT_EQ(r->peak.workspace_bytes, 304611328u);  // the profile's, not a constant of the planner
    EXPECT_EQ(r->peak.host_pinned_bytes,
              bp->host_pinned_bytes + static_cast<uint64_t>(bp->streamed_blocks()) * bp->block_bytes);
    EXPECT_EQ(r->minimum_budget_bytes, *min_total_budget(cfg, cond, o));
    EXPECT_EQ(r->modulation_rows, o.modulation_rows);
    // The resolved knobs reproduce the plan through make_plan (what a negative prompt plans with).
    auto again = make_plan(cfg, cond, r->knobs);
    ASSERT_TRUE(again.ok());
    expect_same_plan(*again, r->plan);
    expect_peak_adds_up(*r, cfg.num_layers);
    kinds[!bp->streamed() ? 0 : (bp->kv_offload || bp->residual_offload) ? 2 : 1]++;
  }
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[1], 0);
  EXPECT_GT(kinds[2], 0);
}

// Activation budget mode (`--budget`): plan_for_budget's slices and its minimum.
TEST(Planner, ActivationBudgetModeIsPlanForBudget) {
  const h3::H3Config cfg;
  const h3::Conditioning cond = clip_15s_1mp();
  for (uint64_t budget : {20 * GiB, 6 * GiB, 5 * GiB}) {
    auto r = plan_memory(request(cfg, cond, MemoryMode::activation_budget, budget));
    ASSERT_TRUE(r.ok()) << r.error().message;
    auto p = plan_for_budget(cfg, cond, budget, 8192);  // the profile's default kv_tile
    ASSERT_TRUE(p.ok());
    expect_same_plan(r->plan, *p);
    EXPECT_FALSE(r->budget.has_value());
    EXPECT_EQ(r->minimum_budget_bytes, *min_activation_budget(cfg, cond));
    EXPECT_EQ(r->peak.resident_blocks, cfg.num_layers);  // residency -1: every block
    expect_peak_adds_up(*r, cfg.num_layers);
  }
  EXPECT_TRUE(plan_memory(request(cfg, cond, MemoryMode::activation_budget, 6 * GiB))->plan.two_pass_attention());
}

// Knobs mode: make_plan of the knobs (kv_tile 0 -> the device's), the residency's peak.
TEST(Planner, KnobsModeIsMakePlanWithTheResidencysPeak) {
  const h3::H3Config cfg;
  const h3::Conditioning cond = clip_15s_1mp();
  PlanRequest q = request(cfg, cond, MemoryMode::knobs);
  q.knobs.attn_chunk_tokens = 8192;
  q.knobs.mlp_chunk_tokens = 4096;
  q.knobs.kv_offload = true;
  q.residency.resident_blocks = 3;
  q.residency.slots = 1;
  auto r = plan_memory(q);
  ASSERT_TRUE(r.ok()) << r.error().message;
  PlanKnobs k = q.knobs;
  k.kv_tile = 8192;
  expect_same_plan(r->plan, *make_plan(cfg, cond, k));
  EXPECT_EQ(r->knobs.kv_tile, 8192);
  EXPECT_EQ(r->minimum_budget_bytes, 0u);
  EXPECT_EQ(r->peak.resident_blocks, 3);
  EXPECT_EQ(r->peak.slots, 1);
  EXPECT_EQ(r->peak.resident_weight_bytes - 3 * r->peak.block_bytes,
            plan_memory(request(cfg, cond, MemoryMode::knobs))->peak.resident_weight_bytes - 50 * r->peak.block_bytes);
  // K/V of one block and 47 streamed blocks in pinned host memory.
  EXPECT_EQ(r->peak.host_pinned_bytes, 47 * r->peak.block_bytes + 2ull * 111274 * 7168 * 2);
  expect_peak_adds_up(*r, cfg.num_layers);
  // The same numbers the total-budget planner gives for the same residency and plan.
  BudgetOptions o = budget_options_for(test::cuda_profile());
  o.modulation_rows = r->modulation_rows;
  o.prefetch = false;
  auto d = device_peak(cfg, cond, o, 3, r->plan);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->predicted_peak_bytes, r->peak.predicted_peak_bytes);
  // No sigmas: no tables.
  q.sigmas.clear();
  EXPECT_EQ(plan_memory(q)->peak.modulation_table_bytes, 0u);
}

// The minimum of each budget mode plans; one byte less is refused naming it.
TEST(Planner, NamedMinimumPlansOneByteLessFails) {
  for (const char* preset : {"tiny", "small"}) {
    const h3::H3Config cfg = *h3::h3_preset(preset);
    const h3::Conditioning cond = test::clip(39, 256, 128, 16);
    for (MemoryMode m : {MemoryMode::activation_budget, MemoryMode::total_budget}) {
      PlanRequest q = request(cfg, cond, m);
      auto minimum = minimum_budget(q);
      ASSERT_TRUE(minimum.ok()) << minimum.error().message;
      ASSERT_GT(*minimum, 0u);
      q.budget_bytes = *minimum;
      auto at = plan_memory(q);
      ASSERT_TRUE(at.ok()) << preset << " " << memory_mode_name(m) << ": " << at.error().message;
      EXPECT_EQ(at->minimum_budget_bytes, *minimum);
      EXPECT_LE(m == MemoryMode::total_budget ? at->peak.predicted_peak_bytes : at->plan.predicted_peak_bytes, *minimum);
      q.budget_bytes = *minimum - 1;
      auto below = plan_memory(q);
      ASSERT_FALSE(below.ok());
      EXPECT_EQ(below.error().code, ErrorCode::out_of_budget);
      EXPECT_EQ(named_minimum(below.error().message), static_cast<long long>(*minimum))
          << below.error().message;
    }
    EXPECT_EQ(*minimum_budget(request(cfg, cond, MemoryMode::knobs)), 0u);
  }
}

// Weight bytes are the tensor table's, by role: a table whose block linears are int8
// with an f32 per-row scale (what a quantised file holds; role block) gives smaller
// blocks, so more of them stay resident under the same budget. Before the planner took
// the source's table, the declared bf16 bytes were counted whatever the file held.
TEST(Planner, WeightBytesFollowTheTensorTable) {
  const h3::H3Config cfg;
  const h3::Conditioning cond = clip_15s_1mp();
  std::vector<h3::TensorSpec> q8 = h3::h3_tensor_specs(cfg);
  std::vector<h3::TensorSpec> scales;
  for (h3::TensorSpec& s : q8)
    if (s.role == h3::TensorRole::block && s.shape.size() == 2) {
      s.dtype = DType::i8;
      scales.push_back({s.name + "_scale", DType::f32, {s.shape[0]}, s.group, h3::TensorRole::block, s.block});
    }
  q8.insert(q8.end(), scales.begin(), scales.end());
  // Per block: qkv [3I, D], out [D, I], fc1 [2F, D], fc2 [D, F] at 1 byte + f32 scales
  // per output row + the bf16 norms, each rounded up to 256 bytes.
  const uint64_t D = 5376, I = 7168, F = 14336;
  auto al = [](uint64_t b) { return (b + 255) / 256 * 256; };
  const uint64_t norms = 2 * al(D * 2) + 2 * al(128 * 2);
  const uint64_t want = al(3 * I * D) + al(D * I) + al(2 * F * D) + al(D * F) + al(3 * I * 4) + al(D * 4) +
                        al(2 * F * 4) + al(D * 4) + norms;
  EXPECT_EQ(tally_weights(q8).block, want);
  EXPECT_EQ(tally_weights(h3::h3_tensor_specs(cfg)).block, block_weight_bytes(cfg));  // 770,725,376 bf16
  EXPECT_LT(want, block_weight_bytes(cfg) / 2 + block_weight_bytes(cfg) / 50);
  PlanRequest bf = request(cfg, cond, MemoryMode::total_budget, 24 * GiB);
  PlanRequest i8 = bf;
  i8.tensors = &q8;
  auto a = plan_memory(bf), b = plan_memory(i8);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->peak.block_bytes, block_weight_bytes(cfg));
  EXPECT_EQ(b->peak.block_bytes, want);
  EXPECT_GT(b->residency.resident_blocks, a->residency.resident_blocks);
  // The bf16 refiner blocks no longer fit an int8 block's slot, so the text phase loads
  // them whole (docs/budget.md "Text refiner"), which then sets the minimum...
  EXPECT_EQ(a->peak.text_phase_extra_bytes + 2 * tally_weights(q8).refiner_block,
            b->peak.text_phase_extra_bytes);
  EXPECT_GT(*minimum_budget(i8), *minimum_budget(bf));
  // ... unless the refiner's linears are int8 too: then they stream through the smaller
  // slots and the minimum falls.
  std::vector<h3::TensorSpec> all8 = q8;
  for (h3::TensorSpec& s : all8)
    if (s.role == h3::TensorRole::refiner && s.block >= 0 && s.shape.size() == 2) s.dtype = DType::i8;
  PlanRequest a8 = bf;
  a8.tensors = &all8;
  EXPECT_LE(tally_weights(all8).refiner_block, tally_weights(all8).block);
  EXPECT_LT(*minimum_budget(a8), *minimum_budget(bf));
}

TEST(Planner, Refusals) {
  const h3::H3Config cfg = *h3::h3_preset("tiny");
  const h3::Conditioning cond = test::clip(5, 32, 32, 4);
  PlanRequest q = request(cfg, cond, MemoryMode::knobs);
  q.residency.resident_blocks = cfg.num_layers + 1;
  auto r = plan_memory(q);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("resident blocks must be -1 (all) or 0.."), std::string::npos) << r.error().message;
  q.residency = {};
  q.residency.slots = 3;
  EXPECT_NE(plan_memory(q).error().message.find("block slots must be 1 or 2"), std::string::npos);
  q.residency = {};
  q.knobs.kv_offload = true;  // with stock attention: make_plan's own refusal, unchanged
  auto kv = plan_memory(q);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.error().message, make_plan(cfg, cond, PlanKnobs{0, 0, 0, 8192, true}).error().message);
  PlanRequest none;
  EXPECT_EQ(plan_memory(none).error().code, ErrorCode::invalid_argument);
  // The total budget needs a sigma (its AdaLN tables).
  PlanRequest t = request(cfg, cond, MemoryMode::total_budget, GiB);
  t.sigmas.clear();
  EXPECT_FALSE(plan_memory(t).ok());
}

// The front-ends' paths are the planner's: api::Session::plan / minimum_budget with the
// backend's own profile and the source's tensor table, and sample::plan_generation.
TEST(Planner, SessionAndGenerateCallThePlanner) {
  auto opened = api::Session::open_backend("cpu");
  ASSERT_TRUE(opened.ok());
  api::Session& s = **opened;
  api::WeightsSpec w;
  w.preset = "small";
  ASSERT_TRUE(s.load_weights(w).ok());
  const DeviceProfile d = s.device_profile();
  EXPECT_EQ(d.workspace_bytes, s.backend().workspace_bytes());
  EXPECT_EQ(d.default_kv_tile, s.backend().default_kv_tile());
  const h3::Conditioning cond = test::clip(39, 512, 384, 64);
  api::MemorySpec m;
  m.mode = MemoryMode::activation_budget;
  m.activation_budget = 9ull << 20;
  auto rp = s.plan(cond, {0.8f}, m);
  ASSERT_TRUE(rp.ok()) << rp.error().message;
  PlanRequest q;
  q.cfg = &s.config();
  q.tensors = &s.source().specs();
  q.cond = &cond;
  q.sigmas = {0.8f};
  q.mode = MemoryMode::activation_budget;
  q.budget_bytes = m.activation_budget;
  q.device = d;
  auto direct = plan_memory(q);
  ASSERT_TRUE(direct.ok());
  expect_same_plan(rp->plan, direct->plan);
  EXPECT_TRUE(rp->plan.two_pass_attention());  // 9 MiB slices this clip (S = 2,498)
  EXPECT_EQ(rp->peak.predicted_peak_bytes, direct->peak.predicted_peak_bytes);
  EXPECT_EQ(*s.minimum_budget(cond, {0.8f}, m), direct->minimum_budget_bytes);
  // generate's per-prompt plans in the activation mode are the planner's too.
  sample::GenerateRequest g;
  g.cond = cond;
  std::vector<float> text(static_cast<size_t>(64 * s.config().text_dim), 0.5f);
  g.text = TensorView(text.data(), DType::f32, {64, s.config().text_dim});
  g.sigmas = {0.8f, 0.0f};
  api::Session::apply(*rp, g);
  EXPECT_EQ(g.budget_bytes, m.activation_budget);
  auto plans = s.plan_generation(g);
  ASSERT_TRUE(plans.ok()) << plans.error().message;
  expect_same_plan(plans->positive, direct->plan);
}
