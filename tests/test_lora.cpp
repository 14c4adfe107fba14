// LoRA files (src/model/lora.h): ComfyUI's key aliases and pair styles, the refusals,
// and the merge arithmetic (f32 and f16 compute dtype, chained LoRAs, row ranges).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "file_test_util.h"
#include "io/safetensors.h"
#include "model/h3/config.h"
#include "model/lora.h"

using namespace ls;
using namespace ls::lora;

namespace {

using T = test::TensorValues;  // stored with dtype's rounding

using test::randoms;

class Lora : public test::TempDirTest {
 protected:
  Lora() : TempDirTest("ls_lora") {}
  void SetUp() override {
    TempDirTest::SetUp();
    cfg_ = *h3::h3_preset("tiny");
    specs_ = h3::h3_tensor_specs(cfg_);
    for (const auto& s : specs_)
      if (s.name == kTarget) target_ = &s;
    ASSERT_NE(target_, nullptr);
    N_ = target_->shape[0];
    K_ = target_->shape[1];
  }
  static constexpr const char* kTarget = "blocks.1.mlp.fc2.weight";
  // A bf16 weight of the target's shape and the merged result of `set` on it.
  std::vector<uint16_t> weight() const {
    std::vector<float> v = randoms(static_cast<size_t>(N_ * K_), 3, 0.02f);
    std::vector<uint16_t> w(v.size());
    for (size_t i = 0; i < v.size(); ++i) w[i] = f32_to_bf16(v[i]);
    return w;
  }
  std::vector<uint16_t> merged(const LoraSet& set, MergeDtype dt, int64_t row0 = 0, int64_t rows = -1) const {
    std::vector<uint16_t> w = weight();
    if (rows < 0) rows = N_;
    std::vector<uint16_t> part(w.begin() + row0 * K_, w.begin() + (row0 + rows) * K_), out(part.size());
    TensorView in(part.data(), DType::bf16, {rows, K_}), o(out.data(), DType::bf16, {rows, K_});
    EXPECT_TRUE(set.merge(kTarget, row0, in, o, dt).ok());
    return out;
  }
  // A rank-r pair in kohya style under `base`.
  std::map<std::string, T> pair(const std::string& base, int64_t r, const std::string& up = ".lora_up.weight",
                                const std::string& down = ".lora_down.weight", uint32_t seed = 1) const {
    std::map<std::string, T> m;
    m[base + up] = T{DType::bf16, {N_, r}, randoms(static_cast<size_t>(N_ * r), seed, 0.1f)};
    m[base + down] = T{DType::bf16, {r, K_}, randoms(static_cast<size_t>(r * K_), seed + 1, 0.1f)};
    for (auto& [n, t] : m)
      for (float& f : t.values) f = round_bf16(f);
    return m;
  }
  Expected<LoraSet> open1(const std::map<std::string, T>& tensors, double strength = 1.0) {
    std::string name = std::to_string(n_files_++);
    name += ".safetensors";  // (built in steps: GCC 12 warns falsely on "l" + to_string(n) + ...)
    const std::string p = file(name);
    test::write_tensors(p, tensors);
    return LoraSet::open({LoraFile{p, strength}}, specs_);
  }
  h3::H3Config cfg_;
  std::vector<h3::TensorSpec> specs_;
  const h3::TensorSpec* target_ = nullptr;
  int64_t N_ = 0, K_ = 0;
  int n_files_ = 0;
};

TEST(LoraArg, FileAndStrength) {
  auto a = parse_lora_arg("turbo.safetensors");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->path, "turbo.safetensors");
  EXPECT_EQ(a->strength, 1.0);
  auto b = parse_lora_arg("dir/turbo.safetensors:0.75");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->path, "dir/turbo.safetensors");
  EXPECT_EQ(b->strength, 0.75);
  auto c = parse_lora_arg("odd:name.safetensors");  // the tail is no number: all of it is the path
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->path, "odd:name.safetensors");
  EXPECT_FALSE(parse_lora_arg("x.safetensors:inf").ok());
  EXPECT_FALSE(parse_lora_arg(":0.5").ok());
}

// The merge against the formula written out element by element (lora.h).
TEST_F(Lora, MergeFollowsComfyUIsFormulaInF32AndF16) {
  const int64_t r = 4;
  auto t = pair("diffusion_model.blocks.1.mlp.fc2", r);
  t["diffusion_model.blocks.1.mlp.fc2.alpha"] = T{DType::f32, {}, {2.0f}};
  auto set = open1(t, 0.8);
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_TRUE(set->touches(kTarget));
  EXPECT_EQ(set->patch_count(), 1u);
  const auto& up = t["diffusion_model.blocks.1.mlp.fc2.lora_up.weight"].values;
  const auto& down = t["diffusion_model.blocks.1.mlp.fc2.lora_down.weight"].values;
  const std::vector<uint16_t> w = weight();
  for (MergeDtype dt : {MergeDtype::f32, MergeDtype::f16}) {
    auto R = [dt](float x) { return dt == MergeDtype::f16 ? f16_to_f32(f32_to_f16(x)) : x; };
    const float s = static_cast<float>(0.8 * (2.0 / 4.0));
    std::vector<uint16_t> want(w.size());
    int64_t changed = 0;
    for (int64_t o = 0; o < N_; ++o)
      for (int64_t i = 0; i < K_; ++i) {
        float d = 0;
        for (int64_t k = 0; k < r; ++k) d = d + up[static_cast<size_t>(o * r + k)] * down[static_cast<size_t>(k * K_ + i)];
        const float base = R(bf16_to_f32(w[static_cast<size_t>(o * K_ + i)]));
        want[static_cast<size_t>(o * K_ + i)] = f32_to_bf16(R(base + R(s * d)));
        changed += want[static_cast<size_t>(o * K_ + i)] != w[static_cast<size_t>(o * K_ + i)];
      }
    EXPECT_GT(changed, N_ * K_ / 2);  // the LoRA is not a no-op
    std::vector<uint16_t> got = merged(*set, dt);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 2)) << merge_dtype_name(dt);
  }
  // f16 loses what bf16 weights hold below fp16's normal range: the two modes differ.
  EXPECT_NE(merged(*set, MergeDtype::f32), merged(*set, MergeDtype::f16));
}

// Every alias of a layer and every pair style ComfyUI accepts gives the same merge.
TEST_F(Lora, KeyAliasesAndPairStylesAgree) {
  const std::vector<std::string> bases = {"diffusion_model.blocks.1.mlp.fc2", "blocks.1.mlp.fc2",
                                          "lora_unet_blocks_1_mlp_fc2"};
  const std::vector<std::pair<std::string, std::string>> styles = {
      {".lora_up.weight", ".lora_down.weight"}, {".lora_B.weight", ".lora_A.weight"},
      {"_lora.up.weight", "_lora.down.weight"}, {".lora.up.weight", ".lora.down.weight"},
      {".lora_B", ".lora_A"},                   {".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"},
      {".lora_B.default.weight", ".lora_A.default.weight"}};
  std::vector<uint16_t> first;
  for (const auto& b : bases)
    for (const auto& [u, d] : styles) {
      auto set = open1(pair(b, 3, u, d));
      ASSERT_TRUE(set.ok()) << b << u << ": " << set.status().message();
      auto got = merged(*set, MergeDtype::f32);
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << b << u;
    }
  EXPECT_NE(first, weight());
}

// A merge of any row range gives those rows of the whole merge (the weight stream merges
// block by block; a slot may hold part of a layer).
TEST_F(Lora, RowRangesGiveTheWholeMergesRows) {
  auto set = open1(pair("blocks.1.mlp.fc2", 5));
  ASSERT_TRUE(set.ok());
  for (MergeDtype dt : {MergeDtype::f32, MergeDtype::f16}) {
    auto whole = merged(*set, dt);
    for (auto [a, n] : {std::pair<int64_t, int64_t>{0, 1}, {3, 7}, {N_ - 1, 1}, {1, N_ - 1}}) {
      auto part = merged(*set, dt, a, n);
      EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + a * K_, part.size() * 2)) << a << "+" << n;
    }
  }
}

// Two LoRAs apply in the order given, each onto the compute-dtype weight the one before
// left (one rounding to bf16 at the end), so the order can matter in the last bits.
TEST_F(Lora, ChainedLorasApplyInOrderWithOneFinalRounding) {
  const std::string a = file("a.safetensors"), b = file("b.safetensors");
  test::write_tensors(a, pair("blocks.1.mlp.fc2", 2, ".lora_up.weight", ".lora_down.weight", 11));
  test::write_tensors(b, pair("blocks.1.mlp.fc2", 3, ".lora_up.weight", ".lora_down.weight", 21));
  auto ab = LoraSet::open({LoraFile{a, 1.0}, LoraFile{b, 0.5}}, specs_);
  ASSERT_TRUE(ab.ok()) << ab.status().message();
  EXPECT_EQ(ab->patch_count(), 2u);
  EXPECT_NE(ab->describe().find("2 LoRAs"), std::string::npos);
  // Restate: f32 weight, + patch a, + patch b, then bf16.
  auto only_a = LoraSet::open({LoraFile{a, 1.0}}, specs_);
  ASSERT_TRUE(only_a.ok());
  std::vector<uint16_t> w = weight(), got = merged(*ab, MergeDtype::f32);
  // got differs from applying a then rounding then b (two bf16 roundings) somewhere.
  std::vector<uint16_t> after_a = merged(*only_a, MergeDtype::f32);
  EXPECT_NE(got, after_a);
  EXPECT_NE(got, w);
}

TEST_F(Lora, DiffSetAndBiasPatches) {
  // A full diff on fc2 at strength 0.5: w + fl32(0.5 * diff).
  std::map<std::string, T> t;
  t["blocks.1.mlp.fc2.diff"] = T{DType::f32, {N_, K_}, randoms(static_cast<size_t>(N_ * K_), 9, 0.01f)};
  auto set = open1(t, 0.5);
  ASSERT_TRUE(set.ok()) << set.status().message();
  std::vector<uint16_t> w = weight(), got = merged(*set, MergeDtype::f32);
  for (int64_t i = 0; i < N_ * K_; ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)],
              f32_to_bf16(bf16_to_f32(w[static_cast<size_t>(i)]) + 0.5f * t["blocks.1.mlp.fc2.diff"].values[static_cast<size_t>(i)]))
        << i;
  // diff_b patches the module's bias (adaln_proj.linear has one).
  const std::string m = "blocks.0.adaln_proj.linear";
  int64_t bias_n = 0;
  for (const auto& s : specs_)
    if (s.name == m + ".bias") bias_n = s.shape[0];
  ASSERT_GT(bias_n, 0);
  std::map<std::string, T> tb;
  tb[m + ".diff_b"] = T{DType::f32, {bias_n}, std::vector<float>(static_cast<size_t>(bias_n), 0.25f)};
  auto bs = open1(tb);
  ASSERT_TRUE(bs.ok()) << bs.status().message();
  EXPECT_TRUE(bs->touches(m + ".bias"));
  EXPECT_FALSE(bs->touches(m + ".weight"));
  // set_weight replaces the layer.
  std::map<std::string, T> ts;
  ts["blocks.1.mlp.fc2.set_weight"] = T{DType::bf16, {N_, K_}, std::vector<float>(static_cast<size_t>(N_ * K_), 1.5f)};
  auto ss = open1(ts);
  ASSERT_TRUE(ss.ok());
  for (uint16_t v : merged(*ss, MergeDtype::f32)) ASSERT_EQ(v, f32_to_bf16(1.5f));
}

TEST_F(Lora, MalformedFilesAreRefusedByName) {
  auto expect_refused = [&](std::map<std::string, T> t, const std::string& needle) {
    auto s = open1(t);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
  };
  // A key that maps onto no layer.
  expect_refused(pair("diffusion_model.blocks.9.mlp.fc2", 2), "matches no layer");
  // An up half without its down half.
  auto t = pair("blocks.1.mlp.fc2", 2);
  t.erase("blocks.1.mlp.fc2.lora_down.weight");
  expect_refused(t, "has no blocks.1.mlp.fc2.lora_down.weight");
  // Ranks that disagree / a pair that does not make the layer.
  t = pair("blocks.1.mlp.fc2", 2);
  t["blocks.1.mlp.fc2.lora_down.weight"].shape = {2, K_ + 1};
  t["blocks.1.mlp.fc2.lora_down.weight"].values.resize(static_cast<size_t>(2 * (K_ + 1)));
  expect_refused(t, "does not make the layer");
  // Adapters not applied here.
  expect_refused({{"blocks.1.mlp.fc2.hada_w1_a", T{DType::f32, {2, 2}, {1, 2, 3, 4}}}}, "LoHa");
  expect_refused({{"blocks.1.mlp.fc2.lokr_w1", T{DType::f32, {2, 2}, {1, 2, 3, 4}}}}, "LoKr");
  t = pair("blocks.1.mlp.fc2", 2);
  t["blocks.1.mlp.fc2.dora_scale"] = T{DType::f32, {N_, 1}, std::vector<float>(static_cast<size_t>(N_), 1.0f)};
  expect_refused(t, "DoRA");
  // Unknown suffix.
  expect_refused({{"blocks.1.mlp.fc2.something", T{DType::f32, {1}, {1}}}}, "no LoRA tensor this loader knows");
  // Two aliases of one layer in one file.
  t = pair("blocks.1.mlp.fc2", 2);
  auto t2 = pair("lora_unet_blocks_1_mlp_fc2", 2);
  t.insert(t2.begin(), t2.end());
  expect_refused(t, "both patch blocks.1.mlp.fc2.weight");
  // A non-scalar alpha; a non-float tensor.
  t = pair("blocks.1.mlp.fc2", 2);
  t["blocks.1.mlp.fc2.alpha"] = T{DType::f32, {2}, {1, 1}};
  expect_refused(t, "must be a scalar");
  t = pair("blocks.1.mlp.fc2", 2);
  t["blocks.1.mlp.fc2.alpha"] = T{DType::i32, {}, {0}};
  expect_refused(t, "must be F32, BF16 or F16");
  // A missing file.
  auto missing = LoraSet::open({LoraFile{file("absent.safetensors"), 1.0}}, specs_);
  EXPECT_FALSE(missing.ok());
}

}  // namespace
