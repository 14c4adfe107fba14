// `layerstream make-model`: writes a synthetic H3 checkpoint (deterministic weights from
// fill_synthetic under a seed) of a preset's dimensions.
//
// Memory: the file is streamed. Every tensor is generated in pieces of at most 64 MiB
// into one reused buffer and handed to SafetensorsWriter, so a 66 GB h3 model needs
// 64 MiB of RAM. The writer writes to a temporary file and renames it on success; on
// an error or ^C the temporary file is removed and the output path is untouched.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/arena.h"  // format_bytes
#include "io/safetensors.h"
#include "model/h3/config.h"
#include "tools/command.h"
#include "tools/cli_util.h"

namespace ls::tools {
namespace {

// Version of the CMake project (CMakeLists.txt: project(layerstream VERSION ...)).
constexpr const char* kLayerStreamVersion = "0.1.0";
constexpr size_t kPieceBytes = 64ull << 20;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

struct MakeModelOptions {
  std::string preset;
  std::string blocks;     // parsed by parse_count (exit 2 on bad values, not CLI11's codes)
  std::string pdd_heads;
  std::string seed = "0";
  bool adaln_curve = false;
  bool gate_compress = false;
  bool quiet = false;
  std::string output;
};

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "layerstream make-model: error: %s\n", msg.c_str());
  return 2;
}

// A decimal integer in [lo, hi], or an error naming the flag.

Expected<uint64_t> parse_seed(const std::string& text) {
  size_t used = 0;
  unsigned long long v = 0;
  bool ok = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) != 0);
  if (ok) {
    try {
      v = std::stoull(text, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != text.size())
    return make_error(ErrorCode::invalid_argument, "--seed must be a non-negative integer below 2^64 (got '" + text + "')");
  return static_cast<uint64_t>(v);
}

int run_make_model(const MakeModelOptions& o) {
  if (o.preset.empty()) return usage_error("--preset is required (tiny, small or h3)");
  if (o.output.empty()) return usage_error("-o FILE is required");
  auto preset = h3::h3_preset(o.preset);
  if (!preset.ok()) return usage_error(preset.error().message);
  h3::H3Config cfg = *preset;
  if (!o.blocks.empty()) {
    auto n = parse_int("--blocks", o.blocks, 1, 1000);
    if (!n.ok()) return usage_error(n.error().message);
    cfg.num_layers = *n;
  }
  if (!o.pdd_heads.empty()) {
    auto n = parse_int("--pdd-heads", o.pdd_heads, 1, 64);
    if (!n.ok()) return usage_error(n.error().message);
    cfg.pdd_heads = *n;
  }
  auto seed = parse_seed(o.seed);
  if (!seed.ok()) return usage_error(seed.error().message);
  if (o.adaln_curve) cfg = h3::h3_curve_form(cfg);
  cfg.gate_compress = o.gate_compress;
  if (Status st = h3::check_h3_config(cfg); !st.ok()) return usage_error(st.message());

  // File order: by decreasing element size (fp32 before bf16), otherwise the table's
  // order, so every tensor is aligned to its element size in the file and can be used
  // in place from the mapping.
  std::vector<h3::TensorSpec> specs = h3::h3_tensor_specs(cfg);
  std::stable_sort(specs.begin(), specs.end(), [](const h3::TensorSpec& a, const h3::TensorSpec& b) {
    return dtype_size(a.dtype) > dtype_size(b.dtype);
  });
  uint64_t total = 0, params = 0;
  for (const auto& s : specs) {
    total += static_cast<uint64_t>(s.numel()) * static_cast<uint64_t>(dtype_size(s.dtype));
    params += static_cast<uint64_t>(s.numel());
  }

  SafetensorsWriter w(o.output);
  w.set_metadata("format", "pt");
  w.set_metadata("layerstream.kind", "synthetic H3 checkpoint (make-model)");
  w.set_metadata("layerstream.preset", o.preset);
  w.set_metadata("layerstream.seed", std::to_string(*seed));
  w.set_metadata("layerstream.version", kLayerStreamVersion);
  w.set_metadata("layerstream.config", h3::h3_config_json(cfg));
  for (const auto& s : specs)
    if (Status st = w.declare(s.name, s.dtype, s.shape); !st.ok()) return usage_error(st.message());
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "layerstream make-model: error: %s\n", msg.c_str());
    return 1;  // the writer's destructor removes the temporary file
  };
  if (Status st = w.begin(); !st.ok()) return fail(st.message());

  g_interrupted = 0;
  auto old_int = std::signal(SIGINT, on_interrupt);
  auto old_term = std::signal(SIGTERM, on_interrupt);
  struct RestoreSignals {
    void (*i)(int);
    void (*t)(int);
    ~RestoreSignals() { std::signal(SIGINT, i); std::signal(SIGTERM, t); }
  } restore{old_int, old_term};

  const bool progress = !o.quiet && total >= (256ull << 20);
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  int last_pct = -1;
  std::vector<uint8_t> buf(std::min<uint64_t>(kPieceBytes, total));
  uint64_t written = 0;
  for (const auto& s : specs) {
    const int64_t esz = dtype_size(s.dtype), n = s.numel();
    const int64_t per_piece = static_cast<int64_t>(kPieceBytes) / esz;
    for (int64_t a = 0; a < n; a += per_piece) {
      if (g_interrupted) return fail("interrupted; nothing was written to " + o.output);
      const int64_t cnt = std::min(per_piece, n - a);
      h3::fill_synthetic(s, *seed, a, cnt, buf.data());
      if (Status st = w.write(buf.data(), static_cast<size_t>(cnt * esz)); !st.ok()) return fail(st.message());
      written += static_cast<uint64_t>(cnt * esz);
      if (progress) {
        const auto now = std::chrono::steady_clock::now();
        const int pct = static_cast<int>(100 * written / total);
        if ((tty && now - last_report > std::chrono::milliseconds(500)) || (!tty && pct / 10 != last_pct / 10)) {
          const double secs = std::chrono::duration<double>(now - t0).count();
          std::fprintf(stderr, "%smake-model: %s / %s (%d%%), %.0f s%s", tty ? "\r" : "", format_bytes(written).c_str(),
                       format_bytes(total).c_str(), pct, secs, tty ? "   " : "\n");
          std::fflush(stderr);
          last_report = now;
          last_pct = pct;
        }
      }
    }
  }
  if (Status st = w.commit(); !st.ok()) return fail(st.message());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (progress && tty) std::fprintf(stderr, "\n");
  std::printf("wrote %s: preset %s, seed %llu, %zu tensors, %llu parameters, %s in %.1f s\n  %s\n", o.output.c_str(),
              o.preset.c_str(), static_cast<unsigned long long>(*seed), specs.size(), static_cast<unsigned long long>(params),
              format_bytes(total).c_str(), secs, h3::h3_config_summary(cfg).c_str());
  return 0;
}

CommandRun setup_make_model(CLI::App& sub) {
  auto o = std::make_shared<MakeModelOptions>();
  sub.add_option("--preset", o->preset, "Model dimensions: tiny (tests), small (CPU clips) or h3 (the real 33 B model)");
  sub.add_option("--blocks", o->blocks, "Number of DiT blocks (default: the preset's; h3 has 50)");
  sub.add_flag("--adaln-curve", o->adaln_curve,
               "Curve (pruned) form: AdaLN fed by an fp32 table [1025, 8] instead of the time embedder");
  sub.add_option("--pdd-heads", o->pdd_heads, "Size n of a PDD video head bank (video_out [n*96, D]); default 1");
  sub.add_flag("--gate-compress", o->gate_compress, "Add the unused VSA attn.to_gate_compress weights");
  sub.add_option("--seed", o->seed, "Seed of the synthetic weights (default 0)");
  sub.add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  sub.add_option("-o,--output", o->output, "Output .safetensors file (written atomically)");
  return [o]() { return run_make_model(*o); };
}

LS_REGISTER_COMMAND(register_make_model, "make-model",
                    "Write a synthetic H3 checkpoint (deterministic weights) of a preset's dimensions", setup_make_model);

}  // namespace
}  // namespace ls::tools
