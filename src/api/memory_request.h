// ONE memory request and ONE validation for every door (issue 27 item 1).
//
// A memory choice is tagged: a device budget (vram_budget: weights, tables, activations,
// workspace; the planner decides residency, offload and slices), an activation budget
// (the largest slices whose activations fit), or the explicit knobs (slices, offloads,
// residency). Each door (the CLI's flags, ls_engine_params / ls_memory_request, Python's
// Engine keywords, the ComfyUI node's inputs) fills a MemoryRequest with the fields the
// user GAVE and calls resolve_memory(), which checks every field against the range table
// (core/ranges.h) and every combination, and fills in the defaults (here only: MemorySpec's
// and exec::Residency's member initialisers). Nothing given is ignored: a field that has
// no effect under the request's mode is refused with a message naming it, in the door's
// spelling (MemoryNames).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "api/session.h"
#include "core/status.h"

namespace ls::api {

// How a door spells each field in its messages.
struct MemoryNames {
  const char* vram_budget;
  const char* activation_budget;
  const char* prefetch;         // the prefetch choice
  const char* prefetch_off;     // prefetch = 0 (one slot)
  const char* prefetch_always;  // prefetch = 2 (always two)
  const char* mlp_chunk;
  const char* attn_chunk;
  const char* final_chunk;
  const char* kv_offload;
  const char* kv_chunk;
  const char* residual_offload;
  const char* resident_blocks;
  const char* slots;
  const char* a_device;  // how to ask for a device with memory: "--device cuda", "a \"cuda\" device"
};
// The CLI's flags ("--vram-budget", "--budget", ...).
extern const MemoryNames kFlagNames;
// The C API's, Python's and the node's field names ("vram_budget", "activation_budget", ...).
extern const MemoryNames kFieldNames;

struct MemoryRequest {
  // The tag. infer_mode() gives the one the fields imply (the CLI, Python, the node);
  // the C API's ls_memory_request states it.
  MemoryMode mode = MemoryMode::knobs;
  std::optional<uint64_t> vram_budget, activation_budget;  // bytes
  std::optional<int64_t> prefetch;                         // 0 one slot, 1 the planner's choice, 2 always two
  std::optional<int64_t> mlp_chunk, attn_chunk, final_chunk;
  std::optional<bool> kv_offload, residual_offload;
  std::optional<int64_t> kv_chunk;
  std::optional<int64_t> resident_blocks, slots;
};

// total_budget when vram_budget is given, else activation_budget when that is, else knobs.
MemoryMode infer_mode(const MemoryRequest& r);

// Ranges (core/ranges.h), the tag against the fields, every combination; then the
// MemorySpec with the defaults for what was not given (knobs.kv_tile stays 0: numerics,
// not memory). invalid_argument with a message in `names`' spelling.
Expected<MemorySpec> resolve_memory(const MemoryRequest& r, const MemoryNames& names);
// A device budget needs device memory: invalid_argument when device_is_cpu and the
// request has a vram_budget.
Status check_memory_device(const MemoryRequest& r, bool device_is_cpu, const MemoryNames& names);

}  // namespace ls::api
