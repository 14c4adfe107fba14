// One sampling run on the engine: refined text once per prompt, the AdaLN modulation
// tables for the whole schedule once, seeded noise, then the flow Euler sampler
// (sample/sampler.h) with the engine as its velocity model. This is what
// `layerstream generate` runs; it is here (not in the CLI) so tests can drive it.
//
// Order of work (everything that can fail on user input fails before step 1):
//   0. plans for the positive (and, with CFG, the negative) conditioning from the one
//      planner (exec::plan_memory): its knobs mode with the knobs, or its activation
//      budget mode (fails naming the smallest budget);
//   1. refine_text for each prompt used (once per run; at cfg 1 the negative is not
//      refined, it is never evaluated);
//   2. Engine::precompute_adaln with every sigma of the schedule (the AdaLN weights
//      are not touched again; a negative prompt with another length has the same
//      timesteps, so the tables cover its calls too);
//   3. noise = torch-style CPU randn(seed): video first, audio continuing (sample/noise.h);
//   4. sample_flow_euler: per step one forward (cfg 1) or two (positive, negative).
// Memory: the host holds the packed fp32 state and a few same-size vectors (x, v,
// denoised, negative denoised); the device memory is the engine's (one activation
// arena per forward, sized by the plan).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/conditioning.h"
#include "sample/sampler.h"

namespace ls::sample {

// Seeded stand-in text-encoder states (LayerStream has no Qwen3-VL): fp32 [L, width],
// N(0, 1) from TorchCpuGenerator(seed * 2 + which), which = 0 positive, 1 negative.
std::vector<float> standin_text_states(uint64_t seed, int which, int64_t L, int64_t width);

struct GenerateRequest {
  // The positive prompt's conditioning. geometry.text_tokens must equal text's rows.
  // seed, sample_sigmas are filled in by generate() from the fields below.
  h3::Conditioning cond;
  TensorView text;      // host f32|bf16 [L, text_dim]: raw text states of the prompt
  TensorView negative;  // host f32|bf16 [L', text_dim]; required when cfg != 1, else ignored
  std::vector<float> sigmas;  // the schedule: steps + 1 values, descending, last 0
  double cfg = 1.0;
  uint64_t seed = 0;
  exec::PlanKnobs knobs;      // used when budget_bytes == 0
  uint64_t budget_bytes = 0;  // > 0: plan_memory's activation budget mode (budget_bytes, knobs.kv_tile)
  std::vector<float> initial_latent;  // packed fp32, empty = t2va (zeros)
};

struct ForwardRecord {
  int64_t step = 0;
  Prompt prompt = Prompt::positive;
  float sigma = 0;
  exec::RunReport report;
};

struct GenerateResult {
  std::vector<float> video;  // fp32 [latents_dim, T, Hl, Wl]
  std::vector<float> audio;  // fp32 [audio_latents_dim, 2, A]
  exec::Plan plan;           // the positive prompt's plan
  std::optional<exec::Plan> negative_plan;
  std::vector<ForwardRecord> forwards;
  double refine_seconds = 0, adaln_seconds = 0, sampling_seconds = 0, total_seconds = 0;
  uint64_t adaln_table_bytes = 0;
  bool guided() const { return negative_plan.has_value(); }
};

struct GenerateHooks {
  std::function<void(int64_t step, Prompt prompt, float sigma)> on_forward_begin;
  std::function<void(const ForwardRecord&)> on_forward_end;
  StepCallback on_step;
};

// The plans generate() will use, without running anything (for printing / checks).
struct GeneratePlans {
  exec::Plan positive;
  std::optional<exec::Plan> negative;
  h3::Conditioning negative_cond;
};
Expected<GeneratePlans> plan_generation(const h3::H3Config& cfg, const GenerateRequest& req);

Expected<GenerateResult> generate(exec::Engine& engine, const GenerateRequest& req, const GenerateHooks& hooks = {});

}  // namespace ls::sample
