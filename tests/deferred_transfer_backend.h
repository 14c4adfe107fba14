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
#include "forwarding_backend.h"

namespace ls::test {

class DeferredTransferBackend final : public ForwardingBackend {
 public:
  explicit DeferredTransferBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {
    last_.fill(0);
  }
  ~DeferredTransferBackend() override { (void)flush_all(); }

  // How many transfer copies were deferred, and the most held back at once (the tests
  // check these are > 0, so a pass is not vacuous).
  int64_t deferred_copies = 0, most_pending = 0;

  std::string name() const override { return in_->name() + " (deferred transfer queue)"; }
  Status synchronize() override {
    LS_TRY(flush_all());
    return in_->synchronize();
  }
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
  std::deque<Op> pending_;
  std::array<uint64_t, kFences> last_{};  // per fence: seq of its last pending transfer signal, 0 = complete
  uint64_t seq_ = 0;
};

}  // namespace ls::test
