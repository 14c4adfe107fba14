// The plan-invariance property on quantised models (issue 14), shared by
// tests/test_quant_streaming.cpp (CPU, CI) and tests/cuda/test_quant_streaming_cuda.cpp
// (the GPU): int8 ConvRot, fp8 e4m3, int8 with the AdaLN linears quantised (the full
// files), a file whose formats are mixed per layer, one whose blocks differ in layout
// (bf16 edge blocks as the _skip_edges files, int8 and fp8 blocks), and --precision fp8 (static and
// dynamic activation scale). Every residency, slicing (slices of one row, a last slice
// of one row), K/V and residual offload, and every plan of the budget sweep gives the
// bytes of the all-resident stock run (memcmp): the quantised linears are
// row-independent by construction (backend.h). Each case is checked to differ from the
// bf16 model of the same weights (its linears really ran quantised).
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "model/h3/quant.h"
#include "streaming_cases.h"

namespace ls::test::quant {


enum class Kind { int8, fp8, int8_full, mixed, fp8_convert, fp8_dynamic, mixed_blocks };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::int8: return "int8-convrot";
    case Kind::fp8: return "fp8";
    case Kind::int8_full: return "int8-convrot-full";
    case Kind::mixed: return "mixed int8/fp8/bf16";
    case Kind::fp8_convert: return "--precision fp8";
    case Kind::fp8_dynamic: return "--precision fp8, dynamic activation scale";
    case Kind::mixed_blocks: return "blocks of different layouts (skip-edges bf16 / int8 / fp8)";
  }
  return "?";
}

// Formats decided per layer: in every block qkv_proj and fc2 int8 ConvRot, out_proj fp8
// e4m3, fc1 bf16 (every block the same layout; mixed_blocks_layout varies it per block).
inline h3::QuantLayout mixed_layout(const h3::H3Config& cfg) {
  h3::QuantLayout q = *h3::synthetic_quant_layout(cfg, h3::SyntheticFormat::int8_convrot);
  const h3::QuantLayout f8 = *h3::synthetic_quant_layout(cfg, h3::SyntheticFormat::fp8);
  for (int64_t b = 0; b < cfg.num_layers; ++b) {
    q.linears[h3::h3_block_key(b, "attn.out_proj")] = f8.linears.at(h3::h3_block_key(b, "attn.out_proj"));
    q.linears.erase(h3::h3_block_key(b, "mlp.fc1"));
  }
  return q;
}

// Blocks of different layouts (and so different byte counts: the weight store's slots hold
// the largest streamed block, each copy moves a block's own bytes): the community
// int8 "_skip_edges" layout (blocks 0, 1, L-2, L-1 bf16, the rest int8 ConvRot) with block
// 2, where it is not an edge, fp8 e4m3 instead. With 6 blocks: bf16 bf16 fp8 int8 bf16 bf16.
inline h3::QuantLayout mixed_blocks_layout(const h3::H3Config& cfg) {
  h3::QuantLayout q = *h3::synthetic_quant_layout(cfg, h3::SyntheticFormat::int8_convrot_skip_edges);
  const h3::QuantLayout f8 = *h3::synthetic_quant_layout(cfg, h3::SyntheticFormat::fp8);
  if (cfg.num_layers >= 5)
    for (const char* m : {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"})
      q.linears[h3::h3_block_key(2, m)] = f8.linears.at(h3::h3_block_key(2, m));
  return q;
}

// A random tiny case (tests/exactness_util.h) whose linears admit a ConvRot group: every K
// a multiple of 4 (head_dim rounded up to a multiple of 4; hidden and ffn are multiples
// of 8). int8_full uses the tiny preset (time_embed_dim 64: the AdaLN linears' G = 64).
inline ls::test::StreamingCase quant_case(uint64_t seed, Kind kind, int64_t layers, bool gpu) {
  std::mt19937_64 rng(seed);
  ls::test::StreamingCase c;
  if (kind == Kind::int8_full) {
    c.cfg = *h3::h3_preset("tiny");
    c.cfg.hidden = 64;  // small and quick; K = 64 for qkv / fc1 / out_proj
    c.cfg.ffn = 128;
  } else {
    c.cfg = ls::test::tiny_cfg(rng, /*vary=*/true);
    c.cfg.head_dim = (c.cfg.head_dim + 3) / 4 * 4;
  }
  // The CUDA attention kernel takes head_dim 32, 64 or 128 (the tiny preset's 64 stays: its
  // rotary width 6 * 8 = 48 would not fit 32).
  if (gpu && c.cfg.head_dim != 64 && c.cfg.head_dim != 128) c.cfg.head_dim = 32;
  // fp8 on the CUDA tensor cores needs every K (hidden, inner, ffn) a multiple of 16.
  if (gpu) {
    c.cfg.hidden = (c.cfg.hidden + 15) / 16 * 16;
    c.cfg.ffn = (c.cfg.ffn + 15) / 16 * 16;
  }
  c.cfg.num_layers = layers;
  switch (kind) {
    case Kind::int8: c.cfg.quant = *h3::synthetic_quant_layout(c.cfg, h3::SyntheticFormat::int8_convrot); break;
    case Kind::fp8: c.cfg.quant = *h3::synthetic_quant_layout(c.cfg, h3::SyntheticFormat::fp8); break;
    case Kind::int8_full: c.cfg.quant = *h3::synthetic_quant_layout(c.cfg, h3::SyntheticFormat::int8_convrot_full); break;
    case Kind::mixed: c.cfg.quant = mixed_layout(c.cfg); break;
    case Kind::mixed_blocks: c.cfg.quant = mixed_blocks_layout(c.cfg); break;
    case Kind::fp8_convert:
    case Kind::fp8_dynamic: break;
  }
  c.src = std::make_unique<h3::H3SyntheticSource>(c.cfg, seed);
  c.cond = ls::test::random_cond(rng, c.cfg, /*extras=*/true);
  c.in = ls::test::random_inputs(rng, c.cfg, c.cond);
  c.kv_tile = std::uniform_int_distribution<int>(0, 1)(rng) ? std::uniform_int_distribution<int64_t>(1, 16)(rng) : 64;
  const float sigmas[] = {1.0f, 0.8f, 0.5f};
  c.sigma = sigmas[std::uniform_int_distribution<int>(0, 2)(rng)];
  return c;
}

struct QuantSetup {
  std::unique_ptr<Backend> be;
  ls::test::StreamingCase c;
  std::unique_ptr<h3::H3TensorSource> wrapped;  // fp8_convert only
  exec::Plan stock;
  ls::test::StreamingRun ref;
  bool ok = false;
};

// One engine over `src`: refine, precompute, forward (ls::test::run_streaming_on).
inline ls::test::StreamingRun run_on(const h3::H3TensorSource& src, ls::test::StreamingCase& c, Backend& be,
                                     const exec::Residency& res, const exec::Plan& plan) {
  return ls::test::run_streaming_on(src, c, be, res, plan);
}

inline QuantSetup quant_setup(uint64_t seed, Kind kind, int64_t layers, const std::string& device) {
  QuantSetup s;
  s.be = ls::test::streaming_backend(device);
  if (!s.be) return s;
  s.c = quant_case(seed, kind, layers, device != "cpu");
  if (kind == Kind::fp8_convert || kind == Kind::fp8_dynamic) {
    s.wrapped = h3::fp8_convert_source(std::make_unique<h3::H3SyntheticSource>(s.c.cfg, seed), kind == Kind::fp8_dynamic);
    s.c.cfg = s.wrapped->cfg();  // the planner counts the fp8 bytes
  }
  const h3::H3TensorSource& src = s.wrapped ? *s.wrapped : *s.c.src;
  s.ok = ls::test::stock_run(src, s.c, *s.be, s.stock, s.ref);
  if (!s.ok) return s;
  // Not vacuous: the quantised model is not the bf16 one (its linears really ran quantised).
  h3::H3Config plain = s.c.cfg;
  plain.quant = h3::QuantLayout();
  h3::H3SyntheticSource bf(plain, seed);
  const ls::test::StreamingRun b = run_on(bf, s.c, *s.be, exec::Residency{}, s.stock);
  EXPECT_TRUE(b.ok);
  EXPECT_FALSE(ls::test::same_bytes(b.r.video, s.ref.r.video)) << kind_name(kind) << ": same output as the bf16 model";
  return s;
}

inline void check_knobs(uint64_t seed, Kind kind, int64_t layers, int variants, const std::string& device) {
  QuantSetup su = quant_setup(seed, kind, layers, device);
  ASSERT_TRUE(su.ok);
  ls::test::StreamingCase& c = su.c;
  SCOPED_TRACE(std::string(kind_name(kind)) + ", case seed " + std::to_string(seed) + ": " +
               h3::h3_config_summary(c.cfg) + ", kv_tile " + std::to_string(c.kv_tile));
  ls::test::check_knob_draws(su.wrapped ? *su.wrapped : *c.src, c, *su.be, su.stock, su.ref, seed, variants);
}

inline void check_budgets(uint64_t seed, Kind kind, int64_t layers, int budgets, const std::string& device) {
  QuantSetup su = quant_setup(seed, kind, layers, device);
  ASSERT_TRUE(su.ok);
  ASSERT_FALSE(su.wrapped) << "budget sweeps run on StreamingCase sources";
  SCOPED_TRACE(std::string(kind_name(kind)) + ", case seed " + std::to_string(seed) + ": " +
               h3::h3_config_summary(su.c.cfg));
  std::set<std::string> steps;
  ls::test::sweep_budgets(*su.c.src, su.c, *su.be, su.ref, budgets, steps);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_GE(steps.size(), 2u);  // the sweep reached more than one kind of plan
}

}  // namespace ls::test::quant
