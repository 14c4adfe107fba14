// CUDA latent packing (backend/backend.h, "latent packing"): the target latents to the
// patch-embedding rows and the head rows back to the caller's latents, on the engine's
// stream. One thread per element of the rows; each element is one load, the rounding
// points of the CPU reference (src/backend/cpu/pack.cpp) with explicitly rounded fp32
// ops (__fmul_rn / __fadd_rn: never contracted into an FMA), and one store, so the bytes
// are the CPU's (tests/cuda/test_pack_ops.cpp, memcmp). Sources may have any strides
// (a strided torch tensor is read in place); outputs are contiguous. Next to a block's
// GEMMs this is noise (a few MB per call), so there is no vectorisation.
#include <string>

#include "backend/cpu/pack.h"  // the argument checks, shared with the CPU reference
#include "backend/cuda/pack.cuh"

namespace ls::cuda {
namespace {

constexpr int kThreads = 256;

// A 3- or 4-D source latent: data, dtype, strides (elements).
struct Src {
  const void* data;
  bool f32;
  int64_t s0, s1, s2, s3;
};
Src src_of(const TensorView& v) {
  return Src{v.data, v.dtype == DType::f32, v.stride[0], v.stride[1], v.ndim > 2 ? v.stride[2] : 0,
             v.ndim > 3 ? v.stride[3] : 0};
}
__device__ __forceinline__ float load(const Src& s, int64_t off) {
  return s.f32 ? static_cast<const float*>(s.data)[off] : bf16_bits_to_f32(static_cast<const uint16_t*>(s.data)[off]);
}
__device__ __forceinline__ void store(void* out, bool f32, int64_t i, float v) {
  if (f32) static_cast<float*>(out)[i] = v;
  else static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);  // v is a bf16 value: exact
}

// out[r, 4c + 2p + q] = bf16(lat[c, t, 2i + p, 2j + q]), patch row r0 + r = (t * hp + i) * wp + j.
__global__ void pack_video_kernel(Src lat, int64_t C, int64_t hp, int64_t wp, int64_t r0, int64_t n, float* out,
                                  int64_t out_rs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t w = 4 * C;
  if (idx >= n * w) return;
  const int64_t r = idx / w, k = idx % w;
  const int64_t c = k / 4, p = (k / 2) % 2, q = k % 2;
  const int64_t pr = r0 + r, t = pr / (hp * wp), i = (pr / wp) % hp, j = pr % wp;
  const float x = load(lat, c * lat.s0 + t * lat.s1 + (2 * i + p) * lat.s2 + (2 * j + q) * lat.s3);
  out[r * out_rs + k] = round_bf16(x);
}

// out[r, c] = bf16(bf16(lat[c, ch, j]) * carry), r0 + r = ch * A + j.
__global__ void pack_audio_kernel(Src lat, int64_t C, int64_t A, float carry, int64_t r0, int64_t n, float* out,
                                  int64_t out_rs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * C) return;
  const int64_t r = idx / C, c = idx % C;
  const int64_t ch = (r0 + r) / A, j = (r0 + r) % A;
  const float x = round_bf16(load(lat, c * lat.s0 + ch * lat.s1 + j * lat.s2));
  out[r * out_rs + c] = round_bf16(__fmul_rn(x, carry));
}

// v = -bf16(rows[r, k]); mask: v = bf16(v * mask[r]); out[c, t, 2i + p, 2j + q] = v.
__global__ void unpack_video_kernel(const float* rows, int64_t rows_rs, const float* mask, int64_t C, int64_t T,
                                    int64_t Hl, int64_t Wl, int64_t r0, int64_t n, void* out, bool out_f32) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t w = 4 * C;
  if (idx >= n * w) return;
  const int64_t hp = Hl / 2, wp = Wl / 2;
  const int64_t r = idx / w, k = idx % w;
  const int64_t c = k / 4, p = (k / 2) % 2, q = k % 2;
  const int64_t pr = r0 + r, t = pr / (hp * wp), i = (pr / wp) % hp, j = pr % wp;
  float v = -round_bf16(rows[r * rows_rs + k]);  // cast, then negate (exact)
  if (mask) v = round_bf16(__fmul_rn(v, mask[r]));
  store(out, out_f32, ((c * T + t) * Hl + 2 * i + p) * Wl + 2 * j + q, v);
}

// v = -bf16(rows[r, c]); mask; carry: v = bf16(bf16((1 - s) * a_in) + bf16(coef * v)),
// a_in = bf16(bf16(src[c, ch, j]) * carry); out[c, ch, j] = v.
__global__ void unpack_audio_kernel(const float* rows, int64_t rows_rs, const float* mask, int64_t C, int64_t A,
                                    bool apply, Src src, float carry, float one_minus_s, float coef, int64_t r0,
                                    int64_t n, void* out, bool out_f32) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * C) return;
  const int64_t r = idx / C, c = idx % C;
  const int64_t ch = (r0 + r) / A, j = (r0 + r) % A;
  float v = -round_bf16(rows[r * rows_rs + c]);
  if (mask) v = round_bf16(__fmul_rn(v, mask[r]));
  if (apply) {
    const float a_in = round_bf16(__fmul_rn(round_bf16(load(src, c * src.s0 + ch * src.s1 + j * src.s2)), carry));
    const float t1 = round_bf16(__fmul_rn(one_minus_s, a_in));
    const float t2 = round_bf16(__fmul_rn(coef, v));
    v = round_bf16(__fadd_rn(t1, t2));
  }
  store(out, out_f32, (c * 2 + ch) * A + j, v);
}

Status require_device(const CudaContext& ctx, const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    if (v && !v->empty() && (v->device.kind != DeviceKind::cuda || v->device.index != ctx.device))
      return make_error(ErrorCode::unsupported, std::string("cuda ") + op + ": a view lives on " + v->device.str() +
                                                    ", not on cuda:" + std::to_string(ctx.device));
  return Status();
}
unsigned blocks_for(int64_t n) { return static_cast<unsigned>(div_up(n, kThreads)); }

}  // namespace

Status cuda_op_pack_video_rows(CudaContext& ctx, const TensorView& lat, int64_t r0, const TensorView& out) {
  LS_TRY(require_device(ctx, "pack_video_rows", {&lat, &out}));
  LS_TRY(cpu::check_pack_video_args(lat, r0, out));
  const int64_t C = lat.size(0), hp = lat.size(2) / 2, wp = lat.size(3) / 2;
  const int64_t total = out.rows() * 4 * C;
  if (total == 0) return Status();
  pack_video_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(src_of(lat), C, hp, wp, r0, out.rows(),
                                                                    out.ptr<float>(), out.row_stride());
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_pack_audio_rows(CudaContext& ctx, const TensorView& lat, float carry, int64_t r0, const TensorView& out) {
  LS_TRY(require_device(ctx, "pack_audio_rows", {&lat, &out}));
  LS_TRY(cpu::check_pack_audio_args(lat, r0, out));
  const int64_t C = lat.size(0), A = lat.size(2);
  const int64_t total = out.rows() * C;
  if (total == 0) return Status();
  pack_audio_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(src_of(lat), C, A, carry, r0, out.rows(),
                                                                    out.ptr<float>(), out.row_stride());
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_unpack_video_rows(CudaContext& ctx, const TensorView& rows, const TensorView& mask, int64_t r0,
                                 const TensorView& out) {
  LS_TRY(require_device(ctx, "unpack_video_rows", {&rows, &mask, &out}));
  LS_TRY(cpu::check_unpack_video_args(rows, mask, r0, out));
  const int64_t C = out.size(0), T = out.size(1), Hl = out.size(2), Wl = out.size(3);
  const int64_t total = rows.rows() * 4 * C;
  if (total == 0) return Status();
  unpack_video_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(
      rows.ptr<float>(), rows.row_stride(), mask.empty() ? nullptr : mask.ptr<float>(), C, T, Hl, Wl, r0, rows.rows(),
      out.data, out.dtype == DType::f32);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_unpack_audio_rows(CudaContext& ctx, const TensorView& rows, const TensorView& mask,
                                 const Backend::AudioCarryOut& ca, int64_t r0, const TensorView& out) {
  LS_TRY(require_device(ctx, "unpack_audio_rows", {&rows, &mask, &out, ca.apply ? &ca.src : nullptr}));
  LS_TRY(cpu::check_unpack_audio_args(rows, mask, ca, r0, out));
  const int64_t C = out.size(0), A = out.size(2);
  const Src src = ca.apply ? src_of(ca.src) : Src{nullptr, true, 0, 0, 0, 0};
  const int64_t total = rows.rows() * C;
  if (total == 0) return Status();
  unpack_audio_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(
      rows.ptr<float>(), rows.row_stride(), mask.empty() ? nullptr : mask.ptr<float>(), C, A, ca.apply, src, ca.carry,
      ca.one_minus_s, ca.coef, r0, rows.rows(), out.data, out.dtype == DType::f32);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
