// The C API's entry points that need no engine (API version 5): the memory request's
// validation, sizes and values by the range table's grammar, the clip grid, the
// checkpoint probe. Part of the C API (src/api/c_api_internal.h lists its files).
#include "api/c_api_internal.h"

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/c_api_params.h"
#include "api/report_json.h"
#include "model/h3/quant_census.h"

using namespace ls::capi;

extern "C" {

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
