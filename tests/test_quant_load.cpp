// Quantised H3 checkpoints, the model side (issue 14; model/h3/quant.h): the per-layer
// classification of files in ComfyUI's layout, the refusals of malformed ones, the
// synthetic quantised models (source == make-model file), the quantisers, ComfyUI's
// mixed-ops dtype policy, the census and the lossy --precision fp8 source.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "cli_test_util.h"
#include "core/dtype.h"
#include "file_test_util.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/quant.h"
#include "model/h3/quant_census.h"

using namespace ls;
using namespace ls::h3;

namespace {

H3Config preset(const char* n) {
  auto c = h3_preset(n);
  LS_CHECK(c.ok());
  return *c;
}

// One tensor of a file under construction: name, dtype, shape, bytes.
struct RawTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using RawFile = std::vector<RawTensor>;

RawFile tensors_of(const H3TensorSource& src) {
  RawFile f;
  for (const TensorSpec& s : src.specs()) {
    const TensorView v = src.get(s.name);
    const auto* p = static_cast<const uint8_t*>(v.data);
    f.push_back({s.name, s.dtype, s.shape, std::vector<uint8_t>(p, p + v.nbytes())});
  }
  return f;
}
RawTensor* find(RawFile& f, const std::string& name) {
  for (auto& t : f)
    if (t.name == name) return &t;
  return nullptr;
}
void erase(RawFile& f, const std::string& name) {
  std::erase_if(f, [&](const RawTensor& t) { return t.name == name; });
}
void set_json(RawFile& f, const std::string& name, const std::string& json) {
  RawTensor* t = find(f, name);
  if (!t) {
    f.push_back({name, DType::u8, {}, {}});
    t = &f.back();
  }
  t->bytes.assign(json.begin(), json.end());
  t->shape = {static_cast<int64_t>(json.size())};
}
Status write(const RawFile& f, const std::string& path) {
  std::vector<NamedTensor> ts;
  for (const auto& t : f)
    ts.push_back({t.name, TensorView::contiguous(const_cast<uint8_t*>(t.bytes.data()), t.dtype, t.shape.data(),
                                                 static_cast<int>(t.shape.size()))});
  return write_safetensors(path, ts);
}

class QuantFile : public test::TempDirTest {
 protected:
  QuantFile() : TempDirTest("ls_quant") {}
  // Opens f (written to a file); the error message, or "" when it opens.
  std::string open_error(const RawFile& f) {
    const std::string p = file("q.safetensors");
    Status st = write(f, p);
    EXPECT_TRUE(st.ok()) << st.message();
    auto r = open_h3_checkpoint(p);
    return r.ok() ? std::string() : r.error().message;
  }
  std::unique_ptr<H3FileSource> open_ok(const RawFile& f) {
    const std::string p = file("ok.safetensors");
    Status st = write(f, p);
    EXPECT_TRUE(st.ok()) << st.message();
    auto r = open_h3_checkpoint(p);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? std::move(r).value() : nullptr;
  }
};

// Same bytes for every tensor of both sources (and the same table).
void expect_same_tensors(const H3TensorSource& a, const H3TensorSource& b) {
  ASSERT_EQ(a.specs().size(), b.specs().size());
  for (const TensorSpec& s : a.specs()) {
    ASSERT_TRUE(b.has(s.name)) << s.name;
    const TensorView va = a.get(s.name), vb = b.get(s.name);
    ASSERT_EQ(va.dtype, vb.dtype) << s.name;
    ASSERT_EQ(va.nbytes(), vb.nbytes()) << s.name;
    EXPECT_EQ(std::memcmp(va.data, vb.data, static_cast<size_t>(va.nbytes())), 0) << s.name;
  }
}

}  // namespace

// ---- layouts and the table -------------------------------------------------------------

TEST(QuantLayout, SyntheticLayoutsOfTheRealModel) {
  const H3Config h3 = preset("h3");
  auto c8 = quant_census([&] {
    H3Config c = h3;
    c.quant = *synthetic_quant_layout(h3, SyntheticFormat::int8_convrot);
    return c;
  }());
  ASSERT_EQ(c8.quantised.size(), 1u);
  EXPECT_EQ(c8.quantised[0].count, 200);  // Comfy-Org's pruned int8: 200 ConvRot linears, all G = 256
  EXPECT_EQ(c8.quantised[0].group, 256);
  EXPECT_EQ(checkpoint_format_label(c8), "int8_convrot g256");
  H3Config full = h3;
  full.quant = *synthetic_quant_layout(h3, SyntheticFormat::int8_convrot_full);
  auto cf = quant_census(full);
  EXPECT_EQ(checkpoint_format_label(cf), "int8_convrot g256+g64");  // + 50 adaln_proj at G = 64
  int64_t n = 0;
  for (const auto& l : cf.quantised) n += l.count;
  EXPECT_EQ(n, 250);
  H3Config f8 = h3;
  f8.quant = *synthetic_quant_layout(h3, SyntheticFormat::fp8);
  auto c3 = quant_census(f8);
  ASSERT_EQ(c3.quantised.size(), 1u);
  EXPECT_EQ(c3.quantised[0].count, 200);
  EXPECT_EQ(c3.quantised[0].with_input_scale, 150);  // qkv, out_proj, fc1; not fc2
  // The int8 table: I8 weight [N, K] + F32 weight_scale [N, 1] (same role and block) +
  // U8 comfy_quant (role unused).
  H3Config c = h3;
  c.quant = *synthetic_quant_layout(h3, SyntheticFormat::int8_convrot);
  std::map<std::string, TensorSpec> by;
  for (const auto& s : h3_tensor_specs(c)) by.emplace(s.name, s);
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.weight").dtype, DType::i8);
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.weight_scale").shape, (std::vector<int64_t>{5376, 1}));
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.weight_scale").role, TensorRole::block);
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.weight_scale").block, 7);
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.comfy_quant").role, TensorRole::unused);
  EXPECT_EQ(by.at("blocks.7.mlp.fc2.comfy_quant").dtype, DType::u8);
  EXPECT_EQ(by.at("blocks.7.norm1.weight").dtype, DType::bf16);  // untouched
  // Bytes: the pruned (curve-form) int8 model is about half the bf16 one, and the size of
  // Comfy-Org's minimax_h3_*_pruned_int8_convrot file (19.53 GiB).
  H3Config pruned = h3_curve_form(h3);
  const uint64_t bf16_bytes = quant_census(pruned).total_bytes;
  pruned.quant = *synthetic_quant_layout(pruned, SyntheticFormat::int8_convrot);
  const uint64_t int8_bytes = quant_census(pruned).total_bytes;
  EXPECT_LT(int8_bytes, bf16_bytes * 6 / 10);
  EXPECT_NEAR(static_cast<double>(int8_bytes) / (1ull << 30), 19.53, 0.2) << quant_census_text(quant_census(pruned));
}

TEST(QuantLayout, SyntheticGroupsFollowK) {
  // tiny: D = I = 128 (qkv, fc1, out_proj: G = 64), F = 256 (fc2: G = 256).
  const H3Config t = preset("tiny");
  auto q = synthetic_quant_layout(t, SyntheticFormat::int8_convrot);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->find("blocks.0.attn.qkv_proj")->group, 64);
  EXPECT_EQ(q->find("blocks.1.mlp.fc2")->group, 256);
  EXPECT_TRUE(q->mixed_ops);
  EXPECT_FALSE(synthetic_quant_layout(h3_curve_form(t), SyntheticFormat::int8_convrot_full).ok());
  EXPECT_FALSE(parse_synthetic_format("int4").ok());
  EXPECT_EQ(*parse_synthetic_format("int8_convrot"), SyntheticFormat::int8_convrot);
}

// ---- the quantisers --------------------------------------------------------------------

TEST(QuantQuantisers, Int8ConvRotAgainstTheKroneckerMatrixInDouble) {
  // Rows of K = 512 (two groups of 256) and one group-64 case, from bf16 values with a
  // spread of magnitudes; the rotation in double with the explicit H_G, then q and s.
  for (int64_t G : {64, 256}) {
    const int64_t K = 2 * G, rows = 9;
    std::vector<uint16_t> w(static_cast<size_t>(rows * K));
    for (int64_t i = 0; i < rows * K; ++i)
      w[static_cast<size_t>(i)] = f32_to_bf16(static_cast<float>(std::sin(0.37 * static_cast<double>(i)) *
                                                                  (1.0 + static_cast<double>(i % 17))));
    std::vector<int8_t> q(w.size());
    std::vector<float> s(static_cast<size_t>(rows));
    quantise_int8_convrot_rows(w.data(), rows, K, G, q.data(), s.data());
    // H_G[i][j] = prod over base-4 digits of h4[d_i][d_j] / sqrt(G).
    auto h = [&](int64_t i, int64_t j) {
      static const int h4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
      int sign = 1;
      for (int64_t g = G; g > 1; g /= 4, i /= 4, j /= 4) sign *= h4[i % 4][j % 4];
      return sign / std::sqrt(static_cast<double>(G));
    };
    int64_t nonzero = 0, off = 0;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> v(static_cast<size_t>(K), 0.0);
      double amax = 0;
      for (int64_t g = 0; g < K; g += G)
        for (int64_t j = 0; j < G; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < G; ++i) acc += bf16_to_f32(w[static_cast<size_t>(r * K + g + i)]) * h(i, j);
          v[static_cast<size_t>(g + j)] = acc;
          amax = std::max(amax, std::fabs(acc));
        }
      EXPECT_NEAR(s[static_cast<size_t>(r)], amax / 127.0, amax / 127.0 * 1e-6);
      for (int64_t k = 0; k < K; ++k) {
        const double want = std::nearbyint(v[static_cast<size_t>(k)] / s[static_cast<size_t>(r)]);
        const int got = q[static_cast<size_t>(r * K + k)];
        nonzero += got != 0;
        // fp32 vs double rotation: a code may differ by one only at a rounding tie.
        EXPECT_LE(std::fabs(got - want), 1.0);
        off += got != want;
      }
    }
    EXPECT_GT(nonzero, rows * K / 2);       // non-trivial codes
    EXPECT_LE(off, rows * K / 1000 + 1);    // ties are rare
  }
}

TEST(QuantQuantisers, Fp8PerTensor) {
  std::vector<uint16_t> w = {f32_to_bf16(0.5f), f32_to_bf16(-3.0f), f32_to_bf16(1e-3f), f32_to_bf16(2.75f)};
  const float amax = bf16_amax(w.data(), 4);
  EXPECT_EQ(amax, 3.0f);
  const float s = fp8_scale_from_amax(amax);
  EXPECT_EQ(s, 3.0f / 448.0f);
  std::vector<uint8_t> q(4);
  quantise_fp8(w.data(), 4, s, q.data());
  EXPECT_EQ(f8e4m3_to_f32(q[1]), -448.0f);  // the amax maps to the format's max
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(f8e4m3_to_f32(q[static_cast<size_t>(i)]) * s, bf16_to_f32(w[static_cast<size_t>(i)]),
                std::fabs(bf16_to_f32(w[static_cast<size_t>(i)])) / 16 + 1e-6);
  EXPECT_EQ(fp8_scale_from_amax(0.0f), 1.0f);
}

// ---- files -----------------------------------------------------------------------------

TEST_F(QuantFile, SyntheticFilesOpenWithTheirLayout) {
  for (SyntheticFormat f : {SyntheticFormat::int8_convrot, SyntheticFormat::int8_convrot_full, SyntheticFormat::fp8}) {
    SCOPED_TRACE(synthetic_format_name(f));
    H3SyntheticSource syn(preset("tiny"), 7, f);
    auto src = open_ok(tensors_of(syn));
    ASSERT_NE(src, nullptr);
    const QuantLayout& got = src->cfg().quant;
    const QuantLayout& want = syn.cfg().quant;
    ASSERT_EQ(got.linears.size(), want.linears.size());
    EXPECT_TRUE(got.mixed_ops);
    for (const auto& [m, l] : want.linears) {
      const LinearQuant* g = got.find(m);
      ASSERT_NE(g, nullptr) << m;
      EXPECT_EQ(g->format, l.format) << m;
      EXPECT_EQ(g->group, l.group) << m;
      EXPECT_EQ(g->has_input_scale, l.has_input_scale) << m;
      EXPECT_EQ(g->input_scale, l.input_scale) << m;
      EXPECT_EQ(g->comfy_quant, l.comfy_quant) << m;
    }
    expect_same_tensors(syn, *src);
  }
}

TEST_F(QuantFile, MakeModelWritesTheSyntheticSource) {
  for (const char* fmt : {"int8-convrot", "int8-convrot-full", "fp8", "bf16"}) {
    SCOPED_TRACE(fmt);
    const std::string p = file(std::string(fmt) + ".safetensors");
    auto r = test::run_tool("make-model --preset tiny --seed 3 -q --format " + std::string(fmt) + " -o " + p);
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = open_h3_checkpoint(p);
    ASSERT_TRUE(f.ok()) << f.error().message;
    H3SyntheticSource syn(preset("tiny"), 3, *parse_synthetic_format(fmt));
    expect_same_tensors(syn, **f);
  }
  auto bad = test::run_tool("make-model --preset tiny --format int4 -o " + file("x.safetensors"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown weight format 'int4'"), std::string::npos) << bad.out;
}

// Blocks of different layouts in one file: --skip-edges (blocks 0, 1, L-2, L-1 bf16) and
// --bf16-blocks; the file reads back as the synthetic source of that layout, per block.
TEST_F(QuantFile, MakeModelSkipEdgesAndBf16Blocks) {
  H3Config cfg = preset("tiny");
  cfg.num_layers = 6;
  const std::string se = file("skip_edges.safetensors");
  auto r = test::run_tool("make-model --preset tiny --blocks 6 --seed 4 -q --format int8-convrot --skip-edges -o " + se);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("bf16 blocks 0,1,4,5"), std::string::npos) << r.out;
  auto f = open_h3_checkpoint(se);
  ASSERT_TRUE(f.ok()) << f.error().message;
  for (int64_t b = 0; b < 6; ++b) {
    const bool edge = b <= 1 || b >= 4;
    for (const char* m : {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"})
      EXPECT_EQ((*f)->cfg().quant.find(h3_block_key(b, m)) != nullptr, !edge) << b << " " << m;
  }
  H3SyntheticSource syn(cfg, 4, SyntheticFormat::int8_convrot_skip_edges);
  expect_same_tensors(syn, **f);

  const std::string fb = file("fp8_bf16_blocks.safetensors");
  r = test::run_tool("make-model --preset tiny --blocks 6 --seed 4 -q --format fp8 --bf16-blocks 0,3 -o " + fb);
  ASSERT_EQ(r.code, 0) << r.out;
  auto g = open_h3_checkpoint(fb);
  ASSERT_TRUE(g.ok()) << g.error().message;
  H3Config c2 = cfg;
  c2.quant = *synthetic_quant_layout(cfg, SyntheticFormat::fp8, {0, 3});
  EXPECT_EQ(c2.quant.linears.size(), 16u);
  H3SyntheticSource syn2(c2, 4);
  expect_same_tensors(syn2, **g);

  // Refusals (usage errors, exit 2, nothing written).
  for (const char* bad : {"--format bf16 --bf16-blocks 1", "--format fp8 --skip-edges", "--format int8 --bf16-blocks 1,x",
                          "--format int8 --bf16-blocks 6"}) {
    auto b = test::run_tool(std::string("make-model --preset tiny --blocks 6 -q ") + bad + " -o " + file("bad.safetensors"));
    EXPECT_EQ(b.code, 2) << bad << ": " << b.out;
  }
  EXPECT_EQ(skip_edges_blocks(50), (std::vector<int64_t>{0, 1, 48, 49}));
  EXPECT_EQ(skip_edges_blocks(3), (std::vector<int64_t>{0, 1, 2}));
}

TEST_F(QuantFile, MixedOpsHoldsFp32LinearsAsBf16) {
  H3SyntheticSource plain(preset("tiny"), 5);
  H3SyntheticSource q(preset("tiny"), 5, SyntheticFormat::int8_convrot);
  auto f = open_ok(tensors_of(q));
  ASSERT_NE(f, nullptr);
  int64_t changed = 0;
  for (const char* n : {"video_patch_proj.weight", "final_layer.audio_out.bias", "time_embedder.proj_in.weight"}) {
    const TensorView a = plain.get(n), b = f->get(n);
    ASSERT_EQ(b.dtype, DType::f32);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float x = a.ptr<float>()[i], y = b.ptr<float>()[i];
      EXPECT_EQ(y, round_bf16(x)) << n;
      changed += x != y;
    }
  }
  EXPECT_GT(changed, 0);
  // Buffers stay fp32 (rope.inv_freq: 10000^(-i/len) is not bf16-exact).
  const TensorView a = plain.get("rope.inv_freq"), b = f->get("rope.inv_freq");
  EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.nbytes())), 0);
  // A bf16 file keeps its fp32 islands.
  auto pf = open_ok(tensors_of(plain));
  EXPECT_EQ(std::memcmp(pf->get("video_patch_proj.weight").data, plain.get("video_patch_proj.weight").data,
                        static_cast<size_t>(plain.get("video_patch_proj.weight").nbytes())),
            0);
}

TEST_F(QuantFile, ParamsPlacementAndFp8WithoutComfyQuant) {
  H3SyntheticSource q8(preset("tiny"), 1, SyntheticFormat::int8_convrot);
  RawFile f = tensors_of(q8);
  set_json(f, "blocks.0.attn.qkv_proj.comfy_quant",
           R"({"format":"int8_tensorwise","params":{"convrot":true,"convrot_groupsize":64}})");
  find(f, "blocks.1.mlp.fc2.comfy_quant")->dtype = DType::i8;  // JSON bytes stored as I8: accepted
  auto src = open_ok(f);
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(src->cfg().quant.find("blocks.0.attn.qkv_proj")->group, 64);
  EXPECT_EQ(src->cfg().quant.find("blocks.1.mlp.fc2")->group, 256);

  H3SyntheticSource q3(preset("tiny"), 1, SyntheticFormat::fp8);
  RawFile g = tensors_of(q3);
  for (int b = 0; b < 2; ++b)
    for (const char* l : {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"})
      erase(g, h3_block_key(b, l) + ".comfy_quant");  // Comfy-Org's fp8_scaled may carry none
  auto s3 = open_ok(g);
  ASSERT_NE(s3, nullptr);
  EXPECT_EQ(s3->cfg().quant.linears.size(), 8u);
  EXPECT_EQ(s3->cfg().quant.find("blocks.1.attn.out_proj")->input_scale, kSyntheticFp8InputScale);
  EXPECT_FALSE(s3->cfg().quant.find("blocks.1.mlp.fc2")->has_input_scale);
}

TEST_F(QuantFile, MixedFormatsInOneFile) {
  // Block 0 int8, block 1 fp8 except its fc2 (bf16): decided per layer.
  H3SyntheticSource q8(preset("tiny"), 2, SyntheticFormat::int8_convrot);
  H3SyntheticSource q3(preset("tiny"), 2, SyntheticFormat::fp8);
  H3SyntheticSource plain(preset("tiny"), 2);
  RawFile f;
  for (const auto& t : tensors_of(q8))
    if (t.name.rfind("blocks.1.", 0) != 0) f.push_back(t);
  for (const auto& t : tensors_of(q3))
    if (t.name.rfind("blocks.1.", 0) == 0 && t.name.rfind("blocks.1.mlp.fc2", 0) != 0) f.push_back(t);
  for (const auto& t : tensors_of(plain))
    if (t.name == "blocks.1.mlp.fc2.weight") f.push_back(t);
  auto src = open_ok(f);
  ASSERT_NE(src, nullptr);
  const QuantLayout& q = src->cfg().quant;
  EXPECT_EQ(q.find("blocks.0.mlp.fc2")->format, WeightFormat::int8_convrot);
  EXPECT_EQ(q.find("blocks.1.attn.qkv_proj")->format, WeightFormat::fp8_e4m3);
  EXPECT_EQ(q.find("blocks.1.mlp.fc2"), nullptr);
  EXPECT_EQ(q.linears.size(), 7u);
  const QuantCensus c = quant_census(src->cfg());
  EXPECT_EQ(checkpoint_format_label(c), "fp8_e4m3 + int8_convrot g256+g64");
  EXPECT_NE(quant_census_text(c).find("7 quantised linears"), std::string::npos) << quant_census_text(c);
  EXPECT_EQ(quant_census_json(c)["quantised"].size(), 3u);
}

TEST_F(QuantFile, MalformedFilesAreRefusedByName) {
  H3SyntheticSource q8(preset("tiny"), 1, SyntheticFormat::int8_convrot);
  const RawFile good = tensors_of(q8);
  const std::string m = "blocks.1.mlp.fc1";  // K = 128, G = 64, N = 512
  auto refused = [&](const std::function<void(RawFile&)>& edit, const std::string& want) {
    RawFile f = good;
    edit(f);
    const std::string e = open_error(f);
    EXPECT_NE(e.find(want), std::string::npos) << "want '" << want << "' in: " << e;
    EXPECT_NE(e.find("q.safetensors"), std::string::npos) << e;  // names the file
  };
  refused(
      [&](RawFile& f) {
        auto* t = find(f, m + ".comfy_quant");
        t->dtype = DType::f32;  // [len] f32: the bytes grow with it (the view must stay inside them)
        t->bytes.resize(t->bytes.size() * 4);
      },
      "comfy_quant is stored as f32");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", "{\"format\": int8"); }, "comfy_quant is not a JSON object");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", "[1, 2]"); }, "comfy_quant is not a JSON object");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", "{\"convrot\":true}"); }, "no \"format\"");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"nvfp4"})"); }, "format 'nvfp4' is not supported");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int3_magic"})"); }, "unknown format 'int3_magic'");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int8_tensorwise"})"); }, "without ConvRot");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int8_tensorwise","convrot":true,"convrot_groupsize":256})"); },
          "ConvRot group 256 must be a power of 4");  // 256 does not divide K = 128
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int8_tensorwise","convrot":true,"convrot_groupsize":32})"); },
          "ConvRot group 32 must be a power of 4");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int8_tensorwise","convrot":"yes"})"); },
          "\"convrot\" is not a boolean");
  refused([&](RawFile& f) { find(f, m + ".weight_scale")->shape = {511, 1}; find(f, m + ".weight_scale")->bytes.resize(511 * 4); },
          "weight_scale has shape [511, 1], expected [512, 1]");
  refused([&](RawFile& f) { find(f, m + ".weight_scale")->shape = {}; find(f, m + ".weight_scale")->bytes.resize(4); },
          "a per-tensor scale is not supported with ConvRot");
  refused([&](RawFile& f) { erase(f, m + ".weight_scale"); }, "int8 weight without " + m + ".weight_scale");
  refused([&](RawFile& f) { erase(f, m + ".comfy_quant"); }, "int8 weight without " + m + ".comfy_quant");
  refused([&](RawFile& f) { find(f, m + ".weight")->dtype = DType::u8; }, "weight is stored as u8");
  refused([&](RawFile& f) { f.push_back({"blocks.0.mlp.fc1.scale_weight", DType::f32, {}, std::vector<uint8_t>(4)}); },
          "legacy scaled-fp8");
  refused([&](RawFile& f) { set_json(f, "condition_proj.comfy_quant", R"({"format":"float8_e4m3fn"})"); },
          "quantised layer condition_proj: LayerStream runs quantised weights only in the block linears");
  refused([&](RawFile& f) { set_json(f, m + ".comfy_quant", R"({"format":"int8_tensorwise","convrot":true,"full_precision_matrix_mult":true})"); },
          "full_precision_matrix_mult");
  // The unchanged file opens (so every refusal above is due to its edit).
  EXPECT_EQ(open_error(good), "");
}

// ---- --precision fp8 -------------------------------------------------------------------

TEST(QuantFp8Convert, ConvertsQkvFc1Fc2Once) {
  const H3Config cfg = preset("tiny");
  auto conv = fp8_convert_source(std::make_unique<H3SyntheticSource>(cfg, 9));
  H3SyntheticSource plain(cfg, 9);
  EXPECT_NE(conv->describe().find("lossy"), std::string::npos);
  const QuantLayout& q = conv->cfg().quant;
  EXPECT_EQ(q.linears.size(), 6u);  // 2 blocks x (qkv, fc1, fc2)
  EXPECT_EQ(q.find("blocks.0.attn.out_proj"), nullptr);
  EXPECT_FALSE(q.mixed_ops);  // a bf16 model keeps its fp32 islands
  const TensorView w = plain.get("blocks.1.mlp.fc1.weight");
  const TensorView f8 = conv->get("blocks.1.mlp.fc1.weight"), s = conv->get("blocks.1.mlp.fc1.weight_scale");
  ASSERT_EQ(f8.dtype, DType::f8e4m3);
  ASSERT_EQ(s.numel(), 1);
  const float sw = s.ptr<float>()[0];
  EXPECT_EQ(sw, bf16_amax(w.ptr<uint16_t>(), w.numel()) / 448.0f);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double a = bf16_to_f32(w.ptr<uint16_t>()[i]), b = f8e4m3_to_f32(f8.ptr<uint8_t>()[i]) * sw;
    err += (a - b) * (a - b);
    ref += a * a;
  }
  EXPECT_GT(ref, 0);
  EXPECT_LT(std::sqrt(err / ref), 0.05);  // e4m3: 3 mantissa bits
  EXPECT_GT(std::sqrt(err / ref), 1e-3);  // and lossy
  // Everything else is the inner source's.
  EXPECT_EQ(std::memcmp(conv->get("blocks.0.attn.out_proj.weight").data, plain.get("blocks.0.attn.out_proj.weight").data,
                        static_cast<size_t>(plain.get("blocks.0.attn.out_proj.weight").nbytes())),
            0);
  // Released and converted again: the same bytes.
  std::vector<uint8_t> first(static_cast<const uint8_t*>(f8.data), static_cast<const uint8_t*>(f8.data) + f8.nbytes());
  conv->release("blocks.1.mlp.fc1.weight");
  const TensorView again = conv->get("blocks.1.mlp.fc1.weight");
  EXPECT_EQ(std::memcmp(again.data, first.data(), first.size()), 0);
  // An int8 model's quantised layers are kept; nothing left to convert.
  auto conv8 = fp8_convert_source(std::make_unique<H3SyntheticSource>(cfg, 9, SyntheticFormat::int8_convrot));
  EXPECT_EQ(conv8->cfg().quant.find("blocks.0.mlp.fc1")->format, WeightFormat::int8_convrot);
}
