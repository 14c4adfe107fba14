// The engine's parameters in the library's terms: ls_numerics -> ls::Numerics, and the
// memory choice (an ls_memory_request, or the legacy fields of ls_engine_params) ->
// api::MemoryRequest (validated by api::resolve_memory, src/api/memory_request.h).
// Part of the C API (src/api/c_api_internal.h lists its files).
#pragma once

#include <string>

#include "api/c_api_internal.h"

namespace ls::capi {

// ls_numerics (the C mirror) -> ls::Numerics; ls::validate names a bad field. The backend
// (Backend::set_numerics, through Session::open_backend) then refuses what it cannot
// honour and resolves the defaults.
Expected<ls::Numerics> to_numerics(const ls_numerics& c);

// ls_memory_request -> api::MemoryRequest: LS_UNSET fields are not given.
Expected<ls::api::MemoryRequest> request_of(const ls_memory_request& c);

// The memory choice of ls_engine_params: its `memory` (API 5) or its legacy fields, not both.
Expected<ls::api::MemoryRequest> engine_memory_request(const ls_engine_params& p);

// Whether a device string names CPU ranks only ("cpu", "cpu*4"; anything else: a device).
bool cpu_device(const std::string& d);

}  // namespace ls::capi
