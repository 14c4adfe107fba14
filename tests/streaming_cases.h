// Weight streaming, K/V offload and residual offload are memory knobs: they must never
// change an output bit (DESIGN.md §1, issue 5). Shared by tests/test_exec_streaming.cpp
// (CPU backend, CI) and tests/cuda/test_exec_streaming_cuda.cpp (the GPU): for random
// tiny configs and layouts, every residency (all, some, no blocks resident; 1 or 2
// slots), K/V offload with chunks of 1..several key tiles, residual offload and their
// combinations, and every plan plan_total_budget makes for budgets from its minimum up,
// give the bytes of the all-resident stock run (memcmp), and the device memory the
// engine held never exceeds the budget plan's prediction.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>

#include "deferred_transfer_backend.h"
#include "exactness_util.h"
#include "exec/budget_plan.h"
#include "exec/planner.h"

namespace ls::test {

struct StreamingCase {
  h3::H3Config cfg;
  std::unique_ptr<h3::H3SyntheticSource> src;
  h3::Conditioning cond;
  Inputs in;
  float sigma = 0.8f;
  int64_t kv_tile = 1024;
};

// gpu: head_dim 32 (the CUDA attention kernel takes 32, 64 or 128). all_modes: partial
// masks, a keyframe and references at augmentation 0.5, a PDD bank of 4 on both heads
// (add_all_modes in exactness_util.h).
// int8: attention int8 (docs/int8-attention.md) needs a power-of-two head dim (CPU: 32, 64
// when wide) and on the GPU head dim 128 and kv_tile 128 (its kernels').
inline StreamingCase make_streaming_case(uint64_t seed, int64_t layers, bool wide, bool gpu, bool all_modes = false,
                                         bool int8 = false) {
  std::mt19937_64 rng(seed);
  StreamingCase c;
  c.cfg = tiny_cfg(rng, /*vary=*/true);
  c.cfg.num_layers = layers;
  if (gpu) c.cfg.head_dim = 32;  // rope dims 6 x rope_inv_freq_len (<= 18) still fit
  if (wide) {  // big enough for the GPU kernels' tiles and real overlap
    c.cfg.heads = 4;
    c.cfg.head_dim = 64;
    c.cfg.rope_inv_freq_len = 8;
    c.cfg.hidden = 256;
    c.cfg.ffn = 512;
  }
  if (all_modes) c.cfg.pdd_heads = 4;
  if (int8) c.cfg.head_dim = gpu ? 128 : wide ? 64 : 32;
  c.src = std::make_unique<h3::H3SyntheticSource>(c.cfg, seed);
  c.cond = random_cond(rng, c.cfg, /*extras=*/!wide && !all_modes);
  if (wide) {
    c.cond.geometry.T = 4;
    c.cond.geometry.Hl = 16;
    c.cond.geometry.Wl = 16;
    c.cond.geometry.A = 40;
    c.cond.geometry.text_tokens = 17;
  }
  if (all_modes) add_all_modes(rng, c.cfg, c.cond);
  c.in = random_inputs(rng, c.cfg, c.cond);
  c.kv_tile = std::uniform_int_distribution<int>(0, 1)(rng) ? std::uniform_int_distribution<int64_t>(1, 16)(rng) : 64;
  if (int8) c.kv_tile = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(c.kv_tile)));  // divides 4096
  if (int8 && gpu) c.kv_tile = kInt8DefaultKvTile;
  const float sigmas[] = {1.0f, 0.8f, 0.5f};
  c.sigma = sigmas[std::uniform_int_distribution<int>(0, 2)(rng)];
  return c;
}

struct StreamingRun {
  exec::ForwardResult r;
  bool ok = false;
};

// One engine over `src` (the case's source, or a wrapper of it: an fp8 conversion, a
// LoRA), refine, precompute, forward.
inline StreamingRun run_streaming_on(const h3::H3TensorSource& src, StreamingCase& c, Backend& be,
                                     const exec::Residency& res, const exec::Plan& plan) {
  StreamingRun out;
  exec::EngineOptions eo;
  eo.residency = res;
  eo.residency.release_source = false;  // several engines share the source
  auto e = exec::Engine::create(src, be, eo);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return out;
  auto t = (*e)->refine_text(c.in.text_view(c.cfg, c.cond));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  if (!t.ok()) return out;
  Status s = (*e)->precompute_adaln({c.sigma}, c.cond);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return out;
  auto r = (*e)->forward(c.cond, *t, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), c.sigma, plan);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return out;
  EXPECT_LE(r->report.measured_peak_bytes, r->report.predicted_peak_bytes);
  out.r = std::move(*r);
  out.ok = true;
  return out;
}

// The same over the case's own source.
inline StreamingRun run_streaming(StreamingCase& c, Backend& be, const exec::Residency& res, const exec::Plan& plan) {
  return run_streaming_on(*c.src, c, be, res, plan);
}

inline void expect_same(const StreamingRun& ref, const StreamingRun& got, const std::string& what) {
  ASSERT_TRUE(got.ok) << what;
  EXPECT_TRUE(same_bytes(ref.r.video, got.r.video)) << what << ": video differs";
  EXPECT_TRUE(same_bytes(ref.r.audio, got.r.audio)) << what << ": audio differs";
}

// A case, its backend, the stock plan and the all-resident stock run that every other
// run is compared with (ok = false after a reported failure, or all-zero outputs).
struct StreamingSetup {
  std::unique_ptr<Backend> be;
  StreamingCase c;
  exec::Plan stock;
  StreamingRun ref;
  bool ok = false;
};

// device: a make_backend name, or "cpu-deferred": the CPU backend with a transfer queue
// that runs its copies only when a fence wait needs them (deferred_transfer_backend.h),
// so a missing wait changes bytes.
inline Expected<std::unique_ptr<Backend>> make_streaming_backend(const std::string& device) {
  if (device == "cpu-deferred") return std::unique_ptr<Backend>(new DeferredTransferBackend(make_cpu_backend()));
  return make_backend(device);
}
inline bool is_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }
// The backend runs attention int8: every plan then holds the int8 buffers (PlanKnobs::int8_attention).
inline bool runs_int8(const Backend& be) { return be.numerics().attention == AttentionAlgorithm::int8; }

// A deferring backend actually held copies back (the check is not vacuous).
inline void expect_deferred(const Backend& be) {
  if (const auto* d = dynamic_cast<const DeferredTransferBackend*>(&be)) {
    EXPECT_GT(d->deferred_copies, 0);
    EXPECT_GT(d->most_pending, 1);
  }
}

// The backend for `device` (make_streaming_backend); null after a reported failure.
inline std::unique_ptr<Backend> streaming_backend(const std::string& device) {
  auto be = make_streaming_backend(device);
  if (!be.ok()) {
    ADD_FAILURE() << be.error().message;
    return nullptr;
  }
  return std::move(*be);
}

// The case's kv_tile made the backend's (a plan's kv_tile must be), the stock plan, and
// the all-resident stock run over `src` that every other run is compared with. False
// after a reported failure, or when the stock run gave all-zero outputs.
inline bool stock_run(const h3::H3TensorSource& src, StreamingCase& c, Backend& be, exec::Plan& stock,
                      StreamingRun& ref) {
  if (const Status t = use_kv_tile(be, c.kv_tile); !t.ok()) {
    ADD_FAILURE() << t.error().message;
    return false;
  }
  exec::PlanKnobs sk;
  sk.kv_tile = c.kv_tile;
  sk.int8_attention = runs_int8(be);
  auto p = exec::make_plan(c.cfg, c.cond, sk);
  if (!p.ok()) {
    ADD_FAILURE() << p.error().message;
    return false;
  }
  stock = *p;
  ref = run_streaming_on(src, c, be, exec::Residency{}, stock);
  const bool ok = ref.ok && sum_abs(ref.r.video) > 0.0 && sum_abs(ref.r.audio) > 0.0;
  if (!ok) ADD_FAILURE() << "the all-resident stock run failed or gave all-zero outputs";
  return ok;
}

// int8: the backend runs attention int8 (set before the case's kv_tile).
inline StreamingSetup streaming_setup(uint64_t seed, const std::string& device, int64_t layers, bool wide,
                                      bool all_modes = false, bool int8 = false) {
  StreamingSetup s;
  s.be = streaming_backend(device);
  if (!s.be) return s;
  if (int8) {
    Numerics n = s.be->numerics();
    n.attention = AttentionAlgorithm::int8;
    n.kv_tile = 0;
    if (const Status t = s.be->set_numerics(n, s.be->diagnostics()); !t.ok()) {
      ADD_FAILURE() << t.message();
      return s;
    }
  }
  s.c = make_streaming_case(seed, layers, wide, is_gpu(device), all_modes, int8);
  s.ok = stock_run(*s.c.src, s.c, *s.be, s.stock, s.ref);
  return s;
}

// Manual knobs: residency x offload x slices.
// One random memory configuration of a knob sweep (the one draw every sweep makes, here
// and in quant_streaming_cases.h / lora_side_cases.h): residency, slices, offloads, K/V
// chunks of whole tiles. Variants 0 and 1 are always covered: one-row slices (0) and
// slices of S - 1 rows, so a last slice of one row (1), with both offloads on;
// pin_edge_residency also streams every block in 0 and keeps every block resident in 1.
struct KnobDraw {
  exec::Residency res;
  exec::PlanKnobs k;
};
// The unit of a K/V chunk (shorter than S): whole kv_tile tiles, and with attention int8 whole
// 128-key tiles too (contract v4: keys are prepared chunk by chunk, and K's scale groups lie
// in 128-key tiles; exec::resolve_kv_chunk refuses other int8 chunks).
inline int64_t kv_chunk_unit(int64_t kv_tile, bool int8) {
  return int8 ? std::lcm(kv_tile, kInt8KeyGroupTile) : kv_tile;
}
inline KnobDraw draw_knobs(std::mt19937_64& rng, int v, int64_t S, int64_t L, int64_t tr, int64_t kv_tile,
                           bool pin_edge_residency, bool int8 = false) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  KnobDraw d;
  d.res.resident_blocks = pick(0, 2) == 0 ? -1 : pick(0, L);
  d.res.slots = pick(1, 2);
  exec::PlanKnobs& k = d.k;
  k.kv_tile = kv_tile;
  k.attn_chunk_tokens = pick(1, S);
  k.mlp_chunk_tokens = pick(0, 1) ? pick(1, S) : 0;
  k.final_chunk_tokens = pick(0, 1) ? pick(1, tr) : 0;
  k.kv_offload = pick(0, 2) != 0;
  k.residual_offload = pick(0, 1) != 0;
  if (v < 2) {
    k.attn_chunk_tokens = v == 0 ? 1 : std::max<int64_t>(1, S - 1);
    k.mlp_chunk_tokens = v == 0 ? 1 : std::max<int64_t>(1, S - 1);
    k.final_chunk_tokens = v == 0 ? 1 : std::max<int64_t>(1, tr - 1);
    k.kv_offload = true;
    k.residual_offload = true;
    if (pin_edge_residency) d.res.resident_blocks = v == 0 ? 0 : -1;
  }
  if (k.kv_offload) {
    const int64_t unit = kv_chunk_unit(kv_tile, int8), tiles = (S + unit - 1) / unit;
    k.kv_chunk_rows = pick(0, 3) == 0 ? 0 : unit * pick(1, std::max<int64_t>(1, std::min<int64_t>(tiles, 4)));
  }
  return d;
}

// A knob run's name in failure messages.
inline std::string knobs_what(const exec::Residency& res, const exec::Plan& p) {
  return "resident " + std::to_string(res.resident_blocks) + ", slots " + std::to_string(res.slots) + ", plan " +
         p.describe();
}

// `variants` draws of draw_knobs with pin_edge_residency over `src` (the quantised and
// LoRA sweeps): each plan gives the bytes of the stock run `ref`.
inline void check_knob_draws(const h3::H3TensorSource& src, StreamingCase& c, Backend& be, const exec::Plan& stock,
                             const StreamingRun& ref, uint64_t seed, int variants) {
  const int64_t S = stock.sizes.S, L = c.cfg.num_layers, tr = stock.sizes.target_rows;
  std::mt19937_64 rng(seed * 31 + 7);
  for (int v = 0; v < variants; ++v) {
    const KnobDraw d = draw_knobs(rng, v, S, L, tr, c.kv_tile, /*pin_edge_residency=*/true, runs_int8(be));
    auto p = exec::make_plan(c.cfg, c.cond, d.k);
    ASSERT_TRUE(p.ok()) << p.error().message;
    expect_same(ref, run_streaming_on(src, c, be, d.res, *p), knobs_what(d.res, *p));
  }
}

inline void check_streaming_knobs(uint64_t seed, const std::string& device, int64_t layers, bool wide, int variants,
                                  bool all_modes = false, bool int8 = false) {
  StreamingSetup su = streaming_setup(seed, device, layers, wide, all_modes, int8);
  ASSERT_TRUE(su.ok);
  StreamingCase& c = su.c;
  Backend* const be = su.be.get();
  const exec::Plan* const stock = &su.stock;
  const StreamingRun& ref = su.ref;
  SCOPED_TRACE("case seed " + std::to_string(seed) + ": " + h3::h3_config_summary(c.cfg) + ", kv_tile " +
               std::to_string(c.kv_tile));
  const int64_t S = stock->sizes.S, L = c.cfg.num_layers;
  std::mt19937_64 rng(seed * 31 + 7);
  for (int v = 0; v < variants; ++v) {
    KnobDraw d =
        draw_knobs(rng, v, S, L, stock->sizes.target_rows, c.kv_tile, /*pin_edge_residency=*/false, runs_int8(*be));
    exec::Residency& res = d.res;
    exec::PlanKnobs& k = d.k;
    // Always covered too, the overlaps (pass 1 attends the first query slice against each
    // chunk behind its copy out; pass 2 reloads for the other slices; the residual's two
    // slice buffers on the transfer queue):
    //   v = 2: one K/V chunk (all rows) and one query slice (no pass-2 reload), residual on device
    //   v = 3: chunks of one tile (several chunks), one query slice, residual offloaded
    //   v = 4: chunks of one tile, 1-row query slices (every slice reloads), residual on device
    //   (int8: a tile of at least 128 keys, kv_chunk_unit)
    //   v = 5: one chunk, several query slices, residual offloaded, 1-row MLP and head slices
    //   v = 6: residual offload alone (K, V on the device), slices of a third of the rows
    if (v >= 2 && v <= 6) {
      k.kv_offload = v != 6;
      k.residual_offload = v == 3 || v == 5 || v == 6;
      const bool one_chunk = v == 2 || v == 5;
      k.kv_chunk_rows = !k.kv_offload ? 0 : one_chunk ? S : std::min(S, kv_chunk_unit(c.kv_tile, runs_int8(*be)));
      k.attn_chunk_tokens = v == 2 || v == 3 ? S : v == 4 ? 1 : std::max<int64_t>(1, S / 3);
      k.mlp_chunk_tokens = v == 5 ? 1 : std::max<int64_t>(1, S / 3);
      k.final_chunk_tokens = v == 5 ? 1 : 0;
    }
    k.int8_attention = runs_int8(*be);
    auto p = exec::make_plan(c.cfg, c.cond, k);
    ASSERT_TRUE(p.ok()) << p.error().message;
    const std::string what = knobs_what(res, *p);
    const StreamingRun got = run_streaming(c, *be, res, *p);
    expect_same(ref, got, what);
    if (!got.ok) continue;
    const exec::RunReport& rep = got.r.report;
    const int64_t R = res.resident_blocks < 0 ? L : res.resident_blocks;
    EXPECT_EQ(rep.streamed_blocks, L - R) << what;
    EXPECT_EQ(rep.kv_offload, k.kv_offload) << what;
    EXPECT_EQ(rep.residual_offload, k.residual_offload) << what;
    // Each streamed block crosses once per forward, never once per slice.
    if (R < L) {
      EXPECT_GT(rep.pcie_weight_bytes, 0u) << what;
      EXPECT_EQ(rep.pcie_weight_bytes % static_cast<uint64_t>(L - R), 0u) << what;
    } else {
      EXPECT_EQ(rep.pcie_weight_bytes, 0u) << what;
    }
    if (k.kv_offload) {
      EXPECT_GT(rep.pcie_kv_bytes, 0u) << what;
    } else {
      EXPECT_EQ(rep.pcie_kv_bytes, 0u) << what;
    }
    if (k.residual_offload) {
      EXPECT_GT(rep.pcie_residual_bytes, 0u) << what;
    } else {
      EXPECT_EQ(rep.pcie_residual_bytes, 0u) << what;
    }
    // K/V traffic: pass 1 out once per block, pass 2 back in for every query slice but
    // the first (attended during pass 1).
    if (k.kv_offload && !k.int8_attention) {
      const uint64_t kv = 2ull * static_cast<uint64_t>(S * c.cfg.inner()) * 2;
      const uint64_t slices = static_cast<uint64_t>((S + p->attn_slice - 1) / p->attn_slice);
      EXPECT_EQ(rep.pcie_kv_bytes, static_cast<uint64_t>(L) * slices * kv) << what;
    }
    // int8 (docs/int8-attention.md §6): no bf16 K/V crosses (the prepare computes them again);
    // the prepared keys (k8 + sk + v8t: 2 I + 4 H bytes a key) out once and in for every
    // slice but the first (attended during the prepare).
    if (k.kv_offload && k.int8_attention) {
      const uint64_t I = static_cast<uint64_t>(c.cfg.inner()), H = static_cast<uint64_t>(c.cfg.heads);
      const uint64_t slices = static_cast<uint64_t>((S + p->attn_slice - 1) / p->attn_slice);
      const uint64_t per_block = slices * static_cast<uint64_t>(S) * (2 * I + 4 * H);
      EXPECT_EQ(rep.pcie_kv_bytes, static_cast<uint64_t>(L) * per_block) << what;
    }
  }
  expect_deferred(*be);
}

// The total-budget options for a case on a backend: the case's kv_tile, the backend's
// workspace and attention row quantum (cuDNN's query chunk: slices in whole chunks), the
// call's modulation rows.
inline exec::BudgetOptions budget_options(const StreamingCase& c, const Backend& be) {
  exec::BudgetOptions bo;
  bo.kv_tile = c.kv_tile;
  bo.workspace_bytes = be.workspace_bytes();
  bo.attention_row_quantum = exec::device_profile(be).attention_row_quantum;
  bo.int8_attention = runs_int8(be);
  auto rows = exec::modulation_rows_for(c.cfg, c.cond, {c.sigma});
  EXPECT_TRUE(rows.ok()) << rows.error().message;
  if (rows.ok()) bo.modulation_rows = *rows;
  return bo;
}

// The budgets a case plans within: the planner's minimum and the all-resident plan's peak
// (nullopt after a reported failure).
struct BudgetSpan {
  uint64_t lo = 0, hi = 0;
};
inline std::optional<BudgetSpan> budget_span(const StreamingCase& c, const exec::BudgetOptions& bo) {
  auto lo = exec::min_total_budget(c.cfg, c.cond, bo);
  EXPECT_TRUE(lo.ok()) << lo.error().message;
  auto all = exec::plan_total_budget(c.cfg, c.cond, 1ull << 40, bo);
  EXPECT_TRUE(all.ok()) << all.error().message;
  if (!lo.ok() || !all.ok()) return std::nullopt;
  return BudgetSpan{*lo, all->predicted_peak_bytes};
}

// Plans `budget`, runs the plan (the residency and activations it chose) and compares the
// outputs with the stock run `ref` by memcmp; what the engine held on the device at its
// fullest stays within the plan, and the plan within the budget. Returns the plan
// (nullopt after a reported planning failure).
inline std::optional<exec::BudgetPlan> check_budget_run(const h3::H3TensorSource& src, StreamingCase& c, Backend& be,
                                                        const StreamingRun& ref, const exec::BudgetOptions& bo,
                                                        uint64_t budget) {
  auto bp = exec::plan_total_budget(c.cfg, c.cond, budget, bo);
  EXPECT_TRUE(bp.ok()) << "budget " << budget << ": " << bp.error().message;
  if (!bp.ok()) return std::nullopt;
  exec::Residency res;
  res.resident_blocks = bp->resident_blocks;
  res.slots = bp->prefetch ? 2 : 1;
  const std::string what = bp->describe();
  const StreamingRun got = run_streaming_on(src, c, be, res, bp->activations);
  expect_same(ref, got, what);
  if (got.ok) {
    EXPECT_LE(got.r.report.device_peak_bytes, bp->predicted_peak_bytes) << what;
  }
  EXPECT_LE(bp->predicted_peak_bytes, budget) << what;
  return std::move(bp).value();
}

// The same over the case's own source.
inline std::optional<exec::BudgetPlan> check_budget_run(StreamingCase& c, Backend& be, const StreamingRun& ref,
                                                        const exec::BudgetOptions& bo, uint64_t budget) {
  return check_budget_run(*c.src, c, be, ref, bo, budget);
}

// `budgets` + 1 budgets evenly from the planner's minimum to the all-resident peak, each
// planned, run over `src` and compared with the stock run `ref` (check_budget_run); the
// steps the plans took go to `steps` (a sweep shows it reached several).
inline void sweep_budgets(const h3::H3TensorSource& src, StreamingCase& c, Backend& be, const StreamingRun& ref,
                          int budgets, std::set<std::string>& steps) {
  const exec::BudgetOptions bo = budget_options(c, be);
  const std::optional<BudgetSpan> span = budget_span(c, bo);
  ASSERT_TRUE(span.has_value());
  for (int i = 0; i <= budgets; ++i) {
    const uint64_t budget = span->lo + (span->hi - span->lo) * static_cast<uint64_t>(i) / static_cast<uint64_t>(budgets);
    const std::optional<exec::BudgetPlan> bp = check_budget_run(src, c, be, ref, bo, budget);
    ASSERT_TRUE(bp.has_value());
    steps.insert(bp->step);
  }
}

// Budgets: every plan_total_budget plan from the minimum to all-resident.
inline void check_streaming_budgets(uint64_t seed, const std::string& device, int64_t layers, bool wide, int budgets,
                                    bool all_modes = false, bool int8 = false) {
  StreamingSetup su = streaming_setup(seed, device, layers, wide, all_modes, int8);
  ASSERT_TRUE(su.ok);
  SCOPED_TRACE("case seed " + std::to_string(seed) + ": " + h3::h3_config_summary(su.c.cfg));
  std::set<std::string> steps;
  sweep_budgets(*su.c.src, su.c, *su.be, su.ref, budgets, steps);
  if (::testing::Test::HasFatalFailure()) return;
  // Not vacuous: the sweep reached more than one kind of plan.
  EXPECT_GE(steps.size(), 2u);
  expect_deferred(*su.be);
}

}  // namespace ls::test
