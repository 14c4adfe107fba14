// The CLI's input-file loaders (forward's --inputs / --keyframe / --mask, generate's
// --text / --keyframe / --ref): every tensor checked (name, dtype, rank, shape) before its
// bytes are read, and every refusal an ErrorCode::invalid_file naming the file and the
// tensor. The messages print shapes from the file's header (shape_text), never through a
// TensorView: a view holds at most 4 dims and LS_CHECKs more, so building an error with
// one would abort on exactly the hostile input the error is about (issue 28, item 2).
//
// The loaders work on an open SafetensorsReader (fuzz/fuzz_cli_inputs.cpp feeds them
// bytes from memory) and depend on nothing of the CLI but this file; numbers inside the
// files (a keyframe's "pixel_frame" metadata) are returned as text for the CLI's one
// parser (cli/cli_util.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"

namespace ls::cli {

// "[1, 2, 3]" (any rank).
std::string shape_text(const std::vector<int64_t>& shape);

// ---- forward ----------------------------------------------------------------------
// fp32 tensor `name` with exactly `shape`.
Expected<std::vector<float>> read_f32_exact(const SafetensorsReader& file, const std::string& name,
                                            const std::vector<int64_t>& shape);
// --inputs: "video" f32 [C, T, Hl, Wl], "audio" f32 [Ca, 2, A], "text" f32 [L, text_dim].
struct ForwardInputs {
  std::vector<float> video, audio, text;
};
Expected<ForwardInputs> load_forward_inputs(const SafetensorsReader& file, const h3::H3Config& cfg,
                                            const h3::ClipGeometry& g);
// A forward keyframe: "video" f32 [C, T, Hl, Wl] and/or "audio" f32 [C, 2, A]; the pixel
// frame is left to the caller (pixel_frame_text: the file's "pixel_frame" metadata).
Expected<h3::Keyframe> load_forward_keyframe(const SafetensorsReader& file, const h3::H3Config& cfg,
                                             const h3::ClipGeometry& g, std::optional<std::string>& pixel_frame_text);
// --mask: "video_mask" f32 [T, Hl, Wl] and/or "audio_mask" f32 [2, A].
Status load_mask(const SafetensorsReader& file, const h3::ClipGeometry& g, h3::Conditioning& c);

// ---- generate ---------------------------------------------------------------------
// A float tensor (F32, BF16 or F16) of rank `ndim` as fp32 values; `shape` gets its shape.
Expected<std::vector<float>> read_float_tensor(const SafetensorsReader& f, const std::string& name, int ndim,
                                               std::vector<int64_t>& shape);
Status load_video_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::VideoLatent& out);
Status load_audio_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::AudioLatent& out);
// A generate keyframe's latents (video required, audio optional; Hl, Wl the clip's).
Status load_generate_keyframe(const SafetensorsReader& f, const h3::H3Config& cfg, const h3::ClipGeometry& g,
                              h3::Keyframe& kf);
Status load_reference(const SafetensorsReader& f, const h3::H3Config& cfg, h3::Reference& ref);
// --text: "text" [L, text_dim] or [1, L, text_dim] (ComfyUI's cross_attn), optional
// "negative" likewise (dtype and width are the session's to check). Views into the file.
struct TextViews {
  TensorView text, negative;  // negative empty when the file has none
};
Expected<TextViews> load_text_states(const SafetensorsReader& f);

}  // namespace ls::cli
