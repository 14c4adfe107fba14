// The CPU backend: the reference every other backend is checked against.
//
// Every op is fp32 arithmetic over bf16/f32 storage with the reduction orders and
// rounding points written down in docs/numerics.md (and at the top of each op file),
// batch-invariant by construction, multithreaded over rows with ls::parallel_for
// without any bit depending on the thread count. Memory comes from
// host_memory_resource(); copies are memcpy per contiguous row; there is no queue, so
// synchronize() returns at once. Numerics: the CPU has one algorithm of each kind, so
// set_numerics accepts attention auto|native|int8 (int8: docs/int8-attention.md), fp32
// GEMM lanes16 and any kv_tile (default 1024), and refuses everything else (cuDNN,
// cuBLASLt, the CUDA kernel knobs).
//
// Usage:
//   std::unique_ptr<ls::Backend> cpu = ls::make_cpu_backend();
//   LS_TRY(cpu->gemm(x, w, &bias, out));   // bf16 [M, K] x bf16 [N, K] -> bf16 [M, N]
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace ls::cpu {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device{}; }
  std::string name() const override { return "cpu"; }

  MemoryResource& memory() override;
  Status copy(const TensorView& dst, const TensorView& src) override;
  Status synchronize() override { return Status(); }
  // Streaming: host memory is the device memory, every copy is done when the call
  // returns, so fences have nothing to order.
  MemoryResource& pinned_host_memory() override;
  Status copy_async(const TensorView& dst, const TensorView& src, Queue q) override;
  Status signal(Queue q, int fence) override;
  Status wait(Queue q, int fence) override;
  Status host_wait(int fence) override;

  // Numerics: one algorithm of each kind (the reference), kv_tile 1024 by default.
  Status set_numerics(const Numerics& n, const Diagnostics& d) override;
  // attention int8 takes power-of-two head dims 2..512 (the rotation): refused here for
  // another model, naming the device and the algorithms it has.
  Status set_model_head_dim(int64_t head_dim) override;
  Numerics numerics() const override { return numerics_; }
  Diagnostics diagnostics() const override { return diagnostics_; }

  Status gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) override;
  Status rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out) override;
  Status modulate(const TensorView& in, const TensorView& shift, const TensorView& scale, const TensorView& rows,
                  const TensorView& out) override;
  Status gated_add(const TensorView& x, const TensorView& y, const TensorView& gate, const TensorView& rows) override;
  Status add(const TensorView& x, const TensorView& y) override;
  Status qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) override;
  Status swiglu(const TensorView& u, const TensorView& out) override;
  Status silu(const TensorView& x) override;
  Status time_embedding(const TensorView& t, const TensorView& out) override;
  Status convert(const TensorView& src, const TensorView& dst) override;
  Status int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                        bool reset) override;
  Status int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats,
                      const Int8Keys& keys) override;
  Status attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                        const AttentionParams& p) override;
  Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const AttentionParams& p) override;
  Expected<int64_t> count_nonfinite(const TensorView& t) override;
  // bf16 weights: gemm; int8_convrot and fp8_e4m3: src/backend/cpu/linear_quant.cpp (no
  // workspace: the quantised row tiles are fixed-size stack buffers, workspace_bytes() stays 0).
  Status linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                const LinearOptions& opts) override;
  // Latent packing: src/backend/cpu/pack.cpp (also the engine's host path).
  Status pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out) override;
  Status pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out) override;
  Status unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) override;
  Status unpack_audio_rows(const TensorView& rows, const TensorView& mask, const AudioCarryOut& c, int64_t r0,
                           const TensorView& out) override;
  // The LoRA side path of a quantised linear: src/backend/cpu/lora_side.cpp (no workspace).
  Status lora_side(const TensorView& x, const LoraSide& side, const TensorView& out,
                   const LinearOptions& opts) override;

  // Numerics{} resolved (the constructor cannot fail: the defaults are valid).
  static Numerics resolve_default();

 private:
  Numerics numerics_ = resolve_default();
  Diagnostics diagnostics_;
  int64_t head_dim_ = 0;  // set_model_head_dim's (0 = not known)
};

}  // namespace ls::cpu
