// The ONE memory planner (issue 12 part 4; docs/budget.md, docs/memory.md): a pure
// function from (model config and tensor table, conditioning, sigmas, a memory mode,
// device facts) to the plan a run follows and its predicted device peak by component,
// plus the smallest budget of the mode. Nothing is allocated, no device is opened.
//
//   mode               inputs read                          what decides
//   knobs              knobs (slices, offloads, kv_chunk),  the caller: make_plan(knobs),
//                      residency                            residency as given
//   activation_budget  budget_bytes, kv_tile, residency     plan_for_budget (slices only,
//                                                           never offloads)
//   total_budget       budget_bytes, kv_tile, kv_chunk_rows, plan_total_budget: residency,
//                      prefetch, allow_*_offload            offloads, slices
//
// Every front-end plans through it: `layerstream info` (its memory tables and the dry
// run), forward and generate (api::Session::plan / plan_sampling / minimum_budget),
// the C API (through api::Session) and bench_budget (through api::Session);
// sample::plan_generation plans each prompt with it.
//
// Device peak by component (every mode; DevicePeak), with R resident blocks, W one
// block's weight bytes, N the non-block step weights, X the workspace, T the AdaLN
// tables of `modulation_rows` timesteps, A the activation plan's predicted peak:
//   common     = N + R W + slots(R) W + X        slots(R) = 0 if R = L, else min(L - R, slots)
//   steps      = common + T + A
//   text       = common + text weights not in slots + refiner activations
//   precompute = common + T + AdaLN precompute scratch
//   peak       = max(steps, text, precompute)
// (plan_total_budget's arithmetic, budget_plan.cpp, for any residency.) Weight bytes
// come from the tensor table with its dtypes, selected by TensorSpec::role and ::block
// (exec::tally_weights): whatever dtypes the source holds count as they are (int8
// block weights with their f32 scales, role block, included).
//
// Exactness: a plan never changes an output bit (DESIGN.md §1); kv_tile, the one
// numerics input read here, is resolved once (knobs.kv_tile 0 -> the device's default)
// and goes into the plan as given.
//
// Usage:
//   PlanRequest q;
//   q.cfg = &cfg; q.tensors = &source.specs(); q.cond = &cond; q.sigmas = {0.8f};
//   q.mode = MemoryMode::total_budget; q.budget_bytes = 8ull << 30;
//   q.device = device_profile(backend);             // or device_profile(description, numerics) for a dry run
//   Expected<PlanResult> r = plan_memory(q);        // r->plan for Engine::forward,
//                                                   // r->residency for Engine::create
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "exec/budget_plan.h"
#include "exec/plan.h"
#include "exec/weights.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls {
class Backend;
}

namespace ls::exec {

enum class MemoryMode {
  knobs,              // PlanRequest::knobs + residency as given
  activation_budget,  // the largest slices whose activations fit budget_bytes
  total_budget,       // ONE device budget (weights, tables, activations, workspace)
};
const char* memory_mode_name(MemoryMode m);  // "knobs", "activation budget", "total budget"

// A live backend's figures as a DeviceProfile: workspace_bytes() (whatever the backend
// needs for its numerics and formats: no constant here), default_kv_tile() (its
// resolved numerics), the row quantum and attention rate of its resolved algorithm and
// the transfer rates from its description (describe_backend, backend/description.h: no
// backend measures them live). `assumed` lists the throughput figures only.
DeviceProfile device_profile(const Backend& backend);

struct PlanRequest {
  const h3::H3Config* cfg = nullptr;                     // required
  // The tensors the device would hold, with their dtypes (H3TensorSource::specs());
  // null: h3_tensor_specs(*cfg) (the declared table).
  const std::vector<h3::TensorSpec>* tensors = nullptr;
  const h3::Conditioning* cond = nullptr;                // required: the call's conditioning
  // If given, planned instead of `cond` (the longer of two prompts: every buffer grows
  // with S at fixed slices, so its plan fits the shorter one); the AdaLN tables still
  // count cond's timesteps.
  const h3::Conditioning* widest = nullptr;
  // cond's layout when the caller holds the call's (CallLayout: built once per call and
  // handed to the engine too): planned from as it is, never rebuilt. Null: built here.
  const CallLayout* layout = nullptr;
  // Every sigma the run evaluates: the AdaLN tables hold one row set per distinct
  // timestep (modulation_rows_for). Empty: no tables counted (knobs / activation modes
  // only; the total budget needs at least one sigma > 0).
  std::vector<float> sigmas;
  MemoryMode mode = MemoryMode::knobs;
  // Slices, offloads and kv_chunk_rows (knobs mode); kv_tile in every mode (0, the
  // default here, = the device's default_kv_tile); kv_chunk_rows also in total_budget mode.
  PlanKnobs knobs{.kv_tile = 0};
  Residency residency;             // knobs / activation_budget modes (resident_blocks -1 = all)
  uint64_t budget_bytes = 0;       // activation_budget / total_budget modes
  bool prefetch = true;            // total_budget: 2 block slots (else 1)
  bool adaptive_slots = true;      // total_budget with prefetch: 1 slot where offloading exposes less (BudgetOptions)
  bool allow_kv_offload = true;    // total_budget
  bool allow_residual_offload = true;
  DeviceProfile device;            // workspace bytes, default kv_tile, throughput figures
};

struct PlanResult {
  MemoryMode mode = MemoryMode::knobs;
  // The activation plan for Engine::prepare / forward (widest's when one was given).
  Plan plan;
  // Resolved knobs: kv_tile set; in total_budget mode the budget plan's slices, offloads
  // and K/V chunk. Every other conditioning of the run (a negative prompt) plans with
  // these (make_plan).
  PlanKnobs knobs;
  Residency residency;                  // what Engine::create gets (resident_blocks, slots)
  std::optional<BudgetPlan> budget;     // total_budget mode: the planner's full decision record
  DevicePeak peak;                      // every mode (budget_plan.h: device_peak)
  int64_t modulation_rows = 0;          // distinct timesteps of the AdaLN tables counted
  uint64_t budget_bytes = 0;            // the mode's budget (0 in knobs mode)
  uint64_t minimum_budget_bytes = 0;    // the smallest budget of the mode (0 in knobs mode)
};

// The plan. Errors: a missing cfg / cond (invalid_argument); the mode's own errors, in
// the order and with the messages they always had (make_plan's invalid knobs,
// plan_for_budget / plan_total_budget's out_of_budget naming the smallest budget, an
// invalid geometry); an invalid residency (knobs / activation modes: resident_blocks
// -1 or 0..L, slots 1 or 2; WeightStore's message).
Expected<PlanResult> plan_memory(const PlanRequest& request);

// The smallest budget of the request's mode (what its out_of_budget message names and
// PlanResult::minimum_budget_bytes says): total_budget min_total_budget, activation_budget
// min_activation_budget (planned for widest when given), knobs 0.
Expected<uint64_t> minimum_budget(const PlanRequest& request);

}  // namespace ls::exec
