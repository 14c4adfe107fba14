// What the calls of an engine share (ls_engine_denoise, ls_engine_generate, ls_engine_plan,
// ls_engine_refine_text): the engine made for a plan's residency, the caller's output
// buffers, the end of a call that produced velocities (outputs, fingerprint, report).
// Part of the C API (src/api/c_api_internal.h lists its files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/c_api_internal.h"

namespace ls::capi {

// The resolved numerics the backend runs with (what produced the output).
nlohmann::json numerics_json(const ls_engine& e, int64_t kv_tile);

// An output buffer: present and of `want` floats.
Status check_out(const float* p, size_t have, size_t want, const char* what);

// The end of a call that produced velocities: copies them into the caller's buffers
// (NULL: the caller's ls_tensor outputs were written already),
// sets the fingerprint (ls_fingerprint: video bytes then audio bytes) and stores the
// report `j` with the fields every call has (plan, budget plan, resolved numerics,
// version, weights, output hash).
ls_status publish(ls_engine& e, nlohmann::json j, const ls::exec::Plan& plan, const ls::exec::BudgetPlan* budget,
                  std::vector<float> video, std::vector<float> audio, float* video_out, float* audio_out);

// The last outputs' fingerprint, computed once per call at the first request.
uint64_t output_hash_of(const ls_engine& e);

// The engine for rp, made (or remade) when its residency differs from the current one.
Status ensure_engine(ls_engine& e, const ls::api::RunPlan& rp);

}  // namespace ls::capi
