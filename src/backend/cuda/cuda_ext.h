// CUDA-specific extras for the streaming executor (weights and K/V tiles copied on a
// side stream while the compute stream works): pinned host buffers, extra streams and
// events, as small RAII wrappers, and a named lookup of the backend's compute stream.
// The core never includes this; only CUDA-aware code (streaming, benchmarks) does.
// The executor needs none of it: Backend::pinned_host_memory, copy_async(.., Queue::
// transfer) and the fences (backend.h) give the same pattern on the backend's own
// transfer stream. These wrappers remain for benchmarks and tests that time streams.
//
// Usage:
//   auto pinned = cuda::PinnedHostBuffer::create(bytes);      // Expected<...>
//   cuda::Stream copy_stream(device);
//   cuda::Event ready(device);
//   cudaMemcpyAsync(dev, pinned->data(), bytes, cudaMemcpyHostToDevice, copy_stream.get());
//   ready.record(copy_stream.get());
//   ready.wait_on(cuda::compute_stream(backend));   // compute waits for the copy
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace ls::cuda {

// Page-locked host memory (cudaHostAlloc), so async copies overlap with compute.
class PinnedHostBuffer {
 public:
  static Expected<std::unique_ptr<PinnedHostBuffer>> create(size_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  PinnedHostBuffer(void* d, size_t n) : data_(d), bytes_(n) {}
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream on `device`.
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  int device_ = 0;
  cudaStream_t s_ = nullptr;
};

// An event (timing enabled when asked) on `device`.
class Event {
 public:
  explicit Event(int device, bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) const;
  void wait_on(cudaStream_t s) const;  // stream s waits for this event
  void synchronize() const;
  // Milliseconds between two recorded (and completed) events.
  static float elapsed_ms(const Event& start, const Event& stop);

 private:
  int device_ = 0;
  cudaEvent_t e_ = nullptr;
};

// The compute stream of a CUDA backend (nullptr when `b` is not one).
cudaStream_t compute_stream(Backend& b);
// The device index of a CUDA backend (-1 when `b` is not one).
int device_index(Backend& b);

// Attention int8's kernel (docs/int8-attention.md §7): "auto" (the default: the Hopper
// kernel on sm_90 where the build has it and the call fits, else the portable kernel) or
// "portable" (always the portable mma.sync kernel), or "hopper-grid" (auto, but the Hopper
// kernel launched with one CTA per (query tile, head) instead of its persistent grid of one CTA
// per SM: the launch before session 14). All give the same bytes; this exists so that tests and
// benchmarks can run each on the same GPU. int8_attention_kernel names what auto runs on this
// backend: "hopper" or "portable" ("" when `b` is not a CUDA backend).
Status set_int8_attention_kernel(Backend& b, const std::string& kernel);
std::string int8_attention_kernel(Backend& b);

// p8 of attention int8 (contract v2, docs/int8-attention.md §4.3, §7a): "auto" (the default:
// the fast MUFU.EX2 byte where the once-per-device check found this device's ex2 equal to the
// threshold table on every pattern, else the table path) or "table" (always the table path:
// the fast byte corrected against the thresholds, exact on any device). Both give the CPU
// reference's bytes. int8_p8_path names what attention int8 uses now: "ex2" or "table" (""
// when `b` is not a CUDA backend; the first call runs the check). int8_p8_check_summary: the
// check's numbers ("3246367612 patterns, 0 mismatches, table path 0 mismatches, 22.4 ms:
// ex2"), for logs.
Status set_int8_p8_path(Backend& b, const std::string& path);
std::string int8_p8_path(Backend& b);
std::string int8_p8_check_summary(Backend& b);

// The cuBLASLt algorithm pinned for a GEMM key, as text (for logs and benchmarks):
// "algo 66 tile 20 stages 5 splitk 1 red 0 swizzle 0 custom 0 cluster 2 ws 0".
std::string describe_pinned_gemm(Backend& b, const TensorView& x, const TensorView& w, const TensorView* bias,
                                 const TensorView& out);

// Test helper: adds to `counter` (i64 [1] on the device, zeroed by the caller) the
// number of elements whose bytes differ between two device views of equal shape and
// dtype ([M, N], rows may be strided). Lets tests memcmp large GPU results without
// downloading them.
Status count_unequal(Backend& b, const TensorView& x, const TensorView& y, const TensorView& counter);

}  // namespace ls::cuda
