// The C API (include/layerstream/layerstream.h) over api::Session: the entry points of
// the library (status, version, errors, the struct initialisers) and of the engine's
// lifecycle (ls_engine_create, ls_engine_free, ls_engine_model_info). The calls and the
// engine-free functions are in the other c_api*.cpp files (c_api_internal.h lists them).
// Every entry point catches C++ exceptions (std::bad_alloc -> LS_OUT_OF_MEMORY) so none
// crosses the C boundary; every failure leaves a message in the engine (or thread-local)
// error slot.
#include "api/c_api_internal.h"

#include <string>
#include <utility>
#include <vector>

#include "api/c_api_params.h"
#include "api/report_json.h"
#include "core/hash.h"
#include "core/printable.h"
#include "core/thread_pool.h"

namespace ls::capi {

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


// An unsigned field against a signed range (seeds: 0..2^63-1), the value as given in the message.
Status check_u64(const std::string& what, uint64_t v, const ls::ranges::IntRange& r) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) return ls::ranges::check_int(what, static_cast<int64_t>(v), r);
  return ls::ranges::parse_int(what, std::to_string(v), r).error();
}

namespace {

// ls_engine_params.numerics read through its size (ls_numerics_init's without it) into
// e.numerics (its strings kept in e), as the library's Numerics.
Expected<ls::Numerics> engine_numerics(const ls_engine_params& p, ls_engine& e) {
  ls_numerics_init(&e.numerics);
  if (p.numerics) {
    LS_ASSIGN_OR_RETURN(e.numerics, read_params(p.numerics, ls_numerics_init, "ls_numerics"));
  }
  LS_ASSIGN_OR_RETURN(ls::Numerics numerics, to_numerics(e.numerics));
  e.native_variant = numerics.native_variant;
  e.cudnn_form = numerics.cudnn_form;
  e.numerics.native_variant = nullptr;  // not kept: the strings above are
  e.numerics.cudnn_form = nullptr;
  return numerics;
}

// The other numbers against the range table (threads < 0: leave the pool as is; blocks
// 0: the preset's), and a model to load.
Status check_engine_numbers(const ls_engine_params& p) {
  if (p.threads > 0) LS_TRY(ls::ranges::check_int("threads", p.threads, ls::ranges::threads));
  if (p.blocks != 0) LS_TRY(ls::ranges::check_int("blocks", p.blocks, ls::ranges::blocks));
  LS_TRY(check_u64("weights_seed", p.weights_seed, ls::ranges::seed));
  if (!p.model_path && !p.preset)
    return Error{ErrorCode::invalid_argument, "ls_engine_params: give model_path (a checkpoint) or preset"};
  return {};
}

// The backends: devices (sequence parallel, docs/multi-gpu.md): one backend per rank, else
// `device`; then the memory request against the device kind.
Expected<std::unique_ptr<ls::api::Session>> open_session(const ls_engine_params& p, const ls::Numerics& numerics,
                                                         const ls::api::MemoryRequest& mreq) {
  std::vector<std::string> rank_devices{p.device ? p.device : "cpu"};
  if (p.devices) {
    auto d = ls::api::parse_devices(p.devices);
    if (!d.ok()) return Error{ErrorCode::invalid_argument, "ls_engine_params.devices " + d.error().message};
    rank_devices = std::move(*d);
  }
  LS_ASSIGN_OR_RETURN(std::unique_ptr<ls::api::Session> session, ls::api::Session::open_backends(rank_devices, numerics));
  LS_TRY(ls::api::check_memory_device(mreq, session->device_is_cpu(), ls::api::kFieldNames));
  return session;
}

// The weights to load: a checkpoint or a preset, and the LoRAs merged into them.
Expected<ls::api::WeightsSpec> weights_spec(const ls_engine_params& p) {
  ls::api::WeightsSpec ws;
  if (p.model_path) {
    ws.model_path = p.model_path;
  } else {
    ws.preset = p.preset;
    ws.weights_seed = p.weights_seed;
    ws.blocks = p.blocks;
  }
  if (p.lora_count > 0 && !p.loras)
    return Error{ErrorCode::invalid_argument, "ls_engine_params.loras is NULL but lora_count is " + std::to_string(p.lora_count)};
  for (size_t i = 0; i < p.lora_count; ++i) {
    if (!p.loras[i]) return Error{ErrorCode::invalid_argument, "ls_engine_params.loras[" + std::to_string(i) + "] is NULL"};
    LS_ASSIGN_OR_RETURN(ls::lora::LoraFile lf, ls::lora::parse_lora_arg(p.loras[i]));
    ws.loras.push_back(lf);
  }
  if (p.lora_dtype == LS_LORA_DTYPE_F32) ws.lora_dtype = ls::lora::MergeDtype::f32;
  else if (p.lora_dtype == LS_LORA_DTYPE_F16) ws.lora_dtype = ls::lora::MergeDtype::f16;
  else if (p.lora_dtype == LS_LORA_DTYPE_BF16) ws.lora_dtype = ls::lora::MergeDtype::bf16;
  else if (p.lora_dtype != LS_LORA_DTYPE_AUTO)
    return Error{ErrorCode::invalid_argument, "ls_engine_params.lora_dtype must be LS_LORA_DTYPE_AUTO, _F32, _F16 or _BF16"};
  return ws;
}

// ls_engine_create after its params struct is read: numerics -> memory -> numbers ->
// backends -> weights, each refusal before the next step's work.
Status create_engine(const ls_engine_params& p, ls_engine& e) {
  LS_ASSIGN_OR_RETURN(ls::Numerics numerics, engine_numerics(p, e));
  // The memory choice: ls_engine_params.memory (API 5) or the legacy fields, one validation.
  LS_ASSIGN_OR_RETURN(ls::api::MemoryRequest mreq, engine_memory_request(p));
  LS_ASSIGN_OR_RETURN(ls::api::MemorySpec mspec, ls::api::resolve_memory(mreq, ls::api::kFieldNames));
  LS_TRY(check_engine_numbers(p));
  if (p.threads >= 0) ls::set_num_threads(p.threads);
  LS_ASSIGN_OR_RETURN(std::unique_ptr<ls::api::Session> session, open_session(p, numerics, mreq));
  LS_ASSIGN_OR_RETURN(ls::api::WeightsSpec ws, weights_spec(p));
  LS_TRY(session->load_weights(ws));
  e.session = std::move(session);
  e.memory = mspec;
  e.memory.knobs.kv_tile = e.numerics.kv_tile;  // 0 = the device's
  e.check_finite = p.check_finite != 0;
  return {};
}

// A C API struct zeroed with its size set (the versioned-struct protocol); false for NULL.
template <typename T>
bool zero_init(T* p) {
  if (!p) return false;
  std::memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  return true;
}

}  // namespace
}  // namespace ls::capi

using namespace ls::capi;

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
  if (!zero_init(n)) return;
  n->attention = LS_ATTENTION_DEFAULT;
  n->kv_tile = 0;
  n->gemm_f32 = LS_GEMM_F32_LANES16;
  n->cudnn_q_chunk = 2048;
}

void ls_engine_params_init(ls_engine_params* p) {
  if (!zero_init(p)) return;
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
  if (!zero_init(t)) return;
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

void ls_keyframe_tensors_init(ls_keyframe_tensors* k) { zero_init(k); }

void ls_reference_tensors_init(ls_reference_tensors* r) { zero_init(r); }

void ls_model_info_init(ls_model_info* info) { zero_init(info); }

void ls_clip_init(ls_clip* c) {
  if (!zero_init(c)) return;
  const ls::h3::Conditioning d;  // the library's defaults, one source of truth
  c->vis_aug = d.vis_aug;
  c->aud_aug = d.aud_aug;
  c->shift_video = d.shift_video;
  c->shift_audio = d.shift_audio;
  c->audio_scale = d.audio_scale;
}

void ls_denoise_params_init(ls_denoise_params* p) {
  if (!zero_init(p)) return;
  p->output_masks = 1;
}

void ls_generate_params_init(ls_generate_params* p) {
  if (!zero_init(p)) return;
  p->steps = 4;
  p->cfg = 1.0;
}

ls_status ls_engine_create(const ls_engine_params* given, ls_engine** out) {
  return guarded(nullptr, [&]() -> ls_status {
    if (!out) return fail(nullptr, LS_INVALID_ARGUMENT, "ls_engine_create: out is NULL");
    *out = nullptr;
    auto pr = read_params(given, ls_engine_params_init, "ls_engine_params");
    if (!pr.ok()) return fail(nullptr, pr.error());
    auto e = std::make_unique<ls_engine>();
    if (Status st = create_engine(*pr, *e); !st.ok()) return fail(nullptr, st.error());
    *out = e.release();
    return LS_OK;
  });
}

void ls_engine_free(ls_engine* engine) { delete engine; }

const char* ls_engine_last_error(const ls_engine* engine) {
  return engine ? engine->error.c_str() : g_last_error.c_str();
}

ls_status ls_engine_model_info(ls_engine* e, ls_model_info* info) {
  return on_engine(e, [&]() -> ls_status {
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
  zero_init(shape);
}

void ls_memory_request_init(ls_memory_request* r) {
  if (!zero_init(r)) return;
  r->mode = LS_MEMORY_KNOBS;
  r->vram_budget = r->activation_budget = r->prefetch = LS_UNSET;
  r->mlp_chunk = r->attn_chunk = r->final_chunk = LS_UNSET;
  r->kv_offload = r->kv_chunk = r->residual_offload = LS_UNSET;
  r->resident_blocks = r->slots = LS_UNSET;
}

}  // extern "C"
