#include "core/tensor.h"

#include <sstream>

namespace ls {

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

TensorView TensorView::contiguous(void* d, DType t, const int64_t* dims, int n, Device dev) {
  LS_CHECK(n >= 0 && n <= kMaxDims);
  TensorView v;
  v.data = d;
  v.dtype = t;
  v.ndim = n;
  v.device = dev;
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) {
    v.shape[static_cast<size_t>(i)] = dims[i];
    v.stride[static_cast<size_t>(i)] = s;
    s *= dims[i];
  }
  return v;
}

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> dims, Device dev) {
  *this = contiguous(d, t, dims.begin(), static_cast<int>(dims.size()), dev);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[static_cast<size_t>(i)] != 1 && stride[static_cast<size_t>(i)] != s) return false;
    s *= shape[static_cast<size_t>(i)];
  }
  return true;
}

void* TensorView::at(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
  const int64_t idx[4] = {i0, i1, i2, i3};
  int64_t off = 0;
  for (int i = 0; i < ndim; ++i) off += idx[i] * stride[static_cast<size_t>(i)];
  return static_cast<char*>(data) + off * elem_size();
}

TensorView TensorView::slice_rows(int64_t a, int64_t b) const {
  LS_CHECK_MSG(ndim >= 1 && 0 <= a && a <= b && b <= shape[0], "slice_rows out of range: " + shape_str());
  TensorView v = *this;
  v.data = static_cast<char*>(data) + a * stride[0] * elem_size();
  v.shape[0] = b - a;
  return v;
}

TensorView TensorView::cols(int64_t a, int64_t b) const {
  size_t last = static_cast<size_t>(ndim - 1);
  LS_CHECK_MSG(ndim >= 1 && 0 <= a && a <= b && b <= shape[last], "cols out of range: " + shape_str());
  TensorView v = *this;
  v.data = static_cast<char*>(data) + a * stride[last] * elem_size();
  v.shape[last] = b - a;
  return v;
}

TensorView TensorView::unflatten_last(int64_t outer, int64_t inner) const {
  LS_CHECK(ndim >= 1 && ndim < kMaxDims && inner_contiguous());
  size_t last = static_cast<size_t>(ndim - 1);
  LS_CHECK_MSG(outer * inner == shape[last], "unflatten_last: size mismatch " + shape_str());
  TensorView v = *this;
  v.shape[last] = outer;
  v.stride[last] = inner;
  v.shape[last + 1] = inner;
  v.stride[last + 1] = 1;
  v.ndim = ndim + 1;
  return v;
}

TensorView TensorView::flatten_last2() const {
  LS_CHECK(ndim >= 2);
  size_t a = static_cast<size_t>(ndim - 2), b = static_cast<size_t>(ndim - 1);
  LS_CHECK_MSG(stride[b] == 1 && stride[a] == shape[b], "flatten_last2 needs contiguous last dims");
  TensorView v = *this;
  v.shape[a] = shape[a] * shape[b];
  v.stride[a] = 1;
  v.shape[b] = 0;
  v.stride[b] = 0;
  v.ndim = ndim - 1;
  return v;
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " [";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

}  // namespace ls
