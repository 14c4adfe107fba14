// The total-VRAM-budget planner (exec/budget_plan.h, docs/budget.md): decisions at
// S = 111,274 on the real H3 dimensions (the table docs/budget.md shows is printed by
// H3DecisionTable), byte arithmetic by hand, monotonicity in the budget, every peak
// within its budget, the named minimum works and one byte less fails, tiny configs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>

#include "backend/backend.h"
#include "core/arena.h"
#include "description_util.h"
#include "exactness_util.h"
#include "exec/budget_plan.h"
#include "exec/planner.h"

using namespace ls;
using namespace ls::exec;

namespace {

constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

using test::clip;
h3::Conditioning clip_15s_1mp() { return clip(362, 1024, 1024, 500); }  // S = 111,274

const PlannedBuffer* find(const std::vector<PlannedBuffer>& v, const std::string& what) {
  for (const auto& b : v)
    if (b.what == what) return &b;
  return nullptr;
}

std::string gib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(b) / static_cast<double>(GiB));
  return s;
}

std::vector<std::string> specs(const std::vector<PlannedBuffer>& v) {
  std::vector<std::string> out;
  for (const auto& b : v)
    out.push_back(b.what + " " + dtype_name(b.dtype) + " [" + std::to_string(b.rows) + ", " + std::to_string(b.cols) + "]");
  return out;
}

// Invariants every plan satisfies, whatever the inputs.
void expect_consistent(const h3::H3Config& cfg, const h3::Conditioning& cond, const BudgetPlan& p, uint64_t budget) {
  EXPECT_LE(p.predicted_peak_bytes, budget);
  EXPECT_EQ(p.predicted_peak_bytes, std::max({p.steps_peak_bytes, p.text_peak_bytes, p.precompute_peak_bytes}));
  EXPECT_EQ(p.steps_peak_bytes, p.resident_weight_bytes + p.slot_bytes + p.modulation_table_bytes +
                                    p.activation_bytes + p.workspace_bytes);
  EXPECT_EQ(p.resident_weight_bytes, p.nonblock_weight_bytes + static_cast<uint64_t>(p.resident_blocks) * p.block_bytes);
  EXPECT_EQ(p.slot_bytes, static_cast<uint64_t>(p.slots) * p.block_bytes);
  EXPECT_EQ(p.slots == 0, !p.streamed());
  EXPECT_EQ(p.pcie_weight_bytes, static_cast<uint64_t>(p.streamed_blocks()) * p.block_bytes);
  EXPECT_EQ(p.pcie_kv_bytes > 0, p.kv_offload);
  EXPECT_EQ(p.pcie_residual_bytes > 0, p.residual_offload);
  // The activation Plan carries the offload choices, and its lists are what the device
  // holds: exactly make_plan of its own knobs, peak = persistent + max phase.
  const Plan& a = p.activations;
  EXPECT_EQ(a.kv_offload, p.kv_offload);
  EXPECT_EQ(a.residual_offload, p.residual_offload);
  EXPECT_EQ(a.knobs.kv_offload, p.kv_offload);
  EXPECT_EQ(a.knobs.residual_offload, p.residual_offload);
  EXPECT_EQ(a.kv_chunk, p.kv_chunk);
  EXPECT_EQ(p.kv_chunk > 0, p.kv_offload);
  EXPECT_EQ(p.activation_bytes, a.predicted_peak_bytes);
  auto again = make_plan(cfg, cond, a.knobs);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(specs(again->persistent), specs(a.persistent));
  ASSERT_EQ(again->phases.size(), a.phases.size());
  for (size_t i = 0; i < a.phases.size(); ++i) {
    EXPECT_EQ(again->phases[i].name, a.phases[i].name);
    EXPECT_EQ(specs(again->phases[i].buffers), specs(a.phases[i].buffers));
  }
  EXPECT_EQ(again->predicted_peak_bytes, a.predicted_peak_bytes);
  uint64_t mx = 0;
  for (const auto& ph : a.phases) mx = std::max(mx, ph.bytes());
  EXPECT_EQ(p.activation_bytes, sum_bytes(a.persistent) + mx);
  EXPECT_EQ(find(a.persistent, "residual x") == nullptr, p.residual_offload);
  const PlanPhase& attn = a.phase("attn");
  EXPECT_EQ(find(attn.buffers, "K chunk 0") != nullptr, p.kv_offload);
  EXPECT_EQ(find(attn.buffers, "attention state") != nullptr, p.kv_offload);
  EXPECT_EQ(find(a.phase("mlp").buffers, "residual slice 1") != nullptr, p.residual_offload);
  if (p.kv_offload || p.residual_offload) {
    EXPECT_TRUE(a.two_pass_attention());
    EXPECT_EQ(p.resident_blocks, 0);
  }
  if (p.kv_offload) {
    EXPECT_EQ(find(attn.buffers, "V chunk 1")->rows, p.kv_chunk);
    EXPECT_TRUE(p.kv_chunk == p.sizes.S || p.kv_chunk % a.kv_tile == 0);
  }
  EXPECT_FALSE(p.describe().empty());
}

}  // namespace

// The K/V-hiding slice: c >= T / B. The measured H200 defaults, 550 TFLOP/s over
// 55 GB/s -> 10,000 queries; 600 over 50 -> 12,000; at that c, streaming K and V of all
// S keys takes as long as the slice's attention.
TEST(BudgetPlan, KvHidingSliceArithmetic) {
  DeviceFacts f;
  EXPECT_EQ(kv_hiding_slice(f), 10000);
  f.pcie_gb_per_s = 50;
  f.attention_tflops = 600;
  EXPECT_EQ(kv_hiding_slice(f), 12000);
  const double S = 93000, I = 7168;
  const double copy_s = 2 * S * I * 2 / (f.pcie_gb_per_s * 1e9);            // 2.67 GB -> 53 ms at 50 GB/s
  const double attn_s = 4.0 * 12000 * S * I / (f.attention_tflops * 1e12);  // 12k queries
  EXPECT_NEAR(copy_s, attn_s, 1e-9);
  EXPECT_NEAR(2 * S * I * 2, 2.67e9, 0.01e9);                              // the 2.67 GB
  EXPECT_GT(4.0 * 16000 * S * I / (f.attention_tflops * 1e12), copy_s);    // the 16k: hidden
  f.pcie_gb_per_s = 25;
  EXPECT_EQ(kv_hiding_slice(f), 24000);
}

// One block's device weights: the four big linears + norms (bf16), 385,362,688 params.
TEST(BudgetPlan, H3WeightAndTableBytes) {
  h3::H3Config cfg;
  EXPECT_EQ(block_weight_bytes(cfg), 770725376u);
  BudgetOptions o;
  o.modulation_rows = 25;
  auto p = plan_total_budget(cfg, clip_15s_1mp(), kUnlimited, o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  // Per block bf16 [3*25, 6*5376] + final bf16 [25, 2*5376].
  EXPECT_EQ(p->modulation_table_bytes, 50ull * 25 * 18 * 5376 * 2 + 25ull * 2 * 5376 * 2);
  // Non-block: patch projections (fp32 [D, 96] + [D], [D, 32] + [D]), final norm bf16
  // [D], heads fp32 [96, D] + [96], [32, D] + [32], each 256-byte aligned.
  auto al = [](uint64_t b) { return (b + 255) / 256 * 256; };
  const uint64_t D = 5376;
  EXPECT_EQ(p->nonblock_weight_bytes, al(D * 96 * 4) + al(D * 4) + al(D * 32 * 4) + al(D * 4) + al(D * 2) +
                                          al(96 * D * 4) + al(96 * 4) + al(32 * D * 4) + al(32 * 4));
  // Curve form: fp32 tables, twice the bytes.
  auto c = plan_total_budget(h3::h3_curve_form(cfg), clip_15s_1mp(), kUnlimited, o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->modulation_table_bytes, 2 * p->modulation_table_bytes);
}

// The decision table of docs/budget.md (printed), with what each budget must choose.
TEST(BudgetPlan, H3DecisionTable) {
  h3::H3Config cfg;
  const auto cond = clip_15s_1mp();
  // kv_tile 1024, 64 MiB workspace, 25 modulation rows, the measured H200 rates (55 GB/s
  // both ways, 550 TFLOP/s attention, 700 TFLOP/s GEMM: K/V-hiding slice 10,000).
  BudgetOptions o;
  const uint64_t budgets[] = {kUnlimited, 24 * GiB, 12 * GiB, 8 * GiB, 6 * GiB, 4 * GiB, 3 * GiB, 5 * GiB / 2};
  std::printf("S = 111274, h3 preset, kv_tile 1024, workspace 64 MiB, 25 modulation rows, K/V-hiding slice %lld\n",
              static_cast<long long>(kv_hiding_slice(o.device)));
  std::printf("| budget GiB | step | resident / streamed blocks | slots | K/V | residual | attn / MLP / head slice |"
              " weights | slots | tables | activations | peak GiB | PCIe GB / forward | exposed s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<BudgetPlan> plans;
  for (uint64_t b : budgets) {
    auto p = plan_total_budget(cfg, cond, b, o);
    ASSERT_TRUE(p.ok()) << gib(b) << ": " << p.error().message;
    EXPECT_EQ(p->sizes.S, 111274);
    expect_consistent(cfg, cond, *p, b);
    std::printf("| %s | %s | %lld / %lld | %lld | %s | %s | %lld / %lld / %lld | %s | %s | %s | %s | %s | %.1f | %.2f |\n",
                b == kUnlimited ? "unlimited" : gib(b).c_str(), p->step.c_str(),
                static_cast<long long>(p->resident_blocks), static_cast<long long>(p->streamed_blocks()),
                static_cast<long long>(p->slots), p->kv_offload ? "offloaded" : "device",
                p->residual_offload ? "offloaded" : "device", static_cast<long long>(p->activations.attn_slice),
                static_cast<long long>(p->activations.mlp_slice), static_cast<long long>(p->activations.final_slice),
                gib(p->resident_weight_bytes).c_str(), gib(p->slot_bytes).c_str(), gib(p->modulation_table_bytes).c_str(),
                gib(p->activation_bytes).c_str(), gib(p->predicted_peak_bytes).c_str(),
                static_cast<double>(p->pcie_bytes_per_forward()) / 1e9, p->exposed_transfer_seconds);
    plans.push_back(std::move(*p));
  }
  for (const auto& p : plans) std::printf("%s\n", p.describe().c_str());
  auto min = min_total_budget(cfg, cond, o);
  ASSERT_TRUE(min.ok());
  std::printf("minimum total budget: %s (%llu bytes)\n", format_bytes(*min).c_str(),
              static_cast<unsigned long long>(*min));

  // Unlimited: everything resident, the stock activation plan, nothing crosses the bus.
  EXPECT_EQ(plans[0].step, "all resident");
  EXPECT_FALSE(plans[0].streamed());
  EXPECT_TRUE(plans[0].activations.stock());
  EXPECT_EQ(plans[0].pcie_bytes_per_forward(), 0u);
  // 24 and 12 GiB: weights stream, K/V and residual stay, some blocks resident, attention
  // slices at least the K/V-hiding size.
  for (int i : {1, 2}) {
    EXPECT_EQ(plans[i].step, "weights streamed");
    EXPECT_TRUE(plans[i].streamed());
    EXPECT_GT(plans[i].resident_blocks, 0);
    EXPECT_FALSE(plans[i].kv_offload || plans[i].residual_offload);
    EXPECT_GE(plans[i].activations.attn_slice, plans[i].kv_hiding_slice);
    EXPECT_EQ(plans[i].slots, 2);
  }
  EXPECT_GT(plans[1].resident_blocks, plans[2].resident_blocks);
  // 6 GiB: K and V of all rows (2.97 GiB) still fit next to 2 slots, with small slices.
  EXPECT_EQ(plans[4].step, "weights streamed, small slices");
  EXPECT_EQ(plans[4].resident_blocks, 0);
  EXPECT_FALSE(plans[4].kv_offload);
  EXPECT_LT(plans[4].activations.attn_slice, plans[4].kv_hiding_slice);
  // 4 GiB: nothing fits without offload; K/V offload alone fits with slices above the
  // hiding size (its pass-2 traffic streams behind attention), which exposes less
  // transfer time than adding residual offload (whose copies are never hidden).
  EXPECT_EQ(plans[5].step, "K/V offload");
  EXPECT_TRUE(plans[5].kv_offload && !plans[5].residual_offload);
  EXPECT_GE(plans[5].activations.attn_slice, plans[5].kv_hiding_slice);
  // 3 and 2.5 GiB: K/V alone does not fit (4 chunks of 4096 rows + the attention state
  // next to x [S, D] 1.11 GiB), so the residual leaves the device too.
  for (int i : {6, 7}) {
    EXPECT_EQ(plans[i].step, "K/V + residual offload");
    EXPECT_TRUE(plans[i].kv_offload && plans[i].residual_offload);
  }
  for (int i : {5, 6, 7}) {
    EXPECT_EQ(plans[i].resident_blocks, 0);
    EXPECT_EQ(plans[i].kv_chunk, 4096);
  }
  // The residual's embedding copies out and head rows in always show; at 4 GiB the
  // K/V copies hide (pass 1's behind the first query slice's attention, pass 2's behind
  // each slice's attention at slices above the hiding size).
  EXPECT_GE(plans[5].exposed_transfer_seconds, 0.0);
  for (int i : {6, 7}) EXPECT_GT(plans[i].exposed_transfer_seconds, 0.0);
  BudgetOptions kv_only = o;
  kv_only.allow_residual_offload = false;
  auto four_kv = plan_total_budget(cfg, cond, 4 * GiB, kv_only);
  ASSERT_TRUE(four_kv.ok());
  EXPECT_EQ(four_kv->activations.attn_slice, plans[5].activations.attn_slice);
  BudgetOptions kv_only_two = kv_only;
  kv_only_two.adaptive_slots = false;
  EXPECT_EQ(plan_total_budget(cfg, cond, 3 * GiB, kv_only_two).error().code, ErrorCode::out_of_budget);
  // With one slot (adaptive_slots) K/V alone fits at 3 GiB.
  auto three_kv = plan_total_budget(cfg, cond, 3 * GiB, kv_only);
  ASSERT_TRUE(three_kv.ok()) << three_kv.error().message;
  EXPECT_EQ(three_kv->slots, 1);
  // 3 GiB keeps two slots at these figures (its slices, 12,118 rows, hide K/V already:
  // 0.04 s exposed against one slot's 0.7 s of weight copies); at 2.5 GiB two slots give
  // slices of a few thousand rows, so one slot wins.
  EXPECT_EQ(plans[6].slots, 2);
  EXPECT_FALSE(plans[6].one_slot_chosen);
  EXPECT_EQ(plans[7].slots, 1);
  EXPECT_TRUE(plans[7].one_slot_chosen);
  // Down the table (less budget): never fewer streamed blocks, never less offload, never
  // less exposed transfer time (see MonotonicInTheBudget for what is monotone).
  for (size_t i = 1; i < plans.size(); ++i) {
    EXPECT_GE(plans[i].streamed_blocks(), plans[i - 1].streamed_blocks());
    EXPECT_GE(plans[i].kv_offload, plans[i - 1].kv_offload);
    EXPECT_GE(plans[i].exposed_transfer_seconds, plans[i - 1].exposed_transfer_seconds);
  }
  EXPECT_LT(*min, 3 * GiB);
}

// What is monotone in the budget (budget_plan.h): more budget never streams more blocks,
// never offloads where less budget did not (K/V offload, or any offload), and never
// exposes more transfer time (exposed_transfer_seconds: each level's cost falls as its
// slices grow, and more budget only adds levels to choose from). Residual offload alone
// and raw PCIe bytes are NOT monotone in general (the comparison between the two offload
// levels can flip as slice counts step); the sweep prints how often it flipped. Sweep from the minimum to all-resident in 97 MiB steps.
TEST(BudgetPlan, MonotonicInTheBudget) {
  h3::H3Config cfg;
  const auto cond = clip_15s_1mp();
  // Prefetch on and off; then the CUDA dry-run profile (cuDNN: kv_tile 8192, attention
  // slices quantised to whole 2048-query chunks where that keeps their count); then
  // prefetch without adaptive slots (always two: the policy before session 8).
  for (int variant = 0; variant < 4; ++variant) {
    const bool prefetch = variant != 1;
    BudgetOptions o = variant == 2 ? budget_options_for(test::cuda_profile()) : BudgetOptions{};
    o.prefetch = prefetch;
    o.adaptive_slots = variant != 3;
    BudgetOptions two = o;  // the same budget with two slots kept, for the one-slot plans
    two.adaptive_slots = false;
    int one_slot_plans = 0;
    auto min = min_total_budget(cfg, cond, o);
    ASSERT_TRUE(min.ok());
    auto all = plan_total_budget(cfg, cond, kUnlimited, o);
    ASSERT_TRUE(all.ok());
    const uint64_t top = all->predicted_peak_bytes + GiB;
    int64_t last_streamed = cfg.num_layers + 1;
    bool last_kv = true, last_any = true, last_res = true;
    double last_exposed = 1e300;
    int steps = 0, residual_flips = 0, residual_plans = 0, kv_only_plans = 0;
    for (uint64_t b = *min; b <= top; b += 97 * (1ull << 20), ++steps) {
      auto p = plan_total_budget(cfg, cond, b, o);
      ASSERT_TRUE(p.ok()) << b << ": " << p.error().message;
      EXPECT_LE(p->predicted_peak_bytes, b);
      const bool any = p->kv_offload || p->residual_offload;
      EXPECT_LE(p->streamed_blocks(), last_streamed) << "budget " << b;
      EXPECT_LE(p->kv_offload, last_kv) << "budget " << b;
      EXPECT_LE(any, last_any) << "budget " << b;
      EXPECT_LE(p->exposed_transfer_seconds, last_exposed) << "budget " << b;
      const int64_t q = o.attention_row_quantum, n = p->activations.attn_slice, S = p->sizes.S;
      if (q > 1 && n >= q && n < S) {
        // A whole number of query chunks, unless that would go below the mode's floor
        // or (K/V offloaded) take another slice.
        const int64_t slices = (S + n - 1) / n, whole = ((S + slices - 1) / slices + q - 1) / q * q;
        EXPECT_TRUE(n % q == 0 || (p->kv_offload ? whole > n : n / q * q < p->slice_floor))
            << "budget " << b << ": slice " << n;
      }
      if (p->residual_offload && !last_res) ++residual_flips;
      residual_plans += p->residual_offload;
      kv_only_plans += p->kv_offload && !p->residual_offload;
      if (p->streamed()) {
        // Two slots with prefetch, but where offloading is needed one slot may expose less
        // (adaptive_slots): then it must, strictly, against the two-slot plan if one fits.
        EXPECT_EQ(p->slots, prefetch && !p->one_slot_chosen ? 2 : 1) << "budget " << b;
        EXPECT_EQ(p->prefetch, p->slots == 2) << "budget " << b;
        if (p->one_slot_chosen) {
          ++one_slot_plans;
          EXPECT_TRUE(prefetch && o.adaptive_slots && any) << "budget " << b;
          auto t = plan_total_budget(cfg, cond, b, two);
          if (t.ok()) {
            EXPECT_EQ(t->slots, 2);
            EXPECT_LT(p->exposed_transfer_seconds, t->exposed_transfer_seconds) << "budget " << b;
          }
        }
      }
      last_streamed = p->streamed_blocks();
      last_kv = p->kv_offload;
      last_any = any;
      last_res = p->residual_offload;
      last_exposed = p->exposed_transfer_seconds;
    }
    EXPECT_GT(steps, 100);
    EXPECT_EQ(last_streamed, 0);  // the sweep reached all-resident
    EXPECT_GT(residual_plans, 0);
    EXPECT_GT(kv_only_plans, 0);
    // The small budgets of this clip are where one slot wins (3 GiB: docs/budget.md).
    if (prefetch && o.adaptive_slots) EXPECT_GT(one_slot_plans, 0);
    else EXPECT_EQ(one_slot_plans, 0);
    std::printf("variant %d (prefetch %d, adaptive slots %d, attention row quantum %lld): %d budgets, %d K/V + "
                "residual, %d K/V only, %d with one slot chosen, residual offload re-entered %d times\n",
                variant, prefetch, o.adaptive_slots, static_cast<long long>(o.attention_row_quantum), steps,
                residual_plans, kv_only_plans, one_slot_plans, residual_flips);
  }
}

// The minimum the error names is computed: it plans, and one byte less fails before any
// work with out_of_budget naming that same number.
TEST(BudgetPlan, NamedMinimumWorksOneByteLessFails) {
  h3::H3Config cfg;
  std::mt19937_64 rng(11);
  struct Case {
    h3::H3Config cfg;
    h3::Conditioning cond;
  };
  std::vector<Case> cases{{cfg, clip_15s_1mp()}, {cfg, clip(124, 1344, 768, 300)}, {cfg, clip(5, 32, 32, 1)}};
  for (int i = 0; i < 12; ++i) cases.push_back({test::tiny_cfg(rng), clip(5 + 17 * (i % 3), 32 * (1 + i % 2), 64, 1 + i)});
  int n = 0;
  for (const Case& c : cases) {
    for (int opt = 0; opt < 8; ++opt) {
      BudgetOptions o;
      o.allow_kv_offload = (opt & 1) != 0;
      o.allow_residual_offload = (opt & 2) != 0;
      o.prefetch = (opt & 4) != 0;
      o.kv_tile = (opt % 3 == 0) ? 1024 : 16;
      o.kv_chunk_rows = (opt % 2 == 0) ? 0 : o.kv_tile;
      auto min = min_total_budget(c.cfg, c.cond, o);
      ASSERT_TRUE(min.ok()) << min.error().message;
      ASSERT_GT(*min, 0u);
      auto ok = plan_total_budget(c.cfg, c.cond, *min, o);
      ASSERT_TRUE(ok.ok()) << ok.error().message;
      expect_consistent(c.cfg, c.cond, *ok, *min);
      EXPECT_EQ(ok->predicted_peak_bytes, *min);
      auto bad = plan_total_budget(c.cfg, c.cond, *min - 1, o);
      ASSERT_FALSE(bad.ok());
      EXPECT_EQ(bad.error().code, ErrorCode::out_of_budget);
      EXPECT_NE(bad.error().message.find(std::to_string(*min) + " bytes"), std::string::npos) << bad.error().message;
      if (!o.allow_kv_offload) {
        EXPECT_FALSE(ok->kv_offload);
      }
      if (!o.allow_residual_offload) {
        EXPECT_FALSE(ok->residual_offload);
      }
      ++n;
    }
  }
  std::printf("%d (config, options) cases\n", n);
  // Offloading lowers the minimum at H3 size by more than K and V (2.97 GiB); it then
  // stops at the AdaLN precompute's peak (tables + one block's 0.48 GiB AdaLN linear).
  BudgetOptions none;
  none.allow_kv_offload = none.allow_residual_offload = false;
  const uint64_t m_none = *min_total_budget(cfg, clip_15s_1mp(), none);
  const uint64_t m_all = *min_total_budget(cfg, clip_15s_1mp(), BudgetOptions{});
  EXPECT_GT(m_none, m_all + 3 * GiB);
}

// Tiny configs: random budgets between the minimum and all-resident plan within budget,
// keep their invariants and stay monotone.
TEST(BudgetPlan, TinyConfigs) {
  std::mt19937_64 rng(5);
  int checked = 0;
  for (int i = 0; i < 40; ++i) {
    const auto cfg = test::tiny_cfg(rng);
    const auto cond = clip(5 + 17 * (i % 4), 32 * (1 + i % 3), 32 * (1 + (i / 3) % 2), 1 + i % 7);
    BudgetOptions o;
    o.kv_tile = 1 + static_cast<int64_t>(rng() % 40);
    o.modulation_rows = 1 + static_cast<int64_t>(rng() % 9);
    o.workspace_bytes = rng() % 5000;
    o.device.pcie_gb_per_s = 1 + static_cast<double>(rng() % 100);
    o.device.attention_tflops = 0.001 + static_cast<double>(rng() % 100) / 100.0;  // hiding slices of ~1..100 rows
    // The exposed-transfer model's other rates, so its terms cross over on these sizes.
    o.device.d2h_gb_per_s = 1 + static_cast<double>(rng() % 100);
    o.device.gemm_tflops = 0.001 + static_cast<double>(rng() % 100) / 100.0;
    o.attention_row_quantum = 1 + static_cast<int64_t>(rng() % 24);
    o.prefetch = (rng() & 1) != 0;
    o.kv_chunk_rows = o.kv_tile * static_cast<int64_t>(rng() % 3);  // 0 = default (S on these sizes)
    auto min = min_total_budget(cfg, cond, o);
    ASSERT_TRUE(min.ok()) << min.error().message;
    auto all = plan_total_budget(cfg, cond, kUnlimited, o);
    ASSERT_TRUE(all.ok());
    EXPECT_FALSE(all->streamed());
    EXPECT_TRUE(all->activations.stock());
    const uint64_t lo = *min, hi = all->predicted_peak_bytes;
    ASSERT_LE(lo, hi);
    // At exactly the all-resident peak, everything is resident again.
    auto at_hi = plan_total_budget(cfg, cond, hi, o);
    ASSERT_TRUE(at_hi.ok());
    EXPECT_FALSE(at_hi->streamed());
    int64_t last_streamed = cfg.num_layers + 1;
    bool last_kv = true, last_any = true;
    double last_exposed = 1e300;
    for (int k = 0; k <= 60; ++k) {
      const uint64_t b = lo + (hi - lo) * static_cast<uint64_t>(k) / 60;
      auto p = plan_total_budget(cfg, cond, b, o);
      ASSERT_TRUE(p.ok()) << p.error().message;
      expect_consistent(cfg, cond, *p, b);
      const bool any = p->kv_offload || p->residual_offload;
      EXPECT_LE(p->streamed_blocks(), last_streamed);
      EXPECT_LE(p->kv_offload, last_kv);
      EXPECT_LE(any, last_any);
      EXPECT_LE(p->exposed_transfer_seconds, last_exposed);
      last_streamed = p->streamed_blocks();
      last_kv = p->kv_offload;
      last_any = any;
      last_exposed = p->exposed_transfer_seconds;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 40 * 61);
}

// Offload traffic: pass 1 sends K and V of all rows out once per block; pass 2 brings
// them back once per query slice but the first (attended in pass 1); the residual
// crosses once per phase that reads it and once more per phase that writes it (embed
// out; per block pass 1 in, pass 2 in + out, MLP in + out; the final layer's target rows
// in), and with K/V offload pass 1 reads the first query slice's rows once more.
TEST(BudgetPlan, PcieArithmetic) {
  h3::H3Config cfg;
  const uint64_t S = 111274, I = 7168, D = 5376, kv = 2 * S * I * 2, x = S * D * 2;
  BudgetOptions o;
  o.allow_residual_offload = false;
  auto p = plan_total_budget(cfg, clip_15s_1mp(), 4 * GiB, o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_TRUE(p->kv_offload);
  EXPECT_EQ(p->kv_chunk, 4096);
  const uint64_t slices = (S + p->activations.attn_slice - 1) / p->activations.attn_slice;
  EXPECT_EQ(p->pcie_kv_bytes, 50 * (kv + (slices - 1) * kv));
  EXPECT_EQ(p->host_pinned_bytes, kv);
  EXPECT_EQ(p->pcie_weight_bytes, 50ull * 770725376ull);
  EXPECT_EQ(p->pcie_residual_bytes, 0u);
  std::printf("%s\n", p->describe().c_str());
  // K/V + residual at 2.5 GiB.
  auto r = plan_total_budget(cfg, clip_15s_1mp(), 5 * GiB / 2, BudgetOptions{});
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->kv_offload && r->residual_offload);
  EXPECT_EQ(r->pcie_residual_bytes,
            x * (1 + 5 * 50) + 110774ull * D * 2 + 50ull * static_cast<uint64_t>(r->activations.attn_slice) * D * 2);
  EXPECT_EQ(r->host_pinned_bytes, kv + x);
  // Residual alone (K/V offload not allowed): needs K and V of all rows on the device.
  BudgetOptions ro;
  ro.allow_kv_offload = false;
  auto m = min_total_budget(cfg, clip_15s_1mp(), ro);
  ASSERT_TRUE(m.ok());
  auto res = plan_total_budget(cfg, clip_15s_1mp(), *m, ro);
  ASSERT_TRUE(res.ok()) << res.error().message;
  EXPECT_TRUE(res->residual_offload && !res->kv_offload);
  EXPECT_EQ(res->step, "residual offload");
  EXPECT_EQ(res->pcie_kv_bytes, 0u);
  EXPECT_EQ(res->host_pinned_bytes, x);
}

// attention int8 (docs/int8-attention.md §6): only the prepared keys cross, S (2 I + 4 H)
// bytes (k8, sk, v8t), out once per block and back in per query slice but the first
// (attended by the prepare walk); the host holds them in that size; with residual offload
// every row is read once more than bf16 offload reads it (pass 1 and the prepare).
TEST(BudgetPlan, PcieArithmeticInt8) {
  h3::H3Config cfg;
  const uint64_t S = 111274, I = 7168, H = 56, D = 5376, kv8 = S * (2 * I + 4 * H), x = S * D * 2;
  BudgetOptions o;
  o.int8_attention = true;
  o.kv_tile = 128;
  auto r = plan_total_budget(cfg, clip_15s_1mp(), 3 * GiB, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->kv_offload);
  const uint64_t slices = (S + r->activations.attn_slice - 1) / r->activations.attn_slice;
  EXPECT_EQ(r->pcie_kv_bytes, 50 * slices * kv8);
  EXPECT_EQ(r->host_pinned_bytes, kv8 + x);
  ASSERT_TRUE(r->residual_offload);  // at 3 GiB (bench/results/issue26 run 10's plan)
  // Contract v3: the prepare walk is pass 1 (K, V once), so the residual is read as bf16
  // offload reads it (v2 read every row once more: + 50 x).
  EXPECT_EQ(r->pcie_residual_bytes, x * (1 + 5 * 50) + 110774ull * D * 2 +
                                        50ull * static_cast<uint64_t>(r->activations.attn_slice) * D * 2);
  std::printf("%s\n", r->describe().c_str());
}

// The exposed-transfer model by hand (budget_plan.cpp exposed_seconds) for the 4 GiB
// K/V-only plan: pass 1's copies out (and the block's weights) against the K/V GEMMs
// and the first query slice's attention; pass 2's reload per further slice against that
// slice's attention and Q / out GEMMs. At the measured rates both hide (0 s); on a
// 16 GB/s bus both show, by exactly these terms.
TEST(BudgetPlan, ExposedTransferByHand) {
  h3::H3Config cfg;
  const double S = 111274, I = 7168, D = 5376, L = 50;
  BudgetOptions o;
  o.allow_residual_offload = false;
  o.adaptive_slots = false;  // two slots throughout (the one-slot term: OneSlotWhereItExposesLess)
  auto fast = plan_total_budget(cfg, clip_15s_1mp(), 4 * GiB, o);
  ASSERT_TRUE(fast.ok() && fast->kv_offload);
  EXPECT_EQ(fast->exposed_transfer_seconds, 0.0);
  o.device.pcie_gb_per_s = o.device.d2h_gb_per_s = 16;
  auto slow = plan_total_budget(cfg, clip_15s_1mp(), 4 * GiB, o);
  ASSERT_TRUE(slow.ok() && slow->kv_offload && !slow->residual_offload);
  const double a = static_cast<double>(slow->activations.attn_slice), s = std::ceil(S / a);
  const double B = 16e9, Ta = 550e12, Tg = 700e12, kv = 4 * S * I, W = 770725376.0;
  const double pass1 = std::max(0.0, kv / B + W / B - 4 * S * D * I / Tg - 4 * a * S * I / Ta);
  const double pass2 = (s - 1) * std::max(0.0, kv / B - a * (4 * S * I / Ta + 4 * D * I / Tg));
  EXPECT_GT(pass1, 0.0);
  EXPECT_GT(pass2, 0.0);
  EXPECT_NEAR(slow->exposed_transfer_seconds, L * (pass1 + pass2), 1e-9 * L * (pass1 + pass2));
}

// Among the offload levels that fit, the plan exposes the least transfer time
// (exposed_transfer_seconds): never more than the K/V-only plan at the same budget. Where
// K/V-only slices reach the hiding size, K/V alone wins (at 4 GiB: 14,091-row slices,
// pass-2 traffic hidden behind attention, against residual copies that never hide);
// where its slices are small, the residual leaves too and buys slices.
TEST(BudgetPlan, OffloadLevelWithLeastExposedTransfer) {
  h3::H3Config cfg;
  const auto cond = clip_15s_1mp();
  // Two slots throughout: the level choice alone (one slot: OneSlotWhereItExposesLess).
  BudgetOptions both;
  both.adaptive_slots = false;
  BudgetOptions kv_only = both;
  kv_only.allow_residual_offload = false;
  auto min = min_total_budget(cfg, cond, kv_only);
  ASSERT_TRUE(min.ok());
  int both_fit = 0, residual_won = 0, kv_won = 0;
  for (uint64_t b = *min; b < 6 * GiB; b += 61 * (1ull << 20)) {
    auto p = plan_total_budget(cfg, cond, b, both);
    auto k = plan_total_budget(cfg, cond, b, kv_only);
    ASSERT_TRUE(p.ok() && k.ok());
    if (!k->kv_offload) {
      EXPECT_FALSE(p->kv_offload || p->residual_offload);  // no offload needed: identical decisions
      EXPECT_EQ(p->activations.knobs.attn_chunk_tokens, k->activations.knobs.attn_chunk_tokens);
      continue;
    }
    ++both_fit;
    ASSERT_TRUE(p->kv_offload);
    EXPECT_LE(p->exposed_transfer_seconds, k->exposed_transfer_seconds) << b;
    if (p->residual_offload) {
      ++residual_won;
      EXPECT_LT(p->exposed_transfer_seconds, k->exposed_transfer_seconds) << b;  // ties keep K/V only
      EXPECT_GT(p->activations.attn_slice, k->activations.attn_slice);
      EXPECT_LT(k->activations.attn_slice, k->kv_hiding_slice);
    } else {
      ++kv_won;
      EXPECT_EQ(p->exposed_transfer_seconds, k->exposed_transfer_seconds);
    }
  }
  EXPECT_GT(residual_won, 0);
  EXPECT_GT(kv_won, 0);
  std::printf("%d budgets with K/V offload: K/V + residual chosen at %d, K/V only at %d\n", both_fit, residual_won,
              kv_won);
  auto four = plan_total_budget(cfg, cond, 4 * GiB, BudgetOptions{});
  ASSERT_TRUE(four.ok());
  EXPECT_TRUE(four->kv_offload && !four->residual_offload);
  EXPECT_GE(four->activations.attn_slice, four->kv_hiding_slice);
}

// BudgetOptions::adaptive_slots (policy step 3): where offloading is needed, each offload
// level is also planned with ONE block slot, and the lower exposed transfer time wins.
// At 3 GiB on the CUDA profile (hopper: kv_tile 8192, 605 TFLOP/s, 55 GB/s) the second
// slot's 735 MiB as attention slices take them from 9,344 to 16,000 rows: K/V reloads
// fall from 1.78 to 1.04 TiB, and the exposure from ~6.7 s to the ~0.7 s of weight
// copies one slot can no longer hide (measured on the H200: 1.205x -> 1.068x the
// unlimited run, bench/results/issue15/s8). The exposure of a one-slot plan includes
// those copies, (L - R) W / B_h2d, whatever the level: also a --no-prefetch plan
// without offload.
TEST(BudgetPlan, OneSlotWhereItExposesLess) {
  h3::H3Config cfg;
  const auto cond = clip_15s_1mp();
  const double B = 55e9, W = static_cast<double>(block_weight_bytes(cfg));
  BudgetOptions o = budget_options_for(test::cuda_profile(AttentionAlgorithm::hopper));
  o.modulation_rows = 2;
  BudgetOptions keep = o, none = o;
  keep.adaptive_slots = false;
  none.prefetch = false;
  auto p = plan_total_budget(cfg, cond, 3 * GiB, o);
  auto k = plan_total_budget(cfg, cond, 3 * GiB, keep);
  auto n = plan_total_budget(cfg, cond, 3 * GiB, none);
  ASSERT_TRUE(p.ok() && k.ok() && n.ok());
  EXPECT_TRUE(p->one_slot_chosen);
  EXPECT_EQ(p->slots, 1);
  EXPECT_FALSE(p->prefetch);
  EXPECT_EQ(k->slots, 2);
  EXPECT_FALSE(k->one_slot_chosen);
  EXPECT_FALSE(n->one_slot_chosen);  // asked for, not chosen
  // The chosen plan is the --no-prefetch one, decision for decision.
  EXPECT_EQ(p->activations.knobs.attn_chunk_tokens, n->activations.knobs.attn_chunk_tokens);
  EXPECT_EQ(p->kv_offload, n->kv_offload);
  EXPECT_EQ(p->residual_offload, n->residual_offload);
  EXPECT_EQ(p->exposed_transfer_seconds, n->exposed_transfer_seconds);
  EXPECT_EQ(p->activations.attn_slice, 16000);
  EXPECT_EQ(k->activations.attn_slice, 9344);
  EXPECT_LT(p->pcie_kv_bytes, k->pcie_kv_bytes);
  // The weight copies are in the one-slot exposure, and the rest is hidden at 16,000 rows
  // but the residual's embedding copies out and the head's rows in (never hidden).
  const double x = 111274.0 * 5376 * 2, head = 110774.0 * 5376 * 2;
  EXPECT_NEAR(p->exposed_transfer_seconds, 50 * W / B + (x + head) / B, 1e-6);
  EXPECT_GT(k->exposed_transfer_seconds, 6.0);
  // Without offload one slot still exposes the copies (a --no-prefetch plan at 8 GiB);
  // with prefetch nothing is chosen there: no offload is needed, two slots hide them.
  auto n8 = plan_total_budget(cfg, cond, 8 * GiB, none);
  auto p8 = plan_total_budget(cfg, cond, 8 * GiB, o);
  ASSERT_TRUE(n8.ok() && p8.ok());
  ASSERT_FALSE(n8->kv_offload || n8->residual_offload);
  EXPECT_NEAR(n8->exposed_transfer_seconds, static_cast<double>(n8->pcie_weight_bytes) / B, 1e-6);
  EXPECT_EQ(p8->slots, 2);
  EXPECT_EQ(p8->exposed_transfer_seconds, 0.0);
  // The minimum the policy names is the one-slot one (every block streamed, one slot),
  // and it plans; with two slots kept it is larger.
  auto m = min_total_budget(cfg, cond, o), mk = min_total_budget(cfg, cond, keep);
  ASSERT_TRUE(m.ok() && mk.ok());
  EXPECT_LT(*m, *mk);
  auto at = plan_total_budget(cfg, cond, *m, o);
  ASSERT_TRUE(at.ok()) << at.error().message;
  EXPECT_EQ(at->slots, 1);
  EXPECT_FALSE(plan_total_budget(cfg, cond, *m - 1, o).ok());
  std::printf("3 GiB: %s\n  kept two slots: %s\n", p->describe().c_str(), k->describe().c_str());
}

// modulation_rows_for counts what Engine::precompute_adaln builds: the "adaln.final"
// table it computes has exactly that many rows, for random conditionings (masks,
// keyframes, references) and schedules with repeats and the terminal 0.
TEST(BudgetPlan, ModulationRowsForMatchesThePrecompute) {
  std::mt19937_64 rng(21);
  int checked = 0;
  for (int i = 0; i < 6; ++i) {
    const auto cfg = test::tiny_cfg(rng, false);
    const auto cond = test::random_cond(rng, cfg, /*extras=*/i % 2 == 1);
    std::vector<float> sigmas;
    for (int s = 0; s < 3 + i; ++s) sigmas.push_back(1.0f - 0.9f * static_cast<float>(s) / static_cast<float>(3 + i));
    sigmas.push_back(sigmas[1]);  // a repeat counts once
    sigmas.push_back(0.0f);       // never evaluated
    auto rows = modulation_rows_for(cfg, cond, sigmas);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    EXPECT_GE(*rows, 3 + i);  // at least one timestep per distinct sigma > 0
    int64_t seen = -1;
    exec::EngineOptions eo;
    eo.eval = [&](const std::string& name, int64_t, const TensorView& t) {
      if (name == "adaln.final") seen = t.shape[0];
    };
    h3::H3SyntheticSource src(cfg, 1);
    auto be = make_cpu_backend();
    auto eng = exec::Engine::create(src, *be, eo);
    ASSERT_TRUE(eng.ok()) << eng.error().message;
    ASSERT_TRUE((*eng)->precompute_adaln(sigmas, cond).ok());
    EXPECT_EQ(seen, *rows);
    ++checked;
  }
  EXPECT_EQ(checked, 6);
  h3::H3Config cfg;
  auto none = modulation_rows_for(cfg, clip(5, 32, 32, 1), {0.0f});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
}

TEST(BudgetPlan, OptionErrors) {
  h3::H3Config cfg;
  const auto cond = clip(5, 32, 32, 1);
  BudgetOptions o;
  o.kv_tile = 0;
  EXPECT_EQ(plan_total_budget(cfg, cond, GiB, o).error().code, ErrorCode::invalid_argument);
  o = {};
  o.modulation_rows = 0;
  EXPECT_EQ(plan_total_budget(cfg, cond, GiB, o).error().code, ErrorCode::invalid_argument);
  o = {};
  o.device.attention_tflops = -1;
  EXPECT_FALSE(min_total_budget(cfg, cond, o).ok());
  o = {};
  o.device.pcie_gb_per_s = 0;
  EXPECT_FALSE(plan_total_budget(cfg, cond, GiB, o).ok());
  o = {};
  o.attention_row_quantum = 0;
  EXPECT_FALSE(plan_total_budget(cfg, cond, GiB, o).ok());
  o = {};
  o.device.d2h_gb_per_s = 0;
  EXPECT_FALSE(plan_total_budget(cfg, cond, GiB, o).ok());
  o = {};
  o.device.gemm_tflops = -2;
  EXPECT_FALSE(min_total_budget(cfg, cond, o).ok());
  auto zero = plan_total_budget(cfg, cond, 0, BudgetOptions{});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, ErrorCode::out_of_budget);
  EXPECT_NE(zero.error().message.find("smallest total budget"), std::string::npos);
}

TEST(BudgetPlan, CudaProfileArithmetic) {
  // 64 heads x 128 at 2048-query chunks: Qs + 4 Ot bf16 [131072, 128] = 5 x 32 MiB,
  // 4 Lt + L f32 [131072] = 5 x 512 KiB, acc f32 [131072, 128] = 64 MiB, cuDNN 64 MiB.
  EXPECT_EQ(cudnn_attention_workspace_bytes(64, 128), 5 * (32ull << 20) + 5 * (512ull << 10) + (64ull << 20) + (64ull << 20));
  EXPECT_EQ(cudnn_attention_workspace_bytes(64, 128), 304611328u);  // 290.5 MiB
  // Odd sizes round each piece up to 256 bytes: R = 64 x 1 = 64 rows of 3: 384 -> 512 B
  // bf16 pieces, 256 B f32 vectors, 768 -> 768 B acc.
  EXPECT_EQ(cudnn_attention_workspace_bytes(1, 3, 64), 5 * 512u + 5 * 256u + 768u + (64ull << 20));
  const DeviceProfile d = test::cuda_profile();
  EXPECT_EQ(d.workspace_bytes, 304611328u);
  EXPECT_EQ(d.default_kv_tile, 8192);
  EXPECT_EQ(d.assumed.size(), 3u);
  const DeviceProfile native = test::cuda_profile(AttentionAlgorithm::native);
  EXPECT_EQ(native.workspace_bytes, 304611328u);  // the build's constant, whichever path runs
  EXPECT_EQ(native.default_kv_tile, 1024);
  const DeviceProfile plain = test::cuda_profile(AttentionAlgorithm::backend_default, CudaBuild{false, true});
  EXPECT_EQ(plain.workspace_bytes, (64ull << 20) + (164ull << 20));  // cuBLASLt GEMM + quantised linears (linear_quant.cu)
  EXPECT_EQ(plain.default_kv_tile, 1024);
  // Per algorithm: cuDNN's query chunks and rate, hopper's 128-query CTAs and rate, native.
  EXPECT_EQ(d.attention_row_quantum, 2048);
  EXPECT_EQ(d.throughput.attention_tflops, 550.0);
  EXPECT_EQ(test::cuda_profile(AttentionAlgorithm::cudnn, {}, 1024).attention_row_quantum, 1024);
  const DeviceProfile hopper = test::cuda_profile(AttentionAlgorithm::hopper);
  EXPECT_EQ(hopper.workspace_bytes, 304611328u);
  EXPECT_EQ(hopper.default_kv_tile, 8192);
  EXPECT_EQ(hopper.attention_row_quantum, 128);
  EXPECT_EQ(hopper.throughput.attention_tflops, 605.0);
  EXPECT_EQ(native.attention_row_quantum, 1);
  EXPECT_EQ(native.throughput.attention_tflops, 305.0);
  // A faster attention hides less transfer per row: the K/V-hiding slice grows with it.
  EXPECT_GT(kv_hiding_slice(hopper.throughput), kv_hiding_slice(d.throughput));
  const BudgetOptions o = budget_options_for(d);
  EXPECT_EQ(o.workspace_bytes, d.workspace_bytes);
  EXPECT_EQ(o.kv_tile, 8192);
  EXPECT_EQ(o.device.pcie_gb_per_s, DeviceFacts{}.pcie_gb_per_s);
}

// The descriptions answer "can this run here" with the messages the backends refuse with
// (one source): the CPU has neither cuDNN nor the Hopper kernel, a CUDA build without
// cuDNN refuses cudnn, hopper serves head dim 128 only; resolve_described refuses the same.
TEST(BudgetPlan, DescriptionsRefuseWhatCannotRun) {
  const BackendDescription cpu = cpu_description();
  for (AttentionAlgorithm a : {AttentionAlgorithm::cudnn, AttentionAlgorithm::hopper}) {
    const Status s = cpu.can_implement_attention(a);
    ASSERT_FALSE(s.ok()) << to_string(a);
    EXPECT_EQ(s.error().code, ErrorCode::unsupported);
    Numerics n;
    n.attention = a;
    const Status live = make_cpu_backend()->set_numerics(n, {});
    ASSERT_FALSE(live.ok());
    EXPECT_EQ(live.message(), s.message()) << "the CPU backend refuses with its description's message";
    EXPECT_FALSE(resolve_described(cpu, n).ok());
  }
  EXPECT_TRUE(cpu.can_implement_attention(AttentionAlgorithm::native, 128).ok());
  EXPECT_EQ(cpu.default_attention(), AttentionAlgorithm::native);
  EXPECT_EQ(cpu.workspace_bytes(Numerics{}), 0u);
  const BackendDescription no_cudnn = cuda_description(CudaBuild{false, true});
  const Status s = no_cudnn.can_implement_attention(AttentionAlgorithm::cudnn);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("built without cuDNN"), std::string::npos) << s.message();
  EXPECT_EQ(no_cudnn.default_attention(), AttentionAlgorithm::native);
  const BackendDescription cuda = cuda_description();
  EXPECT_EQ(cuda.default_attention(), AttentionAlgorithm::cudnn);
  EXPECT_TRUE(cuda.can_implement_attention(AttentionAlgorithm::hopper, 128).ok());
  const Status h64 = cuda.can_implement_attention(AttentionAlgorithm::hopper, 64);
  ASSERT_FALSE(h64.ok());
  EXPECT_NE(h64.message().find("head dim 128"), std::string::npos) << h64.message();
  EXPECT_FALSE(cuda_description(CudaBuild{true, false}).can_implement_attention(AttentionAlgorithm::hopper).ok());
  EXPECT_EQ(cuda.attention(AttentionAlgorithm::backend_default), nullptr);
}
