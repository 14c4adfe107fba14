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

// The pointer forms: ls_clip.keyframes, then ls_clip.references.
Status pointer_keyframes(const ls::h3::H3Config& cfg, const ls_clip& c, ls::h3::Conditioning& cond) {
  if (c.keyframe_count > 0 && !c.keyframes)
    return Error{ErrorCode::invalid_argument, "ls_clip.keyframes is NULL with keyframe_count > 0"};
  for (size_t i = 0; i < c.keyframe_count; ++i) {
    const ls_keyframe& k = c.keyframes[i];
    ls::h3::Keyframe kf;
    kf.pixel_frame = k.pixel_frame;
    if (!k.video.data && !k.audio.data)
      return Error{ErrorCode::invalid_argument, "keyframe " + std::to_string(i) + " has neither a video nor an audio latent"};
    LS_TRY(video_latent(k.video, cfg.latents_dim, "keyframe", kf.video));
    LS_TRY(audio_latent(k.audio, cfg.audio_latents_dim, "keyframe", kf.audio));
    kf.noise = noise(k.noise);
    cond.keyframes.push_back(std::move(kf));
  }
  return {};
}
Status pointer_references(const ls::h3::H3Config& cfg, const ls_clip& c, ls::h3::Conditioning& cond) {
  if (c.reference_count > 0 && !c.references)
    return Error{ErrorCode::invalid_argument, "ls_clip.references is NULL with reference_count > 0"};
  for (size_t i = 0; i < c.reference_count; ++i) {
    const ls_reference& r = c.references[i];
    ls::h3::Reference ref;
    if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
      return Error{ErrorCode::invalid_argument, "reference " + std::to_string(i) + ": unknown kind"};
    ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
    LS_TRY(video_latent(r.video, cfg.latents_dim, "reference", ref.video));
    LS_TRY(audio_latent(r.audio, cfg.audio_latents_dim, "reference", ref.audio));
    ref.noise = noise(r.noise);
    cond.refs.push_back(std::move(ref));
  }
  return {};
}

// The tensor forms (ls_keyframe_tensors, ls_reference_tensors), each refused beside its pointer form.
Status tensor_keyframes(const ls::h3::H3Config& cfg, const ls_clip& c, TensorIO& io, ls::h3::Conditioning& cond) {
  if (c.keyframe_tensor_count > 0 && c.keyframe_count > 0)
    return Error{ErrorCode::invalid_argument, "ls_clip: give keyframes or keyframe_tensors, not both"};
  if (c.keyframe_tensor_count > 0 && !c.keyframe_tensors)
    return Error{ErrorCode::invalid_argument, "ls_clip.keyframe_tensors is NULL with keyframe_tensor_count > 0"};
  for (size_t i = 0; i < c.keyframe_tensor_count; ++i) {
    const std::string what = "keyframe " + std::to_string(i);
    LS_ASSIGN_OR_RETURN(ls_keyframe_tensors k, read_element(c.keyframe_tensors[i], ls_keyframe_tensors_init, what));
    if (!k.video && !k.audio) return Error{ErrorCode::invalid_argument, what + " has neither a video nor an audio latent"};
    ls::h3::Keyframe kf;
    kf.pixel_frame = k.pixel_frame;
    LS_TRY(video_tensor(k.video, cfg.latents_dim, io, what + " video", kf.video));
    LS_TRY(audio_tensor(k.audio, cfg.audio_latents_dim, io, what + " audio", kf.audio));
    LS_TRY(values_tensor(k.noise_video, io, what + " noise_video", kf.noise.video));
    LS_TRY(values_tensor(k.noise_audio, io, what + " noise_audio", kf.noise.audio));
    cond.keyframes.push_back(std::move(kf));
  }
  return {};
}
Status tensor_references(const ls::h3::H3Config& cfg, const ls_clip& c, TensorIO& io, ls::h3::Conditioning& cond) {
  if (c.reference_tensor_count > 0 && c.reference_count > 0)
    return Error{ErrorCode::invalid_argument, "ls_clip: give references or reference_tensors, not both"};
  if (c.reference_tensor_count > 0 && !c.reference_tensors)
    return Error{ErrorCode::invalid_argument, "ls_clip.reference_tensors is NULL with reference_tensor_count > 0"};
  for (size_t i = 0; i < c.reference_tensor_count; ++i) {
    const std::string what = "reference " + std::to_string(i);
    LS_ASSIGN_OR_RETURN(ls_reference_tensors r, read_element(c.reference_tensors[i], ls_reference_tensors_init, what));
    if (enum_field(r.kind) < LS_REFERENCE_IMAGE || enum_field(r.kind) > LS_REFERENCE_VIDEO_AUDIO)
      return Error{ErrorCode::invalid_argument, what + ": unknown kind"};
    ls::h3::Reference ref;
    ref.kind = static_cast<ls::h3::ReferenceKind>(r.kind);
    LS_TRY(video_tensor(r.video, cfg.latents_dim, io, what + " video", ref.video));
    LS_TRY(audio_tensor(r.audio, cfg.audio_latents_dim, io, what + " audio", ref.audio));
    LS_TRY(values_tensor(r.noise_video, io, what + " noise_video", ref.noise.video));
    LS_TRY(values_tensor(r.noise_audio, io, what + " noise_audio", ref.noise.audio));
    cond.refs.push_back(std::move(ref));
  }
  return {};
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
  LS_TRY(pointer_keyframes(cfg, c, cond));
  LS_TRY(pointer_references(cfg, c, cond));
  LS_TRY(tensor_keyframes(cfg, c, io, cond));
  LS_TRY(tensor_references(cfg, c, io, cond));
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
