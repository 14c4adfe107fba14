// Initial noise for a sampling run (h3-model.md §6.1: ComfyUI seeds a CPU generator
// with torch.manual_seed(seed) and draws torch.randn for the video latent first, then
// for the audio latent from the same, continuing stream).
//
// TorchCpuGenerator (model/h3/torch_random.h) restates that generator so a stream can be
// continued across draws (torch_cpu_randn there is its one-shot form, for the condition
// latents' noise augmentation; tests/test_sample_noise.cpp checks the two agree):
//  - MT19937 seeded with the low 32 bits of the seed (the standard initialisation);
//  - randn(n), n >= 16: n uniforms u = (next32 & (2^24-1)) * 2^-24 (exact fp32), then
//    Box-Muller over blocks of 16 (pairs j, j+8; radius = sqrt(-2 log(1-u_j)),
//    theta = fl32(2*pi*u_{j+8}) with pi in double, cos to j and sin to j+8, fp32 libm);
//    if n % 16 != 0 the last 16 values are recomputed from 16 fresh uniforms;
//  - randn(n), n < 16: per value, torch's double normal_distribution (two 53-bit
//    uniforms from 64-bit draws, Box-Muller in double, the sine value cached for the
//    next call), rounded to fp32.
// What is NOT bit-exact against PyTorch: x86 builds of PyTorch evaluate the n >= 16
// transform with AVX2 SLEEF log/sin/cos (1-ulp functions), so individual values can
// differ from this scalar restatement in the last bit or so. The uniform stream, the
// order of draws and the block structure are the same, so the noise is the same up to
// that rounding. Bit-exact PyTorch CPU randn is out of scope.
#pragma once

#include <cstdint>
#include <vector>

#include "model/h3/torch_random.h"

namespace ls::sample {

// The generator (model/h3/torch_random.h, where the condition noise draws from it too).
using TorchCpuGenerator = h3::TorchCpuGenerator;

// The packed initial noise of a t2va run: fp32 [video_elems + audio_elems], video
// noise first, audio continuing the same stream (two randn calls).
std::vector<float> packed_noise(uint64_t seed, int64_t video_elems, int64_t audio_elems);

}  // namespace ls::sample
