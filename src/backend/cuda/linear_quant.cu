// Backend::linear on CUDA (backend.h). Plain weights go to the bf16 GEMM; the quantised
// formats (int8 ConvRot, fp8 e4m3) are not implemented on CUDA yet (issue 14).
#include <string>

#include "backend/cuda/ops.cuh"

namespace ls::cuda {

Status cuda_op_linear(CudaContext& ctx, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                      const TensorView& out, const LinearOptions& opts) {
  if (w.format == WeightFormat::bf16 && !opts.swiglu_input) return cuda_op_gemm(ctx, x, w.w, bias, out);
  return make_error(ErrorCode::unsupported, std::string("linear: the CUDA backend cannot run ") +
                                                weight_format_name(w.format) + " weights yet" +
                                                (opts.swiglu_input ? " (fused swiglu input)" : ""));
}

}  // namespace ls::cuda
