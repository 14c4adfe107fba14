// The C API's ls_engine_params.devices (sequence parallel, docs/multi-gpu.md): "cpu*2"
// gives the bytes of one device; a bad list or a count that does not divide the heads
// is LS_INVALID_ARGUMENT with a message; the report names the ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layerstream/layerstream.h"

namespace {

struct Outcome {
  std::vector<float> video, audio;
  uint64_t hash = 0;
  std::string report;
};

// The tiny preset (2 heads) on `devices` (NULL = the CPU alone).
Outcome run(const char* devices, ls_status* create_status = nullptr) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  p.devices = devices;
  p.attn_chunk = 9;
  ls_engine* e = nullptr;
  const ls_status s = ls_engine_create(&p, &e);
  if (create_status) *create_status = s;
  Outcome r;
  if (s != LS_OK) return r;
  ls_clip clip;
  ls_clip_init(&clip);
  clip.frames = 22, clip.width = 64, clip.height = 64, clip.text_tokens = 8;
  ls_clip_shape shape;
  ls_clip_shape_init(&shape);
  EXPECT_EQ(ls_engine_clip_shape(e, &clip, &shape), LS_OK);
  std::vector<float> video(shape.video_count), audio(shape.audio_count), text(shape.text_count);
  for (size_t i = 0; i < video.size(); ++i) video[i] = static_cast<float>((i * 37 + 11) % 97) / 64.0f - 0.75f;
  for (size_t i = 0; i < audio.size(); ++i) audio[i] = static_cast<float>((i * 37 + 22) % 97) / 64.0f - 0.75f;
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<float>((i * 37 + 33) % 97) / 64.0f - 0.75f;
  r.video.resize(shape.video_count), r.audio.resize(shape.audio_count);
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  d.clip = &clip, d.video = video.data(), d.audio = audio.data(), d.text = text.data(), d.sigma = 0.7f;
  d.video_out = r.video.data(), d.video_out_count = r.video.size();
  d.audio_out = r.audio.data(), d.audio_out_count = r.audio.size();
  EXPECT_EQ(ls_engine_denoise(e, &d), LS_OK) << ls_engine_last_error(e);
  r.hash = ls_engine_output_hash(e);
  const char* rep = nullptr;
  if (ls_engine_report_json(e, &rep) == LS_OK && rep) r.report = rep;
  ls_engine_free(e);
  return r;
}

}  // namespace

TEST(ApiDevices, CpuRanksGiveOneDevicesBytes) {
  const Outcome one = run(nullptr);
  ASSERT_NE(one.hash, 0u);
  const Outcome two = run("cpu*2");
  EXPECT_EQ(one.hash, two.hash);
  ASSERT_EQ(one.video.size(), two.video.size());
  EXPECT_EQ(0, std::memcmp(one.video.data(), two.video.data(), one.video.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.audio.data(), two.audio.data(), one.audio.size() * sizeof(float)));
  EXPECT_NE(two.report.find("\"ranks\""), std::string::npos) << two.report;
}

TEST(ApiDevices, BadListsAreRefused) {
  for (const char* d : {"cpu*3", "cpu,cuda:0", "gpu", ""}) {
    ls_status s = LS_OK;
    run(d, &s);
    EXPECT_EQ(s, LS_INVALID_ARGUMENT) << d << ": " << ls_last_error();
  }
}
