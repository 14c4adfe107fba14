// The engine's parameters in the library's terms (src/api/c_api_params.h).
#include "api/c_api_params.h"

#include <optional>
#include <utility>

namespace ls::capi {

Expected<ls::Numerics> to_numerics(const ls_numerics& c) {
  // kv_tile: 0 = the device's, else the range of every door (ranges.h).
  if (c.kv_tile != 0) LS_TRY(ls::ranges::check_int("numerics.kv_tile", c.kv_tile, ls::ranges::kv_tile));
  const int32_t attention = enum_field(c.attention), gemm_f32 = enum_field(c.gemm_f32);
  if (attention < LS_ATTENTION_DEFAULT || attention > LS_ATTENTION_INT8)
    return Error{ErrorCode::invalid_argument, "numerics.attention is not an ls_attention"};
  if (gemm_f32 < LS_GEMM_F32_LANES16 || gemm_f32 > LS_GEMM_F32_CUBLASLT)
    return Error{ErrorCode::invalid_argument, "numerics.gemm_f32 is not an ls_gemm_f32_order"};
  ls::Numerics n;
  n.attention = attention == LS_ATTENTION_NATIVE   ? ls::AttentionAlgorithm::native
                : attention == LS_ATTENTION_CUDNN  ? ls::AttentionAlgorithm::cudnn
                : attention == LS_ATTENTION_HOPPER ? ls::AttentionAlgorithm::hopper
                : attention == LS_ATTENTION_INT8   ? ls::AttentionAlgorithm::int8
                                                   : ls::AttentionAlgorithm::backend_default;
  n.kv_tile = c.kv_tile;
  n.gemm_f32 = gemm_f32 == LS_GEMM_F32_CUBLASLT ? ls::GemmF32Order::cublaslt : ls::GemmF32Order::lanes16;
  n.native_variant = c.native_variant ? c.native_variant : "";
  n.cudnn_q_chunk = c.cudnn_q_chunk;
  n.cudnn_form = c.cudnn_form ? c.cudnn_form : "";
  n.cudnn_skip_configs = c.cudnn_skip_configs;
  LS_TRY(ls::validate(n));
  return n;
}

// ---- the memory request (ls_memory_request, or the legacy fields of ls_engine_params) ----
namespace {

ls::api::MemoryMode memory_mode_of(int32_t m) {
  return m == LS_MEMORY_VRAM_BUDGET       ? ls::api::MemoryMode::total_budget
         : m == LS_MEMORY_ACTIVATION_BUDGET ? ls::api::MemoryMode::activation_budget
                                            : ls::api::MemoryMode::knobs;
}

Status check_mode(int32_t m, const char* what) {
  if (m < LS_MEMORY_KNOBS || m > LS_MEMORY_VRAM_BUDGET)
    return Error{ErrorCode::invalid_argument, std::string(what) + " is not an ls_memory_mode (" + std::to_string(m) + ")"};
  return {};
}

// A byte count given as int64 (ls_memory_request): a negative one is refused by the size grammar.
Expected<uint64_t> request_bytes(const char* what, int64_t v) {
  if (v < 0) return ls::ranges::parse_size(what, std::to_string(v)).error();
  return static_cast<uint64_t>(v);
}

}  // namespace

Expected<ls::api::MemoryRequest> request_of(const ls_memory_request& c) {
  LS_TRY(check_mode(enum_field(c.mode), "ls_memory_request.mode"));
  ls::api::MemoryRequest r;
  r.mode = memory_mode_of(enum_field(c.mode));
  const auto opt = [](int64_t v, std::optional<int64_t>& out) {
    if (v != LS_UNSET) out = v;
  };
  const auto flag = [](const char* what, int64_t v, std::optional<bool>& out) -> Status {
    if (v == LS_UNSET) return {};
    if (v != 0 && v != 1)
      return Error{ErrorCode::invalid_argument, std::string(what) + " must be 0 or 1 (got " + std::to_string(v) + ")"};
    out = v != 0;
    return {};
  };
  if (c.vram_budget != LS_UNSET) {
    LS_ASSIGN_OR_RETURN(r.vram_budget, request_bytes("vram_budget", c.vram_budget));
  }
  if (c.activation_budget != LS_UNSET) {
    LS_ASSIGN_OR_RETURN(r.activation_budget, request_bytes("activation_budget", c.activation_budget));
  }
  opt(c.prefetch, r.prefetch);
  opt(c.mlp_chunk, r.mlp_chunk), opt(c.attn_chunk, r.attn_chunk), opt(c.final_chunk, r.final_chunk);
  opt(c.kv_chunk, r.kv_chunk), opt(c.resident_blocks, r.resident_blocks), opt(c.slots, r.slots);
  LS_TRY(flag("kv_offload", c.kv_offload, r.kv_offload));
  LS_TRY(flag("residual_offload", c.residual_offload, r.residual_offload));
  return r;
}

namespace {

// The legacy fields of ls_engine_params (API 1-4) as a request: a field that differs from
// its ls_engine_params_init value is given.
Expected<ls::api::MemoryRequest> request_of_legacy(const ls_engine_params& p) {
  ls_engine_params d;
  ls_engine_params_init(&d);
  LS_TRY(check_mode(enum_field(p.memory_mode), "ls_engine_params.memory_mode"));
  ls::api::MemoryRequest r;
  r.mode = memory_mode_of(enum_field(p.memory_mode));
  if (p.vram_budget != d.vram_budget) r.vram_budget = p.vram_budget;
  if (p.activation_budget != d.activation_budget) r.activation_budget = p.activation_budget;
  if (p.prefetch != d.prefetch) r.prefetch = p.prefetch;
  if (p.mlp_chunk != d.mlp_chunk) r.mlp_chunk = p.mlp_chunk;
  if (p.attn_chunk != d.attn_chunk) r.attn_chunk = p.attn_chunk;
  if (p.final_chunk != d.final_chunk) r.final_chunk = p.final_chunk;
  if (p.kv_offload != d.kv_offload) r.kv_offload = p.kv_offload != 0;
  if (p.kv_chunk != d.kv_chunk) r.kv_chunk = p.kv_chunk;
  if (p.residual_offload != d.residual_offload) r.residual_offload = p.residual_offload != 0;
  if (p.resident_blocks != d.resident_blocks) r.resident_blocks = p.resident_blocks;
  if (p.slots != d.slots) r.slots = p.slots;
  return r;
}

// The name of the first legacy memory field of p that is not its default ("" if none).
std::string legacy_memory_field_set(const ls_engine_params& p) {
  ls_engine_params d;
  ls_engine_params_init(&d);
  const std::pair<bool, const char*> fields[] = {
      {enum_field(p.memory_mode) != enum_field(d.memory_mode), "memory_mode"},
      {p.vram_budget != d.vram_budget, "vram_budget"},
      {p.prefetch != d.prefetch, "prefetch"},
      {p.activation_budget != d.activation_budget, "activation_budget"},
      {p.mlp_chunk != d.mlp_chunk, "mlp_chunk"},
      {p.attn_chunk != d.attn_chunk, "attn_chunk"},
      {p.final_chunk != d.final_chunk, "final_chunk"},
      {p.kv_offload != d.kv_offload, "kv_offload"},
      {p.kv_chunk != d.kv_chunk, "kv_chunk"},
      {p.residual_offload != d.residual_offload, "residual_offload"},
      {p.resident_blocks != d.resident_blocks, "resident_blocks"},
      {p.slots != d.slots, "slots"}};
  for (const auto& [set, name] : fields)
    if (set) return name;
  return "";
}


}  // namespace

Expected<ls::api::MemoryRequest> engine_memory_request(const ls_engine_params& p) {
  if (!p.memory) return request_of_legacy(p);
  if (const std::string f = legacy_memory_field_set(p); !f.empty())
    return Error{ErrorCode::invalid_argument,
                 "ls_engine_params: give memory (an ls_memory_request) or the legacy memory fields, not both: " + f +
                     " is set"};
  LS_ASSIGN_OR_RETURN(ls_memory_request mr, read_params(p.memory, ls_memory_request_init, "ls_memory_request"));
  return request_of(mr);
}

bool cpu_device(const std::string& d) { return d.rfind("cpu", 0) == 0; }

}  // namespace ls::capi
