// ls_tensor: descriptor and device checks, host/device copies (src/api/c_api_tensor.h).
#include "api/c_api_tensor.h"

#include <cstring>

#include "core/dtype.h"

namespace ls::capi {

Expected<ls_tensor> tensor_desc(const ls_tensor* given, const std::string& what) {
  if (!given) return Error{ErrorCode::invalid_argument, what + " is NULL"};
  if (given->size < sizeof(uint32_t))
    return Error{ErrorCode::invalid_argument, what + ".size is not set: initialise it with ls_tensor_init()"};
  if (given->size > sizeof(ls_tensor))
    return Error{ErrorCode::invalid_argument, what + ".size is " + std::to_string(given->size) + " but this library knows " +
                                                  std::to_string(sizeof(ls_tensor)) + " bytes: the header is newer than the library"};
  ls_tensor t;
  ls_tensor_init(&t);
  std::memcpy(static_cast<void*>(&t), given, given->size);
  t.size = sizeof t;
  return t;
}

bool on_device(const ls_tensor* t) {
  if (!t) return false;
  auto d = tensor_desc(t, "");  // read through its size (a bad one is refused below)
  return d.ok() && d->device_type == LS_DEVICE_CUDA;
}

std::string dims_str(const int64_t* d, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

int64_t numel_of(const ls_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

bool contiguous(const ls_tensor& t) {
  int64_t want = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != want) return false;
    want *= t.shape[i];
  }
  return true;
}

Status check_tensor(const ls_tensor& t, const ls::Device& engine, const std::string& what) {
  if (enum_field(t.dtype) != LS_DTYPE_F32 && enum_field(t.dtype) != LS_DTYPE_BF16)
    return Error{ErrorCode::invalid_argument, what + ".dtype is not an ls_dtype (f32 or bf16)"};
  if (t.ndim < 1 || t.ndim > LS_TENSOR_MAX_DIMS)
    return Error{ErrorCode::invalid_argument, what + ".ndim is " + std::to_string(t.ndim) + "; 1 to " +
                                                  std::to_string(LS_TENSOR_MAX_DIMS) + " dimensions"};
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return Error{ErrorCode::invalid_argument, what + " has a negative dimension " + dims_str(t.shape, t.ndim)};
    if (t.strides[i] < 0) return Error{ErrorCode::invalid_argument, what + " has a negative stride (give a copy)"};
  }
  if (!t.data && numel_of(t) > 0) return Error{ErrorCode::invalid_argument, what + ".data is NULL"};
  if (enum_field(t.device_type) == LS_DEVICE_CPU) return {};
  if (enum_field(t.device_type) != LS_DEVICE_CUDA)
    return Error{ErrorCode::invalid_argument, what + ".device_type is not an ls_device_type (cpu or cuda)"};
  const std::string dev = "cuda:" + std::to_string(t.device_index);
  if (engine.kind != ls::DeviceKind::cuda || engine.index != t.device_index)
    return Error{ErrorCode::invalid_argument, what + " is on " + dev + " but the engine runs on " + engine.str() +
                                                  ": give host memory or memory on the engine's device"};
  return {};
}

Status match_shape(const ls_tensor& t, const std::vector<int64_t>& want, const std::string& what,
                   std::vector<int64_t>* got) {
  int lead = t.ndim - static_cast<int>(want.size());
  bool ok = lead >= 0;
  for (int i = 0; ok && i < lead; ++i) ok = t.shape[i] == 1;
  for (size_t i = 0; ok && i < want.size(); ++i) {
    const int64_t g = t.shape[lead + static_cast<int>(i)];
    ok = want[i] < 0 ? g >= 1 : g == want[i];
  }
  if (!ok) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + (want[i] < 0 ? std::string("*") : std::to_string(want[i]));
    return Error{ErrorCode::invalid_argument, what + " has shape " + dims_str(t.shape, t.ndim) + "; this call needs " + w +
                                                  "] (leading dimensions of size 1 allowed)"};
  }
  if (got) got->assign(t.shape + lead, t.shape + t.ndim);
  return {};
}

size_t elem_bytes(const ls_tensor& t) { return t.dtype == LS_DTYPE_BF16 ? 2 : 4; }

ls::Device device_of(const ls_tensor& t) {
  return t.device_type == LS_DEVICE_CUDA ? ls::Device{ls::DeviceKind::cuda, t.device_index} : ls::Device{};
}

namespace {

// Elements from the first to the last one the view touches (strides >= 0).
int64_t span_of(const ls_tensor& t) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.strides[i];
  return last + 1;
}

// Visits the elements in row-major order: f(i, offset in elements).
template <typename F>
void for_each_offset(const ls_tensor& t, F&& f) {
  const int64_t n = numel_of(t);
  if (n == 0) return;
  int64_t idx[LS_TENSOR_MAX_DIMS] = {};
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) {
        off += t.strides[d];
        break;
      }
      off -= (t.shape[d] - 1) * t.strides[d];
      idx[d] = 0;
    }
  }
}

// A byte range between host and device memory (Backend::copy, then wait for it).
Status device_bytes(TensorIO& io, void* dst, ls::Device dst_dev, const void* src, ls::Device src_dev, int64_t bytes) {
  LS_TRY(io.before_device_access());
  io.staged_bytes += static_cast<uint64_t>(bytes);
  ls::TensorView d(dst, ls::DType::u8, {bytes}, dst_dev);
  ls::TensorView s(const_cast<void*>(src), ls::DType::u8, {bytes}, src_dev);
  LS_TRY(io.backend->copy(d, s));
  return io.backend->synchronize();  // the engine's own queues only
}

}  // namespace

Expected<std::vector<float>> gather(const ls_tensor& t, TensorIO& io, const std::string& what) {
  const int64_t n = numel_of(t);
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const void* base = t.data;
  std::vector<unsigned char> staged;
  if (t.device_type == LS_DEVICE_CUDA) {
    const int64_t bytes = span_of(t) * static_cast<int64_t>(elem_bytes(t));
    staged.resize(static_cast<size_t>(bytes));
    if (Status st = device_bytes(io, staged.data(), ls::Device{}, t.data, device_of(t), bytes); !st.ok())
      return Error{st.error().code, what + ": staging from " + device_of(t).str() + ": " + st.error().message};
    base = staged.data();
  }
  if (t.dtype == LS_DTYPE_F32) {
    const float* src = static_cast<const float*>(base);
    if (contiguous(t)) std::memcpy(out.data(), src, static_cast<size_t>(n) * sizeof(float));
    else for_each_offset(t, [&](int64_t i, int64_t off) { out[static_cast<size_t>(i)] = src[off]; });
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(base);
    for_each_offset(t, [&](int64_t i, int64_t off) { out[static_cast<size_t>(i)] = ls::bf16_to_f32(src[off]); });
  }
  return out;
}

Status check_output(const ls_tensor& t, const ls::Device& engine, const std::vector<int64_t>& want, const std::string& what) {
  LS_TRY(check_tensor(t, engine, what));
  LS_TRY(match_shape(t, want, what));
  if (t.device_type == LS_DEVICE_CUDA && !contiguous(t))
    return Error{ErrorCode::unsupported, what + " on " + device_of(t).str() +
                                             " is strided: device outputs must be contiguous (host outputs may be strided)"};
  // Overlapping elements (a zero stride over a dimension > 1) cannot hold distinct values.
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1 && t.strides[i] == 0)
      return Error{ErrorCode::invalid_argument, what + " has a zero stride: its elements overlap"};
  return {};
}

Status scatter(const ls_tensor& t, const std::vector<float>& v, TensorIO& io, const std::string& what) {
  const int64_t n = numel_of(t);
  LS_CHECK(static_cast<size_t>(n) == v.size());
  if (n == 0) return {};
  if (t.device_type == LS_DEVICE_CUDA) {  // contiguous (check_output)
    std::vector<uint16_t> narrowed;
    const void* src = v.data();
    if (t.dtype == LS_DTYPE_BF16) {
      narrowed.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) narrowed[i] = ls::f32_to_bf16(v[i]);
      src = narrowed.data();
    }
    if (Status st = device_bytes(io, t.data, device_of(t), src, ls::Device{}, n * static_cast<int64_t>(elem_bytes(t)));
        !st.ok())
      return Error{st.error().code, what + ": writing to " + device_of(t).str() + ": " + st.error().message};
    io.wrote = true;
    return {};
  }
  if (t.dtype == LS_DTYPE_F32) {
    float* dst = static_cast<float*>(t.data);
    if (contiguous(t)) std::memcpy(dst, v.data(), v.size() * sizeof(float));
    else for_each_offset(t, [&](int64_t i, int64_t off) { dst[off] = v[static_cast<size_t>(i)]; });
  } else {
    uint16_t* dst = static_cast<uint16_t*>(t.data);
    for_each_offset(t, [&](int64_t i, int64_t off) { dst[off] = ls::f32_to_bf16(v[static_cast<size_t>(i)]); });
  }
  return {};
}

namespace {

// A latent in tensor form: [C, *, *, *] (video) or [C, 2, *] (audio).
Expected<std::vector<int64_t>> input_shape(const ls_tensor& t, const ls::Device& engine, const std::vector<int64_t>& want,
                                           const std::string& what) {
  LS_TRY(check_tensor(t, engine, what));
  std::vector<int64_t> got;
  LS_TRY(match_shape(t, want, what, &got));
  return got;
}

}  // namespace

Status video_tensor(const ls_tensor* p, int64_t C, TensorIO& io, const std::string& what, ls::h3::VideoLatent& out) {
  if (!p) return {};
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_ASSIGN_OR_RETURN(std::vector<int64_t> d, input_shape(t, io.backend->device(), {C, -1, -1, -1}, what));
  out.T = d[1], out.Hl = d[2], out.Wl = d[3];
  LS_ASSIGN_OR_RETURN(out.data, gather(t, io, what));
  return {};
}
Status audio_tensor(const ls_tensor* p, int64_t C, TensorIO& io, const std::string& what, ls::h3::AudioLatent& out) {
  if (!p) return {};
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_ASSIGN_OR_RETURN(std::vector<int64_t> d, input_shape(t, io.backend->device(), {C, 2, -1}, what));
  out.A = d[2];
  LS_ASSIGN_OR_RETURN(out.data, gather(t, io, what));
  return {};
}
Status values_tensor(const ls_tensor* p, TensorIO& io, const std::string& what, std::vector<float>& out) {
  if (!p) return {};
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_TRY(check_tensor(t, io.backend->device(), what));
  LS_ASSIGN_OR_RETURN(out, gather(t, io, what));
  return {};
}
Expected<std::vector<float>> fixed_tensor(const ls_tensor* p, const std::vector<int64_t>& want, TensorIO& io,
                                          const std::string& what) {
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_TRY(input_shape(t, io.backend->device(), want, what));
  return gather(t, io, what);
}

Expected<ls::TensorView> device_view(const ls_tensor* p, const std::vector<int64_t>& want, TensorIO& io,
                                     const std::string& what) {
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_TRY(input_shape(t, io.backend->device(), want, what));
  ls::TensorView v;
  v.data = t.data;
  v.dtype = t.dtype == LS_DTYPE_BF16 ? ls::DType::bf16 : ls::DType::f32;
  v.ndim = static_cast<int>(want.size());
  const int lead = t.ndim - v.ndim;
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[static_cast<size_t>(i)] = t.shape[lead + i];
    v.stride[static_cast<size_t>(i)] = t.strides[lead + i];
  }
  v.device = device_of(t);
  return v;
}

ls::TensorView output_view(const ls_tensor& t, const std::vector<int64_t>& shape) {
  ls::TensorView v;
  v.data = t.data;
  v.dtype = t.dtype == LS_DTYPE_BF16 ? ls::DType::bf16 : ls::DType::f32;
  v.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[static_cast<size_t>(i)] = shape[static_cast<size_t>(i)];
    v.stride[static_cast<size_t>(i)] = stride;
    stride *= shape[static_cast<size_t>(i)];
  }
  v.device = device_of(t);
  return v;
}

}  // namespace ls::capi
