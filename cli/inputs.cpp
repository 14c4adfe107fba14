// The CLI's input-file loaders (cli/inputs.h).
#include "cli/inputs.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace ls::cli {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

std::string quoted(const std::string& name) { return "\"" + name + "\""; }

}  // namespace

// ---- forward ----------------------------------------------------------------------

Expected<std::vector<float>> read_f32_exact(const SafetensorsReader& file, const std::string& name,
                                            const std::vector<int64_t>& shape) {
  const SafetensorsEntry* e = file.find(name);
  if (!e) return make_error(ErrorCode::invalid_file, file.path() + ": no tensor " + quoted(name));
  if (e->dtype != DType::f32 || e->shape != shape)
    return make_error(ErrorCode::invalid_file, file.path() + ": " + quoted(name) + " is " +
                                                   dtype_safetensors_name(e->dtype) + " " + shape_text(e->shape) +
                                                   ", expected f32 " + shape_text(shape));
  std::vector<float> out(static_cast<size_t>(e->numel()));
  // memcpy: the tensor need not be aligned in the file.
  if (!out.empty()) std::memcpy(out.data(), file.data(*e), out.size() * sizeof(float));
  return out;
}

Expected<ForwardInputs> load_forward_inputs(const SafetensorsReader& file, const h3::H3Config& cfg,
                                            const h3::ClipGeometry& g) {
  ForwardInputs in;
  LS_ASSIGN_OR_RETURN(in.video, read_f32_exact(file, "video", {cfg.latents_dim, g.T, g.Hl, g.Wl}));
  LS_ASSIGN_OR_RETURN(in.audio, read_f32_exact(file, "audio", {cfg.audio_latents_dim, 2, g.A}));
  LS_ASSIGN_OR_RETURN(in.text, read_f32_exact(file, "text", {g.text_tokens, cfg.text_dim}));
  return in;
}

Expected<h3::Keyframe> load_forward_keyframe(const SafetensorsReader& file, const h3::H3Config& cfg,
                                             const h3::ClipGeometry& g, std::optional<std::string>& pixel_frame_text) {
  h3::Keyframe k;
  const SafetensorsEntry* v = file.find("video");
  // No "video" but an "audio": an audio-only keyframe (ComfyUI's AddGuide with audio only).
  if ((v && v->shape.size() != 4) || (!v && !file.find("audio")))
    return make_error(ErrorCode::invalid_file,
                      file.path() + ": a keyframe file needs \"video\" f32 [C, T, Hl, Wl] and/or \"audio\" f32 [C, 2, A]" +
                          (v ? " (its \"video\" is " + shape_text(v->shape) + ")" : std::string()));
  if (v) {
    k.video.T = v->shape[1], k.video.Hl = v->shape[2], k.video.Wl = v->shape[3];
    LS_ASSIGN_OR_RETURN(k.video.data, read_f32_exact(file, "video", {cfg.latents_dim, k.video.T, g.Hl, g.Wl}));
  }
  if (const SafetensorsEntry* a = file.find("audio")) {
    if (a->shape.size() != 3)
      return make_error(ErrorCode::invalid_file, file.path() + ": \"audio\" must be f32 [C, 2, A] (is " +
                                                     shape_text(a->shape) + ")");
    k.audio.A = a->shape[2];
    LS_ASSIGN_OR_RETURN(k.audio.data, read_f32_exact(file, "audio", {cfg.audio_latents_dim, 2, k.audio.A}));
  }
  pixel_frame_text.reset();
  if (auto it = file.metadata().find("pixel_frame"); it != file.metadata().end()) pixel_frame_text = it->second;
  return k;
}

Status load_mask(const SafetensorsReader& file, const h3::ClipGeometry& g, h3::Conditioning& c) {
  const bool hv = file.find("video_mask") != nullptr, ha = file.find("audio_mask") != nullptr;
  if (!hv && !ha)
    return make_error(ErrorCode::invalid_file, file.path() + ": a mask file holds \"video_mask\" f32 [T, Hl, Wl] "
                                                             "and/or \"audio_mask\" f32 [2, A]");
  if (hv) {
    LS_ASSIGN_OR_RETURN(c.video_mask, read_f32_exact(file, "video_mask", {g.T, g.Hl, g.Wl}));
  }
  if (ha) {
    LS_ASSIGN_OR_RETURN(c.audio_mask, read_f32_exact(file, "audio_mask", {2, g.A}));
  }
  return Status();
}

// ---- generate ---------------------------------------------------------------------

Expected<std::vector<float>> read_float_tensor(const SafetensorsReader& f, const std::string& name, int ndim,
                                               std::vector<int64_t>& shape) {
  const SafetensorsEntry* e = f.find(name);
  if (!e) return make_error(ErrorCode::invalid_file, f.path() + " has no tensor " + quoted(name));
  if (e->dtype != DType::f32 && e->dtype != DType::bf16 && e->dtype != DType::f16)
    return make_error(ErrorCode::invalid_file, f.path() + ": tensor " + quoted(name) + " must be F32, BF16 or F16 (is " +
                                                   dtype_safetensors_name(e->dtype) + ")");
  if (static_cast<int>(e->shape.size()) != ndim)
    return make_error(ErrorCode::invalid_file, f.path() + ": tensor " + quoted(name) + " must have " +
                                                   std::to_string(ndim) + " dimensions (has " +
                                                   std::to_string(e->shape.size()) + ": " + shape_text(e->shape) + ")");
  shape = e->shape;
  std::vector<float> out(static_cast<size_t>(e->numel()));
  const void* data = f.data(*e);
  for (int64_t i = 0; i < e->numel(); ++i) out[static_cast<size_t>(i)] = load_as_f32(data, e->dtype, i);
  return out;
}

Status load_video_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::VideoLatent& out) {
  std::vector<int64_t> shape;
  LS_ASSIGN_OR_RETURN(out.data, read_float_tensor(f, "video", 4, shape));
  if (shape[0] != cfg.latents_dim)
    return make_error(ErrorCode::invalid_file, f.path() + ": \"video\" has " + std::to_string(shape[0]) +
                                                   " channels; the model's video latents have " +
                                                   std::to_string(cfg.latents_dim));
  out.T = shape[1];
  out.Hl = shape[2];
  out.Wl = shape[3];
  return {};
}

Status load_audio_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::AudioLatent& out) {
  std::vector<int64_t> shape;
  LS_ASSIGN_OR_RETURN(out.data, read_float_tensor(f, "audio", 3, shape));
  if (shape[0] != cfg.audio_latents_dim || shape[1] != 2)
    return make_error(ErrorCode::invalid_file, f.path() + ": \"audio\" must be [" +
                                                   std::to_string(cfg.audio_latents_dim) + ", 2, A] (is " +
                                                   shape_text(shape) + ")");
  out.A = shape[2];
  return {};
}

Status load_generate_keyframe(const SafetensorsReader& f, const h3::H3Config& cfg, const h3::ClipGeometry& g,
                              h3::Keyframe& kf) {
  LS_TRY(load_video_latent(f, cfg, kf.video));
  if (kf.video.Hl != g.Hl || kf.video.Wl != g.Wl)
    return make_error(ErrorCode::invalid_file, f.path() + ": keyframe latent is " + std::to_string(kf.video.Hl) + "x" +
                                                   std::to_string(kf.video.Wl) + " but the clip's latent is " +
                                                   std::to_string(g.Hl) + "x" + std::to_string(g.Wl));
  if (f.find("audio")) LS_TRY(load_audio_latent(f, cfg, kf.audio));
  return {};
}

Status load_reference(const SafetensorsReader& f, const h3::H3Config& cfg, h3::Reference& ref) {
  const bool has_v = f.find("video") != nullptr, has_a = f.find("audio") != nullptr;
  if (!has_v && !has_a)
    return make_error(ErrorCode::invalid_file, f.path() + ": a reference needs a \"video\" and/or an \"audio\" tensor");
  if (has_v) LS_TRY(load_video_latent(f, cfg, ref.video));
  if (has_a) LS_TRY(load_audio_latent(f, cfg, ref.audio));
  ref.kind = has_v && has_a       ? h3::ReferenceKind::video_audio
             : has_a              ? h3::ReferenceKind::audio
             : ref.video.T == 1   ? h3::ReferenceKind::image
                                  : h3::ReferenceKind::video;
  return {};
}

Expected<TextViews> load_text_states(const SafetensorsReader& f) {
  const SafetensorsEntry* e = f.find("text");
  if (!e) return make_error(ErrorCode::invalid_file, f.path() + " has no tensor \"text\" (text states [L, text_dim])");
  const SafetensorsEntry* n = f.find("negative");
  // ComfyUI's cross_attn is [1, L, text_dim]: a leading batch of one is accepted. The
  // rank is checked on the header's shape before any view is made.
  auto two_d = [&](const SafetensorsEntry& x) {
    return x.shape.size() == 2 || (x.shape.size() == 3 && x.shape[0] == 1);
  };
  for (const SafetensorsEntry* x : {e, n})
    if (x && !two_d(*x))
      return make_error(ErrorCode::invalid_file, f.path() + ": \"text\" and \"negative\" must be [L, text_dim] (or "
                                                             "[1, L, text_dim]); " + quoted(x->name) + " is " +
                                                             shape_text(x->shape));
  TextViews t;
  auto as_2d = [&](const SafetensorsEntry& x) {
    const int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
    return TensorView(const_cast<void*>(f.data(x)), x.dtype, {rows, cols});
  };
  t.text = as_2d(*e);
  if (n) t.negative = as_2d(*n);
  return t;
}

}  // namespace ls::cli
