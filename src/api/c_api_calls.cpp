// The C API's entry points of an engine's calls: the clip's shape, the plan, text
// refinement, generation and the reports; and what the calls share (c_api_calls.h).
// ls_engine_denoise has its own file (c_api_denoise.cpp). Part of the C API
// (src/api/c_api_internal.h lists its files).
#include "api/c_api_calls.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "api/c_api_clip.h"
#include "api/c_api_tensor.h"
#include "api/report_json.h"
#include "sample/schedule.h"

namespace ls::capi {

nlohmann::json numerics_json(const ls_engine& e, int64_t kv_tile) {
  nlohmann::json j = e.session->backend().numerics();
  j["kv_tile"] = kv_tile;  // the plan's (equal to the backend's unless a caller planned another)
  return j;
}

Status check_out(const float* p, size_t have, size_t want, const char* what) {
  if (!p) return Error{ErrorCode::invalid_argument, std::string(what) + " is NULL"};
  if (have != want)
    return Error{ErrorCode::invalid_argument, std::string(what) + "_count is " + std::to_string(have) +
                                                  "; this clip needs " + std::to_string(want) + " floats"};
  return {};
}


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


uint64_t output_hash_of(const ls_engine& e) {
  if (!e.hash_done) {
    e.hash = ls_fingerprint(e.out_video.data(), e.out_video.size(), e.out_audio.data(), e.out_audio.size());
    e.hash_done = true;
  }
  return e.hash;
}

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

namespace {

// Both output buffers of a call (denoise, generate): present and of the clip's sizes.
Status check_outputs(const float* video_out, size_t video_count, const float* audio_out, size_t audio_count,
                     size_t nv, size_t na) {
  LS_TRY(check_out(video_out, video_count, nv, "video_out"));
  return check_out(audio_out, audio_count, na, "audio_out");
}

}  // namespace
}  // namespace ls::capi

using namespace ls::capi;

extern "C" {

ls_status ls_engine_clip_shape(ls_engine* e, const ls_clip* clip, ls_clip_shape* shape) {
  return on_engine(e, [&]() -> ls_status {
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
  return on_engine(e, [&]() -> ls_status {
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
  return on_engine(e, [&]() -> ls_status {
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

ls_status ls_engine_generate(ls_engine* e, const ls_generate_params* given) {
  return on_engine(e, given, ls_generate_params_init, "ls_generate_params", [&](const ls_generate_params& p) -> ls_status {
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
                   std::move(r->audio), p.video_out, p.audio_out);
  });
}

ls_status ls_engine_report_json(ls_engine* e, const char** json) {
  return on_engine(e, [&]() -> ls_status {
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
  return on_engine(e, [&]() -> ls_status {
    if (!json) return fail(e, LS_INVALID_ARGUMENT, "json is NULL");
    *json = nullptr;
    if (!e->have_report) return fail(e, LS_NOT_FOUND, "no report: no denoise or generate call has succeeded yet");
    *json = e->report_base.c_str();
    return LS_OK;
  });
}

}  // extern "C"
