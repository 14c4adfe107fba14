// One memory request and one range table at every door (issues 27 item 1, 28 item 6).
//
// tests/data/memory_doors.json is fed here to the CLI (`layerstream forward` flags) and
// to the C API twice (ls_engine_params.memory: the tagged ls_memory_request; and the
// legacy ls_engine_params fields), and by tests/python/test_doors.py to Python and the
// ComfyUI node: every door must accept the same cases and refuse the others with the
// same message (each door's spelling of the field names substituted). Then the range
// table: the values issue 28 found accepted by the C and Python doors but refused by the
// CLI, refused at the C door with the CLI's message; and the LoRA strength grammar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "layerstream/layerstream.h"
#include "model/lora.h"

namespace {

using nlohmann::json;

json load_table() {
  std::ifstream f(std::string(LS_TEST_DATA_DIR) + "/memory_doors.json");
  EXPECT_TRUE(f.good());
  return json::parse(f);
}

// {field} -> the door's spelling.
const std::map<std::string, std::string> kCliNames = {
    {"vram_budget", "--vram-budget"},       {"activation_budget", "--budget"},
    {"prefetch", "--no-prefetch/--keep-prefetch"},
    {"prefetch_off", "--no-prefetch"},      {"prefetch_always", "--keep-prefetch"},
    {"mlp_chunk", "--mlp-chunk"},           {"attn_chunk", "--attn-chunk"},
    {"final_chunk", "--final-chunk"},       {"kv_offload", "--kv-offload"},
    {"kv_chunk", "--kv-chunk"},             {"residual_offload", "--residual-offload"},
    {"resident_blocks", "--resident-blocks"}, {"slots", "--slots"},
    {"a_device", "--device cuda"}};
const std::map<std::string, std::string> kFieldNames = {
    {"vram_budget", "vram_budget"},         {"activation_budget", "activation_budget"},
    {"prefetch", "prefetch"},               {"prefetch_off", "prefetch=0"},
    {"prefetch_always", "prefetch=2"},      {"mlp_chunk", "mlp_chunk"},
    {"attn_chunk", "attn_chunk"},           {"final_chunk", "final_chunk"},
    {"kv_offload", "kv_offload"},           {"kv_chunk", "kv_chunk"},
    {"residual_offload", "residual_offload"}, {"resident_blocks", "resident_blocks"},
    {"slots", "slots"},                     {"a_device", "a \"cuda\" device"}};

std::string spell(std::string text, const std::map<std::string, std::string>& names) {
  for (const auto& [k, v] : names) {
    const std::string key = "{" + k + "}";
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + v.size()))
      text.replace(at, key.size(), v);
  }
  EXPECT_EQ(text.find('{'), std::string::npos) << "unknown placeholder in " << text;
  return text;
}

// ---- the C door --------------------------------------------------------------------------
// The case's memory as an ls_memory_request (new) or the legacy ls_engine_params fields;
// sizes through ls_parse_size (the C door's parser). Returns "" or the message.
std::string c_door(const json& c, bool tagged) {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  const std::string device = c.value("device", "cpu");
  p.device = device.c_str();
  ls_memory_request r;
  ls_memory_request_init(&r);
  for (const auto& [key, v] : c["memory"].items()) {
    if (key == "vram_budget" || key == "activation_budget") {
      uint64_t bytes = 0;
      if (ls_parse_size(key.c_str(), v.get<std::string>().c_str(), &bytes) != LS_OK) return ls_last_error();
      if (key == "vram_budget") {
        r.mode = LS_MEMORY_VRAM_BUDGET, r.vram_budget = static_cast<int64_t>(bytes);
        p.memory_mode = LS_MEMORY_VRAM_BUDGET, p.vram_budget = bytes;
      } else {
        if (r.mode != LS_MEMORY_VRAM_BUDGET) r.mode = LS_MEMORY_ACTIVATION_BUDGET;
        if (p.memory_mode != LS_MEMORY_VRAM_BUDGET) p.memory_mode = LS_MEMORY_ACTIVATION_BUDGET;
        r.activation_budget = static_cast<int64_t>(bytes), p.activation_budget = bytes;
      }
      continue;
    }
    const int64_t x = v.get<int64_t>();
    if (key == "prefetch") r.prefetch = x, p.prefetch = static_cast<int32_t>(x);
    else if (key == "mlp_chunk") r.mlp_chunk = x, p.mlp_chunk = x;
    else if (key == "attn_chunk") r.attn_chunk = x, p.attn_chunk = x;
    else if (key == "final_chunk") r.final_chunk = x, p.final_chunk = x;
    else if (key == "kv_offload") r.kv_offload = x, p.kv_offload = static_cast<int32_t>(x);
    else if (key == "kv_chunk") r.kv_chunk = x, p.kv_chunk = x;
    else if (key == "residual_offload") r.residual_offload = x, p.residual_offload = static_cast<int32_t>(x);
    else if (key == "resident_blocks") r.resident_blocks = x, p.resident_blocks = x;
    else if (key == "slots") r.slots = x, p.slots = static_cast<int32_t>(x);
    else ADD_FAILURE() << "unknown key " << key;
  }
  if (tagged) {
    // The validation alone first: the same answer as ls_engine_create's.
    const ls_status v = ls_memory_validate(&r, device.c_str());
    const std::string vmsg = v == LS_OK ? "" : ls_last_error();
    ls_engine_params fresh;
    ls_engine_params_init(&fresh);
    fresh.preset = "tiny";
    fresh.device = device.c_str();
    fresh.memory = &r;
    p = fresh;
    ls_engine* e = nullptr;
    const ls_status st = ls_engine_create(&p, &e);
    const std::string msg = st == LS_OK ? "" : ls_last_error();
    EXPECT_EQ(msg, vmsg) << "ls_memory_validate and ls_engine_create disagree";
    ls_engine_free(e);
    return msg;
  }
  ls_engine* e = nullptr;
  const ls_status st = ls_engine_create(&p, &e);
  ls_engine_free(e);
  return st == LS_OK ? "" : ls_last_error();
}

// ---- the CLI door --------------------------------------------------------------------------
std::string cli_door(const json& c, int* code) {
  std::string args = "forward --preset tiny --frames 5 --width 32 --height 32 --text-tokens 1 --sigma 1 -q";
  for (const auto& [key, v] : c["memory"].items()) {
    const auto quoted = [](const std::string& s) { return " '" + s + "'"; };
    if (key == "vram_budget") args += " --vram-budget" + quoted(v.get<std::string>());
    else if (key == "activation_budget") args += " --budget" + quoted(v.get<std::string>());
    else if (key == "prefetch") args += v.get<int64_t>() == 0 ? " --no-prefetch" : " --keep-prefetch";
    else if (key == "kv_offload") args += " --kv-offload";
    else if (key == "residual_offload") args += " --residual-offload";
    else args += " --" + std::string(key == "mlp_chunk"        ? "mlp-chunk"
                                     : key == "attn_chunk"     ? "attn-chunk"
                                     : key == "final_chunk"    ? "final-chunk"
                                     : key == "kv_chunk"       ? "kv-chunk"
                                     : key == "resident_blocks" ? "resident-blocks"
                                                                : key) +
                 " " + std::to_string(v.get<int64_t>());
  }
  args += " --device " + c.value("device", std::string("cpu"));
  const ls::test::ToolRun r = ls::test::run_tool(args);
  *code = r.code;
  return r.out;
}

TEST(Doors, MemoryTableSameAnswerAtTheCliAndTheCApi) {
  const json table = load_table();
  ASSERT_GE(table["cases"].size(), 15u);
  int refused = 0, accepted = 0;
  for (const json& c : table["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string expect = c["expect"];
    const bool ok = expect == "ok";
    ok ? ++accepted : ++refused;
    // C API, the tagged request and the legacy fields.
    for (bool tagged : {true, false}) {
      const std::string msg = c_door(c, tagged);
      if (ok) EXPECT_EQ(msg, "") << (tagged ? "ls_memory_request" : "legacy fields");
      else EXPECT_EQ(msg, spell(expect, kFieldNames)) << (tagged ? "ls_memory_request" : "legacy fields");
    }
    // The CLI: exit 0, or exit 2 with "forward: error: <message>".
    int code = -1;
    const std::string out = cli_door(c, &code);
    if (ok) {
      EXPECT_EQ(code, 0) << out;
    } else {
      EXPECT_EQ(code, 2) << out;
      EXPECT_NE(out.find("forward: error: " + spell(expect, kCliNames) + "\n"), std::string::npos)
          << "want: " << spell(expect, kCliNames) << "\ngot: " << out;
    }
  }
  EXPECT_GT(refused, 10);
  EXPECT_GT(accepted, 2);
}

TEST(Doors, SizeParserIsTheLibrarys) {
  uint64_t b = 0;
  ASSERT_EQ(ls_parse_size("vram_budget", "3.5GiB", &b), LS_OK);
  EXPECT_EQ(b, 7ull << 29);
  ASSERT_EQ(ls_parse_size(nullptr, "512m", &b), LS_OK);
  EXPECT_EQ(b, 512ull << 20);
  for (const char* bad : {"12GB", "+5G", "0x10", " 1G", "1G ", "-1", "", "1e3", "nan"}) {
    EXPECT_EQ(ls_parse_size("x", bad, &b), LS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(std::string(ls_last_error()).rfind("x must be a size in 1 B..1 EiB", 0), 0u) << ls_last_error();
  }
}

TEST(Doors, RangeTableIsExported) {
  const size_t n = ls_range_count();
  ASSERT_GE(n, 20u);
  std::map<std::string, ls_range> by_name;
  for (size_t i = 0; i < n; ++i) {
    ls_range r;
    r.size = sizeof r;
    ASSERT_EQ(ls_range_at(i, &r), LS_OK);
    by_name[r.name] = r;
  }
  ls_range past;
  past.size = sizeof past;
  EXPECT_EQ(ls_range_at(n, &past), LS_NOT_FOUND);
  ASSERT_TRUE(by_name.count("kv_tile") && by_name.count("sigma") && by_name.count("vram_budget"));
  EXPECT_STREQ(by_name["kv_tile"].text, "1..2^30");
  EXPECT_STREQ(by_name["sigma"].text, "(0, 1]");
  EXPECT_EQ(by_name["sigma"].lo_open, 1);
  EXPECT_EQ(by_name["vram_budget"].kind, LS_RANGE_SIZE);
  double v = 0;
  EXPECT_EQ(ls_parse_value("sigma", "--sigma", "0.5", &v), LS_OK);
  EXPECT_EQ(v, 0.5);
  EXPECT_EQ(ls_parse_value("sigma", "--sigma", "2.0", &v), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_last_error(), "--sigma must be a finite number in (0, 1] (got '2.0')");
  EXPECT_EQ(ls_parse_value("no_such", nullptr, "1", &v), LS_NOT_FOUND);
}

// The values issue 28 found accepted at the C door (and Python's, through it) but refused by
// the CLI: refused here, with the CLI's message.
ls_engine* tiny_engine() {
  ls_engine_params p;
  ls_engine_params_init(&p);
  p.preset = "tiny";
  ls_engine* e = nullptr;
  EXPECT_EQ(ls_engine_create(&p, &e), LS_OK) << ls_last_error();
  return e;
}

TEST(Doors, CApiRefusesWhatTheCliRefuses) {
  // Engine parameters.
  struct Bad {
    void (*set)(ls_engine_params&, ls_numerics&);
    const char* message;
  };
  const Bad bad[] = {
      {[](ls_engine_params& p, ls_numerics&) { p.blocks = -3; }, "blocks must be an integer in 1..1000 (got '-3')"},
      {[](ls_engine_params& p, ls_numerics&) { p.threads = 5000; }, "threads must be an integer in 0..4096 (got '5000')"},
      {[](ls_engine_params&, ls_numerics& n) { n.kv_tile = int64_t{1} << 40; },
       "numerics.kv_tile must be an integer in 1..2^30 (got '1099511627776')"},
      {[](ls_engine_params& p, ls_numerics&) { p.weights_seed = UINT64_MAX; },
       "weights_seed must be an integer in 0..2^63-1 (got '18446744073709551615')"},
  };
  for (const Bad& b : bad) {
    ls_engine_params p;
    ls_engine_params_init(&p);
    ls_numerics n;
    ls_numerics_init(&n);
    p.preset = "tiny";
    p.numerics = &n;
    b.set(p, n);
    ls_engine* e = nullptr;
    EXPECT_EQ(ls_engine_create(&p, &e), LS_INVALID_ARGUMENT) << b.message;
    EXPECT_STREQ(ls_last_error(), b.message);
    ls_engine_free(e);
  }
  // The clip and the call.
  ls_engine* e = tiny_engine();
  ASSERT_NE(e, nullptr);
  const char* json_out = nullptr;
  ls_clip clip;
  ls_clip_init(&clip);
  clip.frames = 22, clip.width = 64, clip.height = 64, clip.text_tokens = 8;
  ASSERT_EQ(ls_engine_plan(e, &clip, 0.5f, &json_out), LS_OK) << ls_engine_last_error(e);
  for (float sigma : {2.0f, 1e30f, 0.0f, std::nanf("")}) {
    EXPECT_EQ(ls_engine_plan(e, &clip, sigma, &json_out), LS_INVALID_ARGUMENT) << sigma;
    EXPECT_EQ(std::string(ls_engine_last_error(e)).rfind("sigma must be a finite number in (0, 1] (got '", 0), 0u)
        << ls_engine_last_error(e);
  }
  const float nan_sigmas[] = {1.0f, std::nanf(""), 0.0f};
  clip.sample_sigmas = nan_sigmas, clip.sample_sigma_count = 3;
  EXPECT_EQ(ls_engine_plan(e, &clip, 0.5f, &json_out), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_engine_last_error(e), "ls_clip.sample_sigmas[1] must be a finite number in [0, 1] (got 'nan')");
  clip.sample_sigmas = nullptr, clip.sample_sigma_count = 0;
  // A keyframe at frame 10^6 of a 22-frame clip.
  ls_model_info info;
  ls_model_info_init(&info);
  ASSERT_EQ(ls_engine_model_info(e, &info), LS_OK);
  std::vector<float> kv(static_cast<size_t>(info.latents_dim * 1 * 4 * 4), 0.25f);
  ls_keyframe k{};
  k.pixel_frame = 1000000;
  k.video = {kv.data(), 1, 4, 4};
  clip.keyframes = &k, clip.keyframe_count = 1;
  EXPECT_EQ(ls_engine_plan(e, &clip, 0.5f, &json_out), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_engine_last_error(e), "keyframe 0 pixel_frame must be an integer in 0..21 (got '1000000')");
  clip.keyframes = nullptr, clip.keyframe_count = 0;
  clip.frames = 0;
  EXPECT_EQ(ls_engine_plan(e, &clip, 0.5f, &json_out), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_engine_last_error(e), "ls_clip.frames must be an integer in 1..100000 (got '0')");
  clip.frames = 22;
  clip.vis_aug = 1.5;
  EXPECT_EQ(ls_engine_plan(e, &clip, 0.5f, &json_out), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_engine_last_error(e), "ls_clip.vis_aug must be a finite number in [0, 1] (got '1.5')");
  ls_engine_free(e);
}

TEST(Doors, ClipGeometryWithoutAnEngine) {
  ls_clip_grid g;
  g.size = sizeof g;
  ASSERT_EQ(ls_clip_geometry(22, 64, 96, &g), LS_OK) << ls_last_error();
  EXPECT_EQ(g.frames, 22);
  EXPECT_EQ(g.T, 7);
  EXPECT_EQ(g.Hl, 6);
  EXPECT_EQ(g.Wl, 4);
  EXPECT_EQ(g.A, 37);
  ASSERT_EQ(ls_clip_geometry(23, 64, 64, &g), LS_OK);
  EXPECT_EQ(g.frames, 39);  // snapped up to 17j + 5
  EXPECT_EQ(ls_clip_geometry(0, 64, 64, &g), LS_INVALID_ARGUMENT);
  EXPECT_STREQ(ls_last_error(), "frames must be an integer in 1..100000 (got '0')");
  EXPECT_EQ(ls_clip_geometry(22, 48, 64, &g), LS_INVALID_ARGUMENT);  // not a multiple of 32
}

TEST(Doors, LoraStrengthGrammar) {
  auto ok = ls::lora::parse_lora_arg("F:0.5");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->path, "F");
  EXPECT_EQ(ok->strength, 0.5);
  ok = ls::lora::parse_lora_arg("F:-1.25e1");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->strength, -12.5);
  // Not a number at all: part of the file name (a path with ':').
  ok = ls::lora::parse_lora_arg("dir:name.safetensors");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->path, "dir:name.safetensors");
  EXPECT_EQ(ok->strength, 1.0);
  // What strtod reads but the grammar refuses: hex (0x10 gave strength 16), hex floats,
  // '+', spaces, inf / nan, out of ComfyUI's range.
  for (const char* bad : {"F:0x10", "F:0x1p4", "F:+2", "F: 1", "F:inf", "F:nan", "F:1e9", "F:101"}) {
    auto r = ls::lora::parse_lora_arg(bad);
    ASSERT_FALSE(r.ok()) << bad << " gave strength " << (r.ok() ? r->strength : 0);
    EXPECT_NE(r.error().message.find("the strength must be a finite number in [-100, 100]"), std::string::npos)
        << r.error().message;
  }
  // The CLI door: refused as a usage error before any file is read.
  const ls::test::ToolRun r =
      ls::test::run_tool("forward --preset tiny --frames 5 --width 32 --height 32 --text-tokens 1 --sigma 1 --lora F:0x10");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the strength must be a finite number"), std::string::npos) << r.out;
}

}  // namespace
