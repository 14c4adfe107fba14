// What the C API's files share (src/api/c_api*.cpp, compiled into liblayerstream only):
// the engine handle behind ls_engine, the error slots, the exception guard and the
// reading of versioned structs. The files, by concern:
//   c_api.cpp          entry points: status and version, the struct initialisers, the
//                      engine's lifecycle (ls_engine_create / free / model_info)
//   c_api_calls.cpp    entry points of an engine's calls: clip shape, plan, refine text,
//                      generate, reports (and the end every producing call shares)
//   c_api_denoise.cpp  ls_engine_denoise: read -> check -> plan -> run -> report
//   c_api_library.cpp  entry points without an engine: memory validation, sizes, the
//                      range table, the clip grid, the checkpoint probe
//   c_api_params.cpp   ls_numerics and the memory request (or the legacy fields) -> the
//                      library's structs
//   c_api_tensor.cpp   ls_tensor: descriptor and device checks, host/device copies
//   c_api_clip.cpp     ls_clip -> h3::Conditioning: keyframes, references, masks
#pragma once

#define LS_BUILDING_LIBRARY 1
#include "layerstream/layerstream.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api/memory_request.h"
#include "api/session.h"
#include "core/ranges.h"
#include "core/status.h"

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

namespace ls::capi {

using ls::Error;
using ls::ErrorCode;
using ls::Expected;
using ls::Status;

// The error slot of calls without an engine (ls_last_error), per thread.
extern thread_local std::string g_last_error;

ls_status to_status(ErrorCode c);

// Stores the message in the engine's slot (or the thread's when e is NULL); the status.
ls_status fail(ls_engine* e, const Error& err);
ls_status fail(ls_engine* e, ls_status s, const std::string& msg);

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

// An entry point on an engine: guarded, "engine is NULL" refused first; f() -> ls_status.
template <typename F>
ls_status on_engine(ls_engine* e, F&& f) {
  return guarded(e, [&]() -> ls_status {
    if (!e) return fail(nullptr, LS_INVALID_ARGUMENT, "engine is NULL");
    return f();
  });
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

// ... with its params struct read through its size (read_params); f(params) -> ls_status.
template <typename T, typename F>
ls_status on_engine(ls_engine* e, const T* given, void (*init)(T*), const char* name, F&& f) {
  return on_engine(e, [&]() -> ls_status {
    auto params = read_params(given, init, name);
    if (!params.ok()) return fail(e, params.error());
    return f(*params);
  });
}

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
Status check_u64(const std::string& what, uint64_t v, const ls::ranges::IntRange& r);

}  // namespace ls::capi
