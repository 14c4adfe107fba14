// LayerStream C++ handles over the C API (layerstream.h): RAII only, no exceptions.
//
//   layerstream::EnginePtr e = layerstream::make_engine(params, &status);
//   if (!e) std::cerr << ls_last_error();
//   ls_engine_denoise(e.get(), &call);          // the C functions, on e.get()
//   std::string report = layerstream::report_json(e.get());
//
// The choice (docs/api.md): the C functions already return ls_status and keep a
// message; a C++ wrapper that throws would force exceptions on every front-end (the
// Python binding converts statuses itself), so this header adds ownership only:
// unique_ptr deleters and std::string copies of library-owned strings.
#ifndef LAYERSTREAM_LAYERSTREAM_HPP
#define LAYERSTREAM_LAYERSTREAM_HPP

#include <memory>
#include <string>

#include "layerstream/layerstream.h"

namespace layerstream {

struct EngineDeleter {
  void operator()(ls_engine* e) const noexcept { ls_engine_free(e); }
};
using EnginePtr = std::unique_ptr<ls_engine, EngineDeleter>;

// ls_engine_create into an owning pointer; null on failure (*status, if given, says
// why; ls_last_error() has the message).
inline EnginePtr make_engine(const ls_engine_params& params, ls_status* status = nullptr) {
  ls_engine* e = nullptr;
  const ls_status s = ls_engine_create(&params, &e);
  if (status) *status = s;
  return EnginePtr(s == LS_OK ? e : nullptr);
}

// Copies of the engine-owned strings (valid after the next call on the engine too).
inline std::string last_error(const ls_engine* e) { return ls_engine_last_error(e); }
inline std::string report_json(ls_engine* e) {
  const char* j = nullptr;
  return ls_engine_report_json(e, &j) == LS_OK && j ? std::string(j) : std::string();
}
inline std::string plan_json(ls_engine* e, const ls_clip& clip, float sigma) {
  const char* j = nullptr;
  return ls_engine_plan(e, &clip, sigma, &j) == LS_OK && j ? std::string(j) : std::string();
}

}  // namespace layerstream

#endif  // LAYERSTREAM_LAYERSTREAM_HPP
