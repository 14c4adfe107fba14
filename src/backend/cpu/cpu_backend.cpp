// CpuBackend: forwards each Backend method to its cpu_op_* entry (one file per op
// family) and implements memory and copies for host memory.
#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/pack.h"
#include "backend/cpu/linear_quant.h"
#include "backend/description.h"

namespace ls {
namespace cpu {

// Copy between host views of equal shape and dtype whose innermost dimension is
// contiguous: one memcpy when both are contiguous, else one memcpy per innermost row.
Status cpu_op_copy(const TensorView& dst, const TensorView& src) {
  LS_TRY(require_host("copy", {&dst, &src}));
  LS_CHECK_MSG(dst.dtype == src.dtype && dst.ndim == src.ndim,
               "copy between different views: " + dst.shape_str() + " <- " + src.shape_str());
  for (int i = 0; i < src.ndim; ++i)
    LS_CHECK_MSG(dst.size(i) == src.size(i), "copy shape mismatch: " + dst.shape_str() + " <- " + src.shape_str());
  LS_CHECK_MSG(dst.inner_contiguous() && src.inner_contiguous(), "copy needs contiguous rows");
  const int64_t n = src.numel();
  if (n == 0) return Status();
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data, src.data, static_cast<size_t>(n * src.elem_size()));
    return Status();
  }
  const int nd = src.ndim;
  const int64_t inner = src.size(nd - 1);
  const int64_t outer = n / inner;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t soff = 0, doff = 0;
    row_offsets(src, dst, o, soff, doff);
    std::memcpy(static_cast<char*>(dst.data) + doff * dst.elem_size(),
                static_cast<const char*>(src.data) + soff * src.elem_size(),
                static_cast<size_t>(inner * src.elem_size()));
  }
  return Status();
}

// ---- numerics ----------------------------------------------------------------------
Numerics CpuBackend::resolve_default() {
  Numerics n;
  n.attention = cpu_description().default_attention();
  n.kv_tile = cpu_description().default_kv_tile(n.attention);
  return n;
}

// attention int8's head dims on the CPU: powers of two 2..512 (0 = not known yet).
static Status int8_head_dim_ok(int64_t hd) {
  if (hd == 0 || (hd >= 2 && hd <= 512 && (hd & (hd - 1)) == 0)) return Status();
  return make_error(ErrorCode::unsupported,
                    "the cpu backend cannot run attention int8 for a model of head dim " + std::to_string(hd) +
                        ": its int8 reference takes power-of-two head dims 2..512 (the Hadamard rotation); its "
                        "attention algorithms for this model are native (and auto)");
}

Status CpuBackend::set_model_head_dim(int64_t head_dim) {
  if (head_dim < 0) return make_error(ErrorCode::invalid_argument, "set_model_head_dim: negative head dim");
  if (numerics_.attention == AttentionAlgorithm::int8) LS_TRY(int8_head_dim_ok(head_dim));
  head_dim_ = head_dim;
  return Status();
}

Status CpuBackend::set_numerics(const Numerics& n, const Diagnostics& d) {
  LS_TRY(validate(n));
  const auto refuse = [](const std::string& what) {
    return Status(make_error(ErrorCode::unsupported, "the cpu backend " + what));
  };
  // Attention algorithms this backend cannot run: its description's refusal (one source
  // for the backend, the planner and the dry run).
  if (n.attention != AttentionAlgorithm::backend_default)
    if (Status s = cpu_description().can_implement_attention(n.attention); !s.ok()) return s;
  if (n.gemm_f32 == GemmF32Order::cublaslt)
    return refuse("has no cuBLASLt: its fp32 GEMMs are the lanes16 reference order; use gemm_f32 lanes16");
  const Numerics defaults;
  if (!n.native_variant.empty())
    return refuse("has no native CUDA kernel variants (native_variant '" + n.native_variant + "'); leave it empty");
  if (n.cudnn_q_chunk != defaults.cudnn_q_chunk || !n.cudnn_form.empty() || n.cudnn_skip_configs != 0)
    return refuse("has no cuDNN path: cudnn_q_chunk, cudnn_form and cudnn_skip_configs must stay at their "
                  "defaults (" + describe(n) + ")");
  if (!n.gemm_candidate.empty())
    return refuse("has no cuBLASLt candidates (gemm_candidate " + format_gemm_candidate(n.gemm_candidate) +
                  "); leave it empty");
  if (n.attention == AttentionAlgorithm::int8) LS_TRY(int8_head_dim_ok(head_dim_));
  Numerics r = n;
  if (r.attention == AttentionAlgorithm::backend_default) r.attention = cpu_description().default_attention();
  r.native_variant.clear();
  if (r.kv_tile == 0) r.kv_tile = cpu_description().default_kv_tile(r.attention);
  numerics_ = r;
  diagnostics_ = d;  // nothing to log on the CPU; kept so diagnostics() reports what was asked
  return Status();
}

MemoryResource& CpuBackend::memory() { return host_memory_resource(); }
Status CpuBackend::copy(const TensorView& dst, const TensorView& src) { return cpu_op_copy(dst, src); }
MemoryResource& CpuBackend::pinned_host_memory() { return host_memory_resource(); }
Status CpuBackend::copy_async(const TensorView& dst, const TensorView& src, Queue) { return cpu_op_copy(dst, src); }
static Status check_fence(int fence) {
  LS_CHECK_MSG(fence >= 0 && fence < Backend::kFences, "fence " + std::to_string(fence) + " out of range");
  return Status();
}
Status CpuBackend::signal(Queue, int fence) { return check_fence(fence); }
Status CpuBackend::wait(Queue, int fence) { return check_fence(fence); }
Status CpuBackend::host_wait(int fence) { return check_fence(fence); }
Status CpuBackend::gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) {
  return cpu_op_gemm(x, w, bias, out);
}
Status CpuBackend::rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out) {
  return cpu_op_rms_norm(x, w, eps, out);
}
Status CpuBackend::modulate(const TensorView& in, const TensorView& shift, const TensorView& scale,
                            const TensorView& rows, const TensorView& out) {
  return cpu_op_modulate(in, shift, scale, rows, out);
}
Status CpuBackend::gated_add(const TensorView& x, const TensorView& y, const TensorView& gate,
                             const TensorView& rows) {
  return cpu_op_gated_add(x, y, gate, rows);
}
Status CpuBackend::add(const TensorView& x, const TensorView& y) { return cpu_op_add(x, y); }
Status CpuBackend::qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) {
  return cpu_op_qk_norm_rope(x, w, rope, eps);
}
Status CpuBackend::swiglu(const TensorView& u, const TensorView& out) { return cpu_op_swiglu(u, out); }
Status CpuBackend::silu(const TensorView& x) { return cpu_op_silu(x); }
Status CpuBackend::time_embedding(const TensorView& t, const TensorView& out) {
  return cpu_op_time_embedding(t, out);
}
Status CpuBackend::convert(const TensorView& src, const TensorView& dst) { return cpu_op_convert(src, dst); }
Status CpuBackend::attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const AttentionParams& p) {
  return cpu_op_attention(q, k, v, out, p);
}
Status CpuBackend::int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                                  bool reset) {
  return cpu_op_int8_key_stats(k, v, stats, k0, reset);
}
Status CpuBackend::int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats,
                                const Int8Keys& keys) {
  return cpu_op_int8_prepare(k, v, stats, keys);
}
Status CpuBackend::attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                                  const AttentionParams& p) {
  return cpu_op_attention_int8(q, keys, out, p);
}
Expected<int64_t> CpuBackend::count_nonfinite(const TensorView& t) { return cpu_op_count_nonfinite(t); }
Status CpuBackend::pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out) {
  return cpu_op_pack_video_rows(lat, r0, out);
}
Status CpuBackend::pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out) {
  return cpu_op_pack_audio_rows(lat, carry, r0, out);
}
Status CpuBackend::unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) {
  return cpu_op_unpack_video_rows(rows, mask, r0, out);
}
Status CpuBackend::unpack_audio_rows(const TensorView& rows, const TensorView& mask, const AudioCarryOut& c, int64_t r0,
                                     const TensorView& out) {
  return cpu_op_unpack_audio_rows(rows, mask, c, r0, out);
}
Status CpuBackend::linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                          const LinearOptions& opts) {
  return cpu_op_linear(x, w, bias, out, opts);
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

}  // namespace ls
