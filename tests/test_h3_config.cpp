// H3 presets, tensor table, parameter counts (h3-model.md §1.3-1.4), detection (§1.2),
// validation, synthetic weights and clip geometry (§6.3-6.4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "model/h3/config.h"

using namespace ls;
using namespace ls::h3;

namespace {

std::map<std::string, TensorSpec> by_name(const std::vector<TensorSpec>& specs) {
  std::map<std::string, TensorSpec> m;
  for (const auto& s : specs) m.emplace(s.name, s);
  return m;
}

int64_t count_prefix(const std::vector<TensorSpec>& specs, const std::string& prefix) {
  int64_t n = 0;
  for (const auto& s : specs)
    if (s.name.rfind(prefix, 0) == 0) n += s.numel();
  return n;
}

int64_t total(const std::vector<TensorSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) n += s.numel();
  return n;
}

std::vector<TensorInfo> infos(const std::vector<TensorSpec>& specs, const std::string& prefix = "") {
  std::vector<TensorInfo> r;
  for (const auto& s : specs) r.push_back({prefix + s.name, s.dtype, s.shape});
  return r;
}

H3Config preset(const std::string& n) {
  auto c = h3_preset(n);
  EXPECT_TRUE(c.ok()) << n;
  return *c;
}

}  // namespace

TEST(H3Preset, KnownAndUnknown) {
  H3Config tiny = preset("tiny");
  EXPECT_EQ(tiny.hidden, 128);
  EXPECT_EQ(tiny.rope_pairs(), 24);
  EXPECT_EQ(tiny.inner(), 128);
  H3Config small = preset("small");
  EXPECT_EQ(small.hidden, 512);
  EXPECT_EQ(small.ffn, 1408);
  H3Config h3 = preset("h3");
  EXPECT_EQ(h3.hidden, 5376);
  EXPECT_EQ(h3.inner(), 7168);
  for (const char* n : {"tiny", "small", "h3"}) EXPECT_TRUE(check_h3_config(preset(n)).ok()) << n;
  auto bad = h3_preset("huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tiny, small, h3"), std::string::npos);
}

TEST(H3Specs, ParameterCountsMatchSpec) {
  // h3-model.md §1.4.
  const H3Config h3 = preset("h3");
  const auto specs = h3_tensor_specs(h3);
  EXPECT_EQ(count_prefix(specs, "blocks.0."), 645571840);
  EXPECT_EQ(count_prefix(specs, "blocks.49."), 645571840);
  EXPECT_EQ(count_prefix(specs, "blocks.0.adaln_proj."), 260209152);
  EXPECT_EQ(count_prefix(specs, "token_refiner.blocks.0."), 385362688);
  EXPECT_EQ(count_prefix(specs, "time_embedder."), 15835008);  // "15.8 M"
  const int64_t unpruned = total(specs);
  EXPECT_NEAR(static_cast<double>(unpruned) / 1e9, 33.12, 0.005);
  // 50 blocks x big linears = 19.27 B.
  int64_t big = 0;
  for (const auto& s : specs)
    if (s.group == TensorSpec::Group::blocks && s.shape.size() == 2) big += s.numel();
  EXPECT_EQ(big, 50 * 385351680LL);

  const H3Config pruned = h3_curve_form(h3);
  const auto pspecs = h3_tensor_specs(pruned);
  EXPECT_EQ(count_prefix(pspecs, "blocks.7."), 386233600);
  EXPECT_EQ(count_prefix(pspecs, "blocks.7.adaln_proj."), 870912);
  EXPECT_NEAR(static_cast<double>(total(pspecs)) / 1e9, 20.11, 0.005);
  // Tensor count of a bf16 curve-form file: 50 x 10 + 2 x 8 + 1 + 15 = 532 (the int8
  // file's 932 = 50 x 18 + ...: each block's 4 big linears add weight_scale + comfy_quant).
  EXPECT_EQ(pspecs.size(), 532u);
}

TEST(H3Specs, ShapesAndDtypes) {
  const auto m = by_name(h3_tensor_specs(preset("h3")));
  auto shape = [&](const std::string& n) { return m.at(n).shape; };
  EXPECT_EQ(shape("blocks.3.attn.qkv_proj.weight"), (std::vector<int64_t>{21504, 5376}));
  EXPECT_EQ(shape("blocks.3.attn.out_proj.weight"), (std::vector<int64_t>{5376, 7168}));
  EXPECT_EQ(shape("blocks.3.mlp.fc1.weight"), (std::vector<int64_t>{28672, 5376}));
  EXPECT_EQ(shape("blocks.3.mlp.fc2.weight"), (std::vector<int64_t>{5376, 14336}));
  EXPECT_EQ(shape("blocks.3.adaln_proj.linear.weight"), (std::vector<int64_t>{96768, 2688}));
  EXPECT_EQ(shape("final_layer.adaln_proj.linear.weight"), (std::vector<int64_t>{10752, 2688}));
  EXPECT_EQ(shape("final_layer.video_out.weight"), (std::vector<int64_t>{96, 5376}));
  EXPECT_EQ(shape("rope.inv_freq"), (std::vector<int64_t>{16}));
  EXPECT_EQ(m.at("blocks.3.adaln_proj.linear.bias").dtype, DType::bf16);
  EXPECT_EQ(m.at("video_patch_proj.weight").dtype, DType::f32);
  EXPECT_EQ(m.at("condition_proj.bias").dtype, DType::bf16);
  EXPECT_EQ(m.count("blocks.3.attn.to_gate_compress.weight"), 0u);
  EXPECT_EQ(m.count("adaln_t_table"), 0u);

  H3Config c = h3_curve_form(preset("h3"));
  c.gate_compress = true;
  c.pdd_heads = 3;
  const auto p = by_name(h3_tensor_specs(c));
  EXPECT_EQ(p.at("blocks.0.adaln_proj.linear.bias").dtype, DType::f32);
  EXPECT_EQ(p.at("final_layer.adaln_proj.linear.weight").dtype, DType::f32);
  EXPECT_EQ(p.at("adaln_t_table").shape, (std::vector<int64_t>{1025, 8}));
  EXPECT_EQ(p.at("blocks.0.attn.to_gate_compress.weight").shape, (std::vector<int64_t>{7168, 5376}));
  EXPECT_EQ(p.at("final_layer.video_out.weight").shape, (std::vector<int64_t>{288, 5376}));
  EXPECT_EQ(p.count("time_embedder.proj_in.weight"), 0u);
}

// Every tensor has a role and (for block tensors) its block index, so no layer has to
// parse names: the counts per role follow from the config, and block indices agree with
// the names they came from.
TEST(H3Specs, RolesAndBlockIndices) {
  H3Config c = *h3_preset("tiny");
  c.gate_compress = true;
  std::map<TensorRole, int> count;
  for (const TensorSpec& s : h3_tensor_specs(c)) {
    ++count[s.role];
    if (s.name.rfind("blocks.", 0) == 0) {
      EXPECT_EQ(s.block, std::stoll(s.name.substr(7))) << s.name;
    } else if (s.name.rfind("token_refiner.blocks.", 0) == 0) {
      EXPECT_EQ(s.block, std::stoll(s.name.substr(21))) << s.name;
    } else {
      EXPECT_EQ(s.block, -1) << s.name;
    }
    EXPECT_STRNE(tensor_role_name(s.role), "?");
  }
  EXPECT_EQ(count[TensorRole::block], 8 * c.num_layers);  // norm1, qkv, q/k norm, out_proj, norm2, fc1, fc2
  EXPECT_EQ(count[TensorRole::adaln], 2 * c.num_layers + 2);
  EXPECT_EQ(count[TensorRole::unused], c.num_layers);  // attn.to_gate_compress
  EXPECT_EQ(count[TensorRole::refiner], 8 * c.refiner_layers + 1);
  EXPECT_EQ(count[TensorRole::head], 5);
  EXPECT_EQ(count[TensorRole::patch_embed], 4);
  EXPECT_EQ(count[TensorRole::text_proj], 2);
  EXPECT_EQ(count[TensorRole::time_embedder] + count[TensorRole::adaln_table], c.curve_form() ? 1 : 4);
  EXPECT_EQ(count[TensorRole::rope], 1);
}

TEST(H3Detect, RoundTripsEveryPresetAndForm) {
  for (const char* name : {"tiny", "small", "h3"}) {
    for (int form = 0; form < 4; ++form) {
      H3Config c = preset(name);
      if (form & 1) c = h3_curve_form(c);
      if (form & 2) { c.gate_compress = true; c.pdd_heads = 2; }
      for (const std::string prefix : {"", "model.diffusion_model.", "net.", "model."}) {
        auto d = detect_h3_config(infos(h3_tensor_specs(c), prefix));
        ASSERT_TRUE(d.ok()) << name << " " << form << " " << prefix << ": " << d.error().message;
        EXPECT_EQ(d->key_prefix, prefix);
        H3Config got = *d;
        if (c.curve_form()) {  // the time embedder's widths are not in a curve-form file
          got.timestep_input_dim = c.timestep_input_dim;
          got.time_embed_hidden = c.time_embed_hidden;
        }
        EXPECT_EQ(h3_config_json(got), h3_config_json(c)) << name << " " << form << " '" << prefix << "'";
        EXPECT_TRUE(validate_h3_tensors(*d, infos(h3_tensor_specs(c), prefix)).ok());
      }
    }
  }
}

TEST(H3Detect, PrefixRules) {
  const auto specs = h3_tensor_specs(preset("tiny"));
  // Mixed file: most keys under model.model., a few stray keys elsewhere are dropped.
  auto t = infos(specs, "model.model.");
  t.push_back({"first_stage_model.x", DType::f32, {1}});
  auto d = detect_h3_config(t);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->key_prefix, "model.model.");
  EXPECT_EQ(detect_key_prefix(infos(specs)), "");
  // A candidate prefix with <= 5 keys loses to the "model." fallback.
  std::vector<TensorInfo> few = {{"net.a", DType::f32, {1}}, {"model.b", DType::f32, {1}}};
  EXPECT_EQ(detect_key_prefix(few), "model.");
}

TEST(H3Detect, BlockCountStopsAtGap) {
  H3Config c = preset("tiny");
  c.num_layers = 4;
  auto t = infos(h3_tensor_specs(c));
  std::erase_if(t, [](const TensorInfo& i) { return i.name.rfind("blocks.2.", 0) == 0; });
  auto d = detect_h3_config(t);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->num_layers, 2);
}

TEST(H3Detect, ErrorsNameTheProblem) {
  auto not_h3 = detect_h3_config({{"foo.weight", DType::f32, {3}}});
  ASSERT_FALSE(not_h3.ok());
  EXPECT_NE(not_h3.error().message.find("not an H3 checkpoint"), std::string::npos);

  auto t = infos(h3_tensor_specs(preset("tiny")));
  std::erase_if(t, [](const TensorInfo& i) { return i.name == "blocks.0.attn.q_norm.weight"; });
  auto d = detect_h3_config(t);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("blocks.0.attn.q_norm.weight"), std::string::npos);
}

TEST(H3Detect, MetadataOverrides) {
  const auto t = infos(h3_tensor_specs(preset("tiny")));
  auto d = detect_h3_config(t, R"({"num_layers": 2, "gate_compress": false, "adaln_curve_grid": null})");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->num_layers, 2);
  EXPECT_FALSE(d->gate_compress);
  EXPECT_FALSE(detect_h3_config(t, "[1,2]").ok());
  EXPECT_FALSE(detect_h3_config(t, R"({"num_layers": "two"})").ok());
  EXPECT_FALSE(detect_h3_config(t, R"({"patch_size": [1, 4, 4]})").ok());
  // An override that contradicts the shapes is caught by validation.
  auto wrong = detect_h3_config(t, R"({"hidden_size": 256})");
  ASSERT_TRUE(wrong.ok());
  Status v = validate_h3_tensors(*wrong, t);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("video_patch_proj.weight"), std::string::npos);
}

// Issue 28, item 7: overrides are bounded before any arithmetic, and a block count that
// disagrees with the tensors is refused (it used to run the first N blocks silently).
TEST(H3Detect, MetadataOverridesBoundedBeforeUse) {
  const auto t = infos(h3_tensor_specs(preset("tiny")));  // 2 blocks
  auto one = detect_h3_config(t, R"({"num_layers": 1})");
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.error().message.find("num_layers is 1 but the file holds 2 DiT blocks"), std::string::npos)
      << one.error().message;
  for (const char* j : {R"({"latents_dim": 9223372036854775807})", R"({"num_layers": 2147483647})",
                        R"({"hidden_size": -5})", R"({"audio_latents_dim": 18446744073709551615})",
                        R"({"pdd_heads": 1000000})", R"({"adaln_curve_grid": 4611686018427387904})",
                        R"({"attention_head_dim": 0})"}) {
    auto d = detect_h3_config(t, j);
    ASSERT_FALSE(d.ok()) << j;
    EXPECT_NE(d.error().message.find("outside"), std::string::npos) << j << ": " << d.error().message;
  }
}

TEST(H3Validate, FirstWrongTensorNamed) {
  const H3Config c = preset("tiny");
  const auto good = infos(h3_tensor_specs(c));
  ASSERT_TRUE(validate_h3_tensors(c, good).ok());

  auto missing = good;
  std::erase_if(missing, [](const TensorInfo& i) { return i.name == "blocks.1.mlp.fc2.weight"; });
  Status s = validate_h3_tensors(c, missing);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lacks tensor blocks.1.mlp.fc2.weight"), std::string::npos) << s.message();

  auto shape = good;
  for (auto& i : shape)
    if (i.name == "blocks.0.attn.out_proj.weight") i.shape = {128, 127};
  s = validate_h3_tensors(c, shape);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("blocks.0.attn.out_proj.weight has shape [128, 127], expected [128, 128]"), std::string::npos)
      << s.message();

  auto dtype = good;
  for (auto& i : dtype)
    if (i.name == "video_patch_proj.bias") i.dtype = DType::bf16;
  s = validate_h3_tensors(c, dtype);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("video_patch_proj.bias is stored as bf16, declared f32"), std::string::npos) << s.message();
  EXPECT_TRUE(validate_h3_tensors(c, dtype, /*allow_dtype_conversion=*/true).ok());
  for (auto& i : dtype)
    if (i.name == "video_patch_proj.bias") i.dtype = DType::i8;
  EXPECT_FALSE(validate_h3_tensors(c, dtype, true).ok());

  auto quant = good;
  quant.push_back({"blocks.0.mlp.fc1.weight_scale", DType::f32, {512, 1}});
  s = validate_h3_tensors(c, quant);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("quantised"), std::string::npos);
}

TEST(H3Synthetic, PiecewiseEqualsWhole) {
  H3Config c = h3_curve_form(preset("tiny"));
  for (const TensorSpec& s : h3_tensor_specs(c)) {
    const int64_t n = s.numel();
    const size_t bytes = static_cast<size_t>(n * dtype_size(s.dtype));
    std::vector<uint8_t> whole(bytes), pieces(bytes, 0xAB);
    fill_synthetic(s, 7, 0, n, whole.data());
    const int64_t esz = dtype_size(s.dtype);
    for (int64_t a = 0; a < n;) {
      const int64_t len = std::min<int64_t>(n - a, 1 + (a * 7919) % 1001);
      fill_synthetic(s, 7, a, len, pieces.data() + a * esz);
      a += len;
    }
    ASSERT_EQ(std::memcmp(whole.data(), pieces.data(), bytes), 0) << s.name;
  }
}

TEST(H3Synthetic, DeterministicSeededAndScaled) {
  const auto m = by_name(h3_tensor_specs(preset("tiny")));
  auto values = [](const TensorSpec& s, uint64_t seed) {
    std::vector<uint8_t> buf(static_cast<size_t>(s.numel() * dtype_size(s.dtype)));
    fill_synthetic(s, seed, 0, s.numel(), buf.data());
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (int64_t i = 0; i < s.numel(); ++i) v[static_cast<size_t>(i)] = load_as_f64(buf.data(), s.dtype, i);
    return v;
  };
  auto stats = [](const std::vector<double>& v) {
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    return std::pair<double, double>{mean, std::sqrt(sq / static_cast<double>(v.size()))};
  };
  const TensorSpec& qkv = m.at("blocks.0.attn.qkv_proj.weight");  // [384, 128], std 1/sqrt(128)
  const auto a = values(qkv, 1), b = values(qkv, 1), c = values(qkv, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto [mean, sd] = stats(a);
  EXPECT_NEAR(mean, 0.0, 0.003);
  EXPECT_NEAR(sd, 1.0 / std::sqrt(128.0), 0.003);
  // Different tensors of the same shape differ.
  EXPECT_NE(values(m.at("blocks.1.attn.qkv_proj.weight"), 1), a);
  auto [fm, fsd] = stats(values(m.at("blocks.0.mlp.fc2.weight"), 1));  // 0.5/sqrt(256)
  EXPECT_NEAR(fsd, 0.5 / 16.0, 0.002);
  auto [nm, nsd] = stats(values(m.at("blocks.0.norm1.weight"), 1));
  EXPECT_NEAR(nm, 1.0, 0.02);
  EXPECT_GT(nsd, 0.02);
  // rope.inv_freq: exact fp32 10000^(-i/len).
  const auto inv = values(m.at("rope.inv_freq"), 1);
  ASSERT_EQ(inv.size(), 8u);
  EXPECT_EQ(inv[0], 1.0);
  EXPECT_EQ(inv[2], static_cast<double>(0.1f));  // 10000^(-2/8) = 0.1
  EXPECT_EQ(inv[4], static_cast<double>(0.01f));

  const TensorSpec h3_inv{"rope.inv_freq", DType::f32, {16}, TensorSpec::Group::embed};
  const auto inv16 = values(h3_inv, 9);
  const double appendix_b[16] = {1, 0.562341, 0.316228, 0.177828, 0.1, 0.0562341, 0.0316228, 0.0177828, 0.01,
                                 0.00562341, 0.00316228, 0.00177828, 0.001, 0.000562341, 0.000316228, 0.000177828};
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(inv16[static_cast<size_t>(i)] / appendix_b[i], 1.0, 2e-6) << i;
}

TEST(H3Synthetic, CurveTableIsSmooth) {
  const H3Config c = h3_curve_form(preset("tiny"));
  const auto m = by_name(h3_tensor_specs(c));
  const TensorSpec& t = m.at("adaln_t_table");  // f32 [1025, 8]
  std::vector<float> v(static_cast<size_t>(t.numel()));
  fill_synthetic(t, 3, 0, t.numel(), v.data());
  double max_step = 0, max_abs = 0;
  bool nonzero = false;
  for (int64_t g = 1; g < 1025; ++g)
    for (int64_t j = 0; j < 8; ++j) {
      const double x = v[static_cast<size_t>(g * 8 + j)], p = v[static_cast<size_t>((g - 1) * 8 + j)];
      max_step = std::max(max_step, std::abs(x - p));
      max_abs = std::max(max_abs, std::abs(x));
      nonzero |= x != 0;
      EXPECT_GT(x, -0.3);  // post-SiLU-like: bounded below
    }
  EXPECT_TRUE(nonzero);
  EXPECT_LT(max_step, 0.05);
  EXPECT_LT(max_abs, 20.0);
}

TEST(ClipGeometry, WorkedExample) {
  // h3-model.md §6.4: 15 s at 24 fps = 360 frames -> 362, T = 107, A = 603.
  auto g = clip_geometry(360, 1024, 1024, 500);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->frames, 362);
  EXPECT_EQ(g->T, 107);
  EXPECT_EQ(g->A, 603);
  EXPECT_EQ(g->Hl, 64);
  EXPECT_EQ(g->video_tokens(), 109568);
  EXPECT_EQ(g->audio_rows(), 1206);
  EXPECT_EQ(g->tokens(), 111274);
  auto w = clip_geometry(357, 1344, 768, 500);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->frames, 362);
  EXPECT_EQ(w->video_tokens(), 107856);
  EXPECT_EQ(w->tokens(), 109562);
  // Appendix B: 1344x768x345, L = 500 -> T = 102, A = 575, S = 104,466.
  auto b = clip_geometry(345, 1344, 768, 500);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->T, 102);
  EXPECT_EQ(b->A, 575);
  EXPECT_EQ(b->tokens(), 104466);
  // 124 frames at 1344x768: T = 37, A = 207, video 37,296.
  auto s = clip_geometry(124, 1344, 768, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->T, 37);
  EXPECT_EQ(s->A, 207);
  EXPECT_EQ(s->video_tokens(), 37296);
}

TEST(ClipGeometry, SnapAndErrors) {
  auto one = clip_geometry(1, 32, 32, 0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->frames, 5);
  EXPECT_EQ(one->T, 2);
  EXPECT_EQ(one->A, 8);  // round(5 * 5 / 3) = round(8.33)
  auto six = clip_geometry(6, 32, 32, 0);
  ASSERT_TRUE(six.ok());
  EXPECT_EQ(six->frames, 22);
  EXPECT_EQ(six->T, 7);
  EXPECT_FALSE(clip_geometry(0, 32, 32, 0).ok());
  EXPECT_FALSE(clip_geometry(5, 48, 32, 0).ok());
  EXPECT_FALSE(clip_geometry(5, 32, -32, 0).ok());
  EXPECT_FALSE(clip_geometry(5, 32, 32, -1).ok());
}
