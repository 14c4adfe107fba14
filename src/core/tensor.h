// TensorView: a non-owning view of device or host memory. Shapes are written
// PyTorch-order, outermost first; strides are in elements (not bytes). Memory is owned
// by an Arena (activations), a mapped file or a host buffer (weights); views never own.
//
// Example: the K third of a fused qkv buffer, viewed per head:
//   TensorView qkv = ...;                         // bf16 [S, 3*I]
//   TensorView k = qkv.cols(I, 2 * I).unflatten_last(heads, head_dim);  // bf16 [S, H, Dh]
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace ls {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
};

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // elements
  Device device{};

  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = {});
  static TensorView contiguous(void* d, DType t, const int64_t* dims, int n, Device dev = {});

  int64_t size(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t rows() const { return shape[0]; }
  int64_t numel() const;
  int64_t elem_size() const { return dtype_size(dtype); }
  bool is_contiguous() const;
  bool inner_contiguous() const { return ndim == 0 || stride[static_cast<size_t>(ndim - 1)] == 1; }
  bool empty() const { return data == nullptr; }
  int64_t nbytes() const { return numel() * elem_size(); }  // contiguous views only
  int64_t row_stride() const { return stride[0]; }

  // Pointer to the element at (i0, i1, ...) (missing trailing indices are 0).
  void* at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const;
  template <typename T> T* ptr() const { return static_cast<T*>(data); }

  // Rows [a, b) of dimension 0.
  TensorView slice_rows(int64_t a, int64_t b) const;
  // Columns [a, b) of the last dimension (strides kept).
  TensorView cols(int64_t a, int64_t b) const;
  // Split the last dimension [.., n] into [.., n / inner, inner] (it must be contiguous).
  TensorView unflatten_last(int64_t outer, int64_t inner) const;
  // Merge the last two dims [.., a, b] into [.., a*b] (needs stride[-2] == b, stride[-1] == 1).
  TensorView flatten_last2() const;

  std::string shape_str() const;  // "bf16 [S, 5376]"-style, for messages
};

}  // namespace ls
