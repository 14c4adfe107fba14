// The C API (include/layerstream/layerstream.h) through liblayerstream: statuses and
// messages, params versioning by `size`, the numerics refusals, the dry run, one
// denoiser call whose bytes do not depend on the memory mode (exactness through the
// API), the report and the fingerprint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_test_util.h"
#include "layerstream/layerstream.h"
#include "layerstream/layerstream.hpp"

namespace {

using ls_api_test::fill;
using ls_api_test::Inputs;
using ls_api_test::make_inputs;
using ls_api_test::tiny;

using ls_api_test::Out;

Out denoise(ls_engine* e, const Inputs& in, float sigma = 0.7f) {
  Out o = ls_api_test::denoise_call(e, in, sigma);
  EXPECT_EQ(o.status, LS_OK) << ls_engine_last_error(e);
  return o;
}

TEST(Api, StatusStringsAndVersion) {
  EXPECT_STREQ(ls_status_string(LS_OK), "ok");
  EXPECT_STREQ(ls_status_string(LS_OUT_OF_BUDGET), "out_of_budget");
  EXPECT_STREQ(ls_status_string(LS_NONFINITE), "nonfinite");
  EXPECT_NE(std::string(ls_version()).find("layerstream "), std::string::npos);
}

TEST(Api, CreateFailuresSetTheThreadLocalMessage) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  ls_engine* e = reinterpret_cast<ls_engine*>(1);
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);  // neither model nor preset
  EXPECT_EQ(e, nullptr);
  EXPECT_NE(std::string(ls_last_error()).find("preset"), std::string::npos);
  p.preset = "no-such-preset";
  EXPECT_NE(ls_engine_create(&p, &e), LS_OK);
  EXPECT_NE(std::string(ls_last_error()), "");
  p.preset = nullptr;
  p.model_path = "/nonexistent/h3.safetensors";
  EXPECT_EQ(ls_engine_create(&p, &e), LS_NOT_FOUND) << ls_last_error();  // ls::ErrorCode::not_found
  ls_engine_params_init(&p);
  p.preset = "tiny";
  p.memory_mode = LS_MEMORY_VRAM_BUDGET;
  p.vram_budget = 1ull << 30;
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);  // the CPU has no device memory
  EXPECT_NE(std::string(ls_last_error()).find("CPU"), std::string::npos);
  // prefetch: 0 one slot, 1 (default) two or the planner's one, 2 always two; else refused
  // by the range table; and, a vram budget's choice, refused without one (API 5: it was
  // ignored; tests/data/memory_doors.json has the table every door answers alike).
  ls_engine_params_init(&p);
  p.preset = "tiny";
  for (int32_t bad : {-1, 3}) {
    p.prefetch = bad;
    EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(ls_last_error()).find("prefetch must be an integer in 0..2"), std::string::npos)
        << ls_last_error();
  }
  for (int32_t without_budget : {0, 2}) {
    p.prefetch = without_budget;
    EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT) << without_budget;
    EXPECT_NE(std::string(ls_last_error()).find("goes with vram_budget"), std::string::npos) << ls_last_error();
  }
  p.prefetch = 1;  // the default
  ASSERT_EQ(ls_engine_create(&p, &e), LS_OK) << ls_last_error();
  ls_engine_free(e);
  ls_memory_request r;
  ls_memory_request_init(&r);
  r.mode = LS_MEMORY_VRAM_BUDGET;
  r.vram_budget = int64_t{1} << 30;
  for (int64_t good : {0, 1, 2}) {
    r.prefetch = good;
    EXPECT_EQ(ls_memory_validate(&r, "cuda"), LS_OK) << ls_last_error();
  }
}

TEST(Api, ParamsSizeVersioning) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  ls_engine* e = nullptr;
  p.size = 0;  // not initialised
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ls_last_error()).find("_init"), std::string::npos);
  p.size = sizeof p + 8;  // a newer header than the library
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);
  // An older, shorter struct: the fields it lacks take their defaults.
  p.size = static_cast<uint32_t>(offsetof(ls_engine_params, device));
  ASSERT_EQ(ls_engine_create(&p, &e), LS_OK) << ls_last_error();
  ls_engine_free(e);
}

TEST(Api, NumericsReachTheBackend) {
  // cuDNN attention is a CUDA algorithm: the CPU backend's set_numerics refuses it.
  ls_numerics n;
  ls_numerics_init(&n);
  n.attention = LS_ATTENTION_CUDNN;
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  p.numerics = &n;
  ls_engine* e = nullptr;
  EXPECT_EQ(ls_engine_create(&p, &e), LS_UNSUPPORTED);
  EXPECT_NE(std::string(ls_last_error()).find("attention"), std::string::npos);
  n.attention = LS_ATTENTION_HOPPER;  // likewise the Hopper kernel (CUDA on sm_90 only)
  EXPECT_EQ(ls_engine_create(&p, &e), LS_UNSUPPORTED);
  EXPECT_NE(std::string(ls_last_error()).find("Hopper"), std::string::npos) << ls_last_error();
  n.attention = LS_ATTENTION_INT8;  // the CPU runs the INT8 reference (issue 26; tiny: head dim 64)
  {
    ls_engine* e8 = nullptr;
    ASSERT_EQ(ls_engine_create(&p, &e8), LS_OK) << ls_last_error();
    layerstream::EnginePtr owned8(e8);
  }
  {
    const int32_t bad = 5;  // not an ls_attention (stored as an int: the enum's own range is 0..4)
    std::memcpy(static_cast<void*>(&n.attention), &bad, sizeof bad);
  }
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);
  ls_numerics_init(&n);
  n.cudnn_q_chunk = 100;  // not a multiple of 64: ls::validate names the field
  EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ls_last_error()).find("cudnn_q_chunk"), std::string::npos) << ls_last_error();
  ls_numerics_init(&n);
  n.attention = LS_ATTENTION_NATIVE;  // the CPU reference's one algorithm
  n.kv_tile = 8;
  ASSERT_EQ(ls_engine_create(&p, &e), LS_OK) << ls_last_error();
  layerstream::EnginePtr owned(e);
  Inputs in = make_inputs(e);
  const char* json = nullptr;
  ASSERT_EQ(ls_engine_plan(e, &in.clip, 0.7f, &json), LS_OK) << ls_engine_last_error(e);
  auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["plan"]["kv_tile"], 8);
  EXPECT_EQ(j["numerics"]["kv_tile"], 8);
  EXPECT_EQ(j["numerics"]["attention"], "native");
}

TEST(Api, MemoryModesGiveTheSameBytes) {
  auto stock = tiny();
  ASSERT_TRUE(stock);
  Inputs in = make_inputs(stock.get());
  ASSERT_GT(in.shape.S, 100);
  double norm = 0;
  for (float v : in.video) norm += std::fabs(v);
  ASSERT_GT(norm, 0.0);
  const Out a = denoise(stock.get(), in);
  ASSERT_NE(a.hash, 0u);
  EXPECT_EQ(a.hash, ls_fingerprint(a.video.data(), a.video.size(), a.audio.data(), a.audio.size()));
  double out_norm = 0;
  for (float v : a.video) out_norm += std::fabs(v);
  EXPECT_GT(out_norm, 0.0);

  auto sliced = tiny([](ls_engine_params& p) { p.mlp_chunk = 7, p.attn_chunk = 9, p.final_chunk = 5; });
  const Out b = denoise(sliced.get(), in);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(0, std::memcmp(a.video.data(), b.video.data(), a.video.size() * sizeof(float)));

  auto budget = tiny([](ls_engine_params& p) {
    p.memory_mode = LS_MEMORY_ACTIVATION_BUDGET;
    p.activation_budget = 100 << 10;
  });
  const Out c = denoise(budget.get(), in);
  EXPECT_EQ(a.hash, c.hash);
  const char* rep = nullptr;
  ASSERT_EQ(ls_engine_report_json(budget.get(), &rep), LS_OK);
  auto j = nlohmann::json::parse(rep);
  EXPECT_FALSE(j["plan"]["stock"].get<bool>());
  EXPECT_EQ(j["output_hash"].get<std::string>().size(), 16u);
  EXPECT_TRUE(j.contains("version") && j.contains("numerics"));

  // Another sigma: other bytes (the fingerprint is not constant).
  const Out d = denoise(stock.get(), in, 0.3f);
  EXPECT_NE(a.hash, d.hash);
}

TEST(Api, RefinedTextGivesTheSameBytes) {
  auto e = tiny();
  Inputs in = make_inputs(e.get());
  const Out a = denoise(e.get(), in);
  const ls_model_info& m = in.info;
  std::vector<uint16_t> refined(static_cast<size_t>(in.clip.text_tokens * m.hidden));
  ASSERT_EQ(ls_engine_refine_text(e.get(), in.text.data(), in.clip.text_tokens, refined.data(), refined.size()), LS_OK)
      << ls_engine_last_error(e.get());
  Out b;
  b.video.resize(a.video.size()), b.audio.resize(a.audio.size());
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  d.clip = &in.clip, d.video = in.video.data(), d.audio = in.audio.data(), d.refined_text = refined.data();
  d.sigma = 0.7f;
  d.video_out = b.video.data(), d.video_out_count = b.video.size();
  d.audio_out = b.audio.data(), d.audio_out_count = b.audio.size();
  ASSERT_EQ(ls_engine_denoise(e.get(), &d), LS_OK) << ls_engine_last_error(e.get());
  EXPECT_EQ(a.hash, ls_engine_output_hash(e.get()));
}

TEST(Api, BadShapesAndBudgetsAreRefusedWithAMessage) {
  auto e = tiny();
  Inputs in = make_inputs(e.get());
  std::vector<float> vo(in.shape.video_count - 1), ao(in.shape.audio_count);
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  d.clip = &in.clip, d.video = in.video.data(), d.audio = in.audio.data(), d.text = in.text.data(), d.sigma = 0.7f;
  d.video_out = vo.data(), d.video_out_count = vo.size(), d.audio_out = ao.data(), d.audio_out_count = ao.size();
  EXPECT_EQ(ls_engine_denoise(e.get(), &d), LS_INVALID_ARGUMENT);
  EXPECT_NE(layerstream::last_error(e.get()).find("video_out_count"), std::string::npos);
  const char* rep = nullptr;
  EXPECT_EQ(ls_engine_report_json(e.get(), &rep), LS_NOT_FOUND);

  auto small = tiny([](ls_engine_params& p) {
    p.memory_mode = LS_MEMORY_ACTIVATION_BUDGET;
    p.activation_budget = 1024;
  });
  const char* json = nullptr;
  EXPECT_EQ(ls_engine_plan(small.get(), &in.clip, 0.7f, &json), LS_OUT_OF_BUDGET);
  EXPECT_NE(layerstream::last_error(small.get()).find("smallest budget"), std::string::npos);
}

TEST(Api, GenerateMatchesAcrossMemoryModes) {
  auto a = tiny();
  auto b = tiny([](ls_engine_params& p) { p.mlp_chunk = 64, p.attn_chunk = 32, p.final_chunk = 16; });
  Inputs in = make_inputs(a.get());
  std::vector<float> neg(static_cast<size_t>(in.shape.text_count / 8 * 5));
  fill(neg, 9);
  uint64_t h[2];
  ls_engine* es[2] = {a.get(), b.get()};
  for (int i = 0; i < 2; ++i) {
    std::vector<float> vo(in.shape.video_count), ao(in.shape.audio_count);
    ls_generate_params g;
    ls_generate_params_init(&g);
    g.clip = &in.clip, g.steps = 2, g.cfg = 2.0, g.seed = 5, g.text = in.text.data();
    g.negative = neg.data(), g.negative_tokens = 5;
    g.video_out = vo.data(), g.video_out_count = vo.size(), g.audio_out = ao.data(), g.audio_out_count = ao.size();
    ASSERT_EQ(ls_engine_generate(es[i], &g), LS_OK) << ls_engine_last_error(es[i]);
    h[i] = ls_engine_output_hash(es[i]);
  }
  EXPECT_NE(h[0], 0u);
  EXPECT_EQ(h[0], h[1]);
}

}  // namespace

// ---- API version 2: ls_tensor inputs and outputs -------------------------------------
namespace {

uint16_t bf16_bits(float f) {  // round to nearest even (the library's rule)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// A host tensor of `data` with the given shape (row-major strides).
ls_tensor host(void* data, ls_dtype dt, std::vector<int64_t> shape) {
  ls_tensor t;
  ls_tensor_host(&t, data, dt, static_cast<int32_t>(shape.size()), shape.data());
  return t;
}

}  // namespace

TEST(Api, TensorInputsGiveThePointerBytes) {
  auto e = tiny();
  Inputs in = make_inputs(e.get());
  const Out ref = denoise(e.get(), in);
  const ls_model_info& info = in.info;
  const int64_t C = info.latents_dim, T = in.shape.T, H = in.shape.Hl, W = in.shape.Wl;
  // video as bf16 (the inputs are bf16-exact), with a leading 1; audio strided (every
  // other float of a larger buffer); text as f32 with column-major strides.
  std::vector<uint16_t> vb(in.video.size());
  for (size_t i = 0; i < vb.size(); ++i) vb[i] = bf16_bits(in.video[i]);
  std::vector<float> ab(2 * in.audio.size(), -99.0f);
  for (size_t i = 0; i < in.audio.size(); ++i) ab[2 * i] = in.audio[i];
  std::vector<float> tc(in.text.size());
  const int64_t L = in.clip.text_tokens, D = info.text_dim;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t d = 0; d < D; ++d) tc[static_cast<size_t>(d * L + l)] = in.text[static_cast<size_t>(l * D + d)];
  ls_tensor v = host(vb.data(), LS_DTYPE_BF16, {1, C, T, H, W});
  ls_tensor a = host(ab.data(), LS_DTYPE_F32, {info.audio_latents_dim, 2, in.shape.A});
  for (int i = 0; i < 3; ++i) a.strides[i] *= 2;
  ls_tensor t = host(tc.data(), LS_DTYPE_F32, {L, D});
  t.strides[0] = 1, t.strides[1] = L;
  // outputs: video as bf16, audio f32 strided
  std::vector<uint16_t> vo(in.video.size(), 0xffff);
  std::vector<float> ao(2 * in.audio.size(), 5.0f);
  ls_tensor vot = host(vo.data(), LS_DTYPE_BF16, {C, T, H, W});
  ls_tensor aot = host(ao.data(), LS_DTYPE_F32, {info.audio_latents_dim, 2, in.shape.A});
  for (int i = 0; i < 3; ++i) aot.strides[i] *= 2;
  ls_denoise_params d;
  ls_denoise_params_init(&d);
  d.clip = &in.clip, d.sigma = 0.7f;
  d.video_tensor = &v, d.audio_tensor = &a, d.text_tensor = &t, d.video_out_tensor = &vot, d.audio_out_tensor = &aot;
  ASSERT_EQ(ls_engine_denoise(e.get(), &d), LS_OK) << ls_engine_last_error(e.get());
  EXPECT_EQ(ls_engine_output_hash(e.get()), ref.hash);  // the fp32 velocities' fingerprint
  for (size_t i = 0; i < ref.video.size(); ++i) ASSERT_EQ(vo[i], bf16_bits(ref.video[i])) << i;
  for (size_t i = 0; i < ref.audio.size(); ++i) {
    ASSERT_EQ(std::memcmp(&ao[2 * i], &ref.audio[i], 4), 0) << i;
    ASSERT_EQ(ao[2 * i + 1], 5.0f) << i;  // the gaps untouched
  }
}

TEST(Api, TensorRefusals) {
  auto e = tiny();
  Inputs in = make_inputs(e.get());
  Out o;
  o.video.resize(in.shape.video_count), o.audio.resize(in.shape.audio_count);
  const ls_model_info& info = in.info;
  const int64_t C = info.latents_dim, T = in.shape.T, H = in.shape.Hl, W = in.shape.Wl;
  ls_tensor v = host(in.video.data(), LS_DTYPE_F32, {C, T, H, W});
  auto call = [&](auto tweak) {
    ls_denoise_params d;
    ls_denoise_params_init(&d);
    d.clip = &in.clip, d.sigma = 0.7f, d.video_tensor = &v, d.audio = in.audio.data(), d.text = in.text.data();
    d.video_out = o.video.data(), d.video_out_count = o.video.size();
    d.audio_out = o.audio.data(), d.audio_out_count = o.audio.size();
    tweak(d);
    const ls_status s = ls_engine_denoise(e.get(), &d);
    return std::make_pair(s, std::string(ls_engine_last_error(e.get())));
  };
  auto r = call([](ls_denoise_params&) {});
  ASSERT_EQ(r.first, LS_OK) << r.second;
  r = call([&](ls_denoise_params& d) { d.video = in.video.data(); });
  EXPECT_EQ(r.first, LS_INVALID_ARGUMENT);
  EXPECT_NE(r.second.find("give video or video_tensor, not both"), std::string::npos) << r.second;
  ls_tensor bad = host(in.video.data(), LS_DTYPE_F32, {C, T, H, W - 1});
  r = call([&](ls_denoise_params& d) { d.video_tensor = &bad; });
  EXPECT_EQ(r.first, LS_INVALID_ARGUMENT);
  EXPECT_NE(r.second.find("video_tensor has shape [" + std::to_string(C)), std::string::npos) << r.second;
  ls_tensor cuda = v;
  cuda.device_type = LS_DEVICE_CUDA;
  r = call([&](ls_denoise_params& d) { d.video_tensor = &cuda; });
  EXPECT_EQ(r.first, LS_INVALID_ARGUMENT);
  EXPECT_NE(r.second.find("is on cuda:0 but the engine runs on cpu"), std::string::npos) << r.second;
  ls_tensor neg = v;
  neg.strides[0] = -1;
  r = call([&](ls_denoise_params& d) { d.video_tensor = &neg; });
  EXPECT_NE(r.second.find("negative stride"), std::string::npos) << r.second;
  ls_tensor unset = v;
  unset.size = 0;
  r = call([&](ls_denoise_params& d) { d.video_tensor = &unset; });
  EXPECT_NE(r.second.find("ls_tensor_init"), std::string::npos) << r.second;
  // an output with overlapping elements
  ls_tensor overlap = host(o.audio.data(), LS_DTYPE_F32, {info.audio_latents_dim, 2, in.shape.A});
  overlap.strides[0] = 0;
  r = call([&](ls_denoise_params& d) { d.audio_out = nullptr, d.audio_out_tensor = &overlap; });
  EXPECT_NE(r.second.find("zero stride"), std::string::npos) << r.second;
  // both forms of a mask; a keyframe in tensor form beside one in pointer form
  std::vector<float> mask(static_cast<size_t>(T * H * W), 1.0f);
  ls_tensor m = host(mask.data(), LS_DTYPE_F32, {T, H, W});
  in.clip.video_mask = mask.data(), in.clip.video_mask_tensor = &m;
  r = call([](ls_denoise_params&) {});
  EXPECT_NE(r.second.find("give video_mask or video_mask_tensor, not both"), std::string::npos) << r.second;
  in.clip.video_mask = nullptr, in.clip.video_mask_tensor = nullptr;
  ls_tensor kv = host(in.video.data(), LS_DTYPE_F32, {C, 1, H, W});
  ls_keyframe_tensors k;
  ls_keyframe_tensors_init(&k);
  k.video = &kv;
  const ls_keyframe_tensors* kp = &k;
  ls_keyframe pk{};
  pk.video = {in.video.data(), 1, H, W};
  in.clip.keyframe_tensors = &kp, in.clip.keyframe_tensor_count = 1;
  in.clip.keyframes = &pk, in.clip.keyframe_count = 1;
  r = call([](ls_denoise_params&) {});
  EXPECT_NE(r.second.find("give keyframes or keyframe_tensors, not both"), std::string::npos) << r.second;
}

TEST(Api, KeyframeAndMaskTensorsEqualPointerForms) {
  auto e = tiny();
  Inputs in = make_inputs(e.get());
  const ls_model_info& info = in.info;
  const int64_t C = info.latents_dim, T = in.shape.T, H = in.shape.Hl, W = in.shape.Wl;
  std::vector<float> kvid(static_cast<size_t>(C * H * W)), mask(static_cast<size_t>(T * H * W));
  fill(kvid, 7);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<float>(i % 3 != 0);
  const Out plain = denoise(e.get(), in);
  ls_keyframe pk{};
  pk.pixel_frame = 0;
  pk.video = {kvid.data(), 1, H, W};
  in.clip.keyframes = &pk, in.clip.keyframe_count = 1, in.clip.video_mask = mask.data();
  const Out ptr = denoise(e.get(), in);
  EXPECT_NE(ptr.hash, plain.hash);  // the keyframe and mask matter
  in.clip.keyframes = nullptr, in.clip.keyframe_count = 0, in.clip.video_mask = nullptr;
  std::vector<uint16_t> kb(kvid.size());
  for (size_t i = 0; i < kb.size(); ++i) kb[i] = bf16_bits(kvid[i]);  // bf16-exact values
  ls_tensor kv = host(kb.data(), LS_DTYPE_BF16, {C, 1, H, W});
  ls_tensor m = host(mask.data(), LS_DTYPE_F32, {1, 1, T, H, W});
  ls_keyframe_tensors k;
  ls_keyframe_tensors_init(&k);
  k.video = &kv;
  const ls_keyframe_tensors* kp = &k;
  in.clip.keyframe_tensors = &kp, in.clip.keyframe_tensor_count = 1, in.clip.video_mask_tensor = &m;
  const Out ten = denoise(e.get(), in);
  EXPECT_EQ(ten.hash, ptr.hash);
  EXPECT_EQ(std::memcmp(ten.video.data(), ptr.video.data(), ptr.video.size() * 4), 0);
}
