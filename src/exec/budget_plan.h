// Total-VRAM-budget planner (issue 5, the pure part; docs/budget.md): one budget covers
// weights, modulation tables, activations and workspace. Pure arithmetic, nothing is
// allocated; the executor follows the plan and its arenas must stay within it.
//
// What lives on the device (each its own arena, every tensor rounded up with
// Arena::aligned_bytes as the arenas do):
//   resident weights : the denoiser's non-block weights (patch projections, final norm,
//                      output heads) + the first R blocks' weights (norms, qkv, q/k norm,
//                      out_proj, fc1, fc2). AdaLN linears and the time embedder never
//                      live on the device during steps (WeightStore::is_precompute_only(TensorRole));
//                      to_gate_compress and rope.inv_freq stay on the host.
//   block slots      : when R < L, the other L - R blocks stream from host memory into
//                      2 slots (prefetch: block i+1 copies on a copy stream while block i
//                      computes) or 1 slot (no prefetch), each crossing the bus once per
//                      forward. Slot bytes = one block's weight bytes.
//   modulation tables: per block bf16|f32 [3M, 6D] + final [M, 2D] (M = modulation_rows,
//                      the distinct timesteps of the run), precomputed before step one.
//   activations      : plan.h's buffer lists for the chosen slices and offload choices
//                      (K/V offload: K and V [S, I] -> 2 + 2 chunks of kv_chunk rows and
//                      the fp32 attention state; residual offload: x [S, D] -> one
//                      slice of each phase's rows).
//   workspace        : the backend's workspace (DeviceProfile::workspace_bytes: a live
//                      backend's Backend::workspace_bytes() through exec::device_profile,
//                      or for a dry run its description's, backend/description.h).
// Weight bytes come from the tensor table with its dtypes (BudgetOptions::tensors: the
// source's H3TensorSource::specs()), selected by TensorSpec::role and ::block
// (tally_weights), so any format's tensors (int8 weights with f32 scales) count as held.
// Two transient phases happen outside the steps and are checked too:
//   text refinement  : condition_proj + refiner blocks (streamed through the block slots
//                      when there are slots, else loaded whole) + refiner activations;
//                      the text weights are dropped afterwards (before the tables exist).
//   AdaLN precompute : tables + the engine's precompute scratch (time embedder, one
//                      block's AdaLN weight at a time).
// predicted peak = max over {steps, text refinement, AdaLN precompute}.
//
// Policy ("fits" = predicted peak <= budget; the preferred slice is min(S, kv_hiding_slice)):
//   1) all L blocks resident, no offload, every slice >= the preferred slice;
//   2) weights streamed: the most resident blocks that still leave slices >= the
//      preferred slice; failing that, every block streamed and slices down to 1 row;
//   3) only when no plan without offload fits at all: among the offload levels that fit
//      (K/V only; K/V + residual; residual alone when K/V offload is not allowed),
//      every block streamed and slices down to 1 row, the one exposing the least
//      transfer time (BudgetPlan::exposed_transfer_seconds; ties: the fewer offloads):
//      residual copies are never hidden, K/V copies hide behind attention once slices
//      reach the hiding size; with prefetch (BudgetOptions::adaptive_slots) each level is
//      also planned with one block slot instead of two, which gives one block's bytes
//      (735 MiB at H3 size) to the slices and costs the weight copies that no longer
//      hide (one block's copy per block, ~14 ms), and the lower exposure wins (ties: 2);
//   4) else out_of_budget naming the smallest total budget any of these reach.
// Within a step slices are the largest that fit (per phase: the peak is a max over
// phases). Offload steps keep no block resident: memory freed by offloading is never
// spent on resident blocks. Monotone in the budget (tested): streamed blocks, whether
// anything is offloaded, K/V offload, and exposed transfer time never grow with the
// budget; residual offload alone and raw PCIe bytes are not monotone (the comparison may flip between
// the two offload levels as slice counts step; docs/budget.md).
//
// Usage:
//   BudgetOptions o; o.modulation_rows = *modulation_rows_for(cfg, cond, sigmas);
//   o.workspace_bytes = backend.workspace_bytes();
//   Expected<BudgetPlan> bp = plan_total_budget(cfg, cond, 12ull << 30, o);
//   bp->describe(); bp->activations (the Plan for Engine::forward)
// Front-ends do not call it directly: exec::plan_memory (planner.h, the one planner)
// runs it as its total-budget mode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/description.h"
#include "backend/numerics.h"
#include "core/status.h"
#include "exec/plan.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls::exec {

// Device throughput figures (ls::DeviceFacts, backend/description.h: a backend's measured
// rates), used ONLY to pick the query-slice size that hides K/V streaming behind attention
// (kv_hiding_slice) and to compare the offload levels by the transfer time they expose
// (exposed_transfer_seconds). They never change a plan's bytes beyond those choices, and
// never an output bit.
using ls::DeviceFacts;

// What the planner needs to know about a device, as plain numbers, taken from a backend's
// description (backend/description.h) for the numerics it runs: its workspace, default
// kv_tile, the attention's row quantum and rate, the transfer rates. A dry run
// (`layerstream info --vram-budget`) plans from one without opening a device; a real run
// fills BudgetOptions from the Backend it holds. `assumed` says, one line each, which
// figures are documented defaults rather than read from a device.
struct DeviceProfile {
  std::string name;                  // "cuda", "cpu"
  uint64_t workspace_bytes = 0;      // Backend::workspace_bytes()
  int64_t default_kv_tile = 1024;    // Backend::default_kv_tile() (numerics: --kv-tile overrides)
  // Queries the resolved attention algorithm computes in whole blocks (a slice's last
  // block padded to it; AttentionEntry::quantum): the planner sizes two-pass attention
  // slices in whole blocks where that keeps their count.
  int64_t attention_row_quantum = 1;
  bool int8_attention = false;       // [int8 attention] the backend's numerics run attention int8
  DeviceFacts throughput;
  std::vector<std::string> assumed;  // e.g. "workspace 290.5 MiB: ..."
};

// A described backend's figures for its RESOLVED numerics (attention concrete, kv_tile
// set), without a device: workspace = BackendDescription::workspace_bytes, the default
// kv_tile, row quantum and attention rate of the numerics' algorithm, the description's
// transfer and GEMM rates. Every figure is listed in `assumed` (workspace, kv_tile,
// throughput). The dry run plans with it; tests/cuda/test_backend_description_cuda.cpp
// checks the CUDA description against what the CUDA backend asks for.
DeviceProfile device_profile(const BackendDescription& backend, const Numerics& resolved);

// The numerics a described backend resolves `asked` to without a device: attention auto
// -> BackendDescription::default_attention(), kv_tile 0 -> that algorithm's default.
// unsupported (the description's message) for an algorithm the backend cannot run.
Expected<Numerics> resolve_described(const BackendDescription& backend, const Numerics& asked = {});

struct BudgetOptions {
  // The tensors the device would hold, with their dtypes (H3TensorSource::specs());
  // null: h3_tensor_specs(cfg). Must outlive the call.
  const std::vector<h3::TensorSpec>* tensors = nullptr;
  int64_t kv_tile = 1024;                  // keys per attention tile (numerics setting)
  int64_t kv_chunk_rows = 0;               // K/V offload chunk rows (PlanKnobs::kv_chunk_rows; 0 = default)
  uint64_t workspace_bytes = kCudaGemmWorkspaceBytes;  // the backend's workspace (default: the CUDA GEMM's)
  // M_total: distinct timesteps whose modulation tables are precomputed for the run
  // (one table row set per timestep; e.g. 8 steps x video/audio/condition t ~ 25).
  // Pass the run's true count: modulation_rows_for().
  int64_t modulation_rows = 25;
  bool allow_kv_offload = true;
  bool allow_residual_offload = true;
  bool prefetch = true;  // streamed blocks: 2 slots, next block copied while one computes; else 1 slot
  // With prefetch, where offloading is needed (policy step 3): also plan the offload
  // levels with ONE slot, whose freed bytes go to larger slices (fewer K/V reloads), and
  // take it when it exposes less transfer time, the weight copies it no longer hides
  // included (exposed_transfer_seconds). false: always 2 slots (the policy before
  // session 8, for comparison). Memory only: never changes a bit.
  bool adaptive_slots = true;
  DeviceFacts device;
  // Sequence-parallel ranks (docs/multi-gpu.md): the budget is PER RANK (each rank holds
  // every weight, its tables and 1/ranks of the activations); no offload with ranks > 1.
  int64_t ranks = 1;
  // DeviceProfile::attention_row_quantum q. An algorithm computing queries in blocks of q
  // pads a slice's last block (q = 2048: a 10,778-row slice computes 12,288 rows and a
  // 10,240-row one 10,240): two-pass attention slices are sized in whole blocks. K/V on the device: the
  // largest multiple of q that fits. K/V offloaded: for the s = ceil(S / n) slices the
  // n fitting rows give, the smallest multiple of q holding ceil(S / s) rows, when it
  // fits (the same slice count, so no extra reload of K and V). Never below the mode's
  // slice floor; monotone in the budget.
  int64_t attention_row_quantum = 1;
  bool int8_attention = false;  // [int8 attention] PlanKnobs::int8_attention (the int8 buffers counted)
};

// BudgetOptions with a profile's workspace, default kv_tile and throughput (everything
// else at its default).
BudgetOptions budget_options_for(const DeviceProfile& device);

// Smallest query slice c whose attention hides streaming all of K and V once:
// bytes 2 * S * I * 2 (K and V, bf16) cross the bus in 4SI / B seconds; c queries
// against S keys take 4 * c * S * I FLOP (QK^T and PV, 2 FLOP per multiply-add) in
// 4cSI / T seconds. Hidden iff c >= T / B: independent of S and of the model width.
// 550 TFLOP/s over 55 GB/s -> 10,000 queries (600 over 50 -> 12,000). (Issue 5's example: 2.67 GB of K/V at
// S = 93k crosses in ~48 ms; 16k queries take 4 * 16k * 93k * 7168 = 42.7 TFLOP =
// 71 ms at 600 TFLOP/s, hidden with margin; the break-even there is 10.8k.)
int64_t kv_hiding_slice(const DeviceFacts& facts);

// Device weight bytes by role, each tensor rounded up as the arenas do, from a tensor
// table with its dtypes: TensorSpec::role and ::block decide, never the name.
struct WeightTally {
  uint64_t block = 0;           // largest DiT block (role block; all equal in practice) = slot bytes
  uint64_t nonblock = 0;        // roles patch_embed + head: patch projections, final norm, output heads
  uint64_t text = 0;            // role text_proj + the refiner's non-block tensors (final norm)
  uint64_t refiner_block = 0;   // largest refiner block (role refiner, block >= 0)
  int64_t refiner_blocks = 0;
  uint64_t time_embedder = 0;   // role time_embedder: transient during the AdaLN precompute
  uint64_t adaln_largest = 0;   // largest AdaLN linear (role adaln, per block / final), transient
  // Each DiT block's bytes by block index (blocks may differ: e.g. the community int8
  // "_skip_edges" files keep blocks 0, 1, 48, 49 in bf16). The WeightStore holds blocks
  // 0 .. R-1 resident at their own sizes and streams the rest through slots of the largest
  // streamed block's bytes; these three give the same numbers.
  std::vector<uint64_t> blocks;
  uint64_t block_at(int64_t i) const {  // a block absent from the table counts as the largest
    return i >= 0 && i < static_cast<int64_t>(blocks.size()) ? blocks[static_cast<size_t>(i)] : block;
  }
  uint64_t resident_block_bytes(int64_t R) const;            // blocks 0 .. R-1
  uint64_t slot_block_bytes(int64_t R, int64_t L) const;     // largest of blocks R .. L-1 (0 if none)
  uint64_t streamed_block_bytes(int64_t R, int64_t L) const; // blocks R .. L-1
};
// rope, adaln_table and unused tensors never reach the device (read on the host, or not read).
WeightTally tally_weights(const std::vector<h3::TensorSpec>& tensors);

// Device bytes of one DiT block's weights as the WeightStore holds them (per tensor
// aligned; AdaLN and to_gate_compress excluded), of the declared table h3_tensor_specs.
// The largest block's, so = slot bytes.
uint64_t block_weight_bytes(const h3::H3Config& cfg);

struct BudgetPlan {
  // make_plan with the chosen slices and offload knobs: its persistent / phases lists are
  // exactly what the device's activation arena holds, and Engine::forward allocates them.
  Plan activations;
  uint64_t budget_bytes = 0;
  SequenceSizes sizes;

  // Decisions.
  int64_t num_layers = 0;
  int64_t resident_blocks = 0;  // blocks 0 .. resident_blocks-1 stay on the device
  int64_t slots = 0;            // block slots for the streamed blocks (0 when all resident)
  bool prefetch = true;         // the plan's own: false with 1 slot (asked for, or chosen)
  bool one_slot_chosen = false; // prefetch was allowed, 1 slot exposes less (adaptive_slots)
  bool kv_offload = false;
  bool residual_offload = false;
  int64_t kv_chunk = 0;         // rows of a K/V chunk on the device (K/V offload), else 0
  int64_t kv_hiding_slice = 0;  // see kv_hiding_slice(); the preferred slice is min(this, S)
  int64_t slice_floor = 0;      // the smallest slice the chosen step allowed
  std::string step;             // "all resident", "weights streamed", "K/V offload", ...
  bool streamed() const { return resident_blocks < num_layers; }
  int64_t streamed_blocks() const { return num_layers - resident_blocks; }

  // Device bytes per component.
  uint64_t block_bytes = 0;               // one block's weights = one slot
  uint64_t nonblock_weight_bytes = 0;     // patch projections, final norm and heads
  uint64_t resident_weight_bytes = 0;     // nonblock + resident_blocks * block_bytes
  uint64_t slot_bytes = 0;                // slots * block_bytes
  uint64_t modulation_table_bytes = 0;
  uint64_t activation_bytes = 0;          // device activation arena = activations.predicted_peak_bytes
  uint64_t workspace_bytes = 0;
  uint64_t text_phase_extra_bytes = 0;    // text weights not in slots + refiner activations
  uint64_t precompute_scratch_bytes = 0;  // AdaLN precompute scratch (tables counted apart)
  uint64_t steps_peak_bytes = 0;          // resident + slots + tables + activations + workspace
  uint64_t text_peak_bytes = 0;           // resident + slots + workspace + text extra
  uint64_t precompute_peak_bytes = 0;     // resident + slots + tables + workspace + scratch
  uint64_t predicted_peak_bytes = 0;      // max of the three; <= budget_bytes

  // Traffic per forward (host <-> device, both directions), excluding the latents and
  // velocities (MB-scale): streamed block weights, K/V (pass 1 out, pass 2 back in once
  // per query slice) and residual slices (embed out; per block pass 1 in, pass 2 in and
  // out, MLP in and out; final layer in).
  uint64_t pcie_weight_bytes = 0;
  uint64_t pcie_kv_bytes = 0;
  uint64_t pcie_residual_bytes = 0;
  uint64_t pcie_bytes_per_forward() const { return pcie_weight_bytes + pcie_kv_bytes + pcie_residual_bytes; }
  // Seconds of offload transfer per forward the compute cannot hide, by the device
  // facts: per block and phase, the transfer queue's copies beyond that phase's compute
  // (budget_plan.cpp exposed_seconds has the terms: pass 1's K/V copies out behind the
  // K/V GEMMs and the first query slice's attention, pass 2's reloads behind each
  // slice's attention, the residual's double-buffered copies behind each phase). The
  // offload level with the least of this wins; it never grows with the budget (tested).
  // 0 without offload (weight streaming is hidden).
  double exposed_transfer_seconds = 0;
  uint64_t host_pinned_bytes = 0;  // K, V of one block [S, I] each and/or the residual [S, D]

  // One line for the CLI, e.g. "budget 12.00 GiB: 14/50 blocks resident, 36 streamed
  // (2 slots x 735.0 MiB, prefetch); K/V resident, residual resident; attention slices
  // ...; peak 11.9 GiB predicted = ...; PCIe 27.6 GB per forward".
  std::string describe() const;
};

// Predicted device bytes by component for a residency and an activation plan (the
// arithmetic at the top of this file, for any R; plan_total_budget's BudgetPlan
// carries the same numbers for the R it chooses).
struct DevicePeak {
  int64_t resident_blocks = 0;            // R (0..L)
  int64_t slots = 0;                      // block slots (0 when all resident)
  uint64_t block_bytes = 0;               // one block's weights
  uint64_t resident_weight_bytes = 0;     // non-block + R blocks
  uint64_t slot_bytes = 0;                // slots x block_bytes
  uint64_t modulation_table_bytes = 0;
  uint64_t activation_bytes = 0;          // the plan's predicted_peak_bytes
  uint64_t workspace_bytes = 0;
  uint64_t text_phase_extra_bytes = 0;    // text weights not in slots + refiner activations
  uint64_t precompute_scratch_bytes = 0;  // AdaLN precompute scratch (tables counted apart)
  uint64_t steps_peak_bytes = 0;          // resident + slots + tables + activations + workspace
  uint64_t text_peak_bytes = 0;           // resident + slots + workspace + text extra
  uint64_t precompute_peak_bytes = 0;     // resident + slots + tables + workspace + scratch
  uint64_t predicted_peak_bytes = 0;      // max of the three
  // Pinned host memory: the streamed blocks' host copies ((L - R) x block_bytes, as the
  // WeightStore holds them) + K, V [S, I] (K/V offload) + x [S, D] (residual offload).
  uint64_t host_pinned_bytes = 0;
};
// The device peak of `resident_blocks` resident blocks (slots from options.prefetch: 2,
// else 1, never more than the streamed blocks) and `activations` (a Plan for cond: its
// peak and offload choices). options.modulation_rows may be 0 here (no tables).
// Errors: invalid options, config or geometry; resident_blocks outside 0..L.
Expected<DevicePeak> device_peak(const h3::H3Config& cfg, const h3::Conditioning& cond, const BudgetOptions& options,
                                 int64_t resident_blocks, const Plan& activations);
Expected<DevicePeak> device_peak(const h3::H3Config& cfg, const CallLayout& layout, const BudgetOptions& options,
                                 int64_t resident_blocks, const Plan& activations);

// The plan for a total device budget (see the policy above). Errors: invalid options
// (kv_tile < 1, modulation_rows < 1, device facts <= 0), an invalid config or
// geometry, or out_of_budget when nothing fits, naming the smallest budget that works
// (computed by the same arithmetic; that budget then plans successfully).
Expected<BudgetPlan> plan_total_budget(const h3::H3Config& cfg, const h3::Conditioning& cond,
                                       uint64_t total_budget_bytes, const BudgetOptions& options = {});
// The same for a call's layout (built once per call; every overload here builds one from
// cond and calls these).
Expected<BudgetPlan> plan_total_budget(const h3::H3Config& cfg, const CallLayout& layout,
                                       uint64_t total_budget_bytes, const BudgetOptions& options = {});

// The smallest total budget plan_total_budget accepts for these inputs (what the
// out_of_budget message names).
Expected<uint64_t> min_total_budget(const h3::H3Config& cfg, const h3::Conditioning& cond,
                                    const BudgetOptions& options = {});
Expected<uint64_t> min_total_budget(const h3::H3Config& cfg, const CallLayout& layout,
                                    const BudgetOptions& options = {});

// The run's true modulation_rows: the distinct timesteps over every sigma > 0 of the
// schedule (sorted unique, the terminal 0 never evaluated), counted exactly as
// Engine::precompute_adaln counts the rows of the tables it builds. 0 when no sigma is
// > 0 (then there is no table; plan_total_budget needs >= 1). Errors: an invalid
// geometry (h3::build_layout's message).
Expected<int64_t> modulation_rows_for(const h3::H3Config& cfg, const h3::Conditioning& cond,
                                      const std::vector<float>& sigmas);
// The same for cond's layout (built once per call: CallLayout of cond).
Expected<int64_t> modulation_rows_for(const CallLayout& layout, const h3::Conditioning& cond,
                                      const std::vector<float>& sigmas);

}  // namespace ls::exec
