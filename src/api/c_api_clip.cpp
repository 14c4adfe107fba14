// ls_clip -> h3::Conditioning (src/api/c_api_clip.h): the clip's pointer forms
// (ls_keyframe, ls_reference, float masks) and tensor forms (ls_keyframe_tensors,
// ls_reference_tensors, mask tensors), checked against the range table.
#include "api/c_api_clip.h"

#include <string>
#include <utility>
#include <vector>

namespace ls::capi {
namespace {

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

// The pointer forms: ls_clip.keyframes, then ls_clip.references (`name`: "keyframe" or
// "reference"; a count needs its array).
Status check_pointer_array(size_t count, const void* array, const std::string& name) {
  if (count > 0 && !array)
    return Error{ErrorCode::invalid_argument, "ls_clip." + name + "s is NULL with " + name + "_count > 0"};
  return {};
}

// A keyframe's or reference's latents and noise rows in pointer form (each optional).
template <class T>
Status pointer_latents(const T& x, const ls::h3::H3Config& cfg, const char* what, ls::h3::VideoLatent& video,
                       ls::h3::AudioLatent& audio, ls::h3::ConditionNoise& rows) {
  LS_TRY(video_latent(x.video, cfg.latents_dim, what, video));
  LS_TRY(audio_latent(x.audio, cfg.audio_latents_dim, what, audio));
  rows = noise(x.noise);
  return {};
}

// The tensor forms (ls_keyframe_tensors, ls_reference_tensors), each refused beside its
// pointer form: `name` is "keyframe" or "reference".
Status check_tensor_array(size_t tensor_count, size_t pointer_count, const void* array, const std::string& name) {
  if (tensor_count > 0 && pointer_count > 0)
    return Error{ErrorCode::invalid_argument, "ls_clip: give " + name + "s or " + name + "_tensors, not both"};
  if (tensor_count > 0 && !array)
    return Error{ErrorCode::invalid_argument,
                 "ls_clip." + name + "_tensors is NULL with " + name + "_tensor_count > 0"};
  return {};
}

// A keyframe's or reference's latents and noise rows in tensor form (each optional).
template <class T>
Status tensor_latents(const T& x, const ls::h3::H3Config& cfg, TensorIO& io, const std::string& what,
                      ls::h3::VideoLatent& video, ls::h3::AudioLatent& audio, ls::h3::ConditionNoise& noise) {
  LS_TRY(video_tensor(x.video, cfg.latents_dim, io, what + " video", video));
  LS_TRY(audio_tensor(x.audio, cfg.audio_latents_dim, io, what + " audio", audio));
  LS_TRY(values_tensor(x.noise_video, io, what + " noise_video", noise.video));
  return values_tensor(x.noise_audio, io, what + " noise_audio", noise.audio);
}

// One keyframe or reference, in pointer form (ls_keyframe, ls_reference) or tensor form
// (ls_keyframe_tensors, ls_reference_tensors); i names it in a message.
Expected<ls::h3::Keyframe> pointer_keyframe(const ls::h3::H3Config& cfg, const ls_keyframe& k, size_t i) {
  ls::h3::Keyframe kf;
  kf.pixel_frame = k.pixel_frame;
  if (!k.video.data && !k.audio.data)
    return Error{ErrorCode::invalid_argument, "keyframe " + std::to_string(i) + " has neither a video nor an audio latent"};
  LS_TRY(pointer_latents(k, cfg, "keyframe", kf.video, kf.audio, kf.noise));
  return kf;
}
Expected<ls::h3::Reference> pointer_reference(const ls::h3::H3Config& cfg, const ls_reference& r, size_t i) {
  ls::h3::Reference ref;
  if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
    return Error{ErrorCode::invalid_argument, "reference " + std::to_string(i) + ": unknown kind"};
  ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
  LS_TRY(pointer_latents(r, cfg, "reference", ref.video, ref.audio, ref.noise));
  return ref;
}
Expected<ls::h3::Keyframe> tensor_keyframe(const ls::h3::H3Config& cfg, TensorIO& io, const ls_keyframe_tensors* given,
                                           size_t i) {
  const std::string what = "keyframe " + std::to_string(i);
  LS_ASSIGN_OR_RETURN(ls_keyframe_tensors k, read_element(given, ls_keyframe_tensors_init, what));
  if (!k.video && !k.audio) return Error{ErrorCode::invalid_argument, what + " has neither a video nor an audio latent"};
  ls::h3::Keyframe kf;
  kf.pixel_frame = k.pixel_frame;
  LS_TRY(tensor_latents(k, cfg, io, what, kf.video, kf.audio, kf.noise));
  return kf;
}
Expected<ls::h3::Reference> tensor_reference(const ls::h3::H3Config& cfg, TensorIO& io, const ls_reference_tensors* given,
                                             size_t i) {
  const std::string what = "reference " + std::to_string(i);
  LS_ASSIGN_OR_RETURN(ls_reference_tensors r, read_element(given, ls_reference_tensors_init, what));
  if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
    return Error{ErrorCode::invalid_argument, what + ": unknown kind"};
  ls::h3::Reference ref;
  ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
  LS_TRY(tensor_latents(r, cfg, io, what, ref.video, ref.audio, ref.noise));
  return ref;
}

// The n elements of an array, each read by read(element, i), appended to out in order.
template <class T, class Out, class F>
Status read_all(const T* array, size_t n, std::vector<Out>& out, F&& read) {
  for (size_t i = 0; i < n; ++i) {
    LS_ASSIGN_OR_RETURN(Out x, read(array[i], i));
    out.push_back(std::move(x));
  }
  return {};
}

// Every keyframe and reference of the clip: the pointer forms, then the tensor forms.
Status keyframes_and_references(const ls::h3::H3Config& cfg, const ls_clip& c, TensorIO& io,
                                ls::h3::Conditioning& cond) {
  const auto kf_pointer = [&](const ls_keyframe& k, size_t i) { return pointer_keyframe(cfg, k, i); };
  const auto ref_pointer = [&](const ls_reference& r, size_t i) { return pointer_reference(cfg, r, i); };
  const auto kf_tensor = [&](const ls_keyframe_tensors* k, size_t i) { return tensor_keyframe(cfg, io, k, i); };
  const auto ref_tensor = [&](const ls_reference_tensors* r, size_t i) { return tensor_reference(cfg, io, r, i); };
  LS_TRY(check_pointer_array(c.keyframe_count, c.keyframes, "keyframe"));
  LS_TRY(read_all(c.keyframes, c.keyframe_count, cond.keyframes, kf_pointer));
  LS_TRY(check_pointer_array(c.reference_count, c.references, "reference"));
  LS_TRY(read_all(c.references, c.reference_count, cond.refs, ref_pointer));
  LS_TRY(check_tensor_array(c.keyframe_tensor_count, c.keyframe_count, c.keyframe_tensors, "keyframe"));
  LS_TRY(read_all(c.keyframe_tensors, c.keyframe_tensor_count, cond.keyframes, kf_tensor));
  LS_TRY(check_tensor_array(c.reference_tensor_count, c.reference_count, c.reference_tensors, "reference"));
  return read_all(c.reference_tensors, c.reference_tensor_count, cond.refs, ref_tensor);
}

// The masks: float pointers of the clip's sizes, or tensors.
Status masks(const ls_clip& c, TensorIO& io, ls::h3::Conditioning& cond) {
  const ls::h3::ClipGeometry& g = cond.geometry;
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
  return {};
}

}  // namespace

Expected<ls::h3::Conditioning> conditioning(const ls::h3::H3Config& cfg, const ls_clip* given, TensorIO& io) {
  LS_ASSIGN_OR_RETURN(ls_clip c, read_params(given, ls_clip_init, "ls_clip"));
  LS_TRY(check_clip_geometry(c));
  ls::h3::Conditioning cond;
  LS_ASSIGN_OR_RETURN(cond.geometry, ls::h3::clip_geometry(c.frames, c.width, c.height, c.text_tokens));
  if (c.text_tags) cond.text_token_tags.assign(c.text_tags, c.text_tags + c.text_tokens);
  LS_TRY(keyframes_and_references(cfg, c, io, cond));
  LS_TRY(masks(c, io, cond));
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

}  // namespace ls::capi
