// Weight residency: the one place that decides where the forward's weights live
// (style-lessons §9; issue 5; docs/budget.md).
//
//  - CPU backend, every block resident (the default): the source's host views are used
//    as they are (mapped file or synthetic host buffers); nothing is copied.
//  - Otherwise the weights the steps read live in device arenas:
//      resident arena : patch projections, final norm, output heads, and the weights of
//                       blocks 0 .. R-1 (norms, qkv, q/k norm, out_proj, fc1, fc2);
//      block slots    : when R < L, `slots` buffers of the largest streamed block's bytes
//                       each (blocks may differ in layout: a mixed int8 / bf16 file); blocks
//                       R .. L-1 live in pinned host memory (one copy per block, laid out
//                       exactly as it sits in a slot, its own bytes) and are copied into slot (i - R) % slots on
//                       the backend's transfer queue. With 2 slots block i+1 copies while
//                       block i computes (prefetch); with 1 slot the copy of block i+1
//                       waits for block i to finish. Every streamed block crosses the bus
//                       once per forward, never once per slice.
//    AdaLN linears and the time embedder are never resident: only the AdaLN precompute
//    reads them, through transient() copies into its scratch arena, once per run. The
//    text weights (condition_proj, the token refiner) are not resident either: the
//    refiner's blocks go through the slots when there are slots, else through transient
//    copies (refiner_block()), and condition_proj through transient().
//
// Tensors are selected by their role and block index in the model's tensor table
// (TensorSpec::role, TensorSpec::block), never by their names: a block slot holds every
// tensor of role `block` of that block (quantised scales included), the resident arena
// the roles patch_embed, head and block (blocks < R); tensors of role `unused` never go
// to the device. Fences: two handles per slot from the backend's pool (loaded, free),
// taken when blocks stream and held for the store's life.
// Streaming protocol for one forward (the engine's block loop):
//   begin_forward();                      // queues the first `slots` streamed blocks
//   for i: auto w = acquire_block(i);     // compute waits until block i is in its slot
//          ... queue block i's work ...
//          release_block(i);             // slot free after that work; next copy queued
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/block.h"
#include "model/h3/config.h"

namespace ls::h3 {
class H3TensorSource;
}

namespace ls::exec {

struct Residency {
  int64_t resident_blocks = -1;  // blocks 0 .. R-1 stay on the device; -1 = all of them
  int64_t slots = 2;             // slots for the streamed blocks: 2 = prefetch, 1 = none
  // Drop the source's host copy of a tensor once it lives elsewhere (synthetic source:
  // frees host memory; a mapped file is unaffected). Benchmarks that build several
  // engines over one source keep them.
  bool release_source = true;
};

class WeightStore {
 public:
  static Expected<std::unique_ptr<WeightStore>> create(const h3::H3TensorSource& src, Backend& be,
                                                       const Residency& residency, MemoryResource& device_memory);
  ~WeightStore();
  // Device view of a resident non-block weight (LS_CHECK: the name is resident).
  TensorView get(const std::string& name) const;
  // Host view straight from the source (host-side work: RoPE inv_freq, curve table, PDD bank).
  TensorView host(const std::string& name) const;
  // A weight read outside the steps (AdaLN precompute, text refinement): the host view
  // on the host-resident CPU path, else a copy into `scratch` (freed with the caller's scope).
  Expected<TensorView> transient(const std::string& name, Arena& scratch) const;
  // Bytes transient() takes from `scratch` for `name` (0 on the host-resident path).
  uint64_t transient_bytes(const std::string& name) const;
  // After the AdaLN precompute: drop the source's host copy of a precompute-only weight
  // (always, whatever Residency::release_source says: they are read once per run).
  void release_source(const std::string& name) const;
  // Roles only the AdaLN precompute reads (time_embedder, adaln_table, adaln).
  static bool is_precompute_only(h3::TensorRole role);
  // Roles the steps read from the device (patch_embed, block, head).
  static bool is_step_weight(h3::TensorRole role);

  // ---- the block walk of one forward (see the protocol above) ----
  Status begin_forward();
  Expected<h3::WeightGetter> acquire_block(int64_t i);
  Status release_block(int64_t i);

  // ---- text refinement: refiner block i's weights, through slot i % slots (compute
  // queue) when there are slots, else copied into `scratch`. release_refiner_block
  // frees the slot for later copies. ----
  Expected<h3::WeightGetter> refiner_block(int64_t i, Arena& scratch);
  Status release_refiner_block(int64_t i);
  // Bytes refiner_block takes from `scratch` (0 when it goes through a slot or the host).
  uint64_t refiner_block_scratch_bytes(int64_t i) const;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t resident_blocks() const { return resident_blocks_; }
  int64_t slots() const { return slots_; }
  bool streamed(int64_t i) const { return i >= resident_blocks_; }
  uint64_t device_bytes() const;           // resident arena + slots
  uint64_t slot_bytes() const { return slot_bytes_; }  // the largest streamed block's bytes
  uint64_t pinned_host_bytes() const;      // streamed blocks' host copies
  uint64_t forward_copy_bytes() const { return forward_copy_bytes_; }  // since begin_forward

 private:
  WeightStore(const h3::H3TensorSource& src, Backend& be) : src_(src), be_(be) {}
  struct SlotEntry {
    h3::TensorSpec spec;
    uint64_t offset = 0;  // bytes from the slot start (256-aligned)
  };
  // The tensors of `role` and `block` in table order, laid out one after another.
  std::vector<SlotEntry> layout_of(h3::TensorRole role, int64_t block) const;
  static uint64_t layout_bytes(const std::vector<SlotEntry>& l);
  // Views of layout `l` at `base` (a slot or a scratch copy), by tensor name.
  h3::WeightGetter views_at(void* base, const std::vector<SlotEntry>& l, const char* where) const;
  Status queue_load(int64_t block);  // block's host copy -> its slot, on the transfer queue
  int64_t slot_of(int64_t block) const { return (block - resident_blocks_) % slots_; }

  const h3::H3TensorSource& src_;
  Backend& be_;
  bool host_resident_ = true;
  bool release_ = true;
  int64_t num_blocks_ = 0, resident_blocks_ = 0, slots_ = 0;
  std::unique_ptr<Arena> arena_;         // resident weights (device)
  std::unique_ptr<Arena> slot_arena_;    // slots (device)
  std::unique_ptr<Arena> pinned_arena_;  // streamed blocks (pinned host), slot layout each
  std::map<std::string, TensorView> device_;
  std::vector<std::vector<SlotEntry>> block_layouts_;  // [L], each block's own layout
  std::vector<uint64_t> block_bytes_;                  // [L], layout_bytes of each block
  Backend::Fence loaded_[2], free_[2];  // per slot: copy into it done / its last reader done
  uint64_t slot_bytes_ = 0;
  std::vector<void*> slot_ptr_;
  std::vector<void*> host_block_ptr_;    // [L - R] pinned copies
  uint64_t forward_copy_bytes_ = 0;
};

}  // namespace ls::exec
