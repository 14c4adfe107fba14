#include "sample/noise.h"

namespace ls::sample {

std::vector<float> packed_noise(uint64_t seed, int64_t video_elems, int64_t audio_elems) {
  TorchCpuGenerator gen(seed);
  std::vector<float> noise = gen.randn(video_elems);
  const std::vector<float> audio = gen.randn(audio_elems);
  noise.insert(noise.end(), audio.begin(), audio.end());
  return noise;
}

}  // namespace ls::sample
