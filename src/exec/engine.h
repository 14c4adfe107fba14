// The engine: the public C++ API the sampler and the CLI drive. One Engine holds a
// model's weights on one backend and runs H3 denoiser calls under a Plan; with
// EngineOptions::peer_backends it runs every call sequence parallel over several
// backends (one rank each, one thread per rank; docs/multi-gpu.md), with one rank's bytes.
//
//   auto src = h3::open_h3_checkpoint(path);                 // or H3SyntheticSource
//   auto backend = make_backend("cpu");
//   auto engine = exec::Engine::create(**src, **backend);   // weights resident
//   auto text = engine->refine_text(states);                 // once per prompt per run
//   h3::Conditioning cond; cond.geometry = *h3::clip_geometry(frames, w, h, L);
//   auto plan = exec::make_plan(cfg, cond, knobs);           // or plan_for_budget(...)
//   engine->precompute_adaln(all_sigmas, cond);              // before the first step
//   for each step: auto r = engine->forward(cond, *text, video, audio, sigma, *plan);
//                  r->video, r->audio: velocities (ComfyUI sign), r->report
//
// Exactness (DESIGN.md §1): for fixed (weights, inputs, backend, kv_tile) the output
// bytes do not depend on the plan's slice sizes, on whether precompute_adaln ran, or on
// the number of CPU threads. tests/test_exactness*.cpp prove it by memcmp.
//
// Memory: activations come from one Arena per forward whose capacity is the plan's
// predicted peak (exceeding it is an error, never a silent growth). Weights live in a
// WeightStore (exec/weights.h): host views on the CPU, resident blocks plus streamed
// blocks through slots on a device. Modulation tables (AdaLN outputs) live in their own
// arena, sized exactly. With K/V offload, K and V of a block go to pinned host memory
// in pass 1 and come back chunk by chunk in pass 2 (double-buffered on the transfer
// queue); with residual offload the residual stream lives in pinned host memory and
// each slice is copied in and out around its work. Every device arena draws from one
// counting resource, so RunReport::device_peak_bytes is what LayerStream held at most.
// The forward's phases live in files of their own (exec/phase_*.h, typed buffers in
// exec/buffers.h; docs/architecture.md has the layout).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/plan.h"
#include "exec/weights.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls::h3 {
class H3TensorSource;
}

namespace ls::exec {

using h3::Conditioning;

// Refined text states (condition_proj + token refiner + final_norm), computed once per
// prompt per run and reused by every step. Host bf16 [L, D].
struct RefinedText {
  int64_t L = 0, D = 0;
  std::vector<uint16_t> bf16;  // bf16 bits [L, D]
  TensorView view() const;     // host bf16 [L, D] (read-only in spirit)
};

// Device memory at one point of a forward (EngineOptions::record_memory): what each
// LayerStream arena held on the device when a phase of a block ended. `held` also counts
// the activation arena's unused capacity (it is reserved at the plan's predicted peak).
struct MemorySample {
  std::string phase;         // "embed", "attention", "mlp", "final"
  int64_t block = -1;        // DiT block, -1 outside the block loop
  double seconds = 0.0;      // since the forward began
  uint64_t weights = 0;      // resident block weights + non-block weights
  uint64_t slots = 0;        // streaming slots
  uint64_t activations = 0;  // activation arena's high-water mark during the phase (residual, slices, K/V)
  uint64_t kv = 0;           // K and V buffers of two-pass attention (resident or offload chunks), part of `activations`
  uint64_t adaln = 0;        // modulation tables
  uint64_t workspace = 0;    // backend workspace
  uint64_t held = 0;         // everything LayerStream held on the device
};

// What one forward did (for the status line and --json).
struct RunReport {
  bool two_pass_attention = false;
  bool sliced_mlp = false;
  bool sliced_head = false;
  bool stock = true;
  int64_t S = 0;             // packed rows
  int64_t target_rows = 0;   // rows through the final layer
  int64_t attn_slice = 0;    // 0 = stock attention
  int64_t mlp_slice = 0;
  int64_t final_slice = 0;
  int64_t kv_tile = 0;
  uint64_t predicted_peak_bytes = 0;  // activation arena: planner's prediction
  uint64_t measured_peak_bytes = 0;   // activation arena: high-water mark of this call
  uint64_t stock_peak_bytes = 0;      // the stock plan's predicted peak, for comparison
  uint64_t adaln_table_bytes = 0;     // modulation tables held (precomputed or per call)
  bool adaln_precomputed = false;     // tables came from precompute_adaln
  double wall_seconds = 0.0;
  std::string backend;                // "cpu", "cuda:0 (...)"
  std::string numerics;               // the backend's resolved numerics (describe(Backend::numerics()))
  // Residency and traffic (issue 5).
  int64_t resident_blocks = 0;        // blocks whose weights stay on the device
  int64_t streamed_blocks = 0;        // blocks copied into slots during this call
  int64_t slots = 0;                  // 2 = prefetch, 1 = copy then compute, 0 = none
  bool kv_offload = false;            // K/V of each block went to host memory and back
  bool residual_offload = false;      // the residual stream lived in host memory
  int64_t kv_chunk = 0;               // keys per K/V chunk on the device (K/V offload)
  uint64_t pcie_weight_bytes = 0;     // host -> device bytes of streamed block weights
  uint64_t pcie_kv_bytes = 0;         // K/V bytes moved both ways
  uint64_t pcie_residual_bytes = 0;   // residual bytes moved both ways
  uint64_t device_weight_bytes = 0;   // resident weights + slots
  uint64_t device_held_bytes = 0;     // every LayerStream arena on the device during this call
  uint64_t device_peak_bytes = 0;     // the most LayerStream held on the device since create()
  uint64_t pinned_host_bytes = 0;     // pinned host memory (streamed weights, K/V, residual)
  std::map<std::string, double> phase_seconds;  // EngineOptions::profile only: seconds per phase, summed over blocks
  // Sequence parallel (docs/multi-gpu.md): the ranks, and per rank its activation
  // arena's measured peak and the most it held on its device. With ranks > 1,
  // measured_peak_bytes and device_peak_bytes are the largest over the ranks; the
  // other figures (weights, traffic, memory samples) are rank 0's.
  int64_t ranks = 1;
  std::vector<uint64_t> rank_measured_peak_bytes;
  std::vector<uint64_t> rank_device_peak_bytes;
  std::vector<MemorySample> memory;   // EngineOptions::record_memory only: one sample per phase and block

  // One line like ComfyUI's memory-patch nodes:
  // "[LayerStream] two-pass attention (4096-row slices), sliced MLP (4096), stock head; S 8 234;
  //  activation peak 88.1 MiB measured / 88.1 MiB predicted (stock 412.6 MiB, -78.6 %); 3.41 s"
  std::string status_line() const;
  std::string to_json() const;  // one JSON object with every field above
};

struct ForwardResult {
  // Velocities in ComfyUI's sign convention (x0 = x - sigma * v), already negated, masks
  // and the audio carry transform applied. fp32 holding bf16-exact values.
  std::vector<float> video;  // fp32 [latents_dim, T, Hl, Wl]
  std::vector<float> audio;  // fp32 [audio_latents_dim, 2, A]
  RunReport report;
  // FNV-1a 64 of the bytes of video then audio: equal across plans and budgets (what the
  // CLI prints and the benchmarks compare).
  uint64_t hash() const;
};

// Device outputs of one forward (issue 13): views of the caller's output latents on the
// engine's device, contiguous f32|bf16, video [latents_dim, T, Hl, Wl] and audio
// [audio_latents_dim, 2, A]. A stream whose view is set gets its velocities written
// there on the device (unpacked, negated, masked, carried: phase_final); ForwardResult
// still holds them as fp32 (read back for the fingerprint and the non-finite check).
// Empty views: host only. With the audio carry (cond.audio_scale != 1) the audio output
// and the audio input must be on the same side (both on the device, or both on the host).
struct ForwardOutputs {
  TensorView video, audio;
};

// Named intermediates (style-lessons §7), called synchronously with device views that
// are valid only during the call (layer = -1 when not per block). Names:
//   "text.embed" bf16 [L, D] (after condition_proj), "text.refined" bf16 [L, D];
//   "adaln.input" [M, t] (bf16 silu(t_emb) unpruned / f32 curve rows), "adaln.block"
//   [3M, 6D] per block, "adaln.final" [M, 2D] (tables over the M timesteps being
//   computed: one call's, or the whole schedule's in precompute_adaln);
//   "x.embed" bf16 [S, D] (packed input rows); "block.attn" / "block.mlp" bf16 [S, D]
//   (residual after each half of block `layer`).
// Plan-independent: the residual is whole at these points whatever the slicing.
using EvalCallback = std::function<void(const std::string& name, int64_t layer, const TensorView& t)>;

struct EngineOptions {
  EvalCallback eval;  // optional
  // Where the weights live (exec/weights.h): every block resident by default; a
  // BudgetPlan gives resident_blocks and slots.
  Residency residency;
  // Synchronise at every phase boundary and report seconds per phase
  // (RunReport::phase_seconds). A diagnostic: it removes overlap between phases.
  bool profile = false;
  // Check the residual for NaN/inf after every half block and the outputs at the end
  // (one reduction per half block: cheap next to the block). A non-finite value fails
  // forward() with ErrorCode::nonfinite naming the first block and phase where it
  // appeared. false: no check (the CLI's --allow-nonfinite). Never changes a bit.
  bool check_finite = true;
  // Called after each DiT block (blocks done, blocks in all) on the calling thread.
  std::function<void(int64_t done, int64_t total)> progress;
  // Record RunReport::memory (device memory per phase and block, for --memory-plot).
  bool record_memory = false;
  // Sequence parallel over N = 1 + peer_backends.size() ranks (Ulysses, docs/multi-gpu.md):
  // create()'s backend is rank 0, these are ranks 1 .. N-1 (distinct, the same kind of
  // device, the same numerics; they must outlive the engine). Each rank holds its own
  // copy of the weights (this residency on every rank), its own AdaLN tables and
  // activation arena (plans are per rank: PlanKnobs::ranks = N), and the engine runs
  // one thread per rank in forward(). The output bytes equal one rank's. N must divide
  // the heads; `eval` is not available with N > 1; `progress` is called by rank 0.
  std::vector<Backend*> peer_backends;
};

class Engine {
 public:
  // Checks the config, takes every weight the forward needs through a WeightStore
  // (resident: copied to the device once for a non-CPU backend). `weights` and
  // `backend` must outlive the engine.
  static Expected<std::unique_ptr<Engine>> create(const h3::H3TensorSource& weights, Backend& backend,
                                                  const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const h3::H3Config& config() const;
  Backend& backend() const;

  // condition_proj (if text_dim != hidden) + refiner blocks + final_norm on raw text
  // states: host f32|bf16 [L, text_dim] (f32 is rounded to bf16 first, as ComfyUI casts).
  // The refiner's attention walks its keys in tiles of the backend's numerics().kv_tile.
  Expected<RefinedText> refine_text(const TensorView& text_states);

  // Computes the modulation tables of every block and the final layer for every
  // distinct timestep any of `sigmas` (the whole schedule, video sigmas) produces under
  // `cond`; afterwards forward() at those sigmas reads the tables and never touches an
  // AdaLN weight. Bytes equal computing per step (tested). Replaces earlier tables.
  Status precompute_adaln(const std::vector<float>& sigmas, const Conditioning& cond);
  void drop_adaln_tables();
  // Whether the tables precompute_adaln(sigmas, cond) would make are the ones held: the
  // same timesteps (tables are a function of the timesteps and the weights alone), on
  // every rank. A caller keeps them across calls and runs while this holds (issue 25).
  bool has_adaln_tables(const std::vector<float>& sigmas, const Conditioning& cond) const;
  // Frees the activation arena a previous call kept (and the per-call tables), so that
  // work outside the steps (the AdaLN precompute: tables plus one block's AdaLN weight)
  // does not stack on it; the next prepare() / forward() takes the arena again. The
  // planner counts the precompute and the steps as separate peaks (exec/planner.h).
  void release_activations();

  // Optional: takes the plan's device activation arena and, with offload, its pinned
  // host buffers now (pinning gigabytes of host memory takes seconds) instead of in
  // the first forward(); fails here, before any step, when they cannot be had, or when
  // the plan does not fit this call (see forward).
  Status prepare(const Conditioning& cond, const Plan& plan);

  // One denoiser call at video sigma `sigma` (the sampler's fp32 sigma; the timestep is
  // fl32(sigma * 1000) as ComfyUI passes it). Inputs:
  //   video f32|bf16 [latents_dim, T, Hl, Wl], audio f32|bf16 [audio_latents_dim, 2, A],
  //   any strides, in host memory or on the engine's device (packed there: no host copy)
  // (the sampler's state: rounded to bf16 on entry, as ComfyUI casts to the compute
  // dtype; the audio part is the carried variable when cond.audio_scale != 1).
  // `outputs`: optional device output views (ForwardOutputs). The bytes are the same
  // wherever the inputs and outputs live (tested by memcmp).
  // The plan must have been made for (config(), cond), and its kv_tile must be the
  // backend's numerics().kv_tile (a numerics setting, recorded in the report); either
  // mismatch is an invalid_argument error before any work. Its
  // offload knobs (plan.kv_offload, plan.residual_offload) say whether K/V and the
  // residual stay on the device; none of this changes an output bit.
  Expected<ForwardResult> forward(const Conditioning& cond, const RefinedText& text, const TensorView& video,
                                  const TensorView& audio, float sigma, const Plan& plan,
                                  const ForwardOutputs& outputs = {});

  // The call's layout (CallLayout of cond, built once per call and handed to the planner
  // and to each of these): the overloads without it build one of their own.
  Status precompute_adaln(const std::vector<float>& sigmas, const Conditioning& cond, const CallLayout& layout);
  bool has_adaln_tables(const std::vector<float>& sigmas, const Conditioning& cond, const CallLayout& layout) const;
  Status prepare(const Conditioning& cond, const CallLayout& layout, const Plan& plan);
  // `layout` built for a forward (CallLayout(cfg, cond, /*for_forward=*/true): it holds
  // the positions).
  Expected<ForwardResult> forward(const Conditioning& cond, const CallLayout& layout, const RefinedText& text,
                                  const TensorView& video, const TensorView& audio, float sigma, const Plan& plan,
                                  const ForwardOutputs& outputs = {});

  // Sequence-parallel ranks (1 + EngineOptions::peer_backends.size()).
  int64_t ranks() const;

 private:
  Engine();
  struct Impl;
  static Status init_rank(Impl& m, const h3::H3TensorSource& weights, Backend& backend, const EngineOptions& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ls::exec
