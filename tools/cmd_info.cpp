// `layerstream info`: what a checkpoint (or a preset) is, and with a clip, how many
// tokens it makes and how much activation memory a block needs.
//
//   layerstream info FILE                     detected config, parameters and bytes by group
//   layerstream info --preset h3 [--adaln-curve] [--blocks N]
//   ... --frames F --width W --height H [--text-tokens L]   clip geometry, S, the
//        h3-model.md §6.4 buffer table and the per-block memory of the stock and the
//        sliced plan (DESIGN.md §2)
//   ... --json                                the same as one JSON object on stdout
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/arena.h"  // format_bytes
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "model/h3/memory_table.h"
#include "tools/command.h"
#include "tools/cli_util.h"

namespace ls::tools {
namespace {

using json = nlohmann::ordered_json;

struct InfoOptions {
  std::string file;
  std::string preset;
  std::string blocks;
  bool adaln_curve = false;
  std::string frames, width, height, text_tokens = "0", slice_tokens = "8192";
  bool as_json = false;
  bool list_tensors = false;
};

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "layerstream info: error: %s\n", msg.c_str());
  return 2;
}


std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) r += ',';
    r += s[i];
  }
  return v < 0 ? "-" + r : r;
}

std::string params_str(int64_t n) {
  char b[64];
  if (n >= 1000000000)
    std::snprintf(b, sizeof b, "%.2f B", static_cast<double>(n) / 1e9);
  else if (n >= 1000000)
    std::snprintf(b, sizeof b, "%.1f M", static_cast<double>(n) / 1e6);
  else if (n >= 1000)
    std::snprintf(b, sizeof b, "%.1f K", static_cast<double>(n) / 1e3);
  else
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(n));
  return b;
}

std::string shape_json_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One tensor as the source holds it: declared spec plus stored dtype / bytes.
struct Held {
  const h3::TensorSpec* spec;
  DType stored;
  int64_t bytes;
};

int run_info(const InfoOptions& o) {
  if (o.file.empty() == o.preset.empty()) return usage_error("give a checkpoint FILE or --preset NAME (one of them)");
  const bool clip_asked = !o.frames.empty() || !o.width.empty() || !o.height.empty();
  if (clip_asked && (o.frames.empty() || o.width.empty() || o.height.empty()))
    return usage_error("a clip needs all of --frames, --width and --height");

  json out;
  h3::H3Config cfg;
  std::unique_ptr<h3::H3FileSource> file;
  std::vector<std::string> notes;
  std::vector<h3::TensorSpec> specs;
  std::vector<Held> held;
  if (!o.file.empty()) {
    if (!o.blocks.empty() || o.adaln_curve) return usage_error("--blocks and --adaln-curve go with --preset, not a file");
    auto f = h3::open_h3_checkpoint(o.file);
    if (!f.ok() && f.error().code == ErrorCode::unsupported) {
      // Stored dtypes that differ from the declared ones: say so, but still describe it.
      h3::OpenOptions lax;
      lax.allow_dtype_conversion = true;
      auto g = h3::open_h3_checkpoint(o.file, lax);
      if (g.ok()) {
        notes.push_back(f.error().message);
        f = std::move(g);
      }
    }
    if (!f.ok()) {
      std::fprintf(stderr, "layerstream info: error: %s\n", f.error().message.c_str());
      return 2;
    }
    file = std::move(f).value();
    cfg = file->cfg();
    specs = file->specs();
    out["source"] = {{"kind", "file"}, {"path", o.file}, {"file_bytes", file->file().file_size()}};
    json md = json::object();
    for (const auto& [k, v] : file->file().metadata()) md[k] = v;
    out["metadata"] = md;
  } else {
    auto p = h3::h3_preset(o.preset);
    if (!p.ok()) return usage_error(p.error().message);
    cfg = *p;
    if (!o.blocks.empty()) {
      auto n = parse_int("--blocks", o.blocks, 1, 1000);
      if (!n.ok()) return usage_error(n.error().message);
      cfg.num_layers = *n;
    }
    if (o.adaln_curve) cfg = h3::h3_curve_form(cfg);
    specs = h3::h3_tensor_specs(cfg);
    out["source"] = {{"kind", "preset"}, {"preset", o.preset}};
  }
  for (const auto& s : specs) {
    DType stored = s.dtype;
    if (file) stored = file->file().find(cfg.key_prefix + s.name)->dtype;
    held.push_back({&s, stored, s.numel() * dtype_size(stored)});
  }

  // ---- config, parameters and bytes by group ----------------------------------------
  out["config"] = json::parse(h3::h3_config_json(cfg));
  out["config"]["key_prefix"] = cfg.key_prefix;
  out["summary"] = h3::h3_config_summary(cfg);
  const h3::TensorSpec::Group groups[] = {h3::TensorSpec::Group::blocks, h3::TensorSpec::Group::adaln,
                                          h3::TensorSpec::Group::heads,  h3::TensorSpec::Group::refiner,
                                          h3::TensorSpec::Group::embed,  h3::TensorSpec::Group::other};
  json jg = json::object();
  int64_t total_params = 0, total_bytes = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // stored dtype -> tensors, bytes
  for (auto g : groups) {
    int64_t p = 0, b = 0, n = 0;
    for (const Held& h : held)
      if (h.spec->group == g) { p += h.spec->numel(); b += h.bytes; ++n; }
    if (n == 0) continue;
    jg[h3::group_name(g)] = {{"tensors", n}, {"params", p}, {"bytes", b}};
    total_params += p;
    total_bytes += b;
  }
  for (const Held& h : held) {
    auto& d = by_dtype[dtype_name(h.stored)];
    d.first += 1;
    d.second += h.bytes;
  }
  out["groups"] = jg;
  out["total"] = {{"tensors", static_cast<int64_t>(held.size())}, {"params", total_params}, {"bytes", total_bytes}};
  json jd = json::object();
  for (const auto& [k, v] : by_dtype) jd[k] = {{"tensors", v.first}, {"bytes", v.second}};
  out["dtypes"] = jd;
  // Per-block weight bytes that stream every step (the AdaLN projections are
  // precomputed once per schedule; DESIGN.md §2).
  int64_t block0_stream = 0;
  for (const Held& h : held)
    if (h.spec->group == h3::TensorSpec::Group::blocks && h.spec->name.rfind("blocks.0.", 0) == 0) block0_stream += h.bytes;
  out["block_streamed_weight_bytes"] = block0_stream;
  if (file) {
    out["unused_tensors"] = file->unused_keys();
  }
  out["notes"] = notes;
  if (o.list_tensors) {
    json jt = json::array();
    for (const Held& h : held)
      jt.push_back({{"name", h.spec->name},
                    {"group", h3::group_name(h.spec->group)},
                    {"dtype", dtype_name(h.stored)},
                    {"declared_dtype", dtype_name(h.spec->dtype)},
                    {"shape", h.spec->shape},
                    {"bytes", h.bytes}});
    out["tensors"] = jt;
  }

  // ---- clip -------------------------------------------------------------------------
  if (clip_asked) {
    auto f = parse_int("--frames", o.frames, 1, 100000);
    auto w = parse_int("--width", o.width, 1, 65536);
    auto h = parse_int("--height", o.height, 1, 65536);
    auto l = parse_int("--text-tokens", o.text_tokens, 0, 10000000);
    auto c = parse_int("--slice-tokens", o.slice_tokens, 1, 100000000);
    for (auto* e : {&f, &w, &h, &l, &c})
      if (!e->ok()) return usage_error(e->error().message);
    auto g = h3::clip_geometry(*f, *w, *h, *l);
    if (!g.ok()) return usage_error(g.error().message);
    const int64_t S = g->tokens();
    out["clip"] = {{"frames_requested", *f}, {"frames", g->frames},         {"width", g->width},
                   {"height", g->height},    {"T", g->T},                   {"Hl", g->Hl},
                   {"Wl", g->Wl},            {"A", g->A},                   {"text_tokens", g->text_tokens},
                   {"video_tokens", g->video_tokens()}, {"audio_rows", g->audio_rows()}, {"S", S}};
    json jb = json::array();
    for (const auto& m : h3::h3_buffer_table(cfg, S, g->video_tokens()))
      jb.push_back({{"what", m.what}, {"dtype", dtype_name(m.dtype)}, {"shape", m.shape}, {"bytes", m.bytes()}});
    out["buffers"] = jb;
    json jp = json::array();
    for (const auto& bm : {h3::h3_block_memory_stock(cfg, S), h3::h3_block_memory_sliced(cfg, S, *c)}) {
      json phases = json::array();
      for (const auto& ph : bm.phases) {
        json live = json::array();
        for (const auto& m : ph.live)
          live.push_back({{"what", m.what}, {"dtype", dtype_name(m.dtype)}, {"shape", m.shape}, {"bytes", m.bytes()}});
        phases.push_back({{"name", ph.name}, {"bytes", ph.bytes()}, {"live", live}});
      }
      jp.push_back({{"plan", bm.plan},
                    {"peak_bytes", bm.peak_bytes()},
                    {"peak_phase", bm.peak_phase().name},
                    {"residual_bytes", bm.residual_bytes},
                    {"phases", phases}});
    }
    out["block_memory"] = jp;
  }

  if (o.as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  // ---- text -------------------------------------------------------------------------
  if (file)
    std::printf("checkpoint  %s (%s)\n", o.file.c_str(), format_bytes(file->file().file_size()).c_str());
  else
    std::printf("preset      %s\n", o.preset.c_str());
  std::printf("config      %s\n", h3::h3_config_summary(cfg).c_str());
  std::printf("form        %s\n", cfg.curve_form() ? "curve (pruned): AdaLN linears fp32, fed by adaln_t_table"
                                                    : "unpruned: time embedder, AdaLN linears bf16");
  if (file)
    for (const auto& [k, v] : file->file().metadata())
      std::printf("metadata    %s = %s\n", k.c_str(), v.size() > 120 ? (v.substr(0, 117) + "...").c_str() : v.c_str());
  for (const auto& n : notes) std::printf("note        %s\n", n.c_str());
  std::printf("\n%-10s %8s %14s %16s %12s\n", "group", "tensors", "parameters", "", "bytes");
  for (auto g : groups) {
    const char* n = h3::group_name(g);
    if (!jg.contains(n)) continue;
    const auto& e = jg[n];
    std::printf("%-10s %8lld %14s %16s %12s\n", n, static_cast<long long>(e["tensors"].get<int64_t>()),
                params_str(e["params"].get<int64_t>()).c_str(), with_commas(e["params"].get<int64_t>()).c_str(),
                format_bytes(static_cast<uint64_t>(e["bytes"].get<int64_t>())).c_str());
  }
  std::printf("%-10s %8zu %14s %16s %12s\n", "total", held.size(), params_str(total_params).c_str(),
              with_commas(total_params).c_str(), format_bytes(static_cast<uint64_t>(total_bytes)).c_str());
  std::printf("\nstored dtypes:");
  for (const auto& [k, v] : by_dtype)
    std::printf("  %s %lld tensors %s", k.c_str(), static_cast<long long>(v.first), format_bytes(static_cast<uint64_t>(v.second)).c_str());
  std::printf("\nstreamed weights per block (without AdaLN): %s\n", format_bytes(static_cast<uint64_t>(block0_stream)).c_str());
  if (file && !file->unused_keys().empty()) {
    std::printf("unused tensors: %zu (first: %s)\n", file->unused_keys().size(), file->unused_keys().front().c_str());
  }

  if (o.list_tensors) {
    std::printf("\n%-48s %-8s %-5s %-16s %12s\n", "tensor", "group", "dtype", "shape", "bytes");
    for (const Held& h : held)
      std::printf("%-48s %-8s %-5s %-16s %12s\n", (cfg.key_prefix + h.spec->name).c_str(), h3::group_name(h.spec->group),
                  dtype_name(h.stored), shape_json_str(h.spec->shape).c_str(),
                  format_bytes(static_cast<uint64_t>(h.bytes)).c_str());
  }

  if (clip_asked) {
    const auto& c = out["clip"];
    std::printf("\nclip        %lld frames (snapped from %lld), %lldx%lld, text tokens %lld\n",
                static_cast<long long>(c["frames"].get<int64_t>()), static_cast<long long>(c["frames_requested"].get<int64_t>()),
                static_cast<long long>(c["width"].get<int64_t>()), static_cast<long long>(c["height"].get<int64_t>()),
                static_cast<long long>(c["text_tokens"].get<int64_t>()));
    std::printf("latents     T %lld, Hl %lld, Wl %lld, A %lld\n", static_cast<long long>(c["T"].get<int64_t>()),
                static_cast<long long>(c["Hl"].get<int64_t>()), static_cast<long long>(c["Wl"].get<int64_t>()),
                static_cast<long long>(c["A"].get<int64_t>()));
    std::printf("tokens      S = %s (text %s + audio %s + video %s)\n", with_commas(c["S"].get<int64_t>()).c_str(),
                with_commas(c["text_tokens"].get<int64_t>()).c_str(), with_commas(c["audio_rows"].get<int64_t>()).c_str(),
                with_commas(c["video_tokens"].get<int64_t>()).c_str());
    std::printf("\n%-44s %-5s %-24s %16s %12s\n", "buffer", "dtype", "shape", "bytes", "");
    for (const auto& b : out["buffers"])
      std::printf("%-44s %-5s %-24s %16s %12s\n", b["what"].get<std::string>().c_str(), b["dtype"].get<std::string>().c_str(),
                  shape_json_str(b["shape"].get<std::vector<int64_t>>()).c_str(), with_commas(b["bytes"].get<int64_t>()).c_str(),
                  format_bytes(b["bytes"].get<uint64_t>()).c_str());
    for (const auto& bm : out["block_memory"]) {
      std::printf("\nper-block activations, %s: peak %s (%s phase; residual %s)\n", bm["plan"].get<std::string>().c_str(),
                  format_bytes(bm["peak_bytes"].get<uint64_t>()).c_str(), bm["peak_phase"].get<std::string>().c_str(),
                  format_bytes(bm["residual_bytes"].get<uint64_t>()).c_str());
      for (const auto& ph : bm["phases"]) {
        std::printf("  %-44s %12s:", ph["name"].get<std::string>().c_str(), format_bytes(ph["bytes"].get<uint64_t>()).c_str());
        for (const auto& m : ph["live"])
          std::printf(" %s %s%s;", m["what"].get<std::string>().c_str(), m["dtype"].get<std::string>().c_str(),
                      shape_json_str(m["shape"].get<std::vector<int64_t>>()).c_str());
        std::printf("\n");
      }
    }
  }
  return 0;
}

CommandRun setup_info(CLI::App& sub) {
  auto o = std::make_shared<InfoOptions>();
  sub.add_option("file", o->file, "H3 checkpoint (.safetensors)");
  sub.add_option("--preset", o->preset, "Describe a preset (tiny, small, h3) instead of a file");
  sub.add_option("--blocks", o->blocks, "With --preset: number of DiT blocks");
  sub.add_flag("--adaln-curve", o->adaln_curve, "With --preset: the curve (pruned) form");
  sub.add_option("--frames", o->frames, "Clip: pixel frames (snapped up to 17j+5)");
  sub.add_option("--width", o->width, "Clip: width in pixels (multiple of 32)");
  sub.add_option("--height", o->height, "Clip: height in pixels (multiple of 32)");
  sub.add_option("--text-tokens", o->text_tokens, "Clip: text tokens L (default 0)");
  sub.add_option("--slice-tokens", o->slice_tokens, "Slice size of the sliced plan (default 8192)");
  sub.add_flag("--tensors", o->list_tensors, "List every tensor (name, group, dtype, shape, bytes)");
  sub.add_flag("--json", o->as_json, "Print one JSON object instead of text");
  return [o]() { return run_info(*o); };
}

LS_REGISTER_COMMAND(register_info, "info", "Describe an H3 checkpoint or preset, and a clip's tokens and memory", setup_info);

}  // namespace
}  // namespace ls::tools
