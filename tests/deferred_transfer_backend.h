// A CPU backend whose transfer queue really lags: copies queued on Queue::transfer are
// held back and run only when a fence wait (compute queue or host) needs them, or at
// synchronize(). Everything else (every op, compute-queue copies, synchronous copies)
// runs at once, as on the CpuBackend it wraps.
//
// On the plain CPU backend every queue is synchronous, so a missing fence wait cannot
// show: a copy has always landed before the next op reads it. Here a compute op that
// reads a buffer (or host rows) a transfer copy fills, without waiting for that copy's
// fence, reads the old bytes; and a compute op that overwrites a buffer a transfer copy
// still has to read, without waiting for the copy's fence, changes what the copy sends.
// Both change output bytes, so the memcmp streaming tests catch them. (The opposite race,
// a transfer copy running before compute work it should follow, cannot happen here:
// compute work runs when it is queued, always before any later transfer copy. The GPU
// tests cover that one.)
#pragma once

#include <array>
#include <deque>
#include <memory>

#include "backend/backend.h"

namespace ls::test {

class DeferredTransferBackend final : public Backend {
 public:
  explicit DeferredTransferBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) { last_.fill(0); }
  ~DeferredTransferBackend() override { (void)flush_all(); }

  // How many transfer copies were deferred, and the most held back at once (the tests
  // check these are > 0, so a pass is not vacuous).
  int64_t deferred_copies = 0, most_pending = 0;

  Device device() const override { return in_->device(); }
  std::string name() const override { return in_->name() + " (deferred transfer queue)"; }
  MemoryResource& memory() override { return in_->memory(); }
  Status copy(const TensorView& d, const TensorView& s) override { return in_->copy(d, s); }
  Status synchronize() override {
    LS_TRY(flush_all());
    return in_->synchronize();
  }
  MemoryResource& pinned_host_memory() override { return in_->pinned_host_memory(); }
  Status copy_async(const TensorView& d, const TensorView& s, Queue q) override {
    if (q == Queue::compute) return in_->copy(d, s);
    pending_.push_back(Op{d, s, -1, 0});
    ++deferred_copies;
    int64_t copies = 0;
    for (const Op& o : pending_) copies += o.fence < 0;
    most_pending = std::max(most_pending, copies);
    return Status();
  }
  // A compute-queue signal completes at once (the work before it has run); a transfer-
  // queue signal completes when the held-back copies queued before it have run.
  Status signal(Queue q, int f) override {
    if (q == Queue::compute) {
      last_[static_cast<size_t>(f)] = 0;
      return Status();
    }
    pending_.push_back(Op{TensorView(), TensorView(), f, ++seq_});
    last_[static_cast<size_t>(f)] = seq_;
    return Status();
  }
  // Transfer work queued later already follows every compute op queued so far and every
  // earlier transfer copy; a compute wait (or a host wait) runs the held-back copies up to
  // the fence's last signal.
  Status wait(Queue q, int f) override { return q == Queue::transfer ? Status() : flush_to(f); }
  Status host_wait(int f) override { return flush_to(f); }
  Status device_memory_info(uint64_t* a, uint64_t* b) override { return in_->device_memory_info(a, b); }
  Status wait_external(void* s) override { return in_->wait_external(s); }
  Status signal_external(void* s) override { return in_->signal_external(s); }
  size_t workspace_bytes() const override { return in_->workspace_bytes(); }
  Status set_workspace(const TensorView& ws) override { return in_->set_workspace(ws); }
  Status set_numerics(const Numerics& n, const Diagnostics& d) override { return in_->set_numerics(n, d); }
  Numerics numerics() const override { return in_->numerics(); }
  Diagnostics diagnostics() const override { return in_->diagnostics(); }
  Status gemm(const TensorView& x, const TensorView& w, const TensorView* b, const TensorView& o) override {
    return in_->gemm(x, w, b, o);
  }
  Status rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& o) override {
    return in_->rms_norm(x, w, eps, o);
  }
  Status modulate(const TensorView& i, const TensorView& sh, const TensorView& sc, const TensorView& r,
                  const TensorView& o) override {
    return in_->modulate(i, sh, sc, r, o);
  }
  Status rms_norm_modulate(const TensorView& x, const TensorView& w, float eps, const TensorView& sh,
                           const TensorView& sc, const TensorView& r, const TensorView& o) override {
    return in_->rms_norm_modulate(x, w, eps, sh, sc, r, o);
  }
  Status gated_add(const TensorView& x, const TensorView& y, const TensorView& g, const TensorView& r) override {
    return in_->gated_add(x, y, g, r);
  }
  Status add(const TensorView& x, const TensorView& y) override { return in_->add(x, y); }
  Status qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) override {
    return in_->qk_norm_rope(x, w, rope, eps);
  }
  Status swiglu(const TensorView& u, const TensorView& o) override { return in_->swiglu(u, o); }
  Status silu(const TensorView& x) override { return in_->silu(x); }
  Status time_embedding(const TensorView& t, const TensorView& o) override { return in_->time_embedding(t, o); }
  Status convert(const TensorView& s, const TensorView& d) override { return in_->convert(s, d); }
  Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const AttentionParams& p) override {
    return in_->attention(q, k, v, o, p);
  }
  Status linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                const LinearOptions& opts) override {
    return in_->linear(x, w, bias, out, opts);
  }
  Status lora_side(const TensorView& x, const LoraSide& side, const TensorView& out,
                   const LinearOptions& opts) override {
    return in_->lora_side(x, side, out, opts);
  }
  Expected<int64_t> count_nonfinite(const TensorView& t) override { return in_->count_nonfinite(t); }
  Status pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out) override {
    return in_->pack_video_rows(lat, r0, out);
  }
  Status pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out) override {
    return in_->pack_audio_rows(lat, carry, r0, out);
  }
  Status unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) override {
    return in_->unpack_video_rows(rows, mask, r0, out);
  }
  Status unpack_audio_rows(const TensorView& rows, const TensorView& mask, const AudioCarryOut& c, int64_t r0,
                           const TensorView& out) override {
    return in_->unpack_audio_rows(rows, mask, c, r0, out);
  }

 private:
  struct Op {
    TensorView dst, src;  // a copy (fence < 0)
    int fence;            // a transfer-queue signal of this fence
    uint64_t seq;         // its sequence number
  };
  // Runs held-back work in queue order until fence f's last signal has been passed.
  Status flush_to(int f) {
    const uint64_t target = last_[static_cast<size_t>(f)];
    if (target == 0) return Status();  // complete (never signalled on the transfer queue, or passed)
    while (!pending_.empty()) {
      const Op o = pending_.front();
      pending_.pop_front();
      if (o.fence < 0) {
        LS_TRY(in_->copy(o.dst, o.src));
        continue;
      }
      if (last_[static_cast<size_t>(o.fence)] == o.seq) last_[static_cast<size_t>(o.fence)] = 0;
      if (o.seq == target) return Status();
    }
    return Status();
  }
  Status flush_all() {
    while (!pending_.empty()) {
      const Op o = pending_.front();
      pending_.pop_front();
      if (o.fence < 0) LS_TRY(in_->copy(o.dst, o.src));
      else if (last_[static_cast<size_t>(o.fence)] == o.seq) last_[static_cast<size_t>(o.fence)] = 0;
    }
    return Status();
  }
  std::unique_ptr<Backend> in_;
  std::deque<Op> pending_;
  std::array<uint64_t, kFences> last_{};  // per fence: seq of its last pending transfer signal, 0 = complete
  uint64_t seq_ = 0;
};

}  // namespace ls::test
