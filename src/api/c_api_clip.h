// ls_clip -> h3::Conditioning (the clip's grid, keyframes, references, masks and
// numbers, checked against the range table), and the clip's latent sizes.
// Part of the C API (src/api/c_api_internal.h lists its files).
#pragma once

#include <cstddef>

#include "api/c_api_internal.h"
#include "api/c_api_tensor.h"

namespace ls::capi {

// The clip as the engine's conditioning; device tensors in it are staged through io.
Expected<ls::h3::Conditioning> conditioning(const ls::h3::H3Config& cfg, const ls_clip* given, TensorIO& io);

// Floats of the clip's video latent [latents_dim, T, Hl, Wl] and audio latent [audio_latents_dim, 2, A].
size_t video_count(const ls::h3::H3Config& cfg, const ls::h3::ClipGeometry& g);
size_t audio_count(const ls::h3::H3Config& cfg, const ls::h3::ClipGeometry& g);

}  // namespace ls::capi
