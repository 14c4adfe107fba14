// CUDA latent packing (backend/backend.h, "latent packing"): the target latents to the
// patch-embedding rows and the head rows back to the caller's latents, on the engine's
// stream. One thread per element of the rows; each element is one load, the rounding
// points of the CPU reference (src/backend/cpu/pack.cpp) with explicitly rounded fp32
// ops (__fmul_rn / __fadd_rn: never contracted into an FMA), and one store, so the bytes
// are the CPU's (tests/cuda/test_pack_ops.cpp, memcmp). Sources may have any strides
// (a strided torch tensor is read in place); outputs are contiguous. Next to a block's
// GEMMs this is noise (a few MB per call), so there is no vectorisation.
#include <string>

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

bool f32_or_bf16(const TensorView& v) { return v.dtype == DType::f32 || v.dtype == DType::bf16; }

Status require_device(const CudaContext& ctx, const char* op, std::initializer_list<const TensorView*> views) {
  for (const TensorView* v : views)
    if (v && !v->empty() && (v->device.kind != DeviceKind::cuda || v->device.index != ctx.device))
      return make_error(ErrorCode::unsupported, std::string("cuda ") + op + ": a view lives on " + v->device.str() +
                                                    ", not on cuda:" + std::to_string(ctx.device));
  return Status();
}
Status check_rows(const char* op, const TensorView& rows, int64_t width, int64_t r0, int64_t total) {
  if (rows.dtype != DType::f32) return unsupported(op, "rows " + rows.shape_str() + " (f32 rows only)");
  LS_CHECK_MSG(rows.ndim == 2 && rows.size(1) == width && rows.inner_contiguous(),
               std::string(op) + ": rows " + rows.shape_str() + ", width " + std::to_string(width));
  LS_CHECK_MSG(r0 >= 0 && r0 + rows.rows() <= total, std::string(op) + ": rows [" + std::to_string(r0) + ", " +
                                                         std::to_string(r0 + rows.rows()) + ") of " + std::to_string(total));
  return Status();
}
Status check_mask(const char* op, const TensorView& mask, int64_t n) {
  if (mask.empty()) return Status();
  if (mask.dtype != DType::f32) return unsupported(op, "mask " + mask.shape_str() + " (f32 only)");
  LS_CHECK_MSG(mask.ndim == 1 && mask.size(0) == n && mask.is_contiguous(), std::string(op) + ": mask " + mask.shape_str());
  return Status();
}
unsigned blocks_for(int64_t n) { return static_cast<unsigned>(div_up(n, kThreads)); }

}  // namespace

Status cuda_op_pack_video_rows(CudaContext& ctx, const TensorView& lat, int64_t r0, const TensorView& out) {
  LS_TRY(require_device(ctx, "pack_video_rows", {&lat, &out}));
  if (!f32_or_bf16(lat)) return unsupported("pack_video_rows", "latent " + lat.shape_str() + " (f32|bf16 only)");
  LS_CHECK_MSG(lat.ndim == 4 && lat.size(2) % 2 == 0 && lat.size(3) % 2 == 0, "pack_video_rows: latent " + lat.shape_str());
  const int64_t C = lat.size(0), T = lat.size(1), hp = lat.size(2) / 2, wp = lat.size(3) / 2;
  LS_TRY(check_rows("pack_video_rows", out, 4 * C, r0, T * hp * wp));
  const int64_t total = out.rows() * 4 * C;
  if (total == 0) return Status();
  pack_video_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(src_of(lat), C, hp, wp, r0, out.rows(),
                                                                    out.ptr<float>(), out.row_stride());
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

Status cuda_op_pack_audio_rows(CudaContext& ctx, const TensorView& lat, float carry, int64_t r0, const TensorView& out) {
  LS_TRY(require_device(ctx, "pack_audio_rows", {&lat, &out}));
  if (!f32_or_bf16(lat)) return unsupported("pack_audio_rows", "latent " + lat.shape_str() + " (f32|bf16 only)");
  LS_CHECK_MSG(lat.ndim == 3 && lat.size(1) == 2, "pack_audio_rows: latent " + lat.shape_str());
  const int64_t C = lat.size(0), A = lat.size(2);
  LS_TRY(check_rows("pack_audio_rows", out, C, r0, 2 * A));
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
  if (!f32_or_bf16(out)) return unsupported("unpack_video_rows", "output " + out.shape_str() + " (f32|bf16 only)");
  LS_CHECK_MSG(out.ndim == 4 && out.is_contiguous() && out.size(2) % 2 == 0 && out.size(3) % 2 == 0,
               "unpack_video_rows: output " + out.shape_str());
  const int64_t C = out.size(0), T = out.size(1), Hl = out.size(2), Wl = out.size(3);
  LS_TRY(check_rows("unpack_video_rows", rows, 4 * C, r0, T * (Hl / 2) * (Wl / 2)));
  LS_TRY(check_mask("unpack_video_rows", mask, rows.rows()));
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
  if (!f32_or_bf16(out)) return unsupported("unpack_audio_rows", "output " + out.shape_str() + " (f32|bf16 only)");
  LS_CHECK_MSG(out.ndim == 3 && out.size(1) == 2 && out.is_contiguous(), "unpack_audio_rows: output " + out.shape_str());
  const int64_t C = out.size(0), A = out.size(2);
  LS_TRY(check_rows("unpack_audio_rows", rows, C, r0, 2 * A));
  LS_TRY(check_mask("unpack_audio_rows", mask, rows.rows()));
  Src src{nullptr, true, 0, 0, 0, 0};
  if (ca.apply) {
    if (!f32_or_bf16(ca.src)) return unsupported("unpack_audio_rows", "carry source " + ca.src.shape_str());
    LS_CHECK_MSG(ca.src.ndim == 3 && ca.src.size(0) == C && ca.src.size(1) == 2 && ca.src.size(2) == A,
                 "unpack_audio_rows: carry source " + ca.src.shape_str());
    src = src_of(ca.src);
  }
  const int64_t total = rows.rows() * C;
  if (total == 0) return Status();
  unpack_audio_kernel<<<blocks_for(total), kThreads, 0, ctx.stream>>>(
      rows.ptr<float>(), rows.row_stride(), mask.empty() ? nullptr : mask.ptr<float>(), C, A, ca.apply, src, ca.carry,
      ca.one_minus_s, ca.coef, r0, rows.rows(), out.data, out.dtype == DType::f32);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
