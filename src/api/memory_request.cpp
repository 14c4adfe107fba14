#include "api/memory_request.h"

#include "core/ranges.h"

namespace ls::api {

const MemoryNames kFlagNames{"--vram-budget", "--budget",         "--no-prefetch/--keep-prefetch", "--no-prefetch", "--keep-prefetch",
                             "--mlp-chunk",   "--attn-chunk",     "--final-chunk",       "--kv-offload",
                             "--kv-chunk",    "--residual-offload", "--resident-blocks", "--slots",
                             "--device cuda"};
const MemoryNames kFieldNames{"vram_budget", "activation_budget", "prefetch", "prefetch=0",       "prefetch=2",
                              "mlp_chunk",   "attn_chunk",        "final_chunk",      "kv_offload",
                              "kv_chunk",    "residual_offload",  "resident_blocks",  "slots",
                              "a \"cuda\" device"};

MemoryMode infer_mode(const MemoryRequest& r) {
  return r.vram_budget ? MemoryMode::total_budget
         : r.activation_budget ? MemoryMode::activation_budget
                               : MemoryMode::knobs;
}

namespace {

Error bad(std::string msg) { return Error{ErrorCode::invalid_argument, std::move(msg)}; }

Status check_ranges(const MemoryRequest& r, const MemoryNames& n) {
  if (r.vram_budget) LS_TRY(ranges::check_size(n.vram_budget, *r.vram_budget, ranges::budget));
  if (r.activation_budget) LS_TRY(ranges::check_size(n.activation_budget, *r.activation_budget, ranges::budget));
  if (r.prefetch) LS_TRY(ranges::check_int(n.prefetch, *r.prefetch, ranges::prefetch));
  if (r.mlp_chunk) LS_TRY(ranges::check_int(n.mlp_chunk, *r.mlp_chunk, ranges::chunk));
  if (r.attn_chunk) LS_TRY(ranges::check_int(n.attn_chunk, *r.attn_chunk, ranges::chunk));
  if (r.final_chunk) LS_TRY(ranges::check_int(n.final_chunk, *r.final_chunk, ranges::chunk));
  if (r.kv_chunk) LS_TRY(ranges::check_int(n.kv_chunk, *r.kv_chunk, ranges::kv_chunk));
  if (r.resident_blocks) LS_TRY(ranges::check_int(n.resident_blocks, *r.resident_blocks, ranges::resident_blocks));
  if (r.slots) LS_TRY(ranges::check_int(n.slots, *r.slots, ranges::slots));
  return {};
}

}  // namespace

Expected<MemorySpec> resolve_memory(const MemoryRequest& r, const MemoryNames& n) {
  const std::string vram = n.vram_budget, act = n.activation_budget;
  // The tag and its budget.
  if (r.mode == MemoryMode::total_budget && !r.vram_budget)
    return bad("the memory choice is a device budget but " + vram + " is not given");
  if (r.mode == MemoryMode::activation_budget && !r.activation_budget)
    return bad("the memory choice is an activation budget but " + act + " is not given");
  if (r.mode != MemoryMode::total_budget && r.vram_budget)
    return bad(vram + " is given but the memory choice is " + exec::memory_mode_name(r.mode));
  if (r.mode == MemoryMode::knobs && r.activation_budget)
    return bad(act + " is given but the memory choice is " + exec::memory_mode_name(r.mode));
  const bool slices = r.mlp_chunk || r.attn_chunk || r.final_chunk;
  const bool residency = r.resident_blocks || r.slots || r.kv_offload || r.kv_chunk || r.residual_offload;
  if (r.vram_budget && (r.activation_budget || slices || residency))
    return bad(vram + " decides residency, offload and slices: give it alone (no " + act + ", " + n.mlp_chunk + ", " +
               n.attn_chunk + ", " + n.final_chunk + ", " + n.resident_blocks + ", " + n.slots + ", " + n.kv_offload +
               ", " + n.kv_chunk + ", " + n.residual_offload + ")");
  if (r.prefetch && !r.vram_budget) {
    LS_TRY(ranges::check_int(n.prefetch, *r.prefetch, ranges::prefetch));
    if (*r.prefetch == 0)
      return bad(std::string(n.prefetch_off) + " goes with " + vram + " (with " + n.resident_blocks + ", use " +
                 n.slots + " 1)");
    return bad(std::string(*r.prefetch == 2 ? n.prefetch_always : n.prefetch) + " goes with " + vram);
  }
  if (r.slots && !r.resident_blocks)
    return bad(std::string(n.slots) + " has no effect without " + n.resident_blocks +
               " (the manual residency mode): with every block resident nothing streams through slots");
  if (r.kv_chunk && !(r.kv_offload && *r.kv_offload))
    return bad(std::string(n.kv_chunk) + " has no effect without " + n.kv_offload + " (K/V stays whole on the device)");
  if (r.activation_budget && slices)
    return bad(act + " picks the slice sizes: give it or " + n.mlp_chunk + "/" + n.attn_chunk + "/" + n.final_chunk +
               ", not both");
  if (r.activation_budget && ((r.kv_offload && *r.kv_offload) || (r.residual_offload && *r.residual_offload)))
    return bad(act + " plans the slices with K/V and the residual on the device: " + n.kv_offload + " and " +
               n.residual_offload + " go with " + n.attn_chunk + " (or use " + vram + ", which offloads when it must)");
  LS_TRY(check_ranges(r, n));

  MemorySpec m;  // the defaults: MemorySpec's, exec::PlanKnobs' and exec::Residency's initialisers
  m.mode = infer_mode(r);
  if (r.vram_budget) m.total_budget = *r.vram_budget;
  if (r.activation_budget) m.activation_budget = *r.activation_budget;
  if (r.prefetch) {
    m.prefetch = *r.prefetch != 0;
    m.adaptive_slots = *r.prefetch != 2;
  }
  if (r.mlp_chunk) m.knobs.mlp_chunk_tokens = *r.mlp_chunk;
  if (r.attn_chunk) m.knobs.attn_chunk_tokens = *r.attn_chunk;
  if (r.final_chunk) m.knobs.final_chunk_tokens = *r.final_chunk;
  if (r.kv_offload) m.knobs.kv_offload = *r.kv_offload;
  if (r.kv_chunk) m.knobs.kv_chunk_rows = *r.kv_chunk;
  if (r.residual_offload) m.knobs.residual_offload = *r.residual_offload;
  m.knobs.kv_tile = 0;  // numerics (the caller's), 0 = the device's
  if (r.resident_blocks) m.residency.resident_blocks = *r.resident_blocks;
  if (r.slots) m.residency.slots = *r.slots;
  return m;
}

Status check_memory_device(const MemoryRequest& r, bool device_is_cpu, const MemoryNames& n) {
  if (device_is_cpu && r.vram_budget)
    return bad(std::string(n.vram_budget) +
               " is a device budget and the CPU backend has no device memory (on the CPU it only copies weights into "
               "more host memory): use " + n.activation_budget + " for the activation memory, or " + n.a_device);
  return {};
}

}  // namespace ls::api
