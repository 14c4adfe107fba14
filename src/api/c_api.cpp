// The C API (include/layerstream/layerstream.h) over api::Session. Every entry point
// catches C++ exceptions (std::bad_alloc -> LS_OUT_OF_MEMORY) so none crosses the C
// boundary; every failure leaves a message in the engine (or thread-local) error slot.
#define LS_BUILDING_LIBRARY 1
#include "layerstream/layerstream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/memory_request.h"
#include "core/ranges.h"
#include "api/report_json.h"
#include "core/printable.h"
#include "api/session.h"
#include "model/h3/quant_census.h"
#include "core/hash.h"
#include "core/thread_pool.h"
#include "sample/schedule.h"

struct ls_engine {
  std::unique_ptr<ls::api::Session> session;
  ls::api::MemorySpec memory;
  ls_numerics numerics{};          // as given (strings copied below)
  std::string native_variant, cudnn_form;
  bool check_finite = true;
  bool engine_made = false;
  ls::exec::Residency engine_residency;  // the residency the current engine was made with
  std::string error;
  std::string plan_json;
  // The last call's report: report_base without output_hash (ls_engine_call_report_json),
  // report_json with it. The fingerprint reads every output byte (~50 ms at S = 111k, more
  // than the rest of the call outside the forward), so it is computed at the first request
  // (ls_engine_report_json, ls_engine_output_hash) from the kept outputs, not by every call.
  std::string report_base;
  mutable std::string report_json;
  mutable uint64_t hash = 0;
  mutable bool hash_done = false;
  std::vector<float> out_video, out_audio;  // the last outputs (fp32), for the fingerprint
  bool have_report = false;
  // The sigmas whose AdaLN tables the engine holds (ls_engine_denoise with a schedule:
  // kept while later calls' sigmas are among them; issue 25).
  std::vector<float> table_sigmas;
};

namespace {

using ls::Error;
using ls::ErrorCode;
using ls::Expected;
using ls::Status;

thread_local std::string g_last_error;

ls_status to_status(ErrorCode c) {
  switch (c) {
    case ErrorCode::invalid_argument: return LS_INVALID_ARGUMENT;
    case ErrorCode::invalid_file: return LS_INVALID_FILE;
    case ErrorCode::io: return LS_IO;
    case ErrorCode::unsupported: return LS_UNSUPPORTED;
    case ErrorCode::out_of_budget: return LS_OUT_OF_BUDGET;
    case ErrorCode::out_of_memory: return LS_OUT_OF_MEMORY;
    case ErrorCode::device: return LS_DEVICE;
    case ErrorCode::not_found: return LS_NOT_FOUND;
    case ErrorCode::nonfinite: return LS_NONFINITE;
  }
  return LS_INVALID_ARGUMENT;
}

// The C API's error sink (and so the Python package's, which raises this text): file
// bytes quoted in a message are escaped here (core/printable.h).
ls_status fail(ls_engine* e, const Error& err) {
  (e ? e->error : g_last_error) = ls::printable_text(err.message);
  return to_status(err.code);
}
ls_status fail(ls_engine* e, ls_status s, const std::string& msg) {
  (e ? e->error : g_last_error) = ls::printable_text(msg);
  return s;
}

// Runs f() (returning ls_status) with exceptions turned into statuses.
template <typename F>
ls_status guarded(ls_engine* e, F&& f) {
  try {
    if (e) e->error.clear();
    return f();
  } catch (const std::bad_alloc&) {
    return fail(e, LS_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& x) {
    return fail(e, LS_INVALID_ARGUMENT, std::string("internal error: ") + x.what());
  } catch (...) {
    return fail(e, LS_INVALID_ARGUMENT, "internal error");
  }
}

// A caller's params struct read through its `size` (append-only versioning): the
// defaults of this library's struct, overwritten by the first `size` bytes given.
template <typename T>
Expected<T> read_params(const T* given, void (*init)(T*), const char* name) {
  T out;
  init(&out);
  if (!given) return ls::make_error(ErrorCode::invalid_argument, std::string(name) + " is NULL");
  if (given->size < sizeof(uint32_t))
    return ls::make_error(ErrorCode::invalid_argument,
                          std::string(name) + ".size is not set: initialise the struct with " + name + "_init()");
  if (given->size > sizeof(T))
    return ls::make_error(ErrorCode::invalid_argument,
                          std::string(name) + ".size is " + std::to_string(given->size) + " but this library knows " +
                              std::to_string(sizeof(T)) + " bytes: the header is newer than the library");
  std::memcpy(static_cast<void*>(&out), given, given->size);
  out.size = sizeof(T);
  return out;
}

// ls_numerics (the C mirror) -> ls::Numerics; ls::validate names a bad field. The backend
// (Backend::set_numerics, through Session::open_backend) then refuses what it cannot
// honour and resolves the defaults.
// A caller's C enum field as an int: an out-of-range value loaded as the enum type is
// undefined behaviour (the enum's range is that of its enumerators' bits), so the bytes
// are read as the int the C ABI stores.
template <class E>
int32_t enum_field(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t));
  int32_t v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

Expected<ls::Numerics> to_numerics(const ls_numerics& c) {
  // kv_tile: 0 = the device's, else the range of every door (ranges.h).
  if (c.kv_tile != 0) LS_TRY(ls::ranges::check_int("numerics.kv_tile", c.kv_tile, ls::ranges::kv_tile));
  const int32_t attention = enum_field(c.attention), gemm_f32 = enum_field(c.gemm_f32);
  if (attention < LS_ATTENTION_DEFAULT || attention > LS_ATTENTION_INT8)
    return Error{ErrorCode::invalid_argument, "numerics.attention is not an ls_attention"};
  if (gemm_f32 < LS_GEMM_F32_LANES16 || gemm_f32 > LS_GEMM_F32_CUBLASLT)
    return Error{ErrorCode::invalid_argument, "numerics.gemm_f32 is not an ls_gemm_f32_order"};
  ls::Numerics n;
  n.attention = attention == LS_ATTENTION_NATIVE   ? ls::AttentionAlgorithm::native
                : attention == LS_ATTENTION_CUDNN  ? ls::AttentionAlgorithm::cudnn
                : attention == LS_ATTENTION_HOPPER ? ls::AttentionAlgorithm::hopper
                : attention == LS_ATTENTION_INT8   ? ls::AttentionAlgorithm::int8
                                                   : ls::AttentionAlgorithm::backend_default;
  n.kv_tile = c.kv_tile;
  n.gemm_f32 = gemm_f32 == LS_GEMM_F32_CUBLASLT ? ls::GemmF32Order::cublaslt : ls::GemmF32Order::lanes16;
  n.native_variant = c.native_variant ? c.native_variant : "";
  n.cudnn_q_chunk = c.cudnn_q_chunk;
  n.cudnn_form = c.cudnn_form ? c.cudnn_form : "";
  n.cudnn_skip_configs = c.cudnn_skip_configs;
  LS_TRY(ls::validate(n));
  return n;
}

// The resolved numerics the backend runs with (what produced the output).
nlohmann::json numerics_json(const ls_engine& e, int64_t kv_tile) {
  nlohmann::json j = e.session->backend().numerics();
  j["kv_tile"] = kv_tile;  // the plan's (equal to the backend's unless a caller planned another)
  return j;
}

// ---- ls_clip -> h3::Conditioning -----------------------------------------------------
std::vector<float> copy_floats(const float* p, size_t n) { return p ? std::vector<float>(p, p + n) : std::vector<float>{}; }

Status video_latent(const ls_video_latent& v, int64_t C, const char* what, ls::h3::VideoLatent& out) {
  if (!v.data) return {};
  if (v.T < 1 || v.Hl < 1 || v.Wl < 1)
    return Error{ErrorCode::invalid_argument, std::string(what) + ": video T, Hl, Wl must be >= 1"};
  out.T = v.T, out.Hl = v.Hl, out.Wl = v.Wl;
  out.data = copy_floats(v.data, static_cast<size_t>(C * v.T * v.Hl * v.Wl));
  return {};
}
Status audio_latent(const ls_audio_latent& a, int64_t C, const char* what, ls::h3::AudioLatent& out) {
  if (!a.data) return {};
  if (a.A < 1) return Error{ErrorCode::invalid_argument, std::string(what) + ": audio A must be >= 1"};
  out.A = a.A;
  out.data = copy_floats(a.data, static_cast<size_t>(C * 2 * a.A));
  return {};
}
ls::h3::ConditionNoise noise(const ls_condition_noise& n) {
  return {copy_floats(n.video, n.video_count), copy_floats(n.audio, n.audio_count)};
}

// ---- ls_tensor: caller memory (host or device, f32 | bf16, strided) -----------------
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

// The descriptor's own consistency and its device against the engine's.
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

// Shape check with leading 1s dropped (a batch of one). want[i] < 0: any size >= 1,
// returned through `got`.
Status match_shape(const ls_tensor& t, const std::vector<int64_t>& want, const std::string& what,
                   std::vector<int64_t>* got = nullptr) {
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

ls::Device device_of(const ls_tensor& t) {
  return t.device_type == LS_DEVICE_CUDA ? ls::Device{ls::DeviceKind::cuda, t.device_index} : ls::Device{};
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

// The tensor's values as contiguous fp32 (row-major), staged from a device if needed.
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

// An output tensor, checked before any work: the clip's shape, writable memory.
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

// Writes fp32 values (row-major) into an output tensor (checked by check_output).
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

// A latent in tensor form: [C, *, *, *] (video) or [C, 2, *] (audio).
Expected<std::vector<int64_t>> input_shape(const ls_tensor& t, const ls::Device& engine, const std::vector<int64_t>& want,
                                           const std::string& what) {
  LS_TRY(check_tensor(t, engine, what));
  std::vector<int64_t> got;
  LS_TRY(match_shape(t, want, what, &got));
  return got;
}

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
// Any shape: the values in row-major order.
Status values_tensor(const ls_tensor* p, TensorIO& io, const std::string& what, std::vector<float>& out) {
  if (!p) return {};
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_TRY(check_tensor(t, io.backend->device(), what));
  LS_ASSIGN_OR_RETURN(out, gather(t, io, what));
  return {};
}
// A fixed shape (leading 1s allowed).
Expected<std::vector<float>> fixed_tensor(const ls_tensor* p, const std::vector<int64_t>& want, TensorIO& io,
                                          const std::string& what) {
  LS_ASSIGN_OR_RETURN(ls_tensor t, tensor_desc(p, what));
  LS_TRY(input_shape(t, io.backend->device(), want, what));
  return gather(t, io, what);
}

// A latent on the engine's device as the engine's view (leading 1s dropped, the
// caller's strides and dtype kept): the engine packs it there (no host copy).
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

// A versioned struct behind a pointer in an array (ls_keyframe_tensors, ls_reference_tensors).
template <typename T>
Expected<T> read_element(const T* given, void (*init)(T*), const std::string& what) {
  T out;
  init(&out);
  if (!given) return Error{ErrorCode::invalid_argument, what + " is NULL"};
  if (given->size < sizeof(uint32_t) || given->size > sizeof(T))
    return Error{ErrorCode::invalid_argument, what + ".size is " + std::to_string(given->size) +
                                                  ": initialise it with its _init() (or the header is newer than the library)"};
  std::memcpy(static_cast<void*>(&out), given, given->size);
  out.size = sizeof(T);
  return out;
}

// An unsigned field against a signed range (seeds: 0..2^63-1), the value as given in the message.
Status check_u64(const std::string& what, uint64_t v, const ls::ranges::IntRange& r) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return ls::ranges::check_int(what, static_cast<int64_t>(v), r);
  return ls::ranges::parse_int(what, std::to_string(v), r).error();
}

// ---- the memory request (ls_memory_request, or the legacy fields of ls_engine_params) ----
ls::api::MemoryMode memory_mode_of(int32_t m) {
  return m == LS_MEMORY_VRAM_BUDGET       ? ls::api::MemoryMode::total_budget
         : m == LS_MEMORY_ACTIVATION_BUDGET ? ls::api::MemoryMode::activation_budget
                                            : ls::api::MemoryMode::knobs;
}

Status check_mode(int32_t m, const char* what) {
  if (m < LS_MEMORY_KNOBS || m > LS_MEMORY_VRAM_BUDGET)
    return Error{ErrorCode::invalid_argument, std::string(what) + " is not an ls_memory_mode (" + std::to_string(m) + ")"};
  return {};
}

// A byte count given as int64 (ls_memory_request): a negative one is refused by the size grammar.
Expected<uint64_t> request_bytes(const char* what, int64_t v) {
  if (v < 0) return ls::ranges::parse_size(what, std::to_string(v)).error();
  return static_cast<uint64_t>(v);
}

// ls_memory_request -> api::MemoryRequest: LS_UNSET fields are not given.
Expected<ls::api::MemoryRequest> request_of(const ls_memory_request& c) {
  LS_TRY(check_mode(enum_field(c.mode), "ls_memory_request.mode"));
  ls::api::MemoryRequest r;
  r.mode = memory_mode_of(enum_field(c.mode));
  const auto opt = [](int64_t v, std::optional<int64_t>& out) {
    if (v != LS_UNSET) out = v;
  };
  const auto flag = [](const char* what, int64_t v, std::optional<bool>& out) -> Status {
    if (v == LS_UNSET) return {};
    if (v != 0 && v != 1)
      return Error{ErrorCode::invalid_argument, std::string(what) + " must be 0 or 1 (got " + std::to_string(v) + ")"};
    out = v != 0;
    return {};
  };
  if (c.vram_budget != LS_UNSET) {
    LS_ASSIGN_OR_RETURN(r.vram_budget, request_bytes("vram_budget", c.vram_budget));
  }
  if (c.activation_budget != LS_UNSET) {
    LS_ASSIGN_OR_RETURN(r.activation_budget, request_bytes("activation_budget", c.activation_budget));
  }
  opt(c.prefetch, r.prefetch);
  opt(c.mlp_chunk, r.mlp_chunk), opt(c.attn_chunk, r.attn_chunk), opt(c.final_chunk, r.final_chunk);
  opt(c.kv_chunk, r.kv_chunk), opt(c.resident_blocks, r.resident_blocks), opt(c.slots, r.slots);
  LS_TRY(flag("kv_offload", c.kv_offload, r.kv_offload));
  LS_TRY(flag("residual_offload", c.residual_offload, r.residual_offload));
  return r;
}

// The legacy fields of ls_engine_params (API 1-4) as a request: a field that differs from
// its ls_engine_params_init value is given.
Expected<ls::api::MemoryRequest> request_of_legacy(const ls_engine_params& p) {
  ls_engine_params d;
  ls_engine_params_init(&d);
  LS_TRY(check_mode(enum_field(p.memory_mode), "ls_engine_params.memory_mode"));
  ls::api::MemoryRequest r;
  r.mode = memory_mode_of(enum_field(p.memory_mode));
  if (p.vram_budget != d.vram_budget) r.vram_budget = p.vram_budget;
  if (p.activation_budget != d.activation_budget) r.activation_budget = p.activation_budget;
  if (p.prefetch != d.prefetch) r.prefetch = p.prefetch;
  if (p.mlp_chunk != d.mlp_chunk) r.mlp_chunk = p.mlp_chunk;
  if (p.attn_chunk != d.attn_chunk) r.attn_chunk = p.attn_chunk;
  if (p.final_chunk != d.final_chunk) r.final_chunk = p.final_chunk;
  if (p.kv_offload != d.kv_offload) r.kv_offload = p.kv_offload != 0;
  if (p.kv_chunk != d.kv_chunk) r.kv_chunk = p.kv_chunk;
  if (p.residual_offload != d.residual_offload) r.residual_offload = p.residual_offload != 0;
  if (p.resident_blocks != d.resident_blocks) r.resident_blocks = p.resident_blocks;
  if (p.slots != d.slots) r.slots = p.slots;
  return r;
}

// The name of the first legacy memory field of p that is not its default ("" if none).
std::string legacy_memory_field_set(const ls_engine_params& p) {
  ls_engine_params d;
  ls_engine_params_init(&d);
  const std::pair<bool, const char*> fields[] = {
      {enum_field(p.memory_mode) != enum_field(d.memory_mode), "memory_mode"},
      {p.vram_budget != d.vram_budget, "vram_budget"},
      {p.prefetch != d.prefetch, "prefetch"},
      {p.activation_budget != d.activation_budget, "activation_budget"},
      {p.mlp_chunk != d.mlp_chunk, "mlp_chunk"},
      {p.attn_chunk != d.attn_chunk, "attn_chunk"},
      {p.final_chunk != d.final_chunk, "final_chunk"},
      {p.kv_offload != d.kv_offload, "kv_offload"},
      {p.kv_chunk != d.kv_chunk, "kv_chunk"},
      {p.residual_offload != d.residual_offload, "residual_offload"},
      {p.resident_blocks != d.resident_blocks, "resident_blocks"},
      {p.slots != d.slots, "slots"}};
  for (const auto& [set, name] : fields)
    if (set) return name;
  return "";
}

// Whether a device string names CPU ranks only ("cpu", "cpu*4"; anything else: a device).
bool cpu_device(const std::string& d) { return d.rfind("cpu", 0) == 0; }

// The clip's numbers against the range table (ranges.h): what the CLI refuses is refused here
// with the same message (the name is the field's).
Status check_clip_geometry(const ls_clip& c) {
  namespace r = ls::ranges;
  LS_TRY(r::check_int("ls_clip.frames", c.frames, r::frames));
  LS_TRY(r::check_int("ls_clip.width", c.width, r::width));
  LS_TRY(r::check_int("ls_clip.height", c.height, r::height));
  LS_TRY(r::check_int("ls_clip.text_tokens", c.text_tokens, r::text_tokens));
  return {};
}
Status check_clip_values(const ls_clip& c, const ls::h3::Conditioning& cond) {
  namespace r = ls::ranges;
  LS_TRY(r::check_float("ls_clip.vis_aug", c.vis_aug, r::aug));
  LS_TRY(r::check_float("ls_clip.aud_aug", c.aud_aug, r::aug));
  LS_TRY(r::check_float("ls_clip.shift_video", c.shift_video, r::shift));
  LS_TRY(r::check_float("ls_clip.shift_audio", c.shift_audio, r::shift));
  LS_TRY(r::check_float("ls_clip.audio_scale", c.audio_scale, r::audio_scale));
  LS_TRY(check_u64("ls_clip.seed", c.seed, r::seed));
  for (size_t i = 0; i < cond.sample_sigmas.size(); ++i)
    LS_TRY(r::check_float("ls_clip.sample_sigmas[" + std::to_string(i) + "]", cond.sample_sigmas[i], r::sample_sigma));
  const int64_t last = cond.geometry.frames - 1;  // pixel frames of the clip (after snapping)
  for (size_t i = 0; i < cond.keyframes.size(); ++i)
    LS_TRY(r::check_int("keyframe " + std::to_string(i) + " pixel_frame", cond.keyframes[i].pixel_frame,
                        r::IntRange{0, last}));
  return {};
}

Expected<ls::h3::Conditioning> conditioning(const ls::h3::H3Config& cfg, const ls_clip* given, TensorIO& io) {
  LS_ASSIGN_OR_RETURN(ls_clip c, read_params(given, ls_clip_init, "ls_clip"));
  LS_TRY(check_clip_geometry(c));
  ls::h3::Conditioning cond;
  LS_ASSIGN_OR_RETURN(cond.geometry, ls::h3::clip_geometry(c.frames, c.width, c.height, c.text_tokens));
  const ls::h3::ClipGeometry& g = cond.geometry;
  if (c.text_tags) cond.text_token_tags.assign(c.text_tags, c.text_tags + c.text_tokens);
  if (c.keyframe_count > 0 && !c.keyframes)
    return Error{ErrorCode::invalid_argument, "ls_clip.keyframes is NULL with keyframe_count > 0"};
  for (size_t i = 0; i < c.keyframe_count; ++i) {
    const ls_keyframe& k = c.keyframes[i];
    ls::h3::Keyframe kf;
    kf.pixel_frame = k.pixel_frame;
    if (!k.video.data && !k.audio.data)
      return Error{ErrorCode::invalid_argument, "keyframe " + std::to_string(i) + " has neither a video nor an audio latent"};
    LS_TRY(video_latent(k.video, cfg.latents_dim, "keyframe", kf.video));
    LS_TRY(audio_latent(k.audio, cfg.audio_latents_dim, "keyframe", kf.audio));
    kf.noise = noise(k.noise);
    cond.keyframes.push_back(std::move(kf));
  }
  if (c.reference_count > 0 && !c.references)
    return Error{ErrorCode::invalid_argument, "ls_clip.references is NULL with reference_count > 0"};
  for (size_t i = 0; i < c.reference_count; ++i) {
    const ls_reference& r = c.references[i];
    ls::h3::Reference ref;
    if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
      return Error{ErrorCode::invalid_argument, "reference " + std::to_string(i) + ": unknown kind"};
    ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
    LS_TRY(video_latent(r.video, cfg.latents_dim, "reference", ref.video));
    LS_TRY(audio_latent(r.audio, cfg.audio_latents_dim, "reference", ref.audio));
    ref.noise = noise(r.noise);
    cond.refs.push_back(std::move(ref));
  }
  if (c.keyframe_tensor_count > 0 && c.keyframe_count > 0)
    return Error{ErrorCode::invalid_argument, "ls_clip: give keyframes or keyframe_tensors, not both"};
  if (c.keyframe_tensor_count > 0 && !c.keyframe_tensors)
    return Error{ErrorCode::invalid_argument, "ls_clip.keyframe_tensors is NULL with keyframe_tensor_count > 0"};
  for (size_t i = 0; i < c.keyframe_tensor_count; ++i) {
    const std::string what = "keyframe " + std::to_string(i);
    LS_ASSIGN_OR_RETURN(ls_keyframe_tensors k, read_element(c.keyframe_tensors[i], ls_keyframe_tensors_init, what));
    if (!k.video && !k.audio) return Error{ErrorCode::invalid_argument, what + " has neither a video nor an audio latent"};
    ls::h3::Keyframe kf;
    kf.pixel_frame = k.pixel_frame;
    LS_TRY(video_tensor(k.video, cfg.latents_dim, io, what + " video", kf.video));
    LS_TRY(audio_tensor(k.audio, cfg.audio_latents_dim, io, what + " audio", kf.audio));
    LS_TRY(values_tensor(k.noise_video, io, what + " noise_video", kf.noise.video));
    LS_TRY(values_tensor(k.noise_audio, io, what + " noise_audio", kf.noise.audio));
    cond.keyframes.push_back(std::move(kf));
  }
  if (c.reference_tensor_count > 0 && c.reference_count > 0)
    return Error{ErrorCode::invalid_argument, "ls_clip: give references or reference_tensors, not both"};
  if (c.reference_tensor_count > 0 && !c.reference_tensors)
    return Error{ErrorCode::invalid_argument, "ls_clip.reference_tensors is NULL with reference_tensor_count > 0"};
  for (size_t i = 0; i < c.reference_tensor_count; ++i) {
    const std::string what = "reference " + std::to_string(i);
    LS_ASSIGN_OR_RETURN(ls_reference_tensors r, read_element(c.reference_tensors[i], ls_reference_tensors_init, what));
    if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
      return Error{ErrorCode::invalid_argument, what + ": unknown kind"};
    ls::h3::Reference ref;
    ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
    LS_TRY(video_tensor(r.video, cfg.latents_dim, io, what + " video", ref.video));
    LS_TRY(audio_tensor(r.audio, cfg.audio_latents_dim, io, what + " audio", ref.audio));
    LS_TRY(values_tensor(r.noise_video, io, what + " noise_video", ref.noise.video));
    LS_TRY(values_tensor(r.noise_audio, io, what + " noise_audio", ref.noise.audio));
    cond.refs.push_back(std::move(ref));
  }
  if (c.video_mask && c.video_mask_tensor)
    return Error{ErrorCode::invalid_argument, "ls_clip: give video_mask or video_mask_tensor, not both"};
  if (c.audio_mask && c.audio_mask_tensor)
    return Error{ErrorCode::invalid_argument, "ls_clip: give audio_mask or audio_mask_tensor, not both"};
  cond.video_mask = copy_floats(c.video_mask, static_cast<size_t>(g.T * g.Hl * g.Wl));
  cond.audio_mask = copy_floats(c.audio_mask, static_cast<size_t>(2 * g.A));
  if (c.video_mask_tensor) {
    LS_ASSIGN_OR_RETURN(cond.video_mask, fixed_tensor(c.video_mask_tensor, {g.T, g.Hl, g.Wl}, io, "video_mask"));
  }
  if (c.audio_mask_tensor) {
    LS_ASSIGN_OR_RETURN(cond.audio_mask, fixed_tensor(c.audio_mask_tensor, {2, g.A}, io, "audio_mask"));
  }
  cond.vis_aug = c.vis_aug;
  cond.aud_aug = c.aud_aug;
  cond.seed = c.seed;
  cond.shift_video = c.shift_video;
  cond.shift_audio = c.shift_audio;
  cond.audio_scale = c.audio_scale;
  cond.sample_sigmas = copy_floats(c.sample_sigmas, c.sample_sigma_count);
  LS_TRY(check_clip_values(c, cond));
  return cond;
}

size_t video_count(const ls::h3::H3Config& cfg, const ls::h3::ClipGeometry& g) {
  return static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl);
}
size_t audio_count(const ls::h3::H3Config& cfg, const ls::h3::ClipGeometry& g) {
  return static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A);
}

Status check_out(const float* p, size_t have, size_t want, const char* what) {
  if (!p) return Error{ErrorCode::invalid_argument, std::string(what) + " is NULL"};
  if (have != want)
    return Error{ErrorCode::invalid_argument, std::string(what) + "_count is " + std::to_string(have) +
                                                  "; this clip needs " + std::to_string(want) + " floats"};
  return {};
}

// Both output buffers of a call (denoise, generate): present and of the clip's sizes.
Status check_outputs(const float* video_out, size_t video_count, const float* audio_out, size_t audio_count,
                     size_t nv, size_t na) {
  LS_TRY(check_out(video_out, video_count, nv, "video_out"));
  return check_out(audio_out, audio_count, na, "audio_out");
}

// The end of a call that produced velocities: copies them into the caller's buffers
// (NULL: the caller's ls_tensor outputs were written already),
// sets the fingerprint (ls_fingerprint: video bytes then audio bytes) and stores the
// report `j` with the fields every call has (plan, budget plan, resolved numerics,
// version, weights, output hash).
ls_status publish(ls_engine& e, nlohmann::json j, const ls::exec::Plan& plan, const ls::exec::BudgetPlan* budget,
                  std::vector<float> video, std::vector<float> audio, float* video_out, float* audio_out) {
  if (video_out) std::memcpy(video_out, video.data(), video.size() * sizeof(float));
  if (audio_out) std::memcpy(audio_out, audio.data(), audio.size() * sizeof(float));  // NULL: written to tensors
  j["plan"] = ls::api::plan_json(plan);
  j["vram_budget"] = budget ? ls::api::budget_plan_json(*budget) : nlohmann::json();
  j["numerics"] = numerics_json(e, plan.kv_tile);
  j["version"] = ls::api::version_json();
  j["weights"] = e.session->source().describe();
  e.out_video = std::move(video);
  e.out_audio = std::move(audio);
  e.hash_done = false;
  e.report_json.clear();
  e.report_base = j.dump(2);
  e.have_report = true;
  return LS_OK;
}

// The last outputs' fingerprint, computed once per call at the first request.
uint64_t output_hash_of(const ls_engine& e) {
  if (!e.hash_done) {
    e.hash = ls_fingerprint(e.out_video.data(), e.out_video.size(), e.out_audio.data(), e.out_audio.size());
    e.hash_done = true;
  }
  return e.hash;
}

// The engine for rp, made (or remade) when its residency differs from the current one.
Status ensure_engine(ls_engine& e, const ls::api::RunPlan& rp) {
  ls::api::Session& s = *e.session;
  if (e.engine_made && e.engine_residency.resident_blocks == rp.residency.resident_blocks &&
      e.engine_residency.slots == rp.residency.slots)
    return {};
  ls::exec::EngineOptions eo;
  eo.check_finite = e.check_finite;
  eo.residency.release_source = false;  // a later clip may need another residency
  e.engine_made = false;
  LS_TRY(s.create_engine(rp, eo));
  e.engine_made = true;
  e.engine_residency = rp.residency;
  return {};
}


// The sigmas whose AdaLN tables one ls_engine_denoise call holds (issue 25). Without a
// schedule: the call's own. With one (clip.sample_sigmas, ComfyUI's
// transformer_options["sample_sigmas"]): the held set when the call's sigma and every
// schedule sigma are in it (the tables are kept: no AdaLN weight crosses to the device),
// else the schedule's sigmas plus the call's (computed once, then kept). Sigmas match by
// timestep, fl32(sigma * 1000), which is what the tables are made from: ComfyUI hands the
// wrapper a timestep, and the sigma recovered from it need not be the schedule's float.
std::vector<float> call_table_sigmas(const std::vector<float>& held, const std::vector<float>& schedule, float sigma) {
  if (schedule.empty()) return {sigma};
  auto ts = [](float x) { return x * 1000.0f; };
  auto has = [&](const std::vector<float>& v, float x) {
    return std::any_of(v.begin(), v.end(), [&](float y) { return ts(y) == ts(x); });
  };
  bool reuse = has(held, sigma);
  for (float x : schedule) reuse = reuse && (!(x > 0.0f) || has(held, x));
  if (reuse) return held;
  std::vector<float> out;
  for (float x : schedule)
    if (x > 0.0f && !has(out, x)) out.push_back(x);
  if (!has(out, sigma)) out.push_back(sigma);
  return out;
}

// "give X or X_tensor, not both"; neither is fine here (the caller checks what is required).
Status one_form(const void* ptr, const ls_tensor* tensor, const char* name) {
  if (ptr && tensor)
    return Error{ErrorCode::invalid_argument, std::string("ls_denoise_params: give ") + name + " or " + name + "_tensor, not both"};
  return {};
}

// ls_engine_denoise after its params struct is read: the inputs (pointers or tensors,
// staged through io), one denoiser call, the outputs.
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ls_status denoise_call(ls_engine& eng, const ls_denoise_params& p, TensorIO& io) {
  const auto t_call = std::chrono::steady_clock::now();
  ls_engine* e = &eng;
  ls::api::Session& s = *e->session;
  const ls::h3::H3Config& cfg = s.config();
  const ls::Device dev = s.backend().device();
  for (auto [ptr, t, name] : {std::tuple<const void*, const ls_tensor*, const char*>{p.video, p.video_tensor, "video"},
                              {p.audio, p.audio_tensor, "audio"},
                              {p.text, p.text_tensor, "text"},
                              {p.refined_text, p.refined_text_tensor, "refined_text"},
                              {p.video_out, p.video_out_tensor, "video_out"},
                              {p.audio_out, p.audio_out_tensor, "audio_out"}})
    if (Status st = one_form(ptr, t, name); !st.ok()) return fail(e, st.error());
  if (Status st = ls::ranges::check_float("ls_denoise_params.sigma", p.sigma, ls::ranges::sigma); !st.ok())
    return fail(e, st.error());
  auto cond = conditioning(cfg, p.clip, io);
  if (!cond.ok()) return fail(e, cond.error());
  cond->output_masks = p.output_masks != 0;
  const ls::h3::ClipGeometry& g = cond->geometry;
  const std::vector<float> table_sigmas = call_table_sigmas(e->table_sigmas, cond->sample_sigmas, p.sigma);
  if (cfg.pdd_heads > 1 && cond->sample_sigmas.empty()) cond->sample_sigmas = {1.0f, p.sigma, 0.0f};
  if ((!p.video && !p.video_tensor) || (!p.audio && !p.audio_tensor))
    return fail(e, LS_INVALID_ARGUMENT, "ls_denoise_params: video and audio are required");
  if (!p.text && !p.refined_text && !p.text_tensor && !p.refined_text_tensor)
    return fail(e, LS_INVALID_ARGUMENT, "ls_denoise_params: give text (raw states) or refined_text");
  const size_t nv = video_count(cfg, g), na = audio_count(cfg, g);
  const std::vector<int64_t> vshape{cfg.latents_dim, g.T, g.Hl, g.Wl}, ashape{cfg.audio_latents_dim, 2, g.A};
  // The target latents. On the engine's device they stay there: the engine packs them
  // (and writes device outputs) on its stream, after wait_external. With the audio carry
  // (audio_scale != 1) the output's carry term reads the audio input, so the audio stays
  // on the device only when its input and its output both are; otherwise it is staged.
  // Everything else in tensor form: contiguous fp32 host copies.
  auto on_device = [](const ls_tensor* t) {
    if (!t) return false;
    auto d = tensor_desc(t, "");  // read through its size (a bad one is refused below)
    return d.ok() && d->device_type == LS_DEVICE_CUDA;
  };
  const bool carry = cond->audio_scale != 1.0;
  const bool v_in_dev = on_device(p.video_tensor), a_in_dev = on_device(p.audio_tensor);
  const bool v_out_dev = on_device(p.video_out_tensor), a_out_dev = on_device(p.audio_out_tensor);
  const bool audio_in_on_device = a_in_dev && (!carry || a_out_dev);
  const bool audio_out_on_device = a_out_dev && (!carry || a_in_dev);
  const uint64_t staged_before = io.staged_bytes;  // the conditioning's staging
  std::vector<float> video_in, audio_in, text_in, refined_in;
  const float* video = p.video;
  const float* audio = p.audio;
  const float* text = p.text;
  ls::TensorView video_dev, audio_dev;  // device views of the target latents
  if (p.video_tensor && v_in_dev) {
    auto v = device_view(p.video_tensor, vshape, io, "video_tensor");
    if (!v.ok()) return fail(e, v.error());
    video_dev = *v;
  } else if (p.video_tensor) {
    auto v = fixed_tensor(p.video_tensor, vshape, io, "video_tensor");
    if (!v.ok()) return fail(e, v.error());
    video_in = std::move(*v);
    video = video_in.data();
  }
  if (p.audio_tensor && audio_in_on_device) {
    auto a = device_view(p.audio_tensor, ashape, io, "audio_tensor");
    if (!a.ok()) return fail(e, a.error());
    audio_dev = *a;
  } else if (p.audio_tensor) {
    auto a = fixed_tensor(p.audio_tensor, ashape, io, "audio_tensor");
    if (!a.ok()) return fail(e, a.error());
    audio_in = std::move(*a);
    audio = audio_in.data();
  }
  const uint64_t latents_staged = io.staged_bytes - staged_before;
  ls::exec::RefinedText refined;
  bool have_refined = false;
  if (p.refined_text_tensor) {
    auto t = tensor_desc(p.refined_text_tensor, "refined_text_tensor");
    if (!t.ok()) return fail(e, t.error());
    auto r = fixed_tensor(p.refined_text_tensor, {g.text_tokens, cfg.hidden}, io, "refined_text_tensor");
    if (!r.ok()) return fail(e, r.error());
    // The refined states are bf16 values: bf16 given, or f32 holding bf16 values exactly
    // (anything else would be rounded here, silently changing the call's input).
    refined.bf16.resize(r->size());
    for (size_t i = 0; i < r->size(); ++i) {
      const float x = (*r)[i];
      refined.bf16[i] = ls::f32_to_bf16(x);
      if (ls::f32_bits(ls::bf16_to_f32(refined.bf16[i])) != ls::f32_bits(x))
        return fail(e, LS_INVALID_ARGUMENT,
                    "refined_text_tensor holds a value that is not a bf16 value (element " + std::to_string(i) +
                        "): the refined text states are bf16 [L, hidden]; give them as bf16");
    }
    have_refined = true;
  } else if (p.refined_text) {
    refined.bf16.assign(p.refined_text, p.refined_text + g.text_tokens * cfg.hidden);
    have_refined = true;
  } else if (p.text_tensor) {
    auto t = fixed_tensor(p.text_tensor, {g.text_tokens, cfg.text_dim}, io, "text_tensor");
    if (!t.ok()) return fail(e, t.error());
    text_in = std::move(*t);
    text = text_in.data();
  }

  // The outputs, checked after the inputs (a bad input is named as such) and before any
  // engine work.
  ls_tensor vout{}, aout{};
  if (p.video_out_tensor) {
    auto t = tensor_desc(p.video_out_tensor, "video_out_tensor");
    if (!t.ok()) return fail(e, t.error());
    vout = *t;
    if (Status st = check_output(vout, dev, vshape, "video_out_tensor"); !st.ok()) return fail(e, st.error());
  } else if (Status st = check_out(p.video_out, p.video_out_count, nv, "video_out"); !st.ok()) {
    return fail(e, st.error());
  }
  if (p.audio_out_tensor) {
    auto t = tensor_desc(p.audio_out_tensor, "audio_out_tensor");
    if (!t.ok()) return fail(e, t.error());
    aout = *t;
    if (Status st = check_output(aout, dev, ashape, "audio_out_tensor"); !st.ok()) return fail(e, st.error());
  } else if (Status st = check_out(p.audio_out, p.audio_out_count, na, "audio_out"); !st.ok()) {
    return fail(e, st.error());
  }

  // The plan counts the tables this call holds (the schedule's, or the call's own).
  const double t_inputs = seconds_since(t_call);
  const auto t_plan0 = std::chrono::steady_clock::now();
  auto rp = s.plan(*cond, table_sigmas, e->memory);
  if (!rp.ok()) return fail(e, rp.error());
  const double t_plan = seconds_since(t_plan0);
  if (Status st = ensure_engine(*e, *rp); !st.ok()) return fail(e, st.error());
  ls::api::DenoiseCall call;
  call.precompute_sigmas = table_sigmas;
  call.cond = &*cond;
  if (have_refined) {
    refined.L = g.text_tokens;
    refined.D = cfg.hidden;
    call.refined = &refined;
  } else {
    call.text = ls::TensorView(const_cast<float*>(text), ls::DType::f32, {g.text_tokens, cfg.text_dim});
  }
  call.video = video_dev.empty()
                   ? ls::TensorView(const_cast<float*>(video), ls::DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})
                   : video_dev;
  call.audio = audio_dev.empty()
                   ? ls::TensorView(const_cast<float*>(audio), ls::DType::f32, {cfg.audio_latents_dim, 2, g.A})
                   : audio_dev;
  // Device outputs: written by the engine on its stream (contiguous: check_output).
  auto out_view = [](const ls_tensor& t, const std::vector<int64_t>& shape) {
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
  };
  uint64_t readback = 0;
  if (v_out_dev) {
    call.outputs.video = out_view(vout, vshape);
    readback += static_cast<uint64_t>(nv * elem_bytes(vout));
  }
  if (audio_out_on_device) {
    call.outputs.audio = out_view(aout, ashape);
    readback += static_cast<uint64_t>(na * elem_bytes(aout));
  }
  if (!video_dev.empty() || !audio_dev.empty() || !call.outputs.video.empty() || !call.outputs.audio.empty()) {
    if (Status st = io.before_device_access(); !st.ok()) return fail(e, st.error());
    // The engine's writes are queued from here on: the caller's stream waits for them
    // (TensorIO::finish), also when the call fails part way.
    if (!call.outputs.video.empty() || !call.outputs.audio.empty()) io.wrote = true;
  }
  call.sigma = p.sigma;
  call.plan = &rp->plan;
  e->have_report = false;
  e->table_sigmas.clear();  // unknown until the call's precompute has succeeded
  ls::api::DenoiseTimes times;
  const auto t_denoise0 = std::chrono::steady_clock::now();
  auto r = s.denoise(call, &times);
  if (!r.ok()) return fail(e, r.error());
  const double t_denoise = seconds_since(t_denoise0);
  e->table_sigmas = table_sigmas;
  const uint64_t out_staged_before = io.staged_bytes;
  if (p.video_out_tensor && call.outputs.video.empty())
    if (Status st = scatter(vout, r->video, io, "video_out_tensor"); !st.ok()) return fail(e, st.error());
  if (p.audio_out_tensor && call.outputs.audio.empty())
    if (Status st = scatter(aout, r->audio, io, "audio_out_tensor"); !st.ok()) return fail(e, st.error());
  const uint64_t outputs_staged = io.staged_bytes - out_staged_before;
  nlohmann::json j = nlohmann::json::parse(r->report.to_json());
  j["call"] = "denoise";
  j["driver_used_bytes"] = s.driver_used_bytes();
  // Whether a target latent (video / audio, input or output) went through host memory;
  // the conditioning tensors' staging is counted apart; the device outputs are read back
  // once for output_hash and the non-finite check (docs/python.md).
  j["staged_through_host"] = latents_staged + outputs_staged > 0;
  j["staged_bytes"] = {{"latents", latents_staged + outputs_staged},
                       {"conditioning", io.staged_bytes - latents_staged - outputs_staged}};
  j["output_readback_bytes"] = readback;
  // The AdaLN tables of this call: computed now, or kept from an earlier call of the run.
  j["adaln"] = {{"tables_computed", times.adaln_tables_computed},
                {"sigmas", table_sigmas.size()},
                {"schedule", !cond->sample_sigmas.empty() && table_sigmas.size() > 1}};
  j["api_seconds"] = {{"inputs", t_inputs}, {"plan", t_plan}, {"denoise", t_denoise},
                      {"outside_forward", seconds_since(t_call) - r->report.wall_seconds}};
  return publish(*e, std::move(j), rp->plan, rp->budget ? &*rp->budget : nullptr, std::move(r->video), std::move(r->audio),
                 p.video_out_tensor ? nullptr : p.video_out, p.audio_out_tensor ? nullptr : p.audio_out);
}

}  // namespace

extern "C" {

const char* ls_status_string(ls_status s) {
  switch (s) {
    case LS_OK: return "ok";
    case LS_INVALID_ARGUMENT: return "invalid_argument";
    case LS_INVALID_FILE: return "invalid_file";
    case LS_IO: return "io";
    case LS_UNSUPPORTED: return "unsupported";
    case LS_OUT_OF_BUDGET: return "out_of_budget";
    case LS_OUT_OF_MEMORY: return "out_of_memory";
    case LS_DEVICE: return "device";
    case LS_NOT_FOUND: return "not_found";
    case LS_NONFINITE: return "nonfinite";
  }
  return "unknown";
}

const char* ls_version(void) {
  static const std::string v = ls::api::version_line();
  return v.c_str();
}

const char* ls_last_error(void) { return g_last_error.c_str(); }

uint64_t ls_fingerprint(const float* video, size_t video_n, const float* audio, size_t audio_n) {
  uint64_t h = ls::kFnv1a64Offset;
  if (video) h = ls::fnv1a64(video, video_n * sizeof(float), h);
  if (audio) h = ls::fnv1a64(audio, audio_n * sizeof(float), h);
  return h;
}

void ls_numerics_init(ls_numerics* n) {
  if (!n) return;
  std::memset(n, 0, sizeof *n);
  n->size = sizeof *n;
  n->attention = LS_ATTENTION_DEFAULT;
  n->kv_tile = 0;
  n->gemm_f32 = LS_GEMM_F32_LANES16;
  n->cudnn_q_chunk = 2048;
}

void ls_engine_params_init(ls_engine_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->device = "cpu";
  p->memory_mode = LS_MEMORY_KNOBS;
  // The memory defaults are the library's (api::MemorySpec, exec::Residency): one place.
  const ls::api::MemorySpec d;
  p->prefetch = d.prefetch ? (d.adaptive_slots ? 1 : 2) : 0;
  p->resident_blocks = d.residency.resident_blocks;
  p->slots = static_cast<int32_t>(d.residency.slots);
  p->check_finite = 1;
}

void ls_tensor_init(ls_tensor* t) {
  if (!t) return;
  std::memset(t, 0, sizeof *t);
  t->size = sizeof *t;
  t->dtype = LS_DTYPE_F32;
  t->device_type = LS_DEVICE_CPU;
}

void ls_tensor_host(ls_tensor* t, void* data, ls_dtype dtype, int32_t ndim, const int64_t* shape) {
  if (!t) return;
  ls_tensor_init(t);
  t->data = data;
  t->dtype = dtype;
  t->ndim = ndim;
  if (ndim < 1 || ndim > LS_TENSOR_MAX_DIMS || !shape) return;  // refused by the call that reads it
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
}

void ls_keyframe_tensors_init(ls_keyframe_tensors* k) {
  if (!k) return;
  std::memset(k, 0, sizeof *k);
  k->size = sizeof *k;
}

void ls_reference_tensors_init(ls_reference_tensors* r) {
  if (!r) return;
  std::memset(r, 0, sizeof *r);
  r->size = sizeof *r;
}

void ls_model_info_init(ls_model_info* info) {
  if (!info) return;
  std::memset(info, 0, sizeof *info);
  info->size = sizeof *info;
}

void ls_clip_init(ls_clip* c) {
  if (!c) return;
  std::memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  const ls::h3::Conditioning d;  // the library's defaults, one source of truth
  c->vis_aug = d.vis_aug;
  c->aud_aug = d.aud_aug;
  c->shift_video = d.shift_video;
  c->shift_audio = d.shift_audio;
  c->audio_scale = d.audio_scale;
}

void ls_denoise_params_init(ls_denoise_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->output_masks = 1;
}

void ls_generate_params_init(ls_generate_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->steps = 4;
  p->cfg = 1.0;
}

ls_status ls_engine_create(const ls_engine_params* given, ls_engine** out) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!out) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_create: out is NULL");
    *out = nullptr;
    auto pr = read_params(given, ls_engine_params_init, "ls_engine_params");
    if (!pr.ok()) return fail(nullptr, pr.error());
    const ls_engine_params& p = *pr;
    auto e = std::make_unique<ls_engine>();
    ls_numerics_init(&e->numerics);
    if (p.numerics) {
      auto n = read_params(p.numerics, ls_numerics_init, "ls_numerics");
      if (!n.ok()) return fail(nullptr, n.error());
      e->numerics = *n;
    }
    auto numerics = to_numerics(e->numerics);
    if (!numerics.ok()) return fail(nullptr, numerics.error());
    e->native_variant = numerics->native_variant;
    e->cudnn_form = numerics->cudnn_form;
    e->numerics.native_variant = nullptr;  // not kept: the strings above are
    e->numerics.cudnn_form = nullptr;
    // The memory choice: ls_engine_params.memory (API 5) or the legacy fields, one validation.
    ls::api::MemoryRequest mreq;
    if (p.memory) {
      if (const std::string f = legacy_memory_field_set(p); !f.empty())
        return fail(nullptr, LS_INVALID_ARGUMENT,
                    "ls_engine_params: give memory (an ls_memory_request) or the legacy memory fields, not both: " +
                        f + " is set");
      auto mr = read_params(p.memory, ls_memory_request_init, "ls_memory_request");
      if (!mr.ok()) return fail(nullptr, mr.error());
      auto r = request_of(*mr);
      if (!r.ok()) return fail(nullptr, r.error());
      mreq = *r;
    } else {
      auto r = request_of_legacy(p);
      if (!r.ok()) return fail(nullptr, r.error());
      mreq = *r;
    }
    auto mspec = ls::api::resolve_memory(mreq, ls::api::kFieldNames);
    if (!mspec.ok()) return fail(nullptr, mspec.error());
    // The other numbers against the range table (threads < 0: leave the pool as is; blocks
    // 0: the preset's).
    if (p.threads > 0)
      if (Status st = ls::ranges::check_int("threads", p.threads, ls::ranges::threads); !st.ok()) return fail(nullptr, st.error());
    if (p.blocks != 0)
      if (Status st = ls::ranges::check_int("blocks", p.blocks, ls::ranges::blocks); !st.ok()) return fail(nullptr, st.error());
    if (Status st = check_u64("weights_seed", p.weights_seed, ls::ranges::seed); !st.ok()) return fail(nullptr, st.error());
    if (!p.model_path && !p.preset)
      return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_params: give model_path (a checkpoint) or preset");
    if (p.threads >= 0) ls::set_num_threads(p.threads);

    // devices (sequence parallel, docs/multi-gpu.md): one backend per rank, else `device`.
    std::vector<std::string> rank_devices{p.device ? p.device : "cpu"};
    if (p.devices) {
      auto d = ls::api::parse_devices(p.devices);
      if (!d.ok()) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_params.devices " + d.error().message);
      rank_devices = std::move(*d);
    }
    auto session = ls::api::Session::open_backends(rank_devices, *numerics);
    if (!session.ok()) return fail(nullptr, session.error());
    if (Status st = ls::api::check_memory_device(mreq, (*session)->device_is_cpu(), ls::api::kFieldNames); !st.ok())
      return fail(nullptr, st.error());
    ls::api::WeightsSpec ws;
    if (p.model_path) {
      ws.model_path = p.model_path;
    } else {
      ws.preset = p.preset;
      ws.weights_seed = p.weights_seed;
      ws.blocks = p.blocks;
    }
    if (p.lora_count > 0 && !p.loras)
      return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_params.loras is NULL but lora_count is " +
                                                    std::to_string(p.lora_count));
    for (size_t i = 0; i < p.lora_count; ++i) {
      if (!p.loras[i]) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_params.loras[" + std::to_string(i) + "] is NULL");
      auto lf = ls::lora::parse_lora_arg(p.loras[i]);
      if (!lf.ok()) return fail(nullptr, lf.error());
      ws.loras.push_back(*lf);
    }
    if (p.lora_dtype == LS_LORA_DTYPE_F32) ws.lora_dtype = ls::lora::MergeDtype::f32;
    else if (p.lora_dtype == LS_LORA_DTYPE_F16) ws.lora_dtype = ls::lora::MergeDtype::f16;
    else if (p.lora_dtype == LS_LORA_DTYPE_BF16) ws.lora_dtype = ls::lora::MergeDtype::bf16;
    else if (p.lora_dtype != LS_LORA_DTYPE_AUTO)
      return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_params.lora_dtype must be LS_LORA_DTYPE_AUTO, _F32, _F16 or _BF16");
    if (Status s = (*session)->load_weights(ws); !s.ok()) return fail(nullptr, s.error());
    e->session = std::move(*session);

    e->memory = *mspec;
    e->memory.knobs.kv_tile = e->numerics.kv_tile;  // 0 = the device's
    e->check_finite = p.check_finite != 0;
    *out = e.release();
    return LS_OK;
  });
}

void ls_engine_free(ls_engine* engine) { delete engine; }

const char* ls_engine_last_error(const ls_engine* engine) {
  return engine ? engine->error.c_str() : g_last_error.c_str();
}

ls_status ls_engine_model_info(ls_engine* e, ls_model_info* info) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    if (!info || info->size < sizeof(uint32_t))
      return fail(e, LS_INVALID_ARGUMENT, "ls_model_info is NULL or not initialised (ls_model_info_init)");
    const ls::h3::H3Config& c = e->session->config();
    ls_model_info m;
    ls_model_info_init(&m);
    m.hidden = c.hidden, m.num_layers = c.num_layers, m.heads = c.heads, m.head_dim = c.head_dim;
    m.text_dim = c.text_dim, m.latents_dim = c.latents_dim, m.audio_latents_dim = c.audio_latents_dim;
    const uint32_t n = info->size < sizeof m ? info->size : static_cast<uint32_t>(sizeof m);
    std::memcpy(static_cast<void*>(info), &m, n);
    info->size = n;
    return LS_OK;
  });
}

void ls_clip_shape_init(ls_clip_shape* shape) {
  if (!shape) return;
  std::memset(shape, 0, sizeof *shape);
  shape->size = sizeof *shape;
}

ls_status ls_engine_clip_shape(ls_engine* e, const ls_clip* clip, ls_clip_shape* shape) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    if (!shape || shape->size < sizeof(uint32_t))
      return fail(e, LS_INVALID_ARGUMENT, "ls_clip_shape is NULL or not initialised (ls_clip_shape_init)");
    const ls::h3::H3Config& cfg = e->session->config();
    TensorIO io{&e->session->backend()};  // device tensors: after the legacy default stream
    auto cond = conditioning(cfg, clip, io);
    if (!cond.ok()) return fail(e, cond.error());
    auto sizes = ls::exec::sequence_sizes(cfg, *cond);
    if (!sizes.ok()) return fail(e, sizes.error());
    const ls::h3::ClipGeometry& g = cond->geometry;
    ls_clip_shape out;
    ls_clip_shape_init(&out);
    out.T = g.T, out.Hl = g.Hl, out.Wl = g.Wl, out.A = g.A, out.S = sizes->S;
    out.video_count = video_count(cfg, g);
    out.audio_count = audio_count(cfg, g);
    out.text_count = static_cast<size_t>(g.text_tokens * cfg.text_dim);
    const uint32_t n = shape->size < sizeof out ? shape->size : static_cast<uint32_t>(sizeof out);
    std::memcpy(static_cast<void*>(shape), &out, n);
    shape->size = n;
    return LS_OK;
  });
}

ls_status ls_engine_plan(ls_engine* e, const ls_clip* clip, float sigma, const char** json) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    if (!json) return fail(e, LS_INVALID_ARGUMENT, "json is NULL");
    *json = nullptr;
    ls::api::Session& s = *e->session;
    const ls::h3::H3Config& cfg = s.config();
    TensorIO io{&e->session->backend()};  // device tensors: after the legacy default stream
    if (Status st = ls::ranges::check_float("sigma", sigma, ls::ranges::sigma); !st.ok()) return fail(e, st.error());
    auto cond = conditioning(cfg, clip, io);
    if (!cond.ok()) return fail(e, cond.error());
    if (cfg.pdd_heads > 1 && cond->sample_sigmas.empty()) cond->sample_sigmas = {1.0f, sigma, 0.0f};
    auto rp = s.plan(*cond, {sigma}, e->memory);
    if (!rp.ok()) return fail(e, rp.error());
    auto minimum = s.minimum_budget(*cond, {sigma}, e->memory);
    if (!minimum.ok()) return fail(e, minimum.error());
    nlohmann::json j;
    j["plan"] = ls::api::plan_json(rp->plan);
    j["vram_budget"] = rp->budget ? ls::api::budget_plan_json(*rp->budget) : nlohmann::json();
    j["resident_blocks"] = rp->residency.resident_blocks;
    j["slots"] = rp->residency.slots;
    j["minimum_budget_bytes"] = *minimum;
    j["numerics"] = numerics_json(*e, rp->plan.kv_tile);
    j["backend"] = s.backend().name();
    j["version"] = ls::api::version_json();
    e->plan_json = j.dump(2);
    *json = e->plan_json.c_str();
    return LS_OK;
  });
}

ls_status ls_engine_refine_text(ls_engine* e, const float* text, int64_t tokens, uint16_t* out, size_t out_count) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    ls::api::Session& s = *e->session;
    const ls::h3::H3Config& cfg = s.config();
    if (!text || tokens < 1) return fail(e, LS_INVALID_ARGUMENT, "text is NULL or tokens < 1");
    if (!out || out_count != static_cast<size_t>(tokens * cfg.hidden))
      return fail(e, LS_INVALID_ARGUMENT, "out must hold tokens * hidden = " + std::to_string(tokens * cfg.hidden) +
                                              " bf16 values");
    if (!e->engine_made) {
      if (e->memory.mode == ls::api::MemoryMode::total_budget)
        return fail(e, LS_INVALID_ARGUMENT,
                    "under a vram budget the engine's residency comes from the clip: call ls_engine_denoise once "
                    "before ls_engine_refine_text");
      ls::api::RunPlan rp;
      rp.residency = e->memory.residency;
      if (Status st = ensure_engine(*e, rp); !st.ok()) return fail(e, st.error());
    }
    auto r = s.engine().refine_text(
        ls::TensorView(const_cast<float*>(text), ls::DType::f32, {tokens, cfg.text_dim}));
    if (!r.ok()) return fail(e, r.error());
    std::memcpy(out, r->bf16.data(), r->bf16.size() * sizeof(uint16_t));
    return LS_OK;
  });
}

ls_status ls_engine_denoise(ls_engine* e, const ls_denoise_params* given) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    auto pr = read_params(given, ls_denoise_params_init, "ls_denoise_params");
    if (!pr.ok()) return fail(e, pr.error());
    const ls_denoise_params& p = *pr;
    TensorIO io{&e->session->backend(), p.stream};
    const ls_status st = denoise_call(*e, p, io);
    // The caller's stream waits for whatever device outputs were written, also when a
    // later step failed (the writes are queued either way).
    if (Status fin = io.finish(); !fin.ok() && st == LS_OK) return fail(e, fin.error());
    return st;
  });
}

ls_status ls_engine_generate(ls_engine* e, const ls_generate_params* given) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    auto pr = read_params(given, ls_generate_params_init, "ls_generate_params");
    if (!pr.ok()) return fail(e, pr.error());
    const ls_generate_params& p = *pr;
    ls::api::Session& s = *e->session;
    const ls::h3::H3Config& cfg = s.config();
    TensorIO io{&s.backend()};
    auto cond = conditioning(cfg, p.clip, io);
    if (!cond.ok()) return fail(e, cond.error());
    const ls::h3::ClipGeometry& g = cond->geometry;
    if (!p.text) return fail(e, LS_INVALID_ARGUMENT, "ls_generate_params.text is NULL");
    for (Status st : {ls::ranges::check_float("ls_generate_params.cfg", p.cfg, ls::ranges::cfg),
                      check_u64("ls_generate_params.seed", p.seed, ls::ranges::seed),
                      cond->sample_sigmas.empty()
                          ? ls::ranges::check_int("ls_generate_params.steps", p.steps, ls::ranges::steps)
                          : Status()})
      if (!st.ok()) return fail(e, st.error());
    const size_t nv = video_count(cfg, g), na = audio_count(cfg, g);
    if (Status st = check_outputs(p.video_out, p.video_out_count, p.audio_out, p.audio_out_count, nv, na); !st.ok())
      return fail(e, st.error());

    ls::sample::GenerateRequest req;
    if (!cond->sample_sigmas.empty()) {
      req.sigmas = cond->sample_sigmas;
    } else {
      auto sched = ls::sample::make_simple_schedule(p.steps, cond->shift_video, cond->shift_audio);
      if (!sched.ok()) return fail(e, sched.error());
      req.sigmas = sched->video;
    }
    cond->sample_sigmas.clear();  // generate() fills it from req.sigmas
    req.cond = std::move(*cond);
    req.text = ls::TensorView(const_cast<float*>(p.text), ls::DType::f32, {g.text_tokens, cfg.text_dim});
    if (p.negative) {
      if (Status st = ls::ranges::check_int("ls_generate_params.negative_tokens", p.negative_tokens,
                                            ls::ranges::text_tokens);
          !st.ok())
        return fail(e, st.error());
      req.negative = ls::TensorView(const_cast<float*>(p.negative), ls::DType::f32, {p.negative_tokens, cfg.text_dim});
    }
    req.cfg = p.cfg;
    req.seed = p.seed;
    if (p.initial_latent) req.initial_latent.assign(p.initial_latent, p.initial_latent + nv + na);

    auto rp = s.plan_sampling(req, e->memory);
    if (!rp.ok()) return fail(e, rp.error());
    ls::api::Session::apply(*rp, req);
    auto plans = s.plan_generation(req);  // every refusal before any work
    if (!plans.ok()) return fail(e, plans.error());
    if (Status st = ensure_engine(*e, *rp); !st.ok()) return fail(e, st.error());
    e->have_report = false;
    auto r = s.generate(req);
    if (!r.ok()) return fail(e, r.error());
    nlohmann::json j;
    j["call"] = "generate";
    if (r->negative_plan) j["negative_plan"] = ls::api::plan_json(*r->negative_plan);
    j["sigmas"] = req.sigmas;
    j["seconds"] = {{"refine_text", r->refine_seconds},
                    {"adaln_precompute", r->adaln_seconds},
                    {"sampling", r->sampling_seconds},
                    {"total", r->total_seconds}};
    nlohmann::json fw = nlohmann::json::array();
    for (const auto& f : r->forwards) {
      nlohmann::json x = nlohmann::json::parse(f.report.to_json());
      x["step"] = f.step;
      x["prompt"] = f.prompt == ls::sample::Prompt::positive ? "positive" : "negative";
      x["sigma"] = f.sigma;
      fw.push_back(x);
    }
    j["forwards"] = fw;
    return publish(*e, std::move(j), r->plan, rp->budget ? &*rp->budget : nullptr, std::move(r->video),
                   std::move(r->audio), p.video_out,
                   p.audio_out);
  });
}

ls_status ls_engine_report_json(ls_engine* e, const char** json) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    if (!json) return fail(e, LS_INVALID_ARGUMENT, "json is NULL");
    *json = nullptr;
    if (!e->have_report) return fail(e, LS_NOT_FOUND, "no report: no denoise or generate call has succeeded yet");
    if (e->report_json.empty()) {
      nlohmann::json j = nlohmann::json::parse(e->report_base);
      char hex[20];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(output_hash_of(*e)));
      j["output_hash"] = hex;
      e->report_json = j.dump(2);
    }
    *json = e->report_json.c_str();
    return LS_OK;
  });
}

uint64_t ls_engine_output_hash(const ls_engine* e) { return e && e->have_report ? output_hash_of(*e) : 0; }

ls_status ls_engine_call_report_json(ls_engine* e, const char** json) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    if (!json) return fail(e, LS_INVALID_ARGUMENT, "json is NULL");
    *json = nullptr;
    if (!e->have_report) return fail(e, LS_NOT_FOUND, "no report: no denoise or generate call has succeeded yet");
    *json = e->report_base.c_str();
    return LS_OK;
  });
}

}  // extern "C"

// ---- API version 5: the memory request, sizes, the range table, the checkpoint probe ----
extern "C" {

void ls_memory_request_init(ls_memory_request* r) {
  if (!r) return;
  std::memset(r, 0, sizeof *r);
  r->size = sizeof *r;
  r->mode = LS_MEMORY_KNOBS;
  r->vram_budget = r->activation_budget = r->prefetch = LS_UNSET;
  r->mlp_chunk = r->attn_chunk = r->final_chunk = LS_UNSET;
  r->kv_offload = r->kv_chunk = r->residual_offload = LS_UNSET;
  r->resident_blocks = r->slots = LS_UNSET;
}

ls_status ls_memory_validate(const ls_memory_request* given, const char* device) {
  return guarded(nullptr, [&]() -> ls_status {
    auto c = read_params(given, ls_memory_request_init, "ls_memory_request");
    if (!c.ok()) return fail(nullptr, c.error());
    auto r = request_of(*c);
    if (!r.ok()) return fail(nullptr, r.error());
    auto spec = ls::api::resolve_memory(*r, ls::api::kFieldNames);
    if (!spec.ok()) return fail(nullptr, spec.error());
    if (device)
      if (Status st = ls::api::check_memory_device(*r, cpu_device(device), ls::api::kFieldNames); !st.ok())
        return fail(nullptr, st.error());
    g_last_error.clear();
    return LS_OK;
  });
}

ls_status ls_parse_size(const char* what, const char* text, uint64_t* bytes) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!text || !bytes) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_parse_size: text or bytes is NULL");
    auto v = ls::ranges::parse_size(what ? what : "size", text);
    if (!v.ok()) return fail(nullptr, v.error());
    *bytes = *v;
    return LS_OK;
  });
}

size_t ls_range_count(void) { return ls::ranges::table().size(); }

ls_status ls_range_at(size_t i, ls_range* out) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!out || out->size < sizeof(uint32_t))
      return fail(nullptr, LS_INVALID_ARGUMENT, "ls_range is NULL or its size is not set");
    const auto t = ls::ranges::table();
    if (i >= t.size())
      return fail(nullptr, LS_NOT_FOUND, "range " + std::to_string(i) + ": the table has " + std::to_string(t.size()));
    const ls::ranges::Entry& e = t[i];
    // The texts live as long as the process (one per entry, made once).
    static const std::vector<std::string> texts = [] {
      std::vector<std::string> v;
      for (const auto& x : ls::ranges::table()) v.push_back(ls::ranges::describe(x));
      return v;
    }();
    ls_range r;
    std::memset(&r, 0, sizeof r);
    r.size = sizeof r;
    r.name = e.name;
    r.unit = e.unit;
    r.meaning = e.meaning;
    r.text = texts[i].c_str();
    switch (e.kind) {
      case ls::ranges::Kind::integer:
        r.kind = LS_RANGE_INTEGER, r.lo = static_cast<double>(e.i.lo), r.hi = static_cast<double>(e.i.hi);
        break;
      case ls::ranges::Kind::real:
        r.kind = LS_RANGE_REAL, r.lo = e.f.lo, r.hi = e.f.hi, r.lo_open = e.f.lo_open, r.hi_open = e.f.hi_open;
        break;
      case ls::ranges::Kind::size:
        r.kind = LS_RANGE_SIZE, r.lo = static_cast<double>(e.s.lo), r.hi = static_cast<double>(e.s.hi);
        break;
    }
    const uint32_t n = out->size < sizeof r ? out->size : static_cast<uint32_t>(sizeof r);
    std::memcpy(static_cast<void*>(out), &r, n);
    out->size = n;
    return LS_OK;
  });
}

ls_status ls_parse_value(const char* name, const char* what, const char* text, double* value) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!name || !text || !value) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_parse_value: name, text or value is NULL");
    if (!ls::ranges::find(name))
      return fail(nullptr, LS_NOT_FOUND, std::string("ls_parse_value: no quantity named '") + name + "' in the range table");
    auto v = ls::ranges::parse_named(name, what ? what : name, text);
    if (!v.ok()) return fail(nullptr, v.error());
    *value = *v;
    return LS_OK;
  });
}

ls_status ls_clip_geometry(int64_t frames, int64_t width, int64_t height, ls_clip_grid* out) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!out || out->size < sizeof(uint32_t))
      return fail(nullptr, LS_INVALID_ARGUMENT, "ls_clip_grid is NULL or its size is not set");
    for (Status st : {ls::ranges::check_int("frames", frames, ls::ranges::frames),
                      ls::ranges::check_int("width", width, ls::ranges::width),
                      ls::ranges::check_int("height", height, ls::ranges::height)})
      if (!st.ok()) return fail(nullptr, st.error());
    auto g = ls::h3::clip_geometry(frames, width, height, 1);
    if (!g.ok()) return fail(nullptr, g.error());
    ls_clip_grid r;
    std::memset(&r, 0, sizeof r);
    r.size = sizeof r;
    r.frames = g->frames, r.width = g->width, r.height = g->height;
    r.T = g->T, r.Hl = g->Hl, r.Wl = g->Wl, r.A = g->A;
    const uint32_t n = out->size < sizeof r ? out->size : static_cast<uint32_t>(sizeof r);
    std::memcpy(static_cast<void*>(out), &r, n);
    out->size = n;
    return LS_OK;
  });
}

ls_status ls_probe_checkpoint(const char* path, const char** json) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!path || !json) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_probe_checkpoint: path or json is NULL");
    *json = nullptr;
    thread_local std::string out;
    nlohmann::ordered_json j;
    j["path"] = path;
    // Opening checks the header, the tensor table, the shapes and every quantised layer
    // (ls::h3::open_h3_checkpoint); the weights are mapped, not read.
    auto src = ls::h3::open_h3_checkpoint(path);
    j["runnable"] = src.ok();
    j["reason"] = src.ok() ? std::string() : src.error().message;
    j["status"] = src.ok() ? "ok" : ls_status_string(to_status(src.error().code));
    if (src.ok()) {
      const ls::h3::H3Config& cfg = (*src)->cfg();
      // ls_model_info's fields (the engine's names), then the checkpoint's config
      // (ComfyUI's "config.transformer" names, as `layerstream info` prints it).
      j["model_info"] = {{"hidden", cfg.hidden},         {"num_layers", cfg.num_layers},
                         {"heads", cfg.heads},           {"head_dim", cfg.head_dim},
                         {"text_dim", cfg.text_dim},     {"latents_dim", cfg.latents_dim},
                         {"audio_latents_dim", cfg.audio_latents_dim}, {"pdd_heads", cfg.pdd_heads}};
      j["config"] = nlohmann::ordered_json::parse(ls::h3::h3_config_json(cfg));
      const ls::h3::QuantCensus census = ls::h3::quant_census(cfg);
      j["format"] = ls::h3::checkpoint_format_label(census);
      j["census"] = ls::h3::quant_census_json(census);
      nlohmann::ordered_json layers = nlohmann::ordered_json::object();
      for (const auto& [name, q] : cfg.quant.linears)
        layers[name] = {{"format", ls::weight_format_name(q.format)}, {"group", q.group},
                        {"input_scale", q.has_input_scale}};
      j["layers"] = layers;
      j["mixed_ops"] = cfg.quant.mixed_ops;
      j["weights"] = (*src)->describe();
    }
    // The clip grid of every H3 model (ls::h3::clip_geometry): pixel frames 17j + 5 ->
    // latent frames 5j + 2, pixels / 16 -> latent height and width (multiples of 32
    // pixels), audio latent frames round(5 * frames / 3) (40 per second at 24 fps).
    j["clip_grid"] = {{"frame_step", 17}, {"frame_offset", 5}, {"latent_frame_step", 5}, {"latent_frame_offset", 2},
                      {"pixel_multiple", 32}, {"latent_downscale", 16}, {"fps", 24}, {"audio_latents_per_second", 40}};
    j["version"] = ls::api::version_json();
    out = j.dump(2);
    *json = out.c_str();
    return LS_OK;
  });
}

}  // extern "C"
