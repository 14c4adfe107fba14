#include "exec/weights.h"

#include <algorithm>
#include <cstring>

#include "core/thread_pool.h"
#include "model/h3/checkpoint.h"

namespace ls::exec {

using h3::TensorRole;

bool WeightStore::is_precompute_only(TensorRole r) {
  return r == TensorRole::time_embedder || r == TensorRole::adaln_table || r == TensorRole::adaln;
}

bool WeightStore::is_step_weight(TensorRole r) {
  return r == TensorRole::patch_embed || r == TensorRole::block || r == TensorRole::head;
}

static uint64_t spec_bytes(const h3::TensorSpec& s) {
  return static_cast<uint64_t>(s.numel()) * static_cast<uint64_t>(dtype_size(s.dtype));
}

static TensorView view_of(void* p, const h3::TensorSpec& s, Device d) {
  TensorView v = TensorView::contiguous(p, s.dtype, s.shape.data(), static_cast<int>(s.shape.size()));
  v.device = d;
  return v;
}

std::vector<WeightStore::SlotEntry> WeightStore::layout_of(TensorRole role, int64_t block) const {
  std::vector<SlotEntry> l;
  uint64_t off = 0;
  for (const auto& s : src_.specs()) {
    if (s.role != role || s.block != block) continue;
    l.push_back(SlotEntry{s, off});
    off += Arena::aligned_bytes(static_cast<size_t>(spec_bytes(s)));
  }
  return l;
}

uint64_t WeightStore::layout_bytes(const std::vector<SlotEntry>& l) {
  return l.empty() ? 0 : l.back().offset + Arena::aligned_bytes(static_cast<size_t>(spec_bytes(l.back().spec)));
}

h3::WeightGetter WeightStore::views_at(void* base, const std::vector<SlotEntry>& l, const char* where) const {
  std::map<std::string, TensorView> views;
  for (const SlotEntry& e : l) views[e.spec.name] = view_of(static_cast<char*>(base) + e.offset, e.spec, be_.device());
  return [views = std::move(views), where](const std::string& n) {
    auto it = views.find(n);
    LS_CHECK_MSG(it != views.end(), "weight '" + n + "' is not in the " + where);
    return it->second;
  };
}

Expected<std::unique_ptr<WeightStore>> WeightStore::create(const h3::H3TensorSource& src, Backend& be,
                                                           const Residency& r, MemoryResource& device_memory) {
  const int64_t L = src.cfg().num_layers;
  if (r.resident_blocks < -1 || r.resident_blocks > L)
    return make_error(ErrorCode::invalid_argument, "resident blocks must be -1 (all) or 0.." + std::to_string(L) +
                                                       " (got " + std::to_string(r.resident_blocks) + ")");
  if (r.slots < 1 || r.slots > 2)
    return make_error(ErrorCode::invalid_argument, "block slots must be 1 or 2 (got " + std::to_string(r.slots) + ")");
  std::unique_ptr<WeightStore> ws(new WeightStore(src, be));
  ws->num_blocks_ = L;
  ws->resident_blocks_ = r.resident_blocks < 0 ? L : r.resident_blocks;
  ws->release_ = r.release_source;
  if (be.device().kind == DeviceKind::cpu && ws->resident_blocks_ == L) return ws;  // host views as they are
  ws->host_resident_ = false;
  // Block layouts by role and block index from the tensor table: every tensor of role
  // `block` (quantised scales included) goes into the slot, nothing of another role. Each
  // block has its own layout (files mix formats per block: the community int8
  // "_skip_edges" builds keep blocks 0, 1, 48, 49 in bf16); a slot holds the largest
  // streamed block, and each copy moves the block's own bytes.
  for (int64_t i = 0; i < L; ++i) {
    ws->block_layouts_.push_back(ws->layout_of(TensorRole::block, i));
    ws->block_bytes_.push_back(layout_bytes(ws->block_layouts_.back()));
  }
  // Resident arena: the step weights (patch projections, head) + blocks 0 .. R-1; never
  // the precompute-only, text, host-only (rope) or unused tensors.
  auto resident = [&](const h3::TensorSpec& s) {
    return is_step_weight(s.role) && (s.role != TensorRole::block || s.block < ws->resident_blocks_);
  };
  uint64_t total = 0;
  for (const auto& s : src.specs())
    if (resident(s)) total += Arena::aligned_bytes(static_cast<size_t>(spec_bytes(s)));
  LS_ASSIGN_OR_RETURN(ws->arena_, Arena::create(device_memory, total));
  for (const auto& s : src.specs()) {
    if (!resident(s)) continue;
    const TensorView h = src.get(s.name);
    LS_ASSIGN_OR_RETURN(void* p, ws->arena_->alloc_bytes(static_cast<size_t>(h.nbytes()), s.name.c_str()));
    const TensorView d = view_of(p, s, be.device());
    LS_TRY(be.copy(d, h));
    LS_TRY(be.synchronize());  // the source's host copy may go now
    if (ws->release_) src.release(s.name);
    ws->device_[s.name] = d;
  }
  // Streamed blocks: pinned host copies in slot layout, and the slots.
  const int64_t streamed = L - ws->resident_blocks_;
  if (streamed > 0) {
    ws->slots_ = std::min<int64_t>(r.slots, streamed);
    uint64_t slot_bytes = 0, pinned_bytes = 0;  // the largest streamed block; all streamed blocks
    for (int64_t i = ws->resident_blocks_; i < L; ++i) {
      slot_bytes = std::max(slot_bytes, ws->block_bytes_[static_cast<size_t>(i)]);
      pinned_bytes += ws->block_bytes_[static_cast<size_t>(i)];
    }
    ws->slot_bytes_ = slot_bytes;
    // loaded[s]: the transfer queue finished copying a block into slot s; free[s]: the
    // compute queue finished the work that reads slot s.
    for (int64_t s = 0; s < ws->slots_; ++s) {
      LS_ASSIGN_OR_RETURN(ws->loaded_[static_cast<size_t>(s)], be.take_fence());
      LS_ASSIGN_OR_RETURN(ws->free_[static_cast<size_t>(s)], be.take_fence());
    }
    LS_ASSIGN_OR_RETURN(ws->slot_arena_,
                        Arena::create(device_memory, static_cast<size_t>(slot_bytes) * static_cast<size_t>(ws->slots_)));
    for (int64_t s = 0; s < ws->slots_; ++s) {
      LS_ASSIGN_OR_RETURN(void* p, ws->slot_arena_->alloc_bytes(static_cast<size_t>(slot_bytes), "block slot"));
      ws->slot_ptr_.push_back(p);
    }
    LS_ASSIGN_OR_RETURN(ws->pinned_arena_, Arena::create(be.pinned_host_memory(), static_cast<size_t>(pinned_bytes)));
    for (int64_t i = ws->resident_blocks_; i < L; ++i) {
      LS_ASSIGN_OR_RETURN(void* p, ws->pinned_arena_->alloc_bytes(
                                       static_cast<size_t>(ws->block_bytes_[static_cast<size_t>(i)]), "streamed block"));
      ws->host_block_ptr_.push_back(p);
      for (const SlotEntry& e : ws->block_layouts_[static_cast<size_t>(i)]) {
        const std::string& n = e.spec.name;
        const TensorView h = src.get(n);
        // Into pinned memory on all cores (36 GB for 50 streamed H3 blocks): 16 MiB pieces.
        char* dst = static_cast<char*>(p) + e.offset;
        const char* from = static_cast<const char*>(h.data);
        parallel_for(h.nbytes(), 16 << 20, [&](int64_t a, int64_t b) {
          std::memcpy(dst + a, from + a, static_cast<size_t>(b - a));
        });
        if (ws->release_) src.release(n);
      }
    }
  }
  LS_TRY(be.synchronize());
  return ws;
}

WeightStore::~WeightStore() { (void)be_.synchronize(); }  // no copy may outlive the buffers

uint64_t WeightStore::device_bytes() const {
  return (arena_ ? arena_->used() : 0) + (slot_arena_ ? slot_arena_->used() : 0);
}
uint64_t WeightStore::pinned_host_bytes() const { return pinned_arena_ ? pinned_arena_->used() : 0; }

TensorView WeightStore::get(const std::string& name) const {
  if (host_resident_) return src_.get(name);
  auto it = device_.find(name);
  LS_CHECK_MSG(it != device_.end(), "weight '" + name + "' is not resident on the device");
  return it->second;
}

TensorView WeightStore::host(const std::string& name) const { return src_.get(name); }

uint64_t WeightStore::transient_bytes(const std::string& name) const {
  if (host_resident_) return 0;
  const auto* s = src_.spec(name);
  LS_CHECK_MSG(s != nullptr, "unknown weight '" + name + "'");
  return Arena::aligned_bytes(static_cast<size_t>(spec_bytes(*s)));
}

Expected<TensorView> WeightStore::transient(const std::string& name, Arena& scratch) const {
  const TensorView h = src_.get(name);
  if (host_resident_) return h;
  LS_ASSIGN_OR_RETURN(void* p, scratch.alloc_bytes(static_cast<size_t>(h.nbytes()), name.c_str()));
  TensorView d = h;
  d.data = p;
  d.device = be_.device();
  LS_TRY(be_.copy(d, h));
  return d;
}

void WeightStore::release_source(const std::string& name) const {
  // Precompute-only weights are read once per run, so their host copies always go
  // (a synthetic source remakes them if a later run asks; a mapped file is unaffected).
  const h3::TensorSpec* s = src_.spec(name);
  if (release_ || (s && is_precompute_only(s->role))) src_.release(name);
}

// ---- block streaming ------------------------------------------------------------------

Status WeightStore::queue_load(int64_t block) {
  const int64_t s = slot_of(block);
  LS_TRY(free_[static_cast<size_t>(s)].wait(Queue::transfer));  // the slot's last user is done
  // The block's own bytes (<= slot_bytes_: a smaller block leaves the slot's tail unused).
  const uint64_t bytes = block_bytes_[static_cast<size_t>(block)];
  const auto n = static_cast<int64_t>(bytes);
  const TensorView dst(slot_ptr_[static_cast<size_t>(s)], DType::u8, {n}, be_.device());
  const TensorView src(host_block_ptr_[static_cast<size_t>(block - resident_blocks_)], DType::u8, {n});
  LS_TRY(be_.copy_async(dst, src, Queue::transfer));
  forward_copy_bytes_ += bytes;
  return loaded_[static_cast<size_t>(s)].signal(Queue::transfer);
}

Status WeightStore::begin_forward() {
  forward_copy_bytes_ = 0;
  for (int64_t i = resident_blocks_; i < std::min(num_blocks_, resident_blocks_ + slots_); ++i) LS_TRY(queue_load(i));
  return Status();
}

Expected<h3::WeightGetter> WeightStore::acquire_block(int64_t i) {
  LS_CHECK(i >= 0 && i < num_blocks_);
  if (host_resident_ || i < resident_blocks_) {
    return h3::WeightGetter([this](const std::string& n) { return get(n); });
  }
  const int64_t s = slot_of(i);
  LS_TRY(loaded_[static_cast<size_t>(s)].wait(Queue::compute));
  return views_at(slot_ptr_[static_cast<size_t>(s)], block_layouts_[static_cast<size_t>(i)], "block slot");
}

Status WeightStore::release_block(int64_t i) {
  if (host_resident_ || i < resident_blocks_) return Status();
  const int64_t s = slot_of(i);
  LS_TRY(free_[static_cast<size_t>(s)].signal(Queue::compute));
  if (i + slots_ < num_blocks_) LS_TRY(queue_load(i + slots_));
  return Status();
}

// ---- text refinement --------------------------------------------------------------------

uint64_t WeightStore::refiner_block_scratch_bytes(int64_t i) const {
  if (host_resident_) return 0;
  const auto l = layout_of(TensorRole::refiner, i);
  if (slots_ > 0 && layout_bytes(l) <= slot_bytes_) return 0;
  return layout_bytes(l);
}

Expected<h3::WeightGetter> WeightStore::refiner_block(int64_t i, Arena& scratch) {
  if (host_resident_) return h3::WeightGetter([this](const std::string& n) { return src_.get(n); });
  const auto l = layout_of(TensorRole::refiner, i);
  void* base = nullptr;
  if (slots_ > 0 && layout_bytes(l) <= slot_bytes_) {
    // Nothing else is queued on the slots outside a forward, and a previous forward's
    // last user of this slot is done before the copy (compute-queue order does it).
    base = slot_ptr_[static_cast<size_t>(i % slots_)];
  } else {
    LS_ASSIGN_OR_RETURN(base, scratch.alloc_bytes(static_cast<size_t>(layout_bytes(l)), "refiner block"));
  }
  for (const SlotEntry& e : l) {
    const TensorView h = src_.get(e.spec.name);
    const TensorView d = view_of(static_cast<char*>(base) + e.offset, e.spec, be_.device());
    LS_TRY(be_.copy_async(d, h, Queue::compute));  // ordered before the block's ops
  }
  LS_TRY(be_.synchronize());  // host views of the source may be released by the caller
  return views_at(base, l, "refiner block copy");
}

Status WeightStore::release_refiner_block(int64_t i) {
  if (host_resident_ || slots_ == 0) return Status();
  return free_[static_cast<size_t>(i % slots_)].signal(Queue::compute);
}

}  // namespace ls::exec
