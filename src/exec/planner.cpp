// The one memory planner (planner.h): each mode's decision (make_plan, plan_for_budget,
// plan_total_budget), then the device peak by component for the chosen residency
// (device_peak, the total-budget planner's own arithmetic), then the mode's minimum.
#include "exec/planner.h"

#include <algorithm>
#include <optional>

#include "backend/backend.h"

namespace ls::exec {

namespace {

// The BudgetOptions the request's device and choices give (the total-budget planner's
// inputs, and the device-peak arithmetic's in every mode).
BudgetOptions budget_options(const PlanRequest& q, int64_t kv_tile, int64_t modulation_rows, bool prefetch,
                             int64_t kv_chunk_rows) {
  BudgetOptions o = budget_options_for(q.device);
  o.tensors = q.tensors;
  o.kv_tile = kv_tile;
  o.kv_chunk_rows = kv_chunk_rows;
  o.modulation_rows = modulation_rows;
  o.allow_kv_offload = q.allow_kv_offload;
  o.allow_residual_offload = q.allow_residual_offload;
  o.prefetch = prefetch;
  o.adaptive_slots = q.adaptive_slots;
  o.ranks = q.knobs.ranks;
  return o;
}

Status check_request(const PlanRequest& q) {
  if (q.cfg == nullptr || q.cond == nullptr)
    return Status(make_error(ErrorCode::invalid_argument, "plan_memory needs a model config and a conditioning"));
  return Status();
}

// WeightStore::create's checks and message (the engine would refuse the same later).
Status check_residency(const Residency& r, int64_t L) {
  if (r.resident_blocks < -1 || r.resident_blocks > L)
    return Status(make_error(ErrorCode::invalid_argument, "resident blocks must be -1 (all) or 0.." + std::to_string(L) +
                                                              " (got " + std::to_string(r.resident_blocks) + ")"));
  if (r.slots < 1 || r.slots > 2)
    return Status(
        make_error(ErrorCode::invalid_argument, "block slots must be 1 or 2 (got " + std::to_string(r.slots) + ")"));
  return Status();
}

int64_t resolve_kv_tile(const PlanRequest& q) { return q.knobs.kv_tile > 0 ? q.knobs.kv_tile : q.device.default_kv_tile; }

Expected<int64_t> table_rows(const PlanRequest& q, const CallLayout& cond_layout) {
  if (q.sigmas.empty()) return int64_t{0};
  return modulation_rows_for(cond_layout, *q.cond, q.sigmas);
}

// The call's layouts, each built once (CallLayout): cond's (the AdaLN table rows; the
// caller's PlanRequest::layout when given) and the planned conditioning's (widest's when
// given, else the same one).
struct Layouts {
  std::optional<CallLayout> own;
  const CallLayout& cond;
  std::optional<CallLayout> widest;
  explicit Layouts(const PlanRequest& q) : cond(q.layout ? *q.layout : own.emplace(*q.cfg, *q.cond)) {
    if (q.widest) widest.emplace(*q.cfg, *q.widest);
  }
  const CallLayout& planned() const { return widest ? *widest : cond; }
};

}  // namespace

const char* memory_mode_name(MemoryMode m) {
  switch (m) {
    case MemoryMode::knobs: return "knobs";
    case MemoryMode::activation_budget: return "activation budget";
    case MemoryMode::total_budget: return "total budget";
  }
  return "?";
}

DeviceProfile device_profile(const Backend& backend) {
  DeviceProfile d;
  d.name = backend.name();
  d.workspace_bytes = backend.workspace_bytes();
  d.default_kv_tile = backend.default_kv_tile();
  // The resolved algorithm's query blocks and attention rate, the transfer rates: the
  // backend's description (backend/description.h).
  const BackendDescription desc = describe_backend(backend);
  const AttentionEntry e = resolved_attention(backend);
  d.attention_row_quantum = e.quantum(backend.numerics());
  d.throughput = desc.rates;
  d.throughput.attention_tflops = e.tflops;
  d.int8_attention = e.key_prepass;  // [int8 attention] the pre-pass's buffers are planned
  d.assumed = {"throughput " + std::to_string(d.throughput.pcie_gb_per_s) + " GB/s host-to-device, " +
               std::to_string(d.throughput.d2h_gb_per_s) + " GB/s device-to-host, " +
               std::to_string(d.throughput.attention_tflops) + " TFLOP/s attention, " +
               std::to_string(d.throughput.gemm_tflops) + " TFLOP/s GEMM: DeviceFacts' defaults (" + desc.rates_source +
               "), not measured on this device"};
  return d;
}

Expected<PlanResult> plan_memory(const PlanRequest& q) {
  LS_TRY(check_request(q));
  const h3::H3Config& cfg = *q.cfg;
  const Layouts lays(q);
  const CallLayout& planned = lays.planned();
  PlanResult r;
  r.mode = q.mode;
  r.knobs = q.knobs;
  r.knobs.kv_tile = resolve_kv_tile(q);
  r.knobs.int8_attention = q.device.int8_attention;  // [int8 attention] the numerics decide, not the caller
  r.residency = q.residency;
  // 1. The mode's decision, in the order (and with the errors) each planner always had.
  switch (q.mode) {
    case MemoryMode::total_budget: {
      LS_ASSIGN_OR_RETURN(r.modulation_rows, modulation_rows_for(lays.cond, *q.cond, q.sigmas));
      const BudgetOptions o = budget_options(q, r.knobs.kv_tile, r.modulation_rows, q.prefetch, q.knobs.kv_chunk_rows);
      LS_ASSIGN_OR_RETURN(BudgetPlan bp, plan_total_budget(cfg, planned, q.budget_bytes, o));
      r.knobs.attn_chunk_tokens = bp.activations.attn_slice;
      r.knobs.mlp_chunk_tokens = bp.activations.mlp_slice;
      r.knobs.final_chunk_tokens = bp.activations.final_slice;
      r.knobs.kv_offload = bp.kv_offload;
      r.knobs.residual_offload = bp.residual_offload;
      r.knobs.kv_chunk_rows = bp.kv_chunk;
      r.residency.resident_blocks = bp.resident_blocks;
      r.residency.slots = bp.prefetch ? 2 : 1;  // 1 also where the planner chose one slot
      r.plan = bp.activations;
      r.budget_bytes = q.budget_bytes;
      LS_ASSIGN_OR_RETURN(r.minimum_budget_bytes, min_total_budget(cfg, planned, o));
      r.budget = std::move(bp);
      break;
    }
    case MemoryMode::activation_budget: {
      LS_ASSIGN_OR_RETURN(r.plan, plan_for_budget(cfg, planned, q.budget_bytes, r.knobs.kv_tile, q.knobs.ranks,
                                                    q.device.int8_attention));
      r.budget_bytes = q.budget_bytes;
      LS_ASSIGN_OR_RETURN(r.minimum_budget_bytes,
                          min_activation_budget(cfg, planned, q.knobs.ranks, q.device.int8_attention));
      break;
    }
    case MemoryMode::knobs: {
      LS_ASSIGN_OR_RETURN(r.plan, make_plan(cfg, planned, r.knobs));
      break;
    }
  }
  // 2. The device peak by component for the residency the run gets.
  if (q.mode != MemoryMode::total_budget) {
    LS_TRY(check_residency(r.residency, cfg.num_layers));
    LS_ASSIGN_OR_RETURN(r.modulation_rows, table_rows(q, lays.cond));
  }
  const int64_t R = r.residency.resident_blocks < 0 ? cfg.num_layers : r.residency.resident_blocks;
  // (kv_chunk_rows 0: the peak arithmetic takes the plan's own resolved chunk.)
  const BudgetOptions o = budget_options(q, r.knobs.kv_tile, r.modulation_rows, r.residency.slots == 2, 0);
  LS_ASSIGN_OR_RETURN(r.peak, device_peak(cfg, planned, o, R, r.plan));
  if (r.budget) {
    // One arithmetic: the budget plan's own components are these.
    const BudgetPlan& bp = *r.budget;
    LS_CHECK(r.peak.predicted_peak_bytes == bp.predicted_peak_bytes && r.peak.slots == bp.slots &&
             r.peak.steps_peak_bytes == bp.steps_peak_bytes && r.peak.text_peak_bytes == bp.text_peak_bytes &&
             r.peak.precompute_peak_bytes == bp.precompute_peak_bytes);
  }
  return r;
}

Expected<uint64_t> minimum_budget(const PlanRequest& q) {
  LS_TRY(check_request(q));
  const Layouts lays(q);
  switch (q.mode) {
    case MemoryMode::total_budget: {
      LS_ASSIGN_OR_RETURN(const int64_t rows, modulation_rows_for(lays.cond, *q.cond, q.sigmas));
      const BudgetOptions o = budget_options(q, resolve_kv_tile(q), rows, q.prefetch, q.knobs.kv_chunk_rows);
      return min_total_budget(*q.cfg, lays.planned(), o);
    }
    case MemoryMode::activation_budget:
      return min_activation_budget(*q.cfg, lays.planned(), q.knobs.ranks, q.device.int8_attention);
    case MemoryMode::knobs: break;
  }
  return uint64_t{0};
}

}  // namespace ls::exec
