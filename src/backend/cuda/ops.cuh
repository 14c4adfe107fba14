// The CUDA op entries, one per backend op (each defined in its family's .cu file:
// rms_norm.cu, modulate.cu, elementwise.cu, qk_norm_rope.cu, time_embedding.cu,
// convert.cu, gemm.cu, attention.cu, nonfinite.cu). Arguments are validated by the entry; shape
// mismatches are bugs (LS_CHECK), unsupported dtypes return a Status.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace ls::cuda {

Status cuda_op_gemm(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView* bias,
                    const TensorView& out);
Status cuda_op_rms_norm(CudaContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& out);
// rms_norm.cu: rms_norm then modulate in one pass, for what _applies accepts (bf16 x, w,
// out; i32 rows; bf16|f32 tables of one dtype; contiguous rows); the backend runs the
// two-op composition (Backend::rms_norm_modulate) for anything else.
bool cuda_rms_norm_modulate_applies(const TensorView& x, const TensorView& w, const TensorView& shift,
                                    const TensorView& scale, const TensorView& rows, const TensorView& out);
Status cuda_op_rms_norm_modulate(CudaContext& ctx, const TensorView& x, const TensorView& w, float eps,
                                 const TensorView& shift, const TensorView& scale, const TensorView& rows,
                                 const TensorView& out);
Status cuda_op_modulate(CudaContext& ctx, const TensorView& in, const TensorView& shift, const TensorView& scale,
                        const TensorView& rows, const TensorView& out);
Status cuda_op_gated_add(CudaContext& ctx, const TensorView& x, const TensorView& y, const TensorView& gate,
                         const TensorView& rows);
Status cuda_op_add(CudaContext& ctx, const TensorView& x, const TensorView& y);
Status cuda_op_qk_norm_rope(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView& rope,
                            float eps);
Status cuda_op_swiglu(CudaContext& ctx, const TensorView& u, const TensorView& out);
Status cuda_op_silu(CudaContext& ctx, const TensorView& x);
Status cuda_op_time_embedding(CudaContext& ctx, const TensorView& t, const TensorView& out);
Status cuda_op_convert(CudaContext& ctx, const TensorView& src, const TensorView& dst);
Status cuda_op_attention(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const AttentionParams& p);
// attention_int8.cu: the portable INT8 attention kernels (docs/int8-attention.md, contract
// v3: statistics per absolute block of kInt8StatBlock keys; sm_80+, head dim 128, kv_tile 128).
// k0: the absolute index of k's first key (Backend::int8_key_stats).
Status cuda_op_int8_key_stats(CudaContext& ctx, const TensorView& k, const TensorView& v, const TensorView& stats,
                              int64_t k0, bool reset);
Status cuda_op_int8_prepare(CudaContext& ctx, const TensorView& k, const TensorView& v, const TensorView& stats,
                            const Int8Keys& keys);
// p8_table: p8 by the table path (the fast ex2 byte corrected against the thresholds) instead
// of the fast byte alone (int8_p8_check.cuh; the backend passes the once-per-device check's choice).
Status cuda_op_attention_int8(CudaContext& ctx, const TensorView& q, const Int8Keys& keys, const TensorView& out,
                              const AttentionParams& p, bool p8_table);
// linear_quant.cu: Backend::linear for every WeightFormat (bf16 goes to cuda_op_gemm). Its
// scratch is the workspace region after the GEMM's (linear_quant_workspace_bytes,
// linear_quant_bench.cuh); cuda_linear_fp8_path says which fp8 path this device runs
// (tensor cores on SM >= 8.9, else dequantise to bf16), for reports.
Status cuda_op_linear(CudaContext& ctx, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                      const TensorView& out, const LinearOptions& opts);
std::string cuda_linear_fp8_path(const CudaContext& ctx);
// lora_side.cu: Backend::lora_side (no workspace: a row block's t lives in shared memory).
Status cuda_op_lora_side(CudaContext& ctx, const TensorView& x, const LoraSide& side, const TensorView& out,
                         const LinearOptions& opts);
// nonfinite.cu: uses ctx.nonfinite_counter; synchronises the compute stream.
Expected<int64_t> cuda_op_count_nonfinite(CudaContext& ctx, const TensorView& t);

// gemm.cu: the algorithm cache's lifetime is the backend's.
GemmAlgoCache* gemm_cache_create();
void gemm_cache_destroy(GemmAlgoCache* c);
// Forgets every pinned algorithm (Backend::set_numerics, when gemm_candidate changes).
void gemm_cache_clear(GemmAlgoCache* c);
size_t gemm_workspace_bytes();
std::string gemm_describe_pinned(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView* bias,
                                 const TensorView& out);

}  // namespace ls::cuda
