// The working state one forward shares between its phases (exec/phase_*.h): the
// backend, the activation arena, the persistent device buffers, where the residual
// lives, and the non-finite check. Made by Engine::forward, alive for one call.
//
// The residual x is bf16 [S, D] on the device, or (residual offload) in pinned host
// memory with one device slice buffer per phase: rows are copied into it before the
// slice's work and back out after, on the compute queue, so the copies are ordered with
// the slice's work without fences.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/plan.h"
#include "model/h3/block.h"
#include "model/h3/config.h"

namespace ls::exec {

struct ForwardState {
  Backend& be;
  const h3::H3Config& cfg;
  Arena& arena;                 // the activation arena (capacity = the plan's predicted peak)
  const bool residual_offload;  // x is pinned host memory, phases hold one slice each
  const bool check_finite_on;   // EngineOptions::check_finite
  int64_t S = 0;                // packed rows
  // This rank's rows [row0, row1) of the sequence (all of [0, S) with one rank) and R,
  // the rows every rank's residual holds (docs/multi-gpu.md; R = S with one rank).
  int64_t row0 = 0, row1 = 0, R = 0;
  Communicator* comm = nullptr;  // sequence parallel (ranks > 1), else null
  TensorView x;                 // bf16 [R, D] rows row0.. : device, or pinned host with residual offload
  TensorView rope;              // bf16 [S, P, 2] (device)
  TensorView mod_rows;          // i32 [S] (device)
  TensorView final_rows;        // i32 [S] (device)
  // Traffic of this call (the report's PCIe bytes).
  uint64_t kv_bytes = 0, residual_bytes = 0;
  // K/V buffers of the current phase (two-pass attention), for the memory samples.
  uint64_t phase_kv = 0;
  // Where the forward is, for the non-finite message: "embed", "block 3 (mlp)".
  const char* phase_name = "embed";
  int64_t phase_block = -1;
  // EngineOptions::profile: synchronise and add the seconds since the last mark to
  // `phase` (no-op without profiling). Set by the engine.
  std::function<Status(const char* phase)> mark = [](const char*) { return Status(); };

  ForwardState(Backend& b, const h3::H3Config& c, Arena& a, bool res_off, bool check)
      : be(b), cfg(c), arena(a), residual_offload(res_off), check_finite_on(check) {}

  std::string where() const;
  // The residual as a block sees it, rows [a, b): x itself, or (residual offload) the
  // phase's slice buffer `rs` after copying the rows in.
  Expected<h3::BlockRows> residual_in(const TensorView& rs, int64_t a, int64_t b);
  // After a slice's work (residual offload): check the slice, copy it back to the host.
  Status residual_out(const h3::BlockRows& r, int64_t a, int64_t b);
  // The phase's residual slice buffer with `rows` rows (residual offload), else empty.
  Expected<TensorView> residual_slice(const std::optional<PlannedBuffer>& spec, int64_t rows);
  // One reduction over `t`: ErrorCode::nonfinite naming where() when it holds a NaN or
  // inf (EngineOptions::check_finite; reads only, never changes a bit).
  Status check_finite(const TensorView& t);
  // The whole residual after a phase (on the device; with residual offload each slice
  // was checked on its way out).
  Status check_residual() { return residual_offload ? Status() : check_finite(x); }
};

}  // namespace ls::exec
