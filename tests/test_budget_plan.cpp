// The total-VRAM-budget planner (exec/budget_plan.h, docs/budget.md): decisions at
// S = 111,274 on the real H3 dimensions (the table docs/budget.md shows is printed by
// H3DecisionTable), byte arithmetic by hand, monotonicity in the budget, every peak
// within its budget, the named minimum works and one byte less fails, tiny configs.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>

#include "core/arena.h"
#include "exactness_util.h"
#include "exec/budget_plan.h"

using namespace ls;
using namespace ls::exec;

namespace {

constexpr uint64_t GiB = 1ull << 30;
constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

h3::Conditioning clip(int64_t frames, int64_t w, int64_t h, int64_t L) {
  h3::Conditioning c;
  auto g = h3::clip_geometry(frames, w, h, L);
  EXPECT_TRUE(g.ok());
  c.geometry = *g;
  return c;
}
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

// Invariants every plan satisfies, whatever the inputs.
void expect_consistent(const BudgetPlan& p, uint64_t budget) {
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
  // Device activation lists: peak = persistent + max phase.
  uint64_t mx = 0;
  for (const auto& ph : p.device_phases) mx = std::max(mx, ph.bytes());
  EXPECT_EQ(p.activation_bytes, sum_bytes(p.device_persistent) + mx);
  EXPECT_EQ(find(p.device_persistent, "residual x") == nullptr, p.residual_offload);
  const PlanPhase& attn = p.device_phases[1];
  ASSERT_EQ(attn.name, "attn");
  EXPECT_EQ(find(attn.buffers, "K tile 0") != nullptr, p.kv_offload);
  if (p.kv_offload || p.residual_offload) {
    EXPECT_TRUE(p.activations.two_pass_attention());
  } else {
    // Without offload the device lists are plan.h's own: same bytes as the Plan's.
    EXPECT_EQ(p.activation_bytes, p.activations.predicted_peak_bytes);
  }
  if (p.kv_offload) {
    EXPECT_EQ(find(attn.buffers, "K tile 1")->rows, std::min(p.activations.kv_tile, p.sizes.S));
  }
  EXPECT_FALSE(p.describe().empty());
}

}  // namespace

// The K/V-hiding slice: c >= T / B. 600 TFLOP/s over 50 GB/s -> 12,000 queries; at that
// c, streaming K and V of all S keys takes as long as the slice's attention.
TEST(BudgetPlan, KvHidingSliceArithmetic) {
  DeviceFacts f;
  EXPECT_EQ(kv_hiding_slice(f), 12000);
  const double S = 93000, I = 7168;
  const double copy_s = 2 * S * I * 2 / (f.pcie_gb_per_s * 1e9);            // 2.67 GB -> 53 ms
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
  BudgetOptions o;  // kv_tile 1024, 64 MiB workspace, 25 modulation rows, 50 GB/s, 600 TFLOP/s
  const uint64_t budgets[] = {kUnlimited, 24 * GiB, 12 * GiB, 8 * GiB, 6 * GiB, 4 * GiB, 3 * GiB, 5 * GiB / 2};
  std::printf("S = 111274, h3 preset, kv_tile 1024, workspace 64 MiB, 25 modulation rows, K/V-hiding slice 12000\n");
  std::printf("| budget GiB | step | resident / streamed blocks | slots | K/V | residual | attn / MLP / head slice |"
              " weights | slots | tables | activations | peak GiB | PCIe GB / forward |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<BudgetPlan> plans;
  for (uint64_t b : budgets) {
    auto p = plan_total_budget(cfg, cond, b, o);
    ASSERT_TRUE(p.ok()) << gib(b) << ": " << p.error().message;
    EXPECT_EQ(p->sizes.S, 111274);
    expect_consistent(*p, b);
    std::printf("| %s | %s | %lld / %lld | %lld | %s | %s | %lld / %lld / %lld | %s | %s | %s | %s | %s | %.1f |\n",
                b == kUnlimited ? "unlimited" : gib(b).c_str(), p->step.c_str(),
                static_cast<long long>(p->resident_blocks), static_cast<long long>(p->streamed_blocks()),
                static_cast<long long>(p->slots), p->kv_offload ? "offloaded" : "device",
                p->residual_offload ? "offloaded" : "device", static_cast<long long>(p->activations.attn_slice),
                static_cast<long long>(p->activations.mlp_slice), static_cast<long long>(p->activations.final_slice),
                gib(p->resident_weight_bytes).c_str(), gib(p->slot_bytes).c_str(), gib(p->modulation_table_bytes).c_str(),
                gib(p->activation_bytes).c_str(), gib(p->predicted_peak_bytes).c_str(),
                static_cast<double>(p->pcie_bytes_per_forward()) / 1e9);
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
    EXPECT_GE(plans[i].activations.attn_slice, 12000);
    EXPECT_EQ(plans[i].slots, 2);
  }
  EXPECT_GT(plans[1].resident_blocks, plans[2].resident_blocks);
  // 6 GiB: K and V of all rows (2.97 GiB) still fit next to 2 slots, with small slices.
  EXPECT_EQ(plans[4].step, "weights streamed, small slices");
  EXPECT_EQ(plans[4].resident_blocks, 0);
  EXPECT_FALSE(plans[4].kv_offload);
  EXPECT_LT(plans[4].activations.attn_slice, 12000);
  // 4 and 3 GiB: K/V offloaded, the residual [S, D] (1.11 GiB) still fits.
  for (int i : {5, 6}) {
    EXPECT_TRUE(plans[i].kv_offload);
    EXPECT_FALSE(plans[i].residual_offload);
    EXPECT_EQ(plans[i].resident_blocks, 0);
  }
  // 2.5 GiB: the residual [S, D] leaves the device too.
  EXPECT_TRUE(plans[7].kv_offload && plans[7].residual_offload);
  // Streaming never increases with the budget down the table... (see Monotonic below).
  for (size_t i = 1; i < plans.size(); ++i) {
    EXPECT_GE(plans[i].streamed_blocks(), plans[i - 1].streamed_blocks());
    EXPECT_GE(plans[i].kv_offload, plans[i - 1].kv_offload);
    EXPECT_GE(plans[i].residual_offload, plans[i - 1].residual_offload);
  }
  EXPECT_LT(*min, 3 * GiB);
}

// More budget never streams more: streamed blocks, K/V offload and residual offload are
// non-increasing in the budget, over a sweep from the minimum to all-resident.
TEST(BudgetPlan, MonotonicInTheBudget) {
  h3::H3Config cfg;
  const auto cond = clip_15s_1mp();
  for (bool prefetch : {true, false}) {
    BudgetOptions o;
    o.prefetch = prefetch;
    auto min = min_total_budget(cfg, cond, o);
    ASSERT_TRUE(min.ok());
    auto all = plan_total_budget(cfg, cond, kUnlimited, o);
    ASSERT_TRUE(all.ok());
    const uint64_t top = all->predicted_peak_bytes + GiB;
    int64_t last_streamed = cfg.num_layers + 1;
    bool last_kv = true, last_res = true;
    int steps = 0;
    for (uint64_t b = *min; b <= top; b += 97 * (1ull << 20), ++steps) {
      auto p = plan_total_budget(cfg, cond, b, o);
      ASSERT_TRUE(p.ok()) << b << ": " << p.error().message;
      EXPECT_LE(p->predicted_peak_bytes, b);
      EXPECT_LE(p->streamed_blocks(), last_streamed) << "budget " << b;
      EXPECT_LE(p->kv_offload, last_kv) << "budget " << b;
      EXPECT_LE(p->residual_offload, last_res) << "budget " << b;
      if (p->streamed()) {
        EXPECT_EQ(p->slots, prefetch ? 2 : 1);
      }
      last_streamed = p->streamed_blocks();
      last_kv = p->kv_offload;
      last_res = p->residual_offload;
    }
    EXPECT_GT(steps, 100);
    EXPECT_EQ(last_streamed, 0);  // the sweep reached all-resident
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
      auto min = min_total_budget(c.cfg, c.cond, o);
      ASSERT_TRUE(min.ok()) << min.error().message;
      ASSERT_GT(*min, 0u);
      auto ok = plan_total_budget(c.cfg, c.cond, *min, o);
      ASSERT_TRUE(ok.ok()) << ok.error().message;
      expect_consistent(*ok, *min);
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
    o.prefetch = (rng() & 1) != 0;
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
    bool last_kv = true, last_res = true;
    for (int k = 0; k <= 60; ++k) {
      const uint64_t b = lo + (hi - lo) * static_cast<uint64_t>(k) / 60;
      auto p = plan_total_budget(cfg, cond, b, o);
      ASSERT_TRUE(p.ok()) << p.error().message;
      expect_consistent(*p, b);
      EXPECT_LE(p->streamed_blocks(), last_streamed);
      EXPECT_LE(p->kv_offload, last_kv);
      EXPECT_LE(p->residual_offload, last_res);
      last_streamed = p->streamed_blocks();
      last_kv = p->kv_offload;
      last_res = p->residual_offload;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 40 * 61);
}

// K/V offload traffic: pass 1 sends K and V of all rows out once per block; pass 2
// brings them back once per query slice.
TEST(BudgetPlan, PcieArithmetic) {
  h3::H3Config cfg;
  BudgetOptions o;
  o.allow_residual_offload = false;
  auto p = plan_total_budget(cfg, clip_15s_1mp(), 4 * GiB, o);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_TRUE(p->kv_offload);
  const uint64_t S = 111274, I = 7168, kv = 2 * S * I * 2;
  const uint64_t slices = (S + p->activations.attn_slice - 1) / p->activations.attn_slice;
  EXPECT_EQ(p->pcie_kv_bytes, 50 * (kv + slices * kv));
  EXPECT_EQ(p->host_pinned_bytes, kv);
  EXPECT_EQ(p->pcie_weight_bytes, 50ull * 770725376ull);
  EXPECT_EQ(p->pcie_residual_bytes, 0u);
  std::printf("%s\n", p->describe().c_str());
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
  auto zero = plan_total_budget(cfg, cond, 0, BudgetOptions{});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, ErrorCode::out_of_budget);
  EXPECT_NE(zero.error().message.find("smallest total budget"), std::string::npos);
}
