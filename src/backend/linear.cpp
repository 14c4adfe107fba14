// LinearWeight helpers, the base Backend::linear (backend.h): plain weights go to gemm;
// quantised formats are refused unless a backend overrides linear() (the CPU and CUDA
// backends do). Also the argument checks every backend's quantised linear shares
// (backend/cpu/linear_quant.h), so the refusals and their messages agree.
#include <cmath>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/linear_quant.h"
#include "core/hadamard.h"

namespace ls {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::int8_convrot: return "int8_convrot";
    case WeightFormat::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

LinearWeight LinearWeight::rows(int64_t a, int64_t b) const {
  LinearWeight r = *this;
  r.w = w.slice_rows(a, b);
  if (format == WeightFormat::int8_convrot && !scale.empty() && scale.numel() > 1) r.scale = scale.slice_rows(a, b);
  if (!lora.empty()) r.lora.up = lora.up.slice_rows(a, b);
  return r;
}

Status Backend::lora_side(const TensorView& x, const LoraSide& side, const TensorView& out, const LinearOptions& opts) {
  (void)x, (void)side, (void)out, (void)opts;
  return make_error(ErrorCode::unsupported, "lora_side: the " + name() + " backend has no LoRA side path");
}

Status linear_lora(Backend& be, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                   const TensorView& out, const LinearOptions& opts) {
  LS_TRY(be.linear(x, w, bias, out, opts));
  if (w.lora.empty()) return Status();
  return be.lora_side(x, w.lora, out, opts);
}

Status check_lora_side_args(const char* who, const TensorView& x, const LoraSide& side, const TensorView& out,
                            const LinearOptions& opts) {
  const std::string op = std::string(who) + " lora_side: ";
  if (x.dtype != DType::bf16 || out.dtype != DType::bf16 || side.down.dtype != DType::f32 ||
      side.up.dtype != DType::f32)
    return make_error(ErrorCode::unsupported, op + "unsupported dtypes x=" + dtype_name(x.dtype) + " down=" +
                                                  dtype_name(side.down.dtype) + " up=" + dtype_name(side.up.dtype) +
                                                  " out=" + dtype_name(out.dtype) +
                                                  " (supported: x bf16, down f32, up f32, out bf16)");
  LS_CHECK_MSG(x.ndim == 2 && out.ndim == 2 && side.down.ndim == 2 && side.up.ndim == 2,
               op + "wants x [M, K], down [K, R], up [N, R], out [M, N]; got x " + x.shape_str() + ", down " +
                   side.down.shape_str() + ", up " + side.up.shape_str() + ", out " + out.shape_str());
  const int64_t K = side.down.size(0), R = side.down.size(1), N = side.up.size(0);
  LS_CHECK_MSG(x.size(1) == (opts.swiglu_input ? 2 * K : K) && out.size(0) == x.size(0) && out.size(1) == N &&
                   side.up.size(1) == R,
               op + "shape mismatch: x " + x.shape_str() + (opts.swiglu_input ? " (swiglu input [M, 2K])" : "") +
                   ", down " + side.down.shape_str() + ", up " + side.up.shape_str() + ", out " + out.shape_str());
  LS_CHECK_MSG(x.inner_contiguous() && out.inner_contiguous() && side.down.is_contiguous() &&
                   side.up.inner_contiguous(),
               op + "rows must be contiguous (down wholly)");
  if (R < 1 || R > kLoraSideMaxRank)
    return make_error(ErrorCode::invalid_argument, op + "the side path's rank " + std::to_string(R) +
                                                       " (the LoRAs' ranks on this layer summed) must be 1.." +
                                                       std::to_string(kLoraSideMaxRank));
  return Status();
}

Status Backend::linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                       const LinearOptions& opts) {
  if (w.format == WeightFormat::bf16 && !opts.swiglu_input) return gemm(x, w.w, bias, out);
  return make_error(ErrorCode::unsupported, std::string("linear: the ") + name() + " backend cannot run " +
                                                weight_format_name(w.format) + " weights" +
                                                (opts.swiglu_input ? " with a fused swiglu input" : ""));
}

Status check_linear_quant_args(const char* who, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                               const TensorView& out, const LinearOptions& opts, int64_t* K_out) {
  const std::string op = std::string(who) + " linear: ";
  const bool i8 = w.format == WeightFormat::int8_convrot, f8 = w.format == WeightFormat::fp8_e4m3;
  if (!i8 && !f8)
    return make_error(ErrorCode::unsupported, op + "unknown weight format " + std::to_string(static_cast<int>(w.format)) +
                                                  " (supported: bf16, int8_convrot, fp8_e4m3)");
  const char* fmt = weight_format_name(w.format);
  if (f8 && opts.swiglu_input)
    return make_error(ErrorCode::unsupported,
                      op + "a fused swiglu input is implemented for int8_convrot only; for fp8_e4m3 run swiglu "
                           "first and pass its bf16 output");
  // dtypes (unsupported: a combination this op does not implement)
  const DType want_w = i8 ? DType::i8 : DType::f8e4m3;
  const bool dtypes_ok = x.dtype == DType::bf16 && w.w.dtype == want_w && out.dtype == DType::bf16 &&
                         (!bias || bias->dtype == DType::f32 || bias->dtype == DType::bf16) &&
                         !w.scale.empty() && w.scale.dtype == DType::f32;
  if (!dtypes_ok)
    return make_error(ErrorCode::unsupported,
                      op + "unsupported dtypes for " + fmt + ": x=" + dtype_name(x.dtype) + " w=" +
                          dtype_name(w.w.dtype) + " scale=" + (w.scale.empty() ? "none" : dtype_name(w.scale.dtype)) +
                          " bias=" + (bias ? dtype_name(bias->dtype) : "none") + " out=" + dtype_name(out.dtype) +
                          " (supported: x bf16, w " + dtype_name(want_w) +
                          ", scale f32, bias none|f32|bf16, out bf16)");
  // shapes that must fit each other (a caller's bug)
  LS_CHECK_MSG(x.ndim == 2 && w.w.ndim == 2 && out.ndim == 2,
               op + "wants x [M, K], w [N, K], out [M, N]; got x " + x.shape_str() + ", w " + w.w.shape_str() +
                   ", out " + out.shape_str());
  const int64_t M = x.size(0), N = w.w.size(0), K = w.w.size(1);
  const int64_t xk = opts.swiglu_input ? 2 * K : K;
  LS_CHECK_MSG(x.size(1) == xk && out.size(0) == M && out.size(1) == N,
               op + "shape mismatch: x " + x.shape_str() + (opts.swiglu_input ? " (swiglu input [M, 2K])" : "") +
                   ", w " + w.w.shape_str() + ", out " + out.shape_str());
  LS_CHECK_MSG(x.inner_contiguous() && w.w.inner_contiguous() && out.inner_contiguous(),
               op + "rows must be contiguous");
  if (bias) LS_CHECK_MSG(bias->ndim == 1 && bias->size(0) == N, op + "bias must be [N]; got " + bias->shape_str());
  // what a weight file or an option can get wrong (invalid_argument / unsupported)
  if (K > kLinearQuantMaxK)
    return make_error(ErrorCode::unsupported, op + fmt + " with K = " + std::to_string(K) + " input features (at most " +
                                                  std::to_string(kLinearQuantMaxK) + ")");
  if (!w.scale.is_contiguous())
    return make_error(ErrorCode::invalid_argument, op + "the weight scale must be contiguous; got " + w.scale.shape_str());
  const int64_t ns = w.scale.numel();
  if (i8) {
    if (!hadamard_group_ok(w.group) || K % w.group != 0)
      return make_error(ErrorCode::invalid_argument,
                        op + "int8_convrot group " + std::to_string(w.group) +
                            " must be a power of 4 in [4, 4096] dividing K = " + std::to_string(K));
    if (ns != 1 && ns != N)
      return make_error(ErrorCode::invalid_argument, op + "int8_convrot weight scale " + w.scale.shape_str() +
                                                         " must have 1 or N = " + std::to_string(N) + " elements");
  } else {
    if (ns != 1)
      return make_error(ErrorCode::invalid_argument,
                        op + "fp8_e4m3 weight scale " + w.scale.shape_str() + " must be one value (per tensor)");
    if (!w.dynamic_act && !(std::isfinite(w.input_scale) && w.input_scale > 0.0f))
      return make_error(ErrorCode::invalid_argument,
                        op + "fp8_e4m3 input_scale " + std::to_string(w.input_scale) + " must be finite and > 0");
  }
  *K_out = K;
  return Status();
}

}  // namespace ls
