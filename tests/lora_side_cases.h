// LoRAs on quantised models (issue 17; the side path, backend.h Backend::lora_side), shared by
// tests/test_lora_side.cpp (CPU, CI) and tests/cuda/test_lora_side_cuda.cpp (the GPU):
//   - random LoRA files for a model (PEFT-style pairs with alpha, on a chosen set of linears
//     and blocks, random ranks), written to a temporary folder;
//   - the op's scalar reference (the order of backend.h, spelled out loop by loop);
//   - the plan-invariance property with LoRAs: every residency, slicing, K/V and residual
//     offload gives the bytes of the all-resident stock run (memcmp), and the LoRA run is not
//     the run without the LoRA (not vacuous).
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/linear_quant_math.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/lora_source.h"
#include "quant_streaming_cases.h"

namespace ls::test::lora_side {

// The four linears of a block.
inline const std::vector<std::string>& block_linears() {
  static const std::vector<std::string> k = {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"};
  return k;
}

struct LoraSpec {
  std::vector<std::string> linears = block_linears();  // which linears of a block
  std::vector<int64_t> blocks;                         // empty: every block
  int64_t rank_lo = 1, rank_hi = 6;
  bool alpha = true;
  float scale = 0.3f;  // of the up / down values
};

// A LoRA file in PEFT style ("diffusion_model.<m>.lora_B.weight" / ".lora_A.weight",
// bf16, optional ".alpha") for `cfg`, written to `path`. Returns the number of pairs.
inline size_t write_lora(const std::string& path, const h3::H3Config& cfg, const LoraSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, s.scale);
  const std::vector<h3::TensorSpec> specs = h3::h3_tensor_specs(cfg);
  struct E {
    std::string name;
    DType dt;
    std::vector<int64_t> shape;
    std::vector<float> v;
  };
  std::vector<E> es;
  std::vector<int64_t> blocks = s.blocks;
  if (blocks.empty())
    for (int64_t b = 0; b < cfg.num_layers; ++b) blocks.push_back(b);
  for (int64_t b : blocks)
    for (const std::string& l : s.linears) {
      const std::string m = h3::h3_block_key(b, l);
      const h3::TensorSpec* w = nullptr;
      for (const auto& t : specs)
        if (t.name == m + ".weight") w = &t;
      EXPECT_NE(w, nullptr) << m;
      if (w == nullptr) continue;
      const int64_t N = w->shape[0], K = w->shape[1];
      const int64_t r = std::uniform_int_distribution<int64_t>(s.rank_lo, s.rank_hi)(rng);
      E up{"diffusion_model." + m + ".lora_B.weight", DType::bf16, {N, r}, {}};
      E down{"diffusion_model." + m + ".lora_A.weight", DType::bf16, {r, K}, {}};
      for (int64_t i = 0; i < N * r; ++i) up.v.push_back(nd(rng));
      for (int64_t i = 0; i < r * K; ++i) down.v.push_back(nd(rng));
      es.push_back(std::move(up));
      es.push_back(std::move(down));
      if (s.alpha)
        es.push_back(E{"diffusion_model." + m + ".alpha", DType::f32, {},
                       {static_cast<float>(std::uniform_int_distribution<int64_t>(1, 8)(rng))}});
    }
  SafetensorsWriter wr(path);
  for (const E& e : es) EXPECT_TRUE(wr.declare(e.name, e.dt, e.shape).ok()) << e.name;
  EXPECT_TRUE(wr.begin().ok());
  size_t pairs = 0;
  for (const E& e : es) {
    std::vector<unsigned char> bytes(e.v.size() * static_cast<size_t>(dtype_size(e.dt)));
    for (size_t i = 0; i < e.v.size(); ++i) store_from_f32(bytes.data(), e.dt, static_cast<int64_t>(i), e.v[i]);
    EXPECT_TRUE(wr.write_tensor(e.name, bytes.data(), bytes.size()).ok()) << e.name;
    pairs += e.name.ends_with(".lora_A.weight");
  }
  EXPECT_TRUE(wr.commit().ok());
  return pairs;
}

// The LoRA source over a fresh synthetic source of `cfg` (seed) with the given files.
inline std::unique_ptr<lora::LoraSource> lora_source(const h3::H3Config& cfg, uint64_t seed,
                                                     const std::vector<lora::LoraFile>& files) {
  auto inner = std::make_unique<h3::H3SyntheticSource>(cfg, seed);
  auto set = lora::LoraSet::open(files, inner->specs());
  EXPECT_TRUE(set.ok()) << (set.ok() ? "" : set.error().message);
  if (!set.ok()) return nullptr;
  auto src = lora::LoraSource::wrap(std::move(inner), std::move(*set), lora::MergeDtype::f32);
  EXPECT_TRUE(src.ok()) << (src.ok() ? "" : src.error().message);
  if (!src.ok()) return nullptr;
  return std::move(*src);
}

// ---- the op's scalar reference (backend.h, Backend::lora_side) --------------------------
// x bf16 [M, xK] row stride xs; down f32 [K, R]; up f32 [N, R] row stride us; out bf16 [M, N]
// row stride os, in place.
inline void lora_side_reference(const uint16_t* x, int64_t xs, int64_t M, bool swiglu, const float* down, int64_t K,
                                int64_t R, const float* up, int64_t us, int64_t N, uint16_t* out, int64_t os) {
  std::vector<float> t(static_cast<size_t>(R));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t r = 0; r < R; ++r) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float a = swiglu ? lq::lq_swiglu(bf16_to_f32(x[m * xs + k]), bf16_to_f32(x[m * xs + K + k]))
                               : bf16_to_f32(x[m * xs + k]);
        const float p = a * down[k * R + r];
        acc = acc + p;
      }
      t[static_cast<size_t>(r)] = acc;
    }
    for (int64_t n = 0; n < N; ++n) {
      float y = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        const float p = t[static_cast<size_t>(r)] * up[n * us + r];
        y = y + p;
      }
      const float o = bf16_to_f32(out[m * os + n]) + y;
      out[m * os + n] = f32_to_bf16(o);
    }
  }
}

// ---- the plan-invariance property with LoRAs ----------------------------------------------
struct LoraSetup {
  std::unique_ptr<Backend> be;
  ls::test::StreamingCase c;  // c.cfg: the LoRA source's config (side tensors counted)
  std::unique_ptr<lora::LoraSource> src;
  exec::Plan stock;
  ls::test::StreamingRun ref;
  bool ok = false;
};

// A quantised case (quant_streaming_cases.h) with a LoRA of `spec` on it, its all-resident
// stock run, and the checks that the run is not vacuous: it differs from the same model
// without the LoRA.
inline LoraSetup lora_setup(uint64_t seed, quant::Kind kind, int64_t layers, const std::string& device,
                            const std::string& lora_path, const LoraSpec& spec) {
  LoraSetup s;
  s.be = ls::test::streaming_backend(device);
  if (!s.be) return s;
  s.c = quant::quant_case(seed, kind, layers, device != "cpu");
  write_lora(lora_path, s.c.cfg, spec, seed * 101 + 5);
  s.src = lora_source(s.c.cfg, seed, {lora::LoraFile{lora_path, 0.8}});
  if (!s.src) return s;
  const h3::H3Config plain_cfg = s.c.cfg;
  s.c.cfg = s.src->cfg();
  s.ok = ls::test::stock_run(*s.src, s.c, *s.be, s.stock, s.ref);
  if (!s.ok) return s;
  h3::H3SyntheticSource without(plain_cfg, seed);
  h3::H3Config keep = s.c.cfg;
  s.c.cfg = plain_cfg;
  const ls::test::StreamingRun b = quant::run_on(without, s.c, *s.be, exec::Residency{}, s.stock);
  s.c.cfg = keep;
  EXPECT_TRUE(b.ok);
  EXPECT_FALSE(ls::test::same_bytes(b.r.video, s.ref.r.video)) << "the LoRA changed no output bit";
  return s;
}

inline void check_lora_knobs(LoraSetup& su, uint64_t seed, int variants) {
  ls::test::StreamingCase& c = su.c;
  SCOPED_TRACE("case seed " + std::to_string(seed) + ": " + h3::h3_config_summary(c.cfg) + ", kv_tile " +
               std::to_string(c.kv_tile) + ", " + su.src->describe());
  ls::test::check_knob_draws(*su.src, c, *su.be, su.stock, su.ref, seed, variants);
}

// Every plan_total_budget plan from the minimum to all-resident: the same bytes, and what
// the engine held within the plan (the side tensors are counted: they are block tensors).
// min_steps: how many different budget steps the sweep must reach (a model whose weights
// are mostly AdaLN tensors, which the precompute holds one at a time, may reach only one).
inline void check_lora_budgets(LoraSetup& su, int budgets, size_t min_steps = 2) {
  std::set<std::string> steps;
  ls::test::sweep_budgets(*su.src, su.c, *su.be, su.ref, budgets, steps);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_GE(steps.size(), min_steps);
}

}  // namespace ls::test::lora_side
