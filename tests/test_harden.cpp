// Issue 28 (the second hostile-input round): each finding's fix, tested at its cause.
//   1. an output can never replace an input (device + inode after links);
//   2. CLI input files with > 4-D tensors are refused, never an abort;
//   3. a model file truncated while mapped is an error naming it, never SIGBUS;
//   4. non-finite values in a quantised checkpoint's float tensors and in LoRA files are
//      refused at load;
//   5. SIGTERM / SIGINT during forward / generate leave no file of the run;
//   7. metadata overrides bounded (tests/test_h3_config.cpp, MetadataOverridesBoundedBeforeUse);
//   8. file bytes escaped at the error sinks;
//   9. an absurd clip is a usage error before any large allocation.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "api/session.h"
#include "cli_test_util.h"
#include "core/dtype.h"
#include "core/printable.h"
#include "exactness_util.h"
#include "file_test_util.h"
#include "io/finite_scan.h"
#include "io/mapping_guard.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/lora.h"

namespace ls {
namespace {

using test::run_tool;

class Harden : public test::TempDirTest {
 protected:
  Harden() : TempDirTest("ls_harden") {}
  // A tiny synthetic checkpoint (make-model), made once per test that needs it.
  std::string tiny_model() {
    const std::string m = file("tiny.safetensors");
    auto r = run_tool("make-model --preset tiny -q -o " + m);
    EXPECT_EQ(r.code, 0) << r.out;
    return m;
  }
  static std::string bytes_of(const std::string& path) { return test::read_all(path); }
};

// A safetensors file of f32 tensors (name, shape), values 0.25.
void write_f32_file(const std::string& path, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts,
                    const std::map<std::string, std::string>& meta = {}) {
  std::vector<std::vector<float>> data;
  std::vector<NamedTensor> named;
  for (const auto& [n, shape] : ts) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    data.emplace_back(static_cast<size_t>(k), 0.25f);
  }
  // SafetensorsWriter: any rank (a TensorView holds at most 4).
  SafetensorsWriter w(path);
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  for (const auto& [n, shape] : ts) ASSERT_TRUE(w.declare(n, DType::f32, shape).ok());
  ASSERT_TRUE(w.begin().ok());
  for (size_t i = 0; i < ts.size(); ++i)
    ASSERT_TRUE(w.write_tensor(ts[i].first, data[i].data(), data[i].size() * 4).ok());
  ASSERT_TRUE(w.commit().ok());
}

// ---- 8. printable error text --------------------------------------------------------

TEST(Printable, ControlBytesAndHiddenCodePointsEscaped) {
  EXPECT_EQ(printable_text("plain text, tab\tand\nnewline"), "plain text, tab\tand\nnewline");
  EXPECT_EQ(printable_text("a\x1b]0;pwned\x07z"), "a\\x1b]0;pwned\\x07z");
  EXPECT_EQ(printable_text("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(printable_text("back\\slash \\x1b"), "back\\slash \\x1b");  // already escaped: kept
  EXPECT_EQ(printable_text("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // UTF-8 kept
  EXPECT_EQ(printable_text("\xc2\x9b" "31m"), "\\xc2\\x9b31m");                         // C1 CSI
  EXPECT_EQ(printable_text("\xe2\x80\xae" "evil"), "\\xe2\\x80\\xaeevil");               // RLO
  EXPECT_EQ(printable_text("\xff\xfe\x7f"), "\\xff\\xfe\\x7f");                          // invalid, DEL
  EXPECT_EQ(printable_text("\xc0\x80"), "\\xc0\\x80");                                   // overlong
  EXPECT_EQ(printable_text(std::string("nul\0x", 5)), "nul\\x00x");
}

TEST_F(Harden, CliErrorsNeverCarryRawControlBytes) {
  // A LoRA whose key name holds an escape sequence that would clear the screen.
  const std::string lora = file("evil.safetensors");
  write_f32_file(lora, {{"diffusion_model.\x1b[2J\x1b]0;pwned\x07.lora_up.weight", {2, 2}}});
  auto r = run_tool("forward --preset tiny --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.5 -q --lora " +
                    lora);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\x1b[2J"), std::string::npos) << r.out;
}

// ---- 1. an output never replaces an input ---------------------------------------------

TEST_F(Harden, OutputPolicyComparesOutputsWithInputs) {
  const std::string in = file("in.bin"), other = file("other.bin"), link = file("link.bin"), hard = file("hard.bin");
  test::write_all(in, "input");
  test::write_all(other, "other");
  ASSERT_EQ(symlink(in.c_str(), link.c_str()), 0);
  ASSERT_EQ(::link(in.c_str(), hard.c_str()), 0);
  const std::vector<io::NamedPath> inputs{{"--model", in}};
  for (const std::string& out : {in, link, hard, dir_.string() + "/./in.bin"}) {
    Status s = io::check_outputs_against_inputs({{"-o", out}}, inputs);
    ASSERT_FALSE(s.ok()) << out;
    EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(s.message().find("same file as --model"), std::string::npos) << s.message();
  }
  // Suffixes: --lora FILE:STRENGTH and --keyframe FILE@FRAME name FILE.
  EXPECT_FALSE(io::check_outputs_against_inputs({{"--json", in}}, {{"--lora", in + ":0.5"}}).ok());
  EXPECT_FALSE(io::check_outputs_against_inputs({{"--json", in}}, {{"--keyframe", in + "@last"}}).ok());
  // Other files, new files and /dev/null pass; two outputs that are one file do not.
  EXPECT_TRUE(io::check_outputs_against_inputs({{"-o", other}, {"--json", file("new.json")}, {"--memory-plot", "/dev/null"}},
                                               inputs).ok());
  EXPECT_FALSE(io::check_outputs_against_inputs({{"-o", other}, {"--json", file("./other.bin")}}, {}).ok());
  EXPECT_EQ(bytes_of(in), "input");
}

TEST_F(Harden, CliRefusesAnOutputThatIsAnInput) {
  const std::string m = tiny_model();
  const std::string before = bytes_of(m);
  const std::string link = file("model_link.safetensors");
  ASSERT_EQ(symlink(m.c_str(), link.c_str()), 0);
  const std::string fwd = "forward --model " + m + " --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.5 -q ";
  for (const std::string& outs : {"-o " + m, "--json " + m, "--memory-plot " + m, "-o " + link, "--json " + link}) {
    auto r = run_tool(fwd + outs);
    EXPECT_EQ(r.code, 2) << outs << ": " << r.out;
    EXPECT_NE(r.out.find("same file as --model"), std::string::npos) << r.out;
  }
  auto g = run_tool("generate --model " + m + " --steps 1 --frames 5 --width 64 --height 64 --text-tokens 4 -q -o " + link);
  EXPECT_EQ(g.code, 2) << g.out;
  // merge-lora: onto its model or its LoRA.
  const std::string lora = file("l.safetensors");
  test::write_all(lora, "not read");
  auto ml = run_tool("merge-lora --model " + m + " --lora " + lora + ":0.5 -o " + m);
  EXPECT_EQ(ml.code, 2) << ml.out;
  auto ll = run_tool("merge-lora --model " + m + " --lora " + lora + " -o " + lora);
  EXPECT_EQ(ll.code, 2) << ll.out;
  EXPECT_NE(ll.out.find("same file as --lora"), std::string::npos) << ll.out;
  EXPECT_EQ(bytes_of(m), before);
  EXPECT_EQ(bytes_of(lora), "not read");
}

// ---- 2. > 4-D tensors in CLI input files ----------------------------------------------

TEST_F(Harden, FiveDimensionalInputsAreRefusedNotAborted) {
  const std::string five = file("five.safetensors");
  write_f32_file(five, {{"video", {1, 1, 1, 1, 1}},
                        {"audio", {1, 1, 1, 1, 1}},
                        {"text", {1, 1, 1, 1, 1}},
                        {"negative", {1, 1, 1, 1, 1}},
                        {"video_mask", {1, 1, 1, 1, 1}},
                        {"audio_mask", {1, 1, 1, 1, 1}}});
  const std::string fwd = "forward --preset tiny --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.5 -q ";
  for (const char* flag : {"--inputs ", "--mask ", "--keyframe "}) {
    auto r = run_tool(fwd + flag + five);
    EXPECT_EQ(r.code, 1) << flag << r.out;  // an invalid file, not SIGABRT (-1)
    EXPECT_NE(r.out.find("[1, 1, 1, 1, 1]"), std::string::npos) << flag << r.out;
    EXPECT_EQ(r.out.find("views hold at most"), std::string::npos) << r.out;
  }
  const std::string gen = "generate --preset tiny --steps 1 --frames 5 --width 64 --height 64 -q -o " +
                          file("g.safetensors") + " ";
  for (const char* flag : {"--text ", "--keyframe ", "--ref "}) {
    auto r = run_tool(gen + flag + five);
    EXPECT_EQ(r.code, 1) << flag << r.out;
    EXPECT_EQ(r.out.find("views hold at most"), std::string::npos) << r.out;
  }
  // "negative" alone 5-D (a valid "text"): generate's second text tensor.
  const std::string neg = file("neg.safetensors");
  write_f32_file(neg, {{"text", {4, 8}}, {"negative", {1, 1, 4, 8, 1}}});
  auto r = run_tool(gen + "--cfg 2 --text " + neg);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("\"negative\" is [1, 1, 4, 8, 1]"), std::string::npos) << r.out;
}

// ---- 3. a model file truncated while in use --------------------------------------------

TEST_F(Harden, TruncatedMappingReadsZerosAndIsReportedNotSigbus) {
  const std::string p = file("big.safetensors");
  write_f32_file(p, {{"w", {1 << 18}}});  // 1 MiB of 0.25
  auto r = SafetensorsReader::open(p);
  ASSERT_TRUE(r.ok());
  const SafetensorsEntry* e = (*r)->find("w");
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(io::check_mapped_files().ok());
  ASSERT_EQ(truncate(p.c_str(), 8192), 0);  // someone else cuts the file short
  const auto* bytes = static_cast<const unsigned char*>((*r)->data(*e));
  uint64_t sum = 0;
  // Every 128th value's high byte (0x3e of 0.25f): SIGBUS past the cut without the guard.
  for (int64_t i = 0; i < 4 * e->numel(); i += 512) sum += bytes[i + 3];
  EXPECT_GT(sum, 0u);                                       // the pages before the cut are still the file's
  EXPECT_LT(sum, 0x3eu * static_cast<uint64_t>(e->numel() / 128));  // and the rest reads zeros
  Status s = io::check_mapped_files();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::io);
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  r->reset();  // the damaged reader gone: nothing left to report
  EXPECT_TRUE(io::check_mapped_files().ok());
}

TEST_F(Harden, SessionReportsAModelTruncatedBetweenLoadAndRun) {
  const std::string m = tiny_model();
  auto opened = api::Session::open_backend("cpu");
  ASSERT_TRUE(opened.ok());
  api::Session& s = **opened;
  api::WeightsSpec w;
  w.model_path = m;
  ASSERT_TRUE(s.load_weights(w).ok());
  const h3::Conditioning cond = test::clip(5, 64, 64, 4);
  api::MemorySpec mem;
  auto rp = s.plan(cond, {0.5f}, mem);
  ASSERT_TRUE(rp.ok()) << rp.error().message;
  ASSERT_TRUE(s.create_engine(*rp, {}).ok());
  ASSERT_EQ(truncate(m.c_str(), 4096), 0);
  const h3::H3Config& cfg = s.config();
  const h3::ClipGeometry& g = cond.geometry;
  std::vector<float> text(static_cast<size_t>(g.text_tokens * cfg.text_dim), 0.1f);
  std::vector<float> video(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl), 0.2f);
  std::vector<float> audio(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A), 0.3f);
  api::DenoiseCall call;
  call.cond = &cond;
  call.text = TensorView(text.data(), DType::f32, {g.text_tokens, cfg.text_dim});
  call.video = TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
  call.audio = TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A});
  call.sigma = 0.5f;
  call.plan = &rp->plan;
  auto r = s.denoise(call);  // SIGBUS without the guard
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(m), std::string::npos) << r.error().message;
}

// ---- 4. non-finite values the quantised path would hide ------------------------------

TEST(FiniteScan, EveryFloatDtype) {
  struct Case {
    DType dt;
    std::vector<unsigned char> bytes;
    int64_t bad, first;
  };
  const float nan = std::nanf(""), inf = INFINITY;
  auto f32 = [](std::vector<float> v) {
    std::vector<unsigned char> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  const Case cases[] = {
      {DType::f32, f32({1, nan, 2, -inf}), 2, 1},
      {DType::f32, f32({1, 2, 3, 4}), 0, -1},
      {DType::bf16, {0x80, 0x3f, 0xc0, 0x7f, 0x80, 0xff, 0, 0}, 2, 1},  // 1, NaN, -inf, 0
      {DType::f16, {0x00, 0x3c, 0x00, 0x7c, 0x00, 0x00, 0x01, 0xfe}, 2, 1},
      {DType::f8e4m3, {0x38, 0x7f, 0x7e, 0xff}, 2, 1},  // 0x7e = 448 is finite
  };
  const std::string dir = std::filesystem::temp_directory_path().string();
  for (const Case& c : cases) {
    const int64_t n = static_cast<int64_t>(c.bytes.size()) / dtype_size(c.dt);
    auto bytes_file = [&]() {
      SafetensorsWriter w(dir + "/ls_harden_scan.safetensors");
      EXPECT_TRUE(w.declare("t", c.dt, {n}).ok());
      EXPECT_TRUE(w.begin().ok());
      EXPECT_TRUE(w.write_tensor("t", c.bytes.data(), c.bytes.size()).ok());
      EXPECT_TRUE(w.commit().ok());
    };
    bytes_file();
    auto r = SafetensorsReader::open(dir + "/ls_harden_scan.safetensors");
    ASSERT_TRUE(r.ok());
    int64_t first = -2;
    EXPECT_EQ(io::count_nonfinite(**r, *(*r)->find("t"), &first), c.bad) << dtype_name(c.dt);
    EXPECT_EQ(first, c.first) << dtype_name(c.dt);
    std::filesystem::remove(dir + "/ls_harden_scan.safetensors");
  }
}

// Overwrites the first element of tensor `name` of the safetensors file with `value`.
void poke(const std::string& path, const std::string& name, float value) {
  uint64_t off = 0;
  DType dt{};
  {
    auto r = SafetensorsReader::open(path);
    ASSERT_TRUE(r.ok());
    const SafetensorsEntry* e = (*r)->find(name);
    ASSERT_NE(e, nullptr) << name;
    off = (*r)->data_start() + e->begin;
    dt = e->dtype;
  }
  unsigned char b[4];
  store_from_f32(b, dt, 0, value);
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, b, static_cast<size_t>(dtype_size(dt)), static_cast<off_t>(off)), dtype_size(dt));
  ::close(fd);
}

TEST_F(Harden, QuantisedCheckpointWithNonFiniteFloatTensorsRefusedAtLoad) {
  for (const char* format : {"int8-convrot", "fp8"}) {
    for (const char* t : {"blocks.0.attn.q_norm.weight", "rope.inv_freq", "blocks.0.attn.qkv_proj.weight_scale"}) {
      const std::string m = file(std::string(format) + ".safetensors");
      auto made = run_tool(std::string("make-model --preset tiny -q --format ") + format + " -o " + m);
      ASSERT_EQ(made.code, 0) << made.out;
      {
        auto opened = h3::open_h3_checkpoint(m);
        ASSERT_TRUE(opened.ok()) << opened.error().message;  // clean before the poke
      }
      poke(m, t, std::nanf(""));
      auto opened = h3::open_h3_checkpoint(m);
      ASSERT_FALSE(opened.ok()) << format << " " << t;
      EXPECT_EQ(opened.error().code, ErrorCode::nonfinite);
      EXPECT_NE(opened.error().message.find(t), std::string::npos) << opened.error().message;
      auto r = run_tool("forward --model " + m + " --frames 5 --width 64 --height 64 --text-tokens 4 --sigma 0.5 -q");
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_NE(r.out.find("non-finite"), std::string::npos) << r.out;
    }
  }
}

TEST_F(Harden, LoraWithNonFiniteFactorOrAlphaRefused) {
  const h3::H3Config cfg = *h3::h3_preset("tiny");
  const std::vector<h3::TensorSpec> specs = h3::h3_tensor_specs(cfg);
  int64_t N = 0, K = 0;
  for (const auto& s : specs)
    if (s.name == "blocks.0.attn.qkv_proj.weight") N = s.shape[0], K = s.shape[1];
  ASSERT_GT(N, 0);
  const std::string m = "diffusion_model.blocks.0.attn.qkv_proj";
  for (int bad = 0; bad < 4; ++bad) {
    const std::string p = file("lora" + std::to_string(bad) + ".safetensors");
    std::vector<float> up(static_cast<size_t>(N * 2), 0.01f), down(static_cast<size_t>(2 * K), 0.01f), alpha{2.0f};
    if (bad == 1) up[5] = std::nanf("");
    if (bad == 2) down[0] = -INFINITY;
    if (bad == 3) alpha[0] = std::nanf("");
    SafetensorsWriter w(p);
    ASSERT_TRUE(w.declare(m + ".lora_up.weight", DType::f32, {N, 2}).ok());
    ASSERT_TRUE(w.declare(m + ".lora_down.weight", DType::f32, {2, K}).ok());
    ASSERT_TRUE(w.declare(m + ".alpha", DType::f32, {}).ok());
    ASSERT_TRUE(w.begin().ok());
    ASSERT_TRUE(w.write_tensor(m + ".lora_up.weight", up.data(), up.size() * 4).ok());
    ASSERT_TRUE(w.write_tensor(m + ".lora_down.weight", down.data(), down.size() * 4).ok());
    ASSERT_TRUE(w.write_tensor(m + ".alpha", alpha.data(), 4).ok());
    ASSERT_TRUE(w.commit().ok());
    lora::LoraFile f;
    f.path = p;
    f.strength = 1.0;
    auto set = lora::LoraSet::open({f}, specs);
    if (bad == 0) {
      EXPECT_TRUE(set.ok()) << set.error().message;  // the clean file loads (not vacuous)
    } else {
      ASSERT_FALSE(set.ok()) << bad;
      EXPECT_EQ(set.error().code, ErrorCode::nonfinite) << set.error().message;
    }
  }
}

// ---- 5. signals during forward / generate ------------------------------------------------

// Starts `layerstream ARGS` in the background (own process group); returns its pid.
pid_t spawn_tool(const std::string& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    const std::string cmd = std::string("exec ") + LS_TOOL_PATH + " " + args + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

TEST_F(Harden, SignalsDuringForwardAndGenerateLeaveNoFiles) {
  const std::string out = file("out");
  std::filesystem::create_directory(out);
  struct Run {
    std::string args;
    int sig;
    const char* progress;  // a progress line's text (stderr)
  };
  const Run runs[] = {
      {"forward --preset small --frames 39 --width 256 --height 256 --text-tokens 16 --sigma 0.5 -o " + out +
           "/v.safetensors --json " + out + "/r.json --memory-plot " + out + "/m.svg",
       SIGTERM, "forward: "},
      {"generate --preset small --steps 8 --frames 22 --width 128 --height 128 -o " + out + "/g.safetensors --json " +
           out + "/g.json",
       SIGINT, "block passes"},
  };
  for (const Run& run : runs) {
    const std::string log = file("log.txt");
    const pid_t pid = spawn_tool(run.args, log);
    ASSERT_GT(pid, 0);
    // Until it is computing: its first progress line on stderr (stdout is a file, so
    // block-buffered), at most 60 s; the run must still be going when the signal comes.
    bool computing = false;
    for (int i = 0; i < 600 && !computing; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      computing = test::read_all(log).find(run.progress) != std::string::npos;
    }
    ASSERT_TRUE(computing) << test::read_all(log);
    ASSERT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the run ended before the signal: make it longer";
    ASSERT_EQ(kill(pid, run.sig), 0);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st)) << test::read_all(log);       // handled, not killed by the signal
    EXPECT_EQ(WEXITSTATUS(st), 128 + run.sig) << test::read_all(log);
    EXPECT_TRUE(std::filesystem::is_empty(out)) << run.args;  // no output, report or temporary file
  }
}

TEST_F(Harden, StagedOutputsPublishTogetherOrNotAtAll) {
  const std::string a = file("a.json"), b = file("b.json");
  test::write_all(a, "old a");
  {
    io::StagedOutputs st;
    auto wa = st.add(a, "-o");
    auto wb = st.add(b, "--json");
    ASSERT_TRUE(wa.ok() && wb.ok());
    ASSERT_TRUE(io::write_output_file(*wa, "new a", "-o").ok());
    // Destroyed before publish (an error or a signal while writing b): nothing changes.
  }
  EXPECT_EQ(test::read_all(a), "old a");
  EXPECT_EQ(listing(), std::vector<std::string>{"a.json"});
  {
    io::StagedOutputs st;
    auto wa = st.add(a, "-o");
    auto wb = st.add(b, "--json");
    ASSERT_TRUE(io::write_output_file(*wa, "new a", "-o").ok());
    ASSERT_TRUE(io::write_output_file(*wb, "new b", "--json").ok());
    EXPECT_EQ(test::read_all(a), "old a");  // not yet
    ASSERT_TRUE(st.publish().ok());
  }
  EXPECT_EQ(test::read_all(a), "new a");
  EXPECT_EQ(test::read_all(b), "new b");
  EXPECT_EQ(listing(), (std::vector<std::string>{"a.json", "b.json"}));
}

// ---- newcomer: latents for ComfyUI's LoadLatent -------------------------------------------

TEST_F(Harden, ComfyuiLatentsAreLoadLatentFilesOfTheRunsLatents) {
  const std::string o = file("clip.safetensors"), prefix = file("clip");
  auto r = run_tool("generate --preset tiny --steps 2 --frames 22 --width 64 --height 64 -q -o " + o +
                    " --comfyui-latents " + prefix);
  ASSERT_EQ(r.code, 0) << r.out;
  auto out = SafetensorsReader::open(o);
  ASSERT_TRUE(out.ok());
  const h3::H3Config cfg = *h3::h3_preset("tiny");
  struct Stream {
    const char* suffix;
    const char* name;
  };
  for (const Stream& st : {Stream{".video.latent", "video"}, Stream{".audio.latent", "audio"}}) {
    auto f = SafetensorsReader::open(prefix + st.suffix);
    ASSERT_TRUE(f.ok()) << st.suffix;
    // ComfyUI's SaveLatent layout: "latent_tensor" with a batch of one, and the empty
    // "latent_format_version_0" marker (LoadLatent then applies no 1/0.18215 scale).
    const SafetensorsEntry* t = (*f)->find("latent_tensor");
    const SafetensorsEntry* v0 = (*f)->find("latent_format_version_0");
    ASSERT_NE(t, nullptr);
    ASSERT_NE(v0, nullptr);
    EXPECT_EQ(v0->numel(), 0);
    EXPECT_EQ(t->dtype, DType::f32);
    const SafetensorsEntry* ref = (*out)->find(st.name);
    ASSERT_NE(ref, nullptr);
    std::vector<int64_t> want{1};
    want.insert(want.end(), ref->shape.begin(), ref->shape.end());
    EXPECT_EQ(t->shape, want) << st.suffix;  // video [1, 24, T, Hl, Wl], audio [1, 32, 2, A]
    EXPECT_EQ(t->shape[1], std::string(st.name) == "video" ? cfg.latents_dim : cfg.audio_latents_dim);
    ASSERT_EQ(t->end - t->begin, ref->end - ref->begin);
    EXPECT_EQ(std::memcmp((*f)->data(*t), (*out)->data(*ref), t->end - t->begin), 0) << st.suffix;
  }
  // Refused where it would write nothing meaningful, and an input is never an output.
  EXPECT_EQ(run_tool("generate -q --comfyui-latents " + prefix).code, 2);
}

// ---- 9. absurd clips ---------------------------------------------------------------------

TEST_F(Harden, AbsurdClipIsAUsageErrorBeforeAnyWork) {
  auto g = h3::clip_geometry(100000, 65536, 65536, 1);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(g.error().message.find("too large"), std::string::npos) << g.error().message;
  EXPECT_TRUE(h3::clip_geometry(1000, 3840, 2176, 1000).ok());  // 4K, 1000 frames: fine
  // The dry run (386 M tokens: 65 s and 6 GB before) is now a refusal.
  auto r = run_tool("info --preset h3 --frames 20000 --width 8192 --height 8192 --text-tokens 500 --vram-budget 80G");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("too large"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ls
