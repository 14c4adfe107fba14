// Elementwise dtype conversion with core/dtype.h's rounding rules: values are widened
// to double (exact for every float dtype), narrowed to float, then rounded once to the
// destination (f64 destinations take the double). NaN encodings follow core/dtype.cpp:
// bf16 keeps the payload (quiet bit set), f16 gives sign|0x7e00, fp8 e4m3 gives 0x7f.
// Views: up to 4 dims, any strides (innermost contiguous); rarely on a hot path, so
// one thread per element with the index decomposed per element.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/ops.cuh"

namespace ls::cuda {
namespace {

struct View4 {
  void* data;
  int64_t shape[4];
  int64_t stride[4];
  int ndim;
  int dtype;  // DType as int
};

// Same bit recipe as ls::f16_to_f32 (core/dtype.cpp), NaN payload included.
__device__ float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    const float v = ldexpf(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

__device__ double load_any(const void* p, int dt, int64_t i) {
  switch (static_cast<DType>(dt)) {
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f8e4m3: {
      const uint8_t v = static_cast<const uint8_t*>(p)[i];
      if ((v & 0x7f) == 0x7f) return __int_as_float(0x7fc00000);
      __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
      return __half2float(__half(hr));
    }
    default: return 0.0;
  }
}

__device__ void store_any(void* p, int dt, int64_t i, double dv) {
  const float f = static_cast<float>(dv);
  switch (static_cast<DType>(dt)) {
    case DType::f64: static_cast<double*>(p)[i] = dv; return;
    case DType::f32: static_cast<float*>(p)[i] = f; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(f); return;
    case DType::f16: {
      uint16_t h;
      if (isnan(f)) h = static_cast<uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
      else h = __half_as_ushort(__float2half_rn(f));
      static_cast<uint16_t*>(p)[i] = h;
      return;
    }
    case DType::f8e4m3: {
      uint8_t v;
      if (isnan(f)) v = 0x7f;
      else v = static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
      static_cast<uint8_t*>(p)[i] = v;
      return;
    }
    default: return;
  }
}

__device__ __forceinline__ int64_t offset_of(const View4& v, int64_t idx) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    const int64_t i = idx % v.shape[d];
    idx /= v.shape[d];
    off += i * v.stride[d];
  }
  return off;
}

__global__ void convert_any(View4 src, View4 dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_any(dst.data, dst.dtype, offset_of(dst, i), load_any(src.data, src.dtype, offset_of(src, i)));
  }
}

View4 to_view4(const TensorView& t) {
  View4 v{};
  v.data = t.data;
  v.ndim = t.ndim;
  v.dtype = static_cast<int>(t.dtype);
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i < t.ndim ? t.shape[static_cast<size_t>(i)] : 1;
    v.stride[i] = i < t.ndim ? t.stride[static_cast<size_t>(i)] : 0;
  }
  return v;
}

}  // namespace

Status cuda_op_convert(CudaContext& ctx, const TensorView& src, const TensorView& dst) {
  LS_CHECK_MSG(src.ndim == dst.ndim, "convert: " + src.shape_str() + " -> " + dst.shape_str());
  for (int i = 0; i < src.ndim; ++i)
    LS_CHECK_MSG(src.shape[static_cast<size_t>(i)] == dst.shape[static_cast<size_t>(i)],
                 "convert: " + src.shape_str() + " -> " + dst.shape_str());
  if (!dtype_is_float(src.dtype) || !dtype_is_float(dst.dtype))
    return unsupported("convert", "float dtypes only: " + src.shape_str() + " -> " + dst.shape_str());
  const int64_t n = src.numel();
  if (n == 0) return Status();
  const int64_t blocks = std::min<int64_t>(div_up(n, 256), static_cast<int64_t>(ctx.sm_count) * 32);
  convert_any<<<static_cast<unsigned>(blocks), 256, 0, ctx.stream>>>(to_view4(src), to_view4(dst), n);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

}  // namespace ls::cuda
