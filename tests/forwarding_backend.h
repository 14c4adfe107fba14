// A Backend that forwards every call to an inner backend, for the test backends that
// change one behaviour and keep the rest: DeferredTransferBackend (a lagging transfer
// queue), ScalarSideBackend (test_lora_side.cpp: the scalar LoRA side path),
// CheckingBackend (tests/cuda/test_quant_forward_cuda.cpp: int8 linears re-run on the
// CPU). A subclass overrides what it changes; everything else reaches the inner backend,
// including the ops with a default in Backend (rms_norm_modulate, linear, lora_side, the
// pack ops, set_model_head_dim), so a test backend never silently runs the base class's
// fallback where the engine would run the inner backend's own op. Keep it complete: a
// virtual added to Backend belongs here too.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace ls::test {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}
  Backend& inner() { return *in_; }

  Device device() const override { return in_->device(); }
  std::string name() const override { return in_->name(); }
  MemoryResource& memory() override { return in_->memory(); }
  Status copy(const TensorView& d, const TensorView& s) override { return in_->copy(d, s); }
  Status synchronize() override { return in_->synchronize(); }
  MemoryResource& pinned_host_memory() override { return in_->pinned_host_memory(); }
  Status copy_async(const TensorView& d, const TensorView& s, Queue q) override { return in_->copy_async(d, s, q); }
  Status signal(Queue q, int f) override { return in_->signal(q, f); }
  Status wait(Queue q, int f) override { return in_->wait(q, f); }
  Status host_wait(int f) override { return in_->host_wait(f); }
  Status device_memory_info(uint64_t* a, uint64_t* b) override { return in_->device_memory_info(a, b); }
  Status wait_external(void* s) override { return in_->wait_external(s); }
  Status signal_external(void* s) override { return in_->signal_external(s); }
  size_t workspace_bytes() const override { return in_->workspace_bytes(); }
  Status set_workspace(const TensorView& ws) override { return in_->set_workspace(ws); }
  Status set_numerics(const Numerics& n, const Diagnostics& d) override { return in_->set_numerics(n, d); }
  Numerics numerics() const override { return in_->numerics(); }
  Diagnostics diagnostics() const override { return in_->diagnostics(); }
  Status set_model_head_dim(int64_t head_dim) override { return in_->set_model_head_dim(head_dim); }
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
  Status int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                        bool reset) override {
    return in_->int8_key_stats(k, v, stats, k0, reset);
  }
  Status int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats, const Int8Keys& keys) override {
    return in_->int8_prepare(k, v, stats, keys);
  }
  Status attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& o,
                        const AttentionParams& p) override {
    return in_->attention_int8(q, keys, o, p);
  }
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

 protected:
  std::unique_ptr<Backend> in_;
};

}  // namespace ls::test
