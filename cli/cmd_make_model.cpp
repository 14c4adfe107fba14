// `layerstream make-model`: writes a synthetic H3 checkpoint (deterministic weights from
// fill_synthetic under a seed) of a preset's dimensions, in bf16 or in ComfyUI's
// quantised layouts (--format int8-convrot | int8-convrot-full | int8-convrot-skip-edges |
// fp8: the bf16 synthetic weights quantised as the published files were made;
// model/h3/quant.h), optionally with some blocks kept in bf16 (--skip-edges, --bf16-blocks).
//
// Memory: the file is streamed. Every tensor is generated in pieces of at most 64 MiB
// into one reused buffer and handed to SafetensorsWriter, so a 66 GB h3 model needs
// 64 MiB of RAM. The writer writes to a temporary file and renames it on success; on
// an error or ^C the temporary file is removed and the output path is untouched.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/arena.h"  // format_bytes
#include "io/safetensors.h"
#include "model/h3/config.h"
#include "model/h3/quant.h"
#include "cli/command.h"
#include "cli/cli_util.h"
#include "cli/interrupt.h"
#include "io/output_file.h"

#include <layerstream_version.h>

namespace ls::cli {
namespace {

constexpr size_t kPieceBytes = 64ull << 20;


struct MakeModelOptions {
  FlagText preset, blocks, pdd_heads, seed, output, format;  // numbers parsed by cli/cli_util.h (exit 2 on bad values)
  FlagText bf16_blocks;  // "0,1,48,49": blocks left in bf16 in a quantised format
  bool skip_edges = false;
  bool adaln_curve = false;
  bool gate_compress = false;
  bool quiet = false;
};

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "layerstream make-model: error: %s\n", msg.c_str());
  return kExitUsage;
}

// What the flags ask for: the config, its weight layout and the seed. Every refusal is
// a usage error (exit 2) but a bad output path (check_output_path's code).
struct ModelPlan {
  h3::H3Config cfg;
  h3::SyntheticFormat format = h3::SyntheticFormat::bf16;
  std::vector<int64_t> bf16_blocks;
  uint64_t seed = 0;
};

Error usage(const std::string& msg) { return {ErrorCode::invalid_argument, msg}; }

Expected<ModelPlan> plan_model(const MakeModelOptions& o) {
  ModelPlan m;
  auto preset = h3::h3_preset(o.preset.text);
  if (!preset.ok()) return usage(preset.error().message);
  h3::H3Config& cfg = m.cfg;
  cfg = *preset;
  if (o.blocks.given()) {
    auto n = flag_int(o.blocks, range::blocks, 0);
    if (!n.ok()) return usage(n.error().message);
    cfg.num_layers = *n;
  }
  if (o.pdd_heads.given()) {
    auto n = flag_int(o.pdd_heads, range::pdd_heads, 1);
    if (!n.ok()) return usage(n.error().message);
    cfg.pdd_heads = *n;
  }
  auto seed_i = flag_int(o.seed, range::seed, 0);
  if (!seed_i.ok()) return usage(seed_i.error().message);
  m.seed = static_cast<uint64_t>(*seed_i);
  // The output path, before any work (a directory, FIFO or missing folder is refused now).
  if (auto t = io::check_output_path(o.output.text, "-o"); !t.ok()) return t.error();
  if (o.adaln_curve) cfg = h3::h3_curve_form(cfg);
  cfg.gate_compress = o.gate_compress;
  if (Status st = h3::check_h3_config(cfg); !st.ok()) return usage(st.message());
  h3::SyntheticFormat& format = m.format;
  if (o.format.given()) {
    auto f = h3::parse_synthetic_format(o.format.text);
    if (!f.ok()) return usage(f.error().message);
    format = *f;
  }
  // Blocks of different layouts: --skip-edges (the community int8 "_skip_edges" builds:
  // blocks 0, 1, L-2, L-1 in bf16) and / or --bf16-blocks LIST.
  std::vector<int64_t>& bf16_blocks = m.bf16_blocks;
  if (o.bf16_blocks.given()) {
    const std::string& t = o.bf16_blocks.text;
    size_t a = 0;
    while (a <= t.size()) {
      const size_t b = std::min(t.find(',', a), t.size());
      const std::string item = t.substr(a, b - a);
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || end != item.c_str() + item.size() || v < 0)
        return usage("--bf16-blocks: '" + t + "' is not a comma-separated list of block indices");
      bf16_blocks.push_back(static_cast<int64_t>(v));
      a = b + 1;
    }
  }
  if (o.skip_edges) {
    if (format == h3::SyntheticFormat::int8_convrot) format = h3::SyntheticFormat::int8_convrot_skip_edges;
    else if (format != h3::SyntheticFormat::int8_convrot_skip_edges)
      return usage("--skip-edges keeps blocks 0, 1, L-2, L-1 of an int8-convrot model in bf16; use it with "
                         "--format int8-convrot (for other formats: --bf16-blocks LIST)");
  }
  if (!bf16_blocks.empty() && format == h3::SyntheticFormat::bf16)
    return usage("--bf16-blocks needs a quantised --format (int8-convrot, int8-convrot-full or fp8)");
  {
    auto q = h3::synthetic_quant_layout(cfg, format, bf16_blocks);
    if (!q.ok()) return usage(q.error().message);
    cfg.quant = std::move(q).value();
  }
  return m;
}

// Streams every tensor into the file (pieces of at most kPieceBytes, one reused buffer),
// with progress on stderr for large models. Returns the exit code.
int write_model(const MakeModelOptions& o, const ModelPlan& m) {
  const h3::H3Config& cfg = m.cfg;
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

  SafetensorsWriter w(o.output.text);
  w.set_metadata("format", "pt");
  w.set_metadata("layerstream.kind", "synthetic H3 checkpoint (make-model)");
  w.set_metadata("layerstream.preset", o.preset.text);
  w.set_metadata("layerstream.seed", std::to_string(m.seed));
  w.set_metadata("layerstream.version", LS_VERSION);
  w.set_metadata("layerstream.config", h3::h3_config_json(cfg));
  w.set_metadata("layerstream.format", h3::synthetic_format_name(m.format));
  for (const auto& s : specs)
    if (Status st = w.declare(s.name, s.dtype, s.shape); !st.ok()) return usage_error(st.message());
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "layerstream make-model: error: %s\n", msg.c_str());
    return kExitRuntime;  // the writer's destructor removes the temporary file
  };
  // ^C / SIGTERM from before the temporary file exists: stop cleanly, the output untouched.
  const InterruptScope interrupt;
  if (Status st = w.begin(); !st.ok()) return fail(st.message());

  const bool progress = !o.quiet && total >= (256ull << 20);
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  int last_pct = -1;
  std::vector<uint8_t> buf(std::min<uint64_t>(kPieceBytes, total));
  uint64_t written = 0;
  for (const auto& s : specs) {
    const int64_t esz = dtype_size(s.dtype), n = s.numel();
    int64_t per_piece = static_cast<int64_t>(kPieceBytes) / esz;
    // A quantised weight: int8 rows are quantised whole (per-row scale); an fp8 weight's
    // per-tensor scale needs one pass over the whole tensor first.
    const bool quantised_weight = s.dtype == DType::i8 || s.dtype == DType::f8e4m3;
    if (quantised_weight) per_piece = std::max<int64_t>(s.shape[1], per_piece / s.shape[1] * s.shape[1]);
    float fp8_scale = 0.0f;
    const float* fp8_scale_p = nullptr;
    if (s.dtype == DType::f8e4m3) {
      h3::TensorSpec plain = s;
      plain.dtype = DType::bf16;
      fp8_scale = h3::synthetic_fp8_weight_scale(plain, m.seed);
      fp8_scale_p = &fp8_scale;
    }
    if (static_cast<uint64_t>(per_piece * esz) > buf.size()) buf.resize(static_cast<size_t>(per_piece * esz));
    for (int64_t a = 0; a < n; a += per_piece) {
      if (interrupt.interrupted()) return fail("interrupted; nothing was written to " + o.output.text);
      const int64_t cnt = std::min(per_piece, n - a);
      h3::fill_synthetic_tensor(cfg, s, m.seed, a, cnt, buf.data(), fp8_scale_p);
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
  std::printf("wrote %s: preset %s, seed %llu, %zu tensors, %llu parameters, %s in %.1f s\n  %s\n", o.output.text.c_str(),
              o.preset.text.c_str(), static_cast<unsigned long long>(m.seed), specs.size(), static_cast<unsigned long long>(params),
              format_bytes(total).c_str(), secs, h3::h3_config_summary(cfg).c_str());
  if (cfg.quant.any()) {
    std::printf("  format %s: %zu quantised linears", h3::synthetic_format_name(m.format), cfg.quant.linears.size());
    std::vector<int64_t> kept = m.bf16_blocks;
    if (m.format == h3::SyntheticFormat::int8_convrot_skip_edges)
      for (int64_t b : h3::skip_edges_blocks(cfg.num_layers)) kept.push_back(b);
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    for (size_t i = 0; i < kept.size(); ++i)
      std::printf("%s%lld", i == 0 ? "; bf16 blocks " : ",", static_cast<long long>(kept[i]));
    std::printf("\n");
  }
  return 0;
}

int run_make_model(const MakeModelOptions& o) {
  auto m = plan_model(o);
  if (!m.ok()) return report_error("layerstream make-model", m.error());
  return write_model(o, *m);
}

CommandRun setup_make_model(CLI::App& sub) {
  auto o = std::make_shared<MakeModelOptions>();
  add_text_flag(sub, "--preset", o->preset, "NAME",
                "Model dimensions: tiny (tests), small (CPU clips) or h3 (the real 33 B model)", "", true);
  add_int_flag(sub, "--blocks", o->blocks, range::blocks, "Number of DiT blocks (h3 has 50)", "the preset's");
  sub.add_flag("--adaln-curve", o->adaln_curve,
               "Curve (pruned) form: AdaLN fed by an fp32 table [1025, 8] instead of the time embedder");
  add_int_flag(sub, "--pdd-heads", o->pdd_heads, range::pdd_heads, "Size n of a PDD video head bank (video_out [n*96, D])",
               "1");
  sub.add_flag("--gate-compress", o->gate_compress, "Add the unused VSA attn.to_gate_compress weights");
  add_int_flag(sub, "--seed", o->seed, range::seed, "Seed of the synthetic weights", "0");
  add_text_flag(sub, "--format", o->format, "FORMAT",
                "Weight format: bf16, int8-convrot (ComfyUI's pruned int8 ConvRot layout: the 4 big linears of every "
                "block), int8-convrot-full (+ the blocks' AdaLN linears at group 64), int8-convrot-skip-edges (int8-convrot "
                "with blocks 0, 1, L-2, L-1 in bf16) or fp8 (fp8_scaled e4m3)",
                "bf16", false);
  sub.add_flag("--skip-edges", o->skip_edges,
               "With --format int8-convrot: keep blocks 0, 1, L-2, L-1 in bf16 (the community _skip_edges builds)");
  add_text_flag(sub, "--bf16-blocks", o->bf16_blocks, "LIST",
                "Comma-separated blocks to keep in bf16 in a quantised --format (e.g. 0,1,48,49)", "", false);
  sub.add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  add_text_flag(sub, "-o,--output", o->output, "FILE", "Output .safetensors file (written atomically)", "", true);
  return [o]() { return run_make_model(*o); };
}

LS_REGISTER_COMMAND(register_make_model, "make-model",
                    "Write a synthetic H3 checkpoint (deterministic weights) of a preset's dimensions", setup_make_model);

}  // namespace
}  // namespace ls::cli
