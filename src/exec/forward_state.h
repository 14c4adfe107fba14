// The working state one forward shares between its phases (exec/phase_*.h): the
// backend, the activation arena, the persistent device buffers, where the residual
// lives, and the non-finite check. Made by Engine::forward, alive for one call.
//
// The residual x is bf16 [S, D] on the device, or (residual offload) in pinned host
// memory with two device slice buffers per phase (ResidualWalk below): a slice's rows
// are copied in on the transfer queue while the previous slice computes, and back out
// while the next one computes, ordered by fences.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/buffers.h"
#include "exec/plan.h"
#include "model/h3/block.h"
#include "model/h3/config.h"

namespace ls::exec {

struct ForwardState;

// Row ranges [a, b) of one phase's walk, in the order it visits them.
using RowRanges = std::vector<std::pair<int64_t, int64_t>>;
// [lo, hi) in slices of `step` rows (the last one shorter).
RowRanges row_slices(int64_t lo, int64_t hi, int64_t step);

// One phase's walk over residual rows: the ranges it visits, in order, each taken with
// in() and given back with out(), then finish(). Without residual offload in() is x
// itself and out() does nothing. With residual offload, range i lives in slice buffer
// j = i % 2 and the copies run on the transfer queue (ForwardState::res_ready/res_done):
//   begin   transfer: rows of ranges 0 and 1 into buffers 0, 1 (a phase that reads), signal ready[j]
//   in(i)   compute: wait ready[j] (the rows landed; the buffer's previous copy out is done)
//   out(i)  compute: signal done[j] (after the finite check of a written slice);
//           transfer: wait done[j], copy the rows back to the host (a phase that writes),
//           copy range i + 2's rows into buffer j (reads), signal ready[j]
//   finish  compute: wait ready[0], ready[1]: no copy touches the buffers any more, so
//           the arena may give their bytes to the next phase at once
// Transfers run in call order on one queue, so a phase's reads of host rows come after
// every earlier phase's write-backs of them: a slice reads what the one-buffer walk
// read, bit for bit. Ranges may repeat rows (attention pass 1 reads the first query
// slice for its Q, then the chunks' rows).
// A phase's two residual slice buffers (empty views without residual offload). Walks
// run one after another on the same buffers (attention's two passes): a walk's finish()
// is what makes the buffers free for the next walk's first copies.
struct ResidualBuffers {
  TensorView buf[2];
};

class ResidualWalk {
 public:
  // spec: the phase's two buffers, allocated here with `rows` rows each (the phase's
  // largest range); reads / writes: whether ranges are copied in / back.
  static Expected<ResidualWalk> begin(ForwardState& st, const std::optional<ResidualSliceSpecs>& spec, int64_t rows,
                                      RowRanges ranges, bool reads, bool writes);
  // The same on buffers the phase allocated itself (ForwardState::residual_buffers).
  static Expected<ResidualWalk> begin(ForwardState& st, const ResidualBuffers& bufs, RowRanges ranges, bool reads,
                                      bool writes);
  // The next range, which must be [a, b) (LS_CHECK): the rows as the block sees them.
  Expected<h3::BlockRows> in(int64_t a, int64_t b);
  // Done with range [a, b) (the one in() gave): written rows checked and queued back.
  Status out(const h3::BlockRows& r, int64_t a, int64_t b);
  Status finish();

 private:
  Status load(size_t i);  // transfer: range i's rows into buffer i % 2 (reads), signal ready
  ForwardState* st_ = nullptr;
  TensorView buf_[2];
  RowRanges ranges_;
  size_t next_ = 0;
  bool reads_ = false, writes_ = false, offload_ = false;
};

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

  // Residual offload's fences (ResidualWalk), taken from the backend's pool at the first
  // walk and held for the call: per slice buffer j, ready[j] (transfer -> compute: rows
  // landed / copy out done) and done[j] (compute -> transfer: the slice's work is done).
  std::optional<Backend::Fence> res_ready[2], res_done[2];

  std::string where() const;
  // Residual offload: the phase's two slice buffers with `rows` rows each (and the
  // walk's fences, taken at the first call); empty views otherwise.
  Expected<ResidualBuffers> residual_buffers(const std::optional<ResidualSliceSpecs>& spec, int64_t rows);
  // The device residual's rows as a block sees them (no residual offload).
  h3::BlockRows device_rows() const { return h3::BlockRows{x, rope, mod_rows, row0}; }
  // One reduction over `t`: ErrorCode::nonfinite naming where() when it holds a NaN or
  // inf (EngineOptions::check_finite; reads only, never changes a bit).
  Status check_finite(const TensorView& t);
  // The whole residual after a phase (on the device; with residual offload each slice
  // was checked on its way out).
  Status check_residual() { return residual_offload ? Status() : check_finite(x); }
};

}  // namespace ls::exec
