// ls_tensor, the caller's memory (host or device, f32 | bf16, strided): descriptor and
// device checks, and the copies between it and the library's fp32 host vectors.
// Part of the C API (src/api/c_api_internal.h lists its files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/c_api_internal.h"

namespace ls::capi {

// The denoiser call's target latents on the engine's device go to the engine as device
// views (packed there, any strides and f32|bf16), and device outputs are written by the
// engine on the device (issue 13). Everything else becomes the library's contiguous
// fp32 host copies (bf16 widened exactly, strides gathered in row-major order): host
// tensors, and device conditioning tensors (keyframe / reference latents, noise, masks,
// text), staged through host memory with Backend::copy; host outputs are written from
// fp32 (bf16: round to nearest even, core/dtype.h). Device work is ordered on the
// caller's stream: wait_external(stream) before the first device read or write,
// signal_external(stream) after the last write (TensorIO::finish).
struct TensorIO {
  ls::Backend* backend = nullptr;
  void* stream = nullptr;  // the caller's cudaStream_t (NULL = legacy default)
  bool waited = false;     // wait_external done (a device tensor was touched)
  bool wrote = false;      // a device output was written
  uint64_t staged_bytes = 0;  // device bytes copied through host memory (device_bytes)

  Status before_device_access() {
    if (waited) return {};
    LS_TRY(backend->wait_external(stream));
    waited = true;
    return {};
  }
  // After the outputs: later work on the caller's stream waits for the device writes.
  Status finish() {
    if (!wrote) return {};
    wrote = false;
    return backend->signal_external(stream);
  }
};

// The caller's descriptor read through its size (ls_tensor_init's defaults beyond it).
Expected<ls_tensor> tensor_desc(const ls_tensor* given, const std::string& what);
// Whether t (read through its size) is a CUDA tensor; a bad descriptor is not (refused later).
bool on_device(const ls_tensor* t);
std::string dims_str(const int64_t* d, int n);
int64_t numel_of(const ls_tensor& t);
bool contiguous(const ls_tensor& t);
size_t elem_bytes(const ls_tensor& t);
ls::Device device_of(const ls_tensor& t);

// The descriptor's own consistency and its device against the engine's.
Status check_tensor(const ls_tensor& t, const ls::Device& engine, const std::string& what);
// Shape check with leading 1s dropped (a batch of one). want[i] < 0: any size >= 1,
// returned through `got`.
Status match_shape(const ls_tensor& t, const std::vector<int64_t>& want, const std::string& what,
                   std::vector<int64_t>* got = nullptr);
// An output tensor, checked before any work: the clip's shape, writable memory.
Status check_output(const ls_tensor& t, const ls::Device& engine, const std::vector<int64_t>& want, const std::string& what);

// The tensor's values as contiguous fp32 (row-major), staged from a device if needed.
Expected<std::vector<float>> gather(const ls_tensor& t, TensorIO& io, const std::string& what);
// Writes fp32 values (row-major) into an output tensor (checked by check_output).
Status scatter(const ls_tensor& t, const std::vector<float>& v, TensorIO& io, const std::string& what);

// Inputs in tensor form (p NULL: nothing given, `out` untouched). A latent: [C, *, *, *]
// (video) or [C, 2, *] (audio).
Status video_tensor(const ls_tensor* p, int64_t C, TensorIO& io, const std::string& what, ls::h3::VideoLatent& out);
Status audio_tensor(const ls_tensor* p, int64_t C, TensorIO& io, const std::string& what, ls::h3::AudioLatent& out);
// Any shape: the values in row-major order.
Status values_tensor(const ls_tensor* p, TensorIO& io, const std::string& what, std::vector<float>& out);
// A fixed shape (leading 1s allowed).
Expected<std::vector<float>> fixed_tensor(const ls_tensor* p, const std::vector<int64_t>& want, TensorIO& io,
                                          const std::string& what);
// A latent on the engine's device as the engine's view (leading 1s dropped, the
// caller's strides and dtype kept): the engine packs it there (no host copy).
Expected<ls::TensorView> device_view(const ls_tensor* p, const std::vector<int64_t>& want, TensorIO& io,
                                     const std::string& what);
// A device output (contiguous: check_output) as the engine's view of `shape`: the engine
// writes it on its stream.
ls::TensorView output_view(const ls_tensor& t, const std::vector<int64_t>& shape);

}  // namespace ls::capi
