// CPU latent packing (backend/backend.h, "latent packing"): the target latents to the
// patch-embedding rows and the head rows back to velocities. Each element is one load,
// at most a few fp32 ops each rounded to bf16 (core/dtype.h), and one store, so the
// result of an element depends on that element alone (any row range, any thread count).
// Single-threaded: at most a few MB per call, next to seconds of block work.
#include "backend/cpu/pack.h"

#include <string>

#include "backend/cpu/cpu_ops.h"
#include "core/dtype.h"

namespace ls::cpu {
namespace {

// Element (i0, i1, i2, i3) of a 3- or 4-D f32|bf16 view with any strides, as f32.
inline float load(const TensorView& v, int64_t off) {
  return v.dtype == DType::f32 ? static_cast<const float*>(v.data)[off]
                               : bf16_to_f32(static_cast<const uint16_t*>(v.data)[off]);
}
inline void store(const TensorView& v, int64_t i, float x) {
  if (v.dtype == DType::f32) static_cast<float*>(v.data)[i] = x;
  else static_cast<uint16_t*>(v.data)[i] = f32_to_bf16(x);  // x is a bf16 value: exact
}
bool f32_or_bf16(const TensorView& v) { return v.dtype == DType::f32 || v.dtype == DType::bf16; }

}  // namespace

// ---- argument checks (pack.h): shared with the CUDA kernels -------------------------
namespace {
Status check_rows(const char* op, const TensorView& rows, int64_t width, int64_t r0, int64_t total) {
  if (rows.dtype != DType::f32) return unsupported_dtypes(op, rows.shape_str(), "f32 rows");
  LS_CHECK_MSG(rows.ndim == 2 && rows.size(1) == width && rows.inner_contiguous(),
               std::string(op) + ": rows " + rows.shape_str() + ", width " + std::to_string(width));
  LS_CHECK_MSG(r0 >= 0 && r0 + rows.rows() <= total, std::string(op) + ": rows [" + std::to_string(r0) + ", " +
                                                         std::to_string(r0 + rows.rows()) + ") of " + std::to_string(total));
  return Status();
}
Status check_mask(const char* op, const TensorView& mask, int64_t n) {
  if (mask.empty()) return Status();
  if (mask.dtype != DType::f32) return unsupported_dtypes(op, mask.shape_str(), "f32 mask");
  LS_CHECK_MSG(mask.ndim == 1 && mask.size(0) == n && mask.is_contiguous(), std::string(op) + ": mask " + mask.shape_str());
  return Status();
}
}  // namespace

Status check_pack_video_args(const TensorView& lat, int64_t r0, const TensorView& out) {
  if (!f32_or_bf16(lat)) return unsupported_dtypes("pack_video_rows", lat.shape_str(), "f32|bf16 latent");
  LS_CHECK_MSG(lat.ndim == 4 && lat.size(2) % 2 == 0 && lat.size(3) % 2 == 0, "pack_video_rows: latent " + lat.shape_str());
  return check_rows("pack_video_rows", out, 4 * lat.size(0), r0, lat.size(1) * (lat.size(2) / 2) * (lat.size(3) / 2));
}

Status check_pack_audio_args(const TensorView& lat, int64_t r0, const TensorView& out) {
  if (!f32_or_bf16(lat)) return unsupported_dtypes("pack_audio_rows", lat.shape_str(), "f32|bf16 latent");
  LS_CHECK_MSG(lat.ndim == 3 && lat.size(1) == 2, "pack_audio_rows: latent " + lat.shape_str());
  return check_rows("pack_audio_rows", out, lat.size(0), r0, 2 * lat.size(2));
}

Status check_unpack_video_args(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) {
  if (!f32_or_bf16(out)) return unsupported_dtypes("unpack_video_rows", out.shape_str(), "f32|bf16 output");
  LS_CHECK_MSG(out.ndim == 4 && out.is_contiguous() && out.size(2) % 2 == 0 && out.size(3) % 2 == 0,
               "unpack_video_rows: output " + out.shape_str());
  LS_TRY(check_rows("unpack_video_rows", rows, 4 * out.size(0), r0, out.size(1) * (out.size(2) / 2) * (out.size(3) / 2)));
  return check_mask("unpack_video_rows", mask, rows.rows());
}

Status check_unpack_audio_args(const TensorView& rows, const TensorView& mask, const Backend::AudioCarryOut& ca,
                               int64_t r0, const TensorView& out) {
  if (!f32_or_bf16(out)) return unsupported_dtypes("unpack_audio_rows", out.shape_str(), "f32|bf16 output");
  LS_CHECK_MSG(out.ndim == 3 && out.size(1) == 2 && out.is_contiguous(), "unpack_audio_rows: output " + out.shape_str());
  const int64_t C = out.size(0), A = out.size(2);
  LS_TRY(check_rows("unpack_audio_rows", rows, C, r0, 2 * A));
  LS_TRY(check_mask("unpack_audio_rows", mask, rows.rows()));
  if (ca.apply) {
    if (!f32_or_bf16(ca.src)) return unsupported_dtypes("unpack_audio_rows", ca.src.shape_str(), "f32|bf16 carry source");
    LS_CHECK_MSG(ca.src.ndim == 3 && ca.src.size(0) == C && ca.src.size(1) == 2 && ca.src.size(2) == A,
                 "unpack_audio_rows: carry source " + ca.src.shape_str());
  }
  return Status();
}

Status cpu_op_pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out) {
  LS_TRY(require_host("pack_video_rows", {&lat, &out}));
  LS_TRY(check_pack_video_args(lat, r0, out));
  const int64_t C = lat.size(0), hp = lat.size(2) / 2, wp = lat.size(3) / 2;
  float* o = out.ptr<float>();
  for (int64_t r = 0; r < out.rows(); ++r) {
    const int64_t pr = r0 + r, t = pr / (hp * wp), i = (pr / wp) % hp, j = pr % wp;
    float* dst = o + r * out.row_stride();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t q = 0; q < 2; ++q) {
          const int64_t off = c * lat.stride[0] + t * lat.stride[1] + (2 * i + p) * lat.stride[2] + (2 * j + q) * lat.stride[3];
          dst[4 * c + 2 * p + q] = round_bf16(load(lat, off));
        }
  }
  return Status();
}

Status cpu_op_pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out) {
  LS_TRY(require_host("pack_audio_rows", {&lat, &out}));
  LS_TRY(check_pack_audio_args(lat, r0, out));
  const int64_t C = lat.size(0), A = lat.size(2);
  float* o = out.ptr<float>();
  for (int64_t r = 0; r < out.rows(); ++r) {
    const int64_t ch = (r0 + r) / A, j = (r0 + r) % A;
    float* dst = o + r * out.row_stride();
    for (int64_t c = 0; c < C; ++c)
      dst[c] = round_bf16(round_bf16(load(lat, c * lat.stride[0] + ch * lat.stride[1] + j * lat.stride[2])) * carry);
  }
  return Status();
}

Status cpu_op_unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) {
  LS_TRY(require_host("unpack_video_rows", {&rows, &mask, &out}));
  LS_TRY(check_unpack_video_args(rows, mask, r0, out));
  const int64_t C = out.size(0), T = out.size(1), Hl = out.size(2), Wl = out.size(3), hp = Hl / 2, wp = Wl / 2;
  const float* in = rows.ptr<float>();
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t pr = r0 + r, t = pr / (hp * wp), i = (pr / wp) % hp, j = pr % wp;
    const float* src = in + r * rows.row_stride();
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t q = 0; q < 2; ++q) {
          float v = -round_bf16(src[4 * c + 2 * p + q]);  // cast, then negate (exact)
          if (!mask.empty()) v = round_bf16(v * mask.ptr<float>()[r]);
          store(out, ((c * T + t) * Hl + 2 * i + p) * Wl + 2 * j + q, v);
        }
  }
  return Status();
}

Status cpu_op_unpack_audio_rows(const TensorView& rows, const TensorView& mask, const Backend::AudioCarryOut& ca,
                                int64_t r0, const TensorView& out) {
  LS_TRY(require_host("unpack_audio_rows", {&rows, &mask, &out, &ca.src}));
  LS_TRY(check_unpack_audio_args(rows, mask, ca, r0, out));
  const int64_t C = out.size(0), A = out.size(2);
  const float* in = rows.ptr<float>();
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t ch = (r0 + r) / A, j = (r0 + r) % A;
    const float* src = in + r * rows.row_stride();
    for (int64_t c = 0; c < C; ++c) {
      float v = -round_bf16(src[c]);
      if (!mask.empty()) v = round_bf16(v * mask.ptr<float>()[r]);
      if (ca.apply) {
        const float a_in = round_bf16(
            round_bf16(load(ca.src, c * ca.src.stride[0] + ch * ca.src.stride[1] + j * ca.src.stride[2])) * ca.carry);
        const float t1 = round_bf16(ca.one_minus_s * a_in);
        const float t2 = round_bf16(ca.coef * v);
        v = round_bf16(t1 + t2);
      }
      store(out, (c * 2 + ch) * A + j, v);
    }
  }
  return Status();
}

}  // namespace ls::cpu
