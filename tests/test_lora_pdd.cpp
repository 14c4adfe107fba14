// PDD bank LoRAs (issue 17 item 4; docs/lora.md "PDD LoRAs"): a LoRA whose .set_weight /
// .set_bias enlarge final_layer.video_out and audio_out into a bank of n heads (ComfyUI PR
// #15908). The LoRA source enlarges the four head tensors' specs, sets cfg.pdd_heads = n and
// hands out exactly the bank (T(value) in the merge dtype); same-shape .set_bias wins over
// .diff_b; the banks ComfyUI's FinalLayer could not run are refused by name; a forward with
// the LoRA is the forward of a model whose heads are that bank (memcmp), for every plan.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "exactness_util.h"
#include "file_test_util.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/lora_source.h"

using namespace ls;

namespace {

using T = test::TensorValues;  // stored with dtype's rounding

using test::randoms;

class LoraPdd : public test::TempDirTest {
 protected:
  LoraPdd() : TempDirTest("ls_lora_pdd") {}
  // The four set tensors of an n-head bank (f32 values; row block 0 a full head, the others
  // small offsets, as the released banks are), keyed as Kijai's converted files name them.
  std::map<std::string, T> bank(int64_t nv, int64_t na, uint32_t seed, bool biases = true) const {
    std::map<std::string, T> m;
    auto head = [&](const std::string& h, int64_t n, int64_t width, uint32_t s) {
      std::vector<float> w = randoms(n * width * D_, s, 0.02f), b = randoms(n * width, s + 1, 0.02f);
      for (int64_t i = width * D_; i < n * width * D_; ++i) w[static_cast<size_t>(i)] *= 0.01f;
      m["diffusion_model.final_layer." + h + ".set_weight"] = T{DType::f32, {n * width, D_}, w};
      if (biases) m["diffusion_model.final_layer." + h + ".set_bias"] = T{DType::f32, {n * width}, b};
    };
    head("video_out", nv, pv_, seed);
    head("audio_out", na, pa_, seed + 10);
    return m;
  }
  std::string put(const std::map<std::string, T>& tensors) {
    const std::string p = file(std::to_string(files_++) + ".safetensors");
    test::write_tensors(p, tensors);
    return p;
  }
  Expected<std::unique_ptr<lora::LoraSource>> wrap(const std::vector<lora::LoraFile>& files, lora::MergeDtype dt,
                                                   uint64_t seed = 3) const {
    auto inner = std::make_unique<h3::H3SyntheticSource>(cfg_, seed);
    LS_ASSIGN_OR_RETURN(lora::LoraSet set, lora::LoraSet::open(files, inner->specs()));
    return lora::LoraSource::wrap(std::move(inner), std::move(set), dt);
  }
  std::string refusal(const std::map<std::string, T>& tensors) {
    auto s = wrap({{put(tensors), 1.0}}, lora::MergeDtype::f32);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.error().message;
  }
  const h3::H3Config cfg_ = *h3::h3_preset("tiny");
  const int64_t pv_ = cfg_.video_patch_dim(), pa_ = cfg_.audio_latents_dim, D_ = cfg_.hidden;
  int files_ = 0;
};

float f16_round(float x) { return f16_to_f32(f32_to_f16(x)); }

TEST_F(LoraPdd, TheSourceHandsOutTheBankAndItsConfig) {
  const int64_t n = 4;
  const std::map<std::string, T> b = bank(n, n, 7);
  const std::string p = put(b);
  for (lora::MergeDtype dt : {lora::MergeDtype::f32, lora::MergeDtype::f16, lora::MergeDtype::bf16}) {
    SCOPED_TRACE(lora::merge_dtype_name(dt));
    auto src = wrap({{p, 0.5}}, dt);  // a set ignores the strength (ComfyUI's copy_)
    ASSERT_TRUE(src.ok()) << src.error().message;
    const lora::LoraSource& s = **src;
    EXPECT_EQ(s.cfg().pdd_heads, n);
    EXPECT_NE(s.describe().find("PDD head bank of 4 heads"), std::string::npos) << s.describe();
    // The specs are h3_tensor_specs of the banked config (the planner and the store agree).
    const std::vector<h3::TensorSpec> want = h3::h3_tensor_specs(s.cfg());
    ASSERT_EQ(s.specs().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(s.specs()[i].name, want[i].name);
      EXPECT_EQ(s.specs()[i].shape, want[i].shape) << want[i].name;
    }
    for (const char* h : {"video_out", "audio_out"})
      for (const char* part : {"weight", "bias"}) {
        const std::string name = std::string("final_layer.") + h + "." + part;
        const T& t = b.at(std::string("diffusion_model.final_layer.") + h + (part[0] == 'w' ? ".set_weight" : ".set_bias"));
        const TensorView v = s.get(name);
        ASSERT_EQ(v.dtype, DType::f32);
        ASSERT_EQ(v.numel(), static_cast<int64_t>(t.values.size())) << name;
        // f32: the values; f16 and the cast-time mode (ComfyUI force-loads a resizing module
        // through patch_weight_to_device in its LoRA compute dtype, fp16): rounded to fp16.
        int64_t differ = 0;
        for (size_t i = 0; i < t.values.size(); ++i) {
          const float w = dt == lora::MergeDtype::f32 ? t.values[i] : f16_round(t.values[i]);
          const float g = v.ptr<float>()[i];
          ASSERT_EQ(std::memcmp(&g, &w, 4), 0) << name << "[" << i << "]";
          differ += g != t.values[i];
        }
        if (dt != lora::MergeDtype::f32) {
          EXPECT_GT(differ, 0) << name << ": fp16 rounding changed nothing";
        }
      }
  }
}

// A same-shape .set_bias replaces the bias (and wins over a .diff_b of the same layer, as
// load_lora registers it last); the cast-time mode merges an fp32 weight in fp32.
TEST_F(LoraPdd, SameShapeSetBiasAndFp32WeightsInTheCastTimeMode) {
  std::map<std::string, T> m;
  const std::vector<float> sb = randoms(pv_, 5, 0.1f), db = randoms(pv_, 6, 0.1f);
  m["final_layer.video_out.set_bias"] = T{DType::f32, {pv_}, sb};
  m["final_layer.video_out.diff_b"] = T{DType::f32, {pv_}, db};
  m["video_patch_proj.diff"] = T{DType::f32, {D_, pv_}, randoms(D_ * pv_, 8, 0.01f)};
  const std::string p = put(m);
  auto f32 = wrap({{p, 1.0}}, lora::MergeDtype::f32);
  auto cast = wrap({{p, 1.0}}, lora::MergeDtype::bf16);
  ASSERT_TRUE(f32.ok() && cast.ok());
  EXPECT_EQ((*f32)->cfg().pdd_heads, 1);
  const TensorView b = (*f32)->get("final_layer.video_out.bias");
  ASSERT_EQ(b.numel(), pv_);
  EXPECT_EQ(std::memcmp(b.data, sb.data(), static_cast<size_t>(pv_) * 4), 0);
  const TensorView a = (*f32)->get("video_patch_proj.weight"), c = (*cast)->get("video_patch_proj.weight");
  EXPECT_EQ(std::memcmp(a.data, c.data, static_cast<size_t>(a.nbytes())), 0)
      << "an fp32 weight's cast-time patch is computed in fp32 (ComfyUI casts it to fp32)";
  EXPECT_EQ((*cast)->merge_dtype_of("video_patch_proj.weight"), lora::MergeDtype::f32);
  EXPECT_EQ((*cast)->merge_dtype_of("blocks.0.attn.qkv_proj.weight"), lora::MergeDtype::bf16);
}

TEST_F(LoraPdd, BanksComfyUICannotRunAreRefused) {
  // Only one head banked (weight and bias).
  {
    std::map<std::string, T> m = bank(4, 1, 1);
    m.erase("diffusion_model.final_layer.audio_out.set_weight");
    m.erase("diffusion_model.final_layer.audio_out.set_bias");
    const std::string e = refusal(m);
    EXPECT_NE(e.find("final_layer.audio_out.weight holds 1 heads, video_out.weight 4"), std::string::npos) << e;
    EXPECT_NE(e.find("ComfyUI banks both heads with one n"), std::string::npos) << e;
  }
  {
    std::map<std::string, T> m = bank(1, 4, 1);
    m.erase("diffusion_model.final_layer.video_out.set_weight");
    m.erase("diffusion_model.final_layer.video_out.set_bias");
    const std::string e = refusal(m);
    EXPECT_NE(e.find("holds 4 heads, video_out.weight 1"), std::string::npos) << e;
  }
  // Different n on the two heads.
  EXPECT_NE(refusal(bank(4, 2, 2)).find("final_layer.audio_out.weight holds 2 heads, video_out.weight 4"),
            std::string::npos);
  // The bias not banked (ComfyUI's _pdd_head reshapes it into n blocks).
  {
    std::map<std::string, T> m = bank(3, 3, 3);
    m.erase("diffusion_model.final_layer.video_out.set_bias");
    const std::string e = refusal(m);
    EXPECT_NE(e.find("final_layer.video_out.bias is missing"), std::string::npos) << e;
    EXPECT_NE(e.find(".set_bias"), std::string::npos) << e;
  }
  // Rows that are no multiple of the head width.
  {
    std::map<std::string, T> m = bank(2, 2, 4);
    T& w = m.at("diffusion_model.final_layer.video_out.set_weight");
    w.shape[0] += 1;
    w.values.resize(static_cast<size_t>(w.shape[0] * D_), 0.0f);
    const std::string e = refusal(m);
    EXPECT_NE(e.find("final_layer.video_out.weight's rows are not a multiple of its head width"), std::string::npos) << e;
  }
  // Another patch on a banked head.
  {
    const std::string p = put(bank(2, 2, 5));
    std::map<std::string, T> d;
    d["final_layer.audio_out.diff"] = T{DType::f32, {pa_, D_}, randoms(pa_ * D_, 9, 0.01f)};
    auto s = wrap({{put(d), 1.0}, {p, 1.0}}, lora::MergeDtype::f32);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("enlarges final_layer.audio_out.weight into a PDD head bank"), std::string::npos)
        << s.error().message;
  }
  // Enlarging any other layer, or changing the heads' columns: refused when the file is read.
  {
    auto inner = std::make_unique<h3::H3SyntheticSource>(cfg_, 3);
    const h3::TensorSpec* q = inner->spec("blocks.0.attn.qkv_proj.weight");
    ASSERT_NE(q, nullptr);
    std::map<std::string, T> m;
    m["blocks.0.attn.qkv_proj.set_weight"] = T{DType::f32, {2 * q->shape[0], q->shape[1]}, randoms(2 * q->numel(), 1, 0.1f)};
    auto set = lora::LoraSet::open({{put(m), 1.0}}, inner->specs());
    ASSERT_FALSE(set.ok());
    EXPECT_NE(set.error().message.find("may enlarge only final_layer.video_out / audio_out"), std::string::npos)
        << set.error().message;
    std::map<std::string, T> c = bank(2, 2, 6);
    T& w = c.at("diffusion_model.final_layer.video_out.set_weight");
    w.shape[1] += 1;
    w.values.resize(static_cast<size_t>(w.shape[0] * w.shape[1]), 0.0f);
    set = lora::LoraSet::open({{put(c), 1.0}}, inner->specs());
    ASSERT_FALSE(set.ok());
    EXPECT_NE(set.error().message.find("final_layer.video_out.set_weight is ["), std::string::npos) << set.error().message;
  }
}

// The forward with a PDD LoRA is the forward of the banked model: every plan (slices, the
// final slice, residency) gives the all-resident stock bytes, and those are the bytes of a
// source whose heads are the bank (the synthetic model of the banked config with its heads
// replaced by the LoRA's values).
class BankedSource final : public h3::H3TensorSource {
 public:
  BankedSource(const h3::H3TensorSource& plain, const lora::LoraSource& with) : plain_(plain), with_(with) {
    set_specs(with.specs());
  }
  const h3::H3Config& cfg() const override { return with_.cfg(); }
  TensorView get(const std::string& n) const override {
    return lora::is_pdd_head_tensor(n) ? with_.get(n) : plain_.get(n);
  }
  bool has(const std::string& n) const override { return with_.has(n); }
  std::string describe() const override { return "banked"; }

 private:
  const h3::H3TensorSource& plain_;
  const lora::LoraSource& with_;
};

exec::ForwardResult forward(const h3::H3TensorSource& src, const h3::Conditioning& cond, test::Inputs& in,
                            const exec::Residency& res, const exec::Plan& p) {
  auto be = make_cpu_backend();
  exec::EngineOptions eo;
  eo.residency = res;
  eo.residency.release_source = false;
  auto e = exec::Engine::create(src, *be, eo);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return {};
  const h3::H3Config& c = src.cfg();
  auto t = (*e)->refine_text(in.text_view(c, cond));
  EXPECT_TRUE(t.ok());
  if (!t.ok()) return {};
  auto r = (*e)->forward(cond, *t, in.video_view(c, cond), in.audio_view(c, cond), 0.75f, p);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(*r) : exec::ForwardResult{};
}

TEST_F(LoraPdd, ForwardEqualsTheBankedModelForEveryPlan) {
  const std::string p = put(bank(4, 4, 11));
  auto src = wrap({{p, 1.0}}, lora::MergeDtype::f32, 21);
  ASSERT_TRUE(src.ok()) << src.error().message;
  const h3::H3Config& c = (*src)->cfg();
  ASSERT_EQ(c.pdd_heads, 4);
  std::mt19937_64 rng(5);
  h3::Conditioning cond = test::random_cond(rng, c, false);
  cond.sample_sigmas = {1.0f, 0.9f, 0.75f, 0.5f, 0.0f};
  test::Inputs in = test::random_inputs(rng, c, cond);
  auto stock = exec::make_plan(c, cond, exec::PlanKnobs{});
  ASSERT_TRUE(stock.ok());
  const exec::ForwardResult want = forward(**src, cond, in, exec::Residency{}, *stock);
  ASSERT_FALSE(want.video.empty());
  // The banked model (the plain model's weights, the bank's heads).
  h3::H3SyntheticSource plain(cfg_, 21);
  BankedSource banked(plain, **src);
  const exec::ForwardResult b = forward(banked, cond, in, exec::Residency{}, *stock);
  ASSERT_EQ(b.video.size(), want.video.size());
  EXPECT_EQ(std::memcmp(b.video.data(), want.video.data(), want.video.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b.audio.data(), want.audio.data(), want.audio.size() * 4), 0);
  // Not vacuous: the plain model's output differs.
  auto plain_plan = exec::make_plan(cfg_, cond, exec::PlanKnobs{});  // no PDD head buffers
  ASSERT_TRUE(plain_plan.ok());
  const exec::ForwardResult none = forward(plain, cond, in, exec::Residency{}, *plain_plan);
  ASSERT_EQ(none.video.size(), want.video.size());
  EXPECT_NE(std::memcmp(none.video.data(), want.video.data(), want.video.size() * 4), 0);
  // Plans and residencies.
  const int64_t S = stock->sizes.S, tr = stock->sizes.target_rows;
  for (int v = 0; v < 4; ++v) {
    exec::PlanKnobs k;
    k.attn_chunk_tokens = v == 0 ? 1 : 1 + (S * v) / 5;
    k.mlp_chunk_tokens = v == 1 ? 1 : 1 + (S * v) / 7;
    k.final_chunk_tokens = v == 2 ? 1 : std::max<int64_t>(1, tr - v);
    k.kv_offload = v % 2 == 1;
    k.residual_offload = v == 3;
    auto pl = exec::make_plan(c, cond, k);
    ASSERT_TRUE(pl.ok()) << pl.error().message;
    exec::Residency res;
    res.resident_blocks = v % 2 == 0 ? 0 : -1;
    res.slots = v == 2 ? 1 : 2;
    const exec::ForwardResult got = forward(**src, cond, in, res, *pl);
    ASSERT_EQ(got.video.size(), want.video.size()) << pl->describe();
    EXPECT_EQ(std::memcmp(got.video.data(), want.video.data(), want.video.size() * 4), 0) << pl->describe();
    EXPECT_EQ(std::memcmp(got.audio.data(), want.audio.data(), want.audio.size() * 4), 0) << pl->describe();
  }
}

}  // namespace
