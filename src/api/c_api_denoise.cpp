// ls_engine_denoise, the denoiser call (ComfyUI's door): read the inputs (pointers or
// ls_tensor views, staged through TensorIO) -> check the outputs -> plan -> run -> write
// the outputs -> report. Part of the C API (src/api/c_api_internal.h lists its files).
#include <algorithm>
#include <chrono>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/c_api_calls.h"
#include "api/c_api_clip.h"
#include "api/c_api_internal.h"
#include "api/c_api_tensor.h"
#include "core/dtype.h"

namespace ls::capi {
namespace {

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One call's inputs as the engine takes them, read and checked before any engine work.
struct DenoiseInputs {
  ls::h3::Conditioning cond;
  std::vector<float> table_sigmas;  // the AdaLN tables the call holds (call_table_sigmas)
  size_t nv = 0, na = 0;            // floats of the clip's video / audio latent
  std::vector<int64_t> vshape, ashape;
  // The target latents: host fp32 (the caller's pointers, or copies of its tensors) or,
  // on the engine's device, views the engine packs there.
  const float* video = nullptr;
  const float* audio = nullptr;
  const float* text = nullptr;
  std::vector<float> video_in, audio_in, text_in;  // the copies
  ls::TensorView video_dev, audio_dev;
  bool v_out_dev = false, audio_out_on_device = false;  // outputs the engine writes on its device
  uint64_t latents_staged = 0;  // target latent bytes staged through host memory (inputs)
  ls::exec::RefinedText refined;
  bool have_refined = false;
  ls_tensor vout{}, aout{};  // the output tensors, when given
};

// Pointer or tensor, not both, for each input and output; the sigma's range.
Status check_forms(const ls_denoise_params& p) {
  for (auto [ptr, t, name] : {std::tuple<const void*, const ls_tensor*, const char*>{p.video, p.video_tensor, "video"},
                              {p.audio, p.audio_tensor, "audio"},
                              {p.text, p.text_tensor, "text"},
                              {p.refined_text, p.refined_text_tensor, "refined_text"},
                              {p.video_out, p.video_out_tensor, "video_out"},
                              {p.audio_out, p.audio_out_tensor, "audio_out"}})
    LS_TRY(one_form(ptr, t, name));
  return ls::ranges::check_float("ls_denoise_params.sigma", p.sigma, ls::ranges::sigma);
}

// The clip, the tables the call holds, the required inputs, the latents' sizes.
Status read_clip(const ls_engine& e, const ls_denoise_params& p, TensorIO& io, DenoiseInputs& in) {
  const ls::h3::H3Config& cfg = e.session->config();
  LS_ASSIGN_OR_RETURN(in.cond, conditioning(cfg, p.clip, io));
  in.cond.output_masks = p.output_masks != 0;
  const ls::h3::ClipGeometry& g = in.cond.geometry;
  in.table_sigmas = call_table_sigmas(e.table_sigmas, in.cond.sample_sigmas, p.sigma);
  if (cfg.pdd_heads > 1 && in.cond.sample_sigmas.empty()) in.cond.sample_sigmas = {1.0f, p.sigma, 0.0f};
  if ((!p.video && !p.video_tensor) || (!p.audio && !p.audio_tensor))
    return Error{ErrorCode::invalid_argument, "ls_denoise_params: video and audio are required"};
  if (!p.text && !p.refined_text && !p.text_tensor && !p.refined_text_tensor)
    return Error{ErrorCode::invalid_argument, "ls_denoise_params: give text (raw states) or refined_text"};
  in.nv = video_count(cfg, g), in.na = audio_count(cfg, g);
  in.vshape = {cfg.latents_dim, g.T, g.Hl, g.Wl};
  in.ashape = {cfg.audio_latents_dim, 2, g.A};
  return {};
}

// The target latents. On the engine's device they stay there: the engine packs them
// (and writes device outputs) on its stream, after wait_external. With the audio carry
// (audio_scale != 1) the output's carry term reads the audio input, so the audio stays
// on the device only when its input and its output both are; otherwise it is staged.
// Everything else in tensor form: contiguous fp32 host copies.
Status read_latents(const ls_denoise_params& p, TensorIO& io, DenoiseInputs& in) {
  const bool carry = in.cond.audio_scale != 1.0;
  const bool v_in_dev = on_device(p.video_tensor), a_in_dev = on_device(p.audio_tensor);
  const bool a_out_dev = on_device(p.audio_out_tensor);
  in.v_out_dev = on_device(p.video_out_tensor);
  const bool audio_in_on_device = a_in_dev && (!carry || a_out_dev);
  in.audio_out_on_device = a_out_dev && (!carry || a_in_dev);
  const uint64_t staged_before = io.staged_bytes;  // the conditioning's staging
  in.video = p.video;
  in.audio = p.audio;
  if (p.video_tensor && v_in_dev) {
    LS_ASSIGN_OR_RETURN(in.video_dev, device_view(p.video_tensor, in.vshape, io, "video_tensor"));
  } else if (p.video_tensor) {
    LS_ASSIGN_OR_RETURN(in.video_in, fixed_tensor(p.video_tensor, in.vshape, io, "video_tensor"));
    in.video = in.video_in.data();
  }
  if (p.audio_tensor && audio_in_on_device) {
    LS_ASSIGN_OR_RETURN(in.audio_dev, device_view(p.audio_tensor, in.ashape, io, "audio_tensor"));
  } else if (p.audio_tensor) {
    LS_ASSIGN_OR_RETURN(in.audio_in, fixed_tensor(p.audio_tensor, in.ashape, io, "audio_tensor"));
    in.audio = in.audio_in.data();
  }
  in.latents_staged = io.staged_bytes - staged_before;
  return {};
}

// The text: refined states (bf16 [L, hidden], a tensor or a pointer) or raw states.
Status read_text(const ls_denoise_params& p, const ls::h3::H3Config& cfg, TensorIO& io, DenoiseInputs& in) {
  const ls::h3::ClipGeometry& g = in.cond.geometry;
  in.text = p.text;
  if (p.refined_text_tensor) {
    LS_TRY(tensor_desc(p.refined_text_tensor, "refined_text_tensor"));
    LS_ASSIGN_OR_RETURN(std::vector<float> r,
                        fixed_tensor(p.refined_text_tensor, {g.text_tokens, cfg.hidden}, io, "refined_text_tensor"));
    // The refined states are bf16 values: bf16 given, or f32 holding bf16 values exactly
    // (anything else would be rounded here, silently changing the call's input).
    in.refined.bf16.resize(r.size());
    for (size_t i = 0; i < r.size(); ++i) {
      const float x = r[i];
      in.refined.bf16[i] = ls::f32_to_bf16(x);
      if (ls::f32_bits(ls::bf16_to_f32(in.refined.bf16[i])) != ls::f32_bits(x))
        return Error{ErrorCode::invalid_argument,
                     "refined_text_tensor holds a value that is not a bf16 value (element " + std::to_string(i) +
                         "): the refined text states are bf16 [L, hidden]; give them as bf16"};
    }
    in.have_refined = true;
  } else if (p.refined_text) {
    in.refined.bf16.assign(p.refined_text, p.refined_text + g.text_tokens * cfg.hidden);
    in.have_refined = true;
  } else if (p.text_tensor) {
    LS_ASSIGN_OR_RETURN(in.text_in, fixed_tensor(p.text_tensor, {g.text_tokens, cfg.text_dim}, io, "text_tensor"));
    in.text = in.text_in.data();
  }
  return {};
}

// The outputs, checked after the inputs (a bad input is named as such) and before any
// engine work.
Status check_call_outputs(const ls_denoise_params& p, const ls::Device& dev, DenoiseInputs& in) {
  if (p.video_out_tensor) {
    LS_ASSIGN_OR_RETURN(in.vout, tensor_desc(p.video_out_tensor, "video_out_tensor"));
    LS_TRY(check_output(in.vout, dev, in.vshape, "video_out_tensor"));
  } else {
    LS_TRY(check_out(p.video_out, p.video_out_count, in.nv, "video_out"));
  }
  if (p.audio_out_tensor) {
    LS_ASSIGN_OR_RETURN(in.aout, tensor_desc(p.audio_out_tensor, "audio_out_tensor"));
    LS_TRY(check_output(in.aout, dev, in.ashape, "audio_out_tensor"));
  } else {
    LS_TRY(check_out(p.audio_out, p.audio_out_count, in.na, "audio_out"));
  }
  return {};
}

Status read_inputs(const ls_engine& e, const ls_denoise_params& p, TensorIO& io, DenoiseInputs& in) {
  LS_TRY(check_forms(p));
  LS_TRY(read_clip(e, p, io, in));
  LS_TRY(read_latents(p, io, in));
  LS_TRY(read_text(p, e.session->config(), io, in));
  return check_call_outputs(p, e.session->backend().device(), in);
}

// The engine's call over the inputs: host views or device views, device outputs written
// by the engine on its stream (contiguous: check_output). `readback`: the device output
// bytes read back once for output_hash and the non-finite check.
Status bind_call(const ls::h3::H3Config& cfg, TensorIO& io, DenoiseInputs& in, ls::api::DenoiseCall& call,
                 uint64_t& readback) {
  const ls::h3::ClipGeometry& g = in.cond.geometry;
  call.precompute_sigmas = in.table_sigmas;
  call.cond = &in.cond;
  if (in.have_refined) {
    in.refined.L = g.text_tokens;
    in.refined.D = cfg.hidden;
    call.refined = &in.refined;
  } else {
    call.text = ls::TensorView(const_cast<float*>(in.text), ls::DType::f32, {g.text_tokens, cfg.text_dim});
  }
  call.video = in.video_dev.empty()
                   ? ls::TensorView(const_cast<float*>(in.video), ls::DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})
                   : in.video_dev;
  call.audio = in.audio_dev.empty()
                   ? ls::TensorView(const_cast<float*>(in.audio), ls::DType::f32, {cfg.audio_latents_dim, 2, g.A})
                   : in.audio_dev;
  readback = 0;
  if (in.v_out_dev) {
    call.outputs.video = output_view(in.vout, in.vshape);
    readback += static_cast<uint64_t>(in.nv * elem_bytes(in.vout));
  }
  if (in.audio_out_on_device) {
    call.outputs.audio = output_view(in.aout, in.ashape);
    readback += static_cast<uint64_t>(in.na * elem_bytes(in.aout));
  }
  if (!in.video_dev.empty() || !in.audio_dev.empty() || !call.outputs.video.empty() || !call.outputs.audio.empty()) {
    LS_TRY(io.before_device_access());
    // The engine's writes are queued from here on: the caller's stream waits for them
    // (TensorIO::finish), also when the call fails part way.
    if (!call.outputs.video.empty() || !call.outputs.audio.empty()) io.wrote = true;
  }
  return {};
}

// The call's seconds: reading the inputs, planning, the denoiser, everything outside the forward.
struct CallSeconds {
  double inputs = 0, plan = 0, denoise = 0, outside_forward = 0;
};

// The report's fields of a denoise call (beside publish's).
nlohmann::json denoise_report(const ls::exec::ForwardResult& r, const DenoiseInputs& in, const TensorIO& io,
                              uint64_t outputs_staged, uint64_t readback, uint64_t driver_used_bytes,
                              const ls::api::DenoiseTimes& times, const CallSeconds& sec) {
  nlohmann::json j = nlohmann::json::parse(r.report.to_json());
  j["call"] = "denoise";
  j["driver_used_bytes"] = driver_used_bytes;
  // Whether a target latent (video / audio, input or output) went through host memory;
  // the conditioning tensors' staging is counted apart; the device outputs are read back
  // once for output_hash and the non-finite check (docs/python.md).
  const uint64_t latents = in.latents_staged + outputs_staged;
  j["staged_through_host"] = latents > 0;
  j["staged_bytes"] = {{"latents", latents}, {"conditioning", io.staged_bytes - latents}};
  j["output_readback_bytes"] = readback;
  // The AdaLN tables of this call: computed now, or kept from an earlier call of the run.
  j["adaln"] = {{"tables_computed", times.adaln_tables_computed},
                {"sigmas", in.table_sigmas.size()},
                {"schedule", !in.cond.sample_sigmas.empty() && in.table_sigmas.size() > 1}};
  j["api_seconds"] = {{"inputs", sec.inputs}, {"plan", sec.plan}, {"denoise", sec.denoise},
                      {"outside_forward", sec.outside_forward}};
  return j;
}

// ls_engine_denoise after its params struct is read: read -> plan -> run -> write -> report.
ls_status denoise_call(ls_engine& e, const ls_denoise_params& p, TensorIO& io) {
  const auto t_call = std::chrono::steady_clock::now();
  ls::api::Session& s = *e.session;
  DenoiseInputs in;
  if (Status st = read_inputs(e, p, io, in); !st.ok()) return fail(&e, st.error());
  CallSeconds sec;
  sec.inputs = seconds_since(t_call);
  // The call's packed layout, built once (on the planner's first use) and handed to the
  // planner and the engine's steps.
  const ls::exec::CallLayout layout(s.config(), in.cond, /*for_forward=*/true);
  // The plan counts the tables this call holds (the schedule's, or the call's own).
  const auto t_plan0 = std::chrono::steady_clock::now();
  auto rp = s.plan(in.cond, in.table_sigmas, e.memory, nullptr, &layout);
  if (!rp.ok()) return fail(&e, rp.error());
  sec.plan = seconds_since(t_plan0);
  if (Status st = ensure_engine(e, *rp); !st.ok()) return fail(&e, st.error());
  ls::api::DenoiseCall call;
  uint64_t readback = 0;
  if (Status st = bind_call(s.config(), io, in, call, readback); !st.ok()) return fail(&e, st.error());
  call.sigma = p.sigma;
  call.plan = &rp->plan;
  call.layout = &layout;
  e.have_report = false;
  e.table_sigmas.clear();  // unknown until the call's precompute has succeeded
  ls::api::DenoiseTimes times;
  const auto t_denoise0 = std::chrono::steady_clock::now();
  auto r = s.denoise(call, &times);
  if (!r.ok()) return fail(&e, r.error());
  sec.denoise = seconds_since(t_denoise0);
  e.table_sigmas = in.table_sigmas;
  const uint64_t out_staged_before = io.staged_bytes;
  if (p.video_out_tensor && call.outputs.video.empty())
    if (Status st = scatter(in.vout, r->video, io, "video_out_tensor"); !st.ok()) return fail(&e, st.error());
  if (p.audio_out_tensor && call.outputs.audio.empty())
    if (Status st = scatter(in.aout, r->audio, io, "audio_out_tensor"); !st.ok()) return fail(&e, st.error());
  const uint64_t outputs_staged = io.staged_bytes - out_staged_before;
  sec.outside_forward = seconds_since(t_call) - r->report.wall_seconds;
  nlohmann::json j = denoise_report(*r, in, io, outputs_staged, readback, s.driver_used_bytes(), times, sec);
  return publish(e, std::move(j), rp->plan, rp->budget ? &*rp->budget : nullptr, std::move(r->video), std::move(r->audio),
                 p.video_out_tensor ? nullptr : p.video_out, p.audio_out_tensor ? nullptr : p.audio_out);
}

}  // namespace
}  // namespace ls::capi

using namespace ls::capi;

extern "C" {

ls_status ls_engine_denoise(ls_engine* e, const ls_denoise_params* given) {
  return on_engine(e, given, ls_denoise_params_init, "ls_denoise_params", [&](const ls_denoise_params& p) -> ls_status {
    TensorIO io{&e->session->backend(), p.stream};
    const ls_status st = denoise_call(*e, p, io);
    // The caller's stream waits for whatever device outputs were written, also when a
    // later step failed (the writes are queued either way).
    if (Status fin = io.finish(); !fin.ok() && st == LS_OK) return fail(e, fin.error());
    return st;
  });
}

}  // extern "C"
