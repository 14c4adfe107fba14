// LoRAs through the CLI (issue 17): `forward --lora` reads exactly the weights of a
// checkpoint pre-merged by `merge-lora` (same output bytes), every memory knob keeps the
// bytes with a LoRA, generate takes --lora too, bad LoRAs and merge-lora on int8 weights are
// refused with a message, and an int8 model takes a LoRA as the side path.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "core/dtype.h"
#include "file_test_util.h"
#include "io/safetensors.h"
#include "model/h3/config.h"

using namespace ls;

namespace {

// n values of nd (in draw order).
std::vector<float> random_values(std::mt19937& rng, std::normal_distribution<float>& nd, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

class CliLora : public test::TempDirTest {
 protected:
  CliLora() : TempDirTest("ls_cli_lora") {}
  void SetUp() override {
    TempDirTest::SetUp();
    base_ = file("base.safetensors");
    ASSERT_EQ(test::run_tool("make-model --preset tiny -q -o " + base_).code, 0);
    // A rank-3 LoRA on two linears of the tiny model (PEFT names on one, kohya on the other).
    const h3::H3Config cfg = *h3::h3_preset("tiny");
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& s : h3::h3_tensor_specs(cfg)) shapes[s.name] = s.shape;
    lora_ = file("lora.safetensors");
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    test::NamedTensors pieces;
    const int64_t r = 3;
    auto add_pair = [&](const std::string& layer, const std::string& key, const char* up, const char* down) {
      const auto& s = shapes.at(layer + ".weight");
      pieces.push_back({key + up, {DType::bf16, {s[0], r}, random_values(rng, nd, s[0] * r)}});
      pieces.push_back({key + down, {DType::bf16, {r, s[1]}, random_values(rng, nd, r * s[1])}});
    };
    add_pair("blocks.0.attn.qkv_proj", "diffusion_model.blocks.0.attn.qkv_proj", ".lora_B.weight", ".lora_A.weight");
    add_pair("blocks.1.mlp.fc1", "lora_unet_blocks_1_mlp_fc1", ".lora_up.weight", ".lora_down.weight");
    pieces.push_back({"lora_unet_blocks_1_mlp_fc1.alpha", {DType::bf16, {}, {2.0f}}});
    ASSERT_NO_FATAL_FAILURE(test::write_tensors(lora_, pieces));
  }
  std::string base_, lora_;
  const std::string clip_ = " --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.7 --seed 3";
};

TEST_F(CliLora, ForwardWithALoraEqualsThePreMergedCheckpoint) {
  const std::string merged = file("merged.safetensors");
  auto m = test::run_tool("merge-lora --model " + base_ + " --lora " + lora_ + ":0.6 -q -o " + merged);
  ASSERT_EQ(m.code, 0) << m.out;
  const auto plain = test::run_tool("forward --model " + base_ + clip_);
  const auto with = test::run_tool("forward --model " + base_ + " --lora " + lora_ + ":0.6" + clip_);
  const auto pre = test::run_tool("forward --model " + merged + clip_);
  ASSERT_EQ(with.code, 0) << with.out;
  ASSERT_EQ(pre.code, 0) << pre.out;
  ASSERT_EQ(test::output_hash(with).size(), 16u) << with.out;
  EXPECT_EQ(test::output_hash(with), test::output_hash(pre));
  EXPECT_NE(test::output_hash(with), test::output_hash(plain));  // the LoRA changes the output
  // Another strength is another output; f16 merge is another numerics setting.
  EXPECT_NE(test::output_hash(test::run_tool("forward --model " + base_ + " --lora " + lora_ + ":0.3" + clip_)), test::output_hash(with));
  const auto f16 = test::run_tool("forward --model " + base_ + " --lora " + lora_ + ":0.6 --lora-dtype f16" + clip_);
  ASSERT_EQ(f16.code, 0) << f16.out;
  EXPECT_NE(test::output_hash(f16), test::output_hash(with));
}

TEST_F(CliLora, MemoryKnobsKeepTheBytesWithALora) {
  const std::string l = " --lora " + lora_ + ":0.6";
  const std::string want = test::output_hash(test::run_tool("forward --model " + base_ + l + clip_));
  ASSERT_EQ(want.size(), 16u);
  for (const std::string knobs : {" --mlp-chunk 7 --attn-chunk 5", " --attn-chunk 3 --kv-offload --kv-chunk 1024",
                                  " --attn-chunk 9 --residual-offload", " --resident-blocks 0 --slots 1",
                                  " --resident-blocks 1 --slots 2 --mlp-chunk 1", " --budget 100K"}) {
    const auto r = test::run_tool("forward --model " + base_ + l + clip_ + knobs);
    ASSERT_EQ(r.code, 0) << knobs << "\n" << r.out;
    EXPECT_EQ(test::output_hash(r), want) << knobs;
  }
}

TEST_F(CliLora, GenerateTakesLoras) {
  const std::string merged = file("merged.safetensors");
  ASSERT_EQ(test::run_tool("merge-lora --model " + base_ + " --lora " + lora_ + " -q -o " + merged).code, 0);
  const std::string g = " --frames 22 --width 64 --height 64 --text-tokens 8 --steps 2 --seed 1";
  const auto a = test::run_tool("generate --model " + base_ + " --lora " + lora_ + g + " -o " + file("a.safetensors"));
  const auto b = test::run_tool("generate --model " + merged + g + " -o " + file("b.safetensors"));
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  // The latents (the files' tensor bytes) are equal; the metadata names the model differently.
  auto fa = SafetensorsReader::open(file("a.safetensors"));
  auto fb = SafetensorsReader::open(file("b.safetensors"));
  ASSERT_TRUE(fa.ok() && fb.ok());
  const SafetensorsReader* ra = fa->get();
  ASSERT_EQ(ra->entries().size(), (*fb)->entries().size());
  for (const auto& e : ra->entries()) {
    const SafetensorsEntry* o = (*fb)->find(e.name);
    ASSERT_NE(o, nullptr) << e.name;
    ASSERT_EQ(e.end - e.begin, o->end - o->begin) << e.name;
    EXPECT_EQ(0, std::memcmp(ra->data(e), (*fb)->data(*o), e.end - e.begin)) << e.name;
  }
}

TEST_F(CliLora, BadLorasAndFormatsAreRefused) {
  auto r = test::run_tool("forward --model " + base_ + " --lora " + file("absent.safetensors") + clip_);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("absent.safetensors"), std::string::npos) << r.out;
  r = test::run_tool("forward --model " + base_ + " --lora " + lora_ + ":nan" + clip_);
  EXPECT_NE(r.code, 0);
  r = test::run_tool("forward --model " + base_ + " --lora-dtype f64 --lora " + lora_ + clip_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("auto, f32, f16 or bf16"), std::string::npos) << r.out;
  // merge-lora cannot merge into int8 weights (ComfyUI requantises stochastically): refused,
  // pointing at --lora (the side path).
  const std::string q = file("int8.safetensors");
  ASSERT_EQ(test::run_tool("make-model --preset tiny --format int8-convrot -q -o " + q).code, 0);
  r = test::run_tool("merge-lora --model " + q + " --lora " + lora_ + " -q -o " + file("m8.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("quantised weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--lora instead"), std::string::npos) << r.out;
}

// A PDD LoRA (ComfyUI PR #15908: the bank as .set_weight / .set_bias of both heads, plus a
// backbone LoRA): `forward --lora` equals `forward` on the checkpoint merge-lora writes, whose
// heads are the bank (ComfyUI's detection reads n from their rows); memory knobs keep it.
TEST_F(CliLora, PddBankLoraEqualsTheBankedCheckpoint) {
  const h3::H3Config cfg = *h3::h3_preset("tiny");
  const int64_t n = 4, pv = cfg.video_patch_dim(), pa = cfg.audio_latents_dim, D = cfg.hidden;
  const std::string pdd = file("pdd.safetensors");
  {
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    test::NamedTensors pieces;
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"diffusion_model.final_layer.video_out.set_weight", {n * pv, D}},
             {"diffusion_model.final_layer.video_out.set_bias", {n * pv}},
             {"diffusion_model.final_layer.audio_out.set_weight", {n * pa, D}},
             {"diffusion_model.final_layer.audio_out.set_bias", {n * pa}}}) {
      int64_t c = 1;
      for (int64_t d : shape) c *= d;
      pieces.push_back({name, {DType::f32, shape, random_values(rng, nd, c)}});
    }
    ASSERT_NO_FATAL_FAILURE(test::write_tensors(pdd, pieces));
  }
  const std::string l = " --lora " + lora_ + ":0.6 --lora " + pdd;
  const std::string merged = file("pdd_merged.safetensors");
  auto m = test::run_tool("merge-lora --model " + base_ + l + " -q -o " + merged);
  ASSERT_EQ(m.code, 0) << m.out;
  {
    auto r = SafetensorsReader::open(merged);
    ASSERT_TRUE(r.ok());
    const SafetensorsEntry* v = (*r)->find("final_layer.video_out.weight");
    const SafetensorsEntry* ab = (*r)->find("final_layer.audio_out.bias");
    ASSERT_TRUE(v != nullptr && ab != nullptr);
    EXPECT_EQ(v->shape, (std::vector<int64_t>{n * pv, D}));
    EXPECT_EQ(ab->shape, (std::vector<int64_t>{n * pa}));
  }
  const auto with = test::run_tool("forward --model " + base_ + l + clip_);
  const auto pre = test::run_tool("forward --model " + merged + clip_);
  const auto plain = test::run_tool("forward --model " + base_ + " --lora " + lora_ + ":0.6" + clip_);
  ASSERT_EQ(with.code, 0) << with.out;
  ASSERT_EQ(pre.code, 0) << pre.out;
  EXPECT_NE(with.out.find("PDD head bank of 4 heads"), std::string::npos) << with.out;
  const std::string want = test::output_hash(with);
  ASSERT_EQ(want.size(), 16u) << with.out;
  EXPECT_EQ(want, test::output_hash(pre));
  EXPECT_NE(want, test::output_hash(plain));  // the bank changes the output
  for (const std::string knobs : {" --mlp-chunk 7 --attn-chunk 5", " --resident-blocks 0 --slots 1", " --budget 100K"}) {
    const auto r = test::run_tool("forward --model " + base_ + l + clip_ + knobs);
    ASSERT_EQ(r.code, 0) << knobs << "\n" << r.out;
    EXPECT_EQ(test::output_hash(r), want) << knobs;
  }
  // A bank on one head only is refused with ComfyUI's reason.
  const std::string half = file("half.safetensors");
  {
    SafetensorsWriter w(half);
    ASSERT_TRUE(w.declare("final_layer.video_out.set_weight", DType::f32, {n * pv, D}).ok());
    ASSERT_TRUE(w.declare("final_layer.video_out.set_bias", DType::f32, {n * pv}).ok());
    ASSERT_TRUE(w.begin().ok());
    std::vector<float> z(static_cast<size_t>(n * pv * D), 0.01f);
    ASSERT_TRUE(w.write_tensor("final_layer.video_out.set_weight", z.data(), z.size() * 4).ok());
    ASSERT_TRUE(w.write_tensor("final_layer.video_out.set_bias", z.data(), static_cast<size_t>(n * pv) * 4).ok());
    ASSERT_TRUE(w.commit().ok());
  }
  const auto r = test::run_tool("forward --model " + base_ + " --lora " + half + clip_);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("ComfyUI banks both heads with one n"), std::string::npos) << r.out;
}

// LoRAs on int8 weights run as the side path (docs/lora.md): said in the weights line, the
// output changes, and every memory knob keeps the bytes.
TEST_F(CliLora, Int8ModelsTakeLorasAsASidePath) {
  const std::string q = file("int8.safetensors");
  ASSERT_EQ(test::run_tool("make-model --preset tiny --format int8-convrot -q -o " + q).code, 0);
  const std::string l = " --lora " + lora_ + ":0.6";
  const auto plain = test::run_tool("forward --model " + q + clip_);
  const auto with = test::run_tool("forward --model " + q + l + clip_);
  ASSERT_EQ(with.code, 0) << with.out;
  EXPECT_NE(with.out.find("LoRA: side path (int8/fp8)"), std::string::npos) << with.out;
  const std::string want = test::output_hash(with);
  ASSERT_EQ(want.size(), 16u) << with.out;
  EXPECT_NE(want, test::output_hash(plain));
  for (const std::string knobs : {" --mlp-chunk 7 --attn-chunk 5", " --resident-blocks 0 --slots 1",
                                  " --attn-chunk 3 --kv-offload --kv-chunk 1024 --residual-offload", " --budget 100K"}) {
    const auto r = test::run_tool("forward --model " + q + l + clip_ + knobs);
    ASSERT_EQ(r.code, 0) << knobs << "\n" << r.out;
    EXPECT_EQ(test::output_hash(r), want) << knobs;
  }
}

}  // namespace
