// `layerstream info FILE | --preset NAME [clip flags] [--vram-budget B | --budget B]`:
// what a checkpoint or preset holds (config, weight formats, parameters and bytes by
// group and dtype, optionally every tensor), and for a clip its tokens, the h3-model.md
// §6.4 buffer table, the activation arena of the stock and the sliced plan and the dry
// run (cli/info/info.h). Built once as JSON, then printed as JSON or as text.
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/arena.h"  // format_bytes
#include "core/printable.h"
#include "exec/plan.h"
#include "exec/planner.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/memory_table.h"
#include "model/h3/quant_census.h"
#include "cli/info/info.h"
#include "cli/report.h"  // plan_paths

namespace ls::cli::info {

namespace {

// One tensor as the source holds it: declared spec plus stored dtype / bytes.
struct Held {
  const h3::TensorSpec* spec;
  DType stored;
  int64_t bytes;
};

constexpr h3::TensorSpec::Group kGroups[] = {h3::TensorSpec::Group::blocks, h3::TensorSpec::Group::adaln,
                                             h3::TensorSpec::Group::heads,  h3::TensorSpec::Group::refiner,
                                             h3::TensorSpec::Group::embed,  h3::TensorSpec::Group::other};

// Everything `info` says about one source, built once, then printed as JSON or text.
struct Described {
  json out;
  h3::H3Config cfg;
  std::unique_ptr<h3::H3FileSource> file;
  std::vector<std::string> notes;
  std::vector<h3::TensorSpec> specs;
  std::vector<Held> held;
  json jg;  // by group
  int64_t total_params = 0, total_bytes = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // stored dtype -> tensors, bytes
  int64_t block0_stream = 0;
  std::optional<Error> refused;  // the dry run's planner refused the budget
};

// ---- the activation tables: what a forward's activation arena holds -------------------

json buffer_json(const exec::PlannedBuffer& b) {
  return {{"what", b.what}, {"dtype", dtype_name(b.dtype)}, {"shape", std::vector<int64_t>{b.rows, b.cols}},
          {"bytes", b.bytes()}};
}

// The activation arena of the knobs plan with every slice `slice` rows (0: the stock
// plan), from exec::plan_memory: the persistent buffers, then each phase with every
// buffer live at its high point (persistent included in "bytes" and "live"); the peak
// is the plan's predicted peak (the arena's capacity, what forward measures).
Expected<json> activation_table_json(const h3::H3Config& cfg, const std::vector<h3::TensorSpec>& tensors,
                                     const h3::Conditioning& cond, int64_t slice) {
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.tensors = &tensors;
  q.cond = &cond;
  q.knobs.attn_chunk_tokens = q.knobs.mlp_chunk_tokens = q.knobs.final_chunk_tokens = slice;
  q.knobs.kv_tile = 1024;  // buffer sizes do not depend on it (no K/V offload here)
  LS_ASSIGN_OR_RETURN(exec::PlanResult r, exec::plan_memory(q));
  const exec::Plan& p = r.plan;
  const uint64_t persistent = exec::sum_bytes(p.persistent);
  const exec::PlannedBuffer* x = exec::find_buffer(p.persistent, "residual x");
  json live0 = json::array();
  for (const auto& b : p.persistent) live0.push_back(buffer_json(b));
  json phases = json::array();
  const exec::PlanPhase* top = nullptr;
  for (const auto& ph : p.phases) {
    json live = live0;
    for (const auto& b : ph.buffers) live.push_back(buffer_json(b));
    phases.push_back({{"name", ph.name}, {"bytes", persistent + ph.bytes()}, {"phase_bytes", ph.bytes()}, {"live", live}});
    if (!top || ph.bytes() > top->bytes()) top = &ph;
  }
  LS_CHECK(top != nullptr && persistent + top->bytes() == p.predicted_peak_bytes);
  return json{{"plan", slice == 0 ? std::string("stock plan (all rows at once)")
                                  : "sliced plan (" + std::to_string(slice) + "-row slices, K/V resident)"},
              {"paths", plan_paths(p)},
              {"slice_tokens", slice},
              {"peak_bytes", p.predicted_peak_bytes},
              {"peak_phase", top->name},
              {"persistent_bytes", persistent},
              {"persistent_count", p.persistent.size()},
              {"residual_bytes", x ? x->bytes() : 0},
              {"phases", phases}};
}

// The checkpoint (opened, validated) or the preset, and each tensor as it is held.
// invalid_argument (exit 2) for flags that do not fit the source.
Status load_source(const InfoOptions& o, Described& d) {
  json& out = d.out;
  h3::H3Config& cfg = d.cfg;
  std::unique_ptr<h3::H3FileSource>& file = d.file;
  std::vector<std::string>& notes = d.notes;
  std::vector<h3::TensorSpec>& specs = d.specs;
  std::vector<Held>& held = d.held;
  if (!o.file.empty()) {
    if (o.blocks.given() || o.adaln_curve) return Error{ErrorCode::invalid_argument, "--blocks and --adaln-curve go with --preset, not a file"};
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
    if (!f.ok()) return f.error();
    file = std::move(f).value();
    cfg = file->cfg();
    specs = file->specs();
    out["source"] = {{"kind", "file"}, {"path", o.file}, {"file_bytes", file->file().file_size()}};
    json md = json::object();
    for (const auto& [k, v] : file->file().metadata()) md[k] = v;
    out["metadata"] = md;
  } else {
    auto p = h3::h3_preset(o.preset);
    if (!p.ok()) return Error{ErrorCode::invalid_argument, p.error().message};
    cfg = *p;
    if (o.blocks.given()) {
      auto n = flag_int(o.blocks, range::blocks, cfg.num_layers);
      if (!n.ok()) return n.error();
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
  return Status();
}

// Config, weight formats, parameters and bytes by group and dtype (+ --tensors).
void describe_weights(const InfoOptions& o, Described& d) {
  json& out = d.out;
  const h3::H3Config& cfg = d.cfg;
  const std::unique_ptr<h3::H3FileSource>& file = d.file;
  const std::vector<Held>& held = d.held;
  json& jg = d.jg;
  int64_t& total_params = d.total_params;
  int64_t& total_bytes = d.total_bytes;
  auto& by_dtype = d.by_dtype;
  int64_t& block0_stream = d.block0_stream;
  const std::vector<std::string>& notes = d.notes;
  out["config"] = json::parse(h3::h3_config_json(cfg));
  out["config"]["key_prefix"] = cfg.key_prefix;
  out["summary"] = h3::h3_config_summary(cfg);
  out["quant"] = h3::quant_census_json(h3::quant_census(cfg));  // formats by layer (issue 14)
  jg = json::object();
  for (auto g : kGroups) {
    int64_t p = 0, b = 0, n = 0;
    for (const Held& h : held)
      if (h.spec->group == g) { p += h.spec->numel(); b += h.bytes; ++n; }
    if (n == 0) continue;
    jg[h3::group_name(g)] = {{"tensors", n}, {"params", p}, {"bytes", b}};
    total_params += p;
    total_bytes += b;
  }
  for (const Held& h : held) {
    auto& entry = by_dtype[dtype_name(h.stored)];
    entry.first += 1;
    entry.second += h.bytes;
  }
  out["groups"] = jg;
  out["total"] = {{"tensors", static_cast<int64_t>(held.size())}, {"params", total_params}, {"bytes", total_bytes}};
  json jd = json::object();
  for (const auto& [k, v] : by_dtype) jd[k] = {{"tensors", v.first}, {"bytes", v.second}};
  out["dtypes"] = jd;
  // Per-block weight bytes that stream every step (the AdaLN projections are
  // precomputed once per schedule; DESIGN.md §2).
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
}

// The clip: geometry and tokens, the buffer table, the activation arena of the stock and
// the sliced plan, and the dry run when a budget is given.
Status describe_clip(const InfoOptions& o, const Numerics& numerics, Described& d) {
  json& out = d.out;
  const h3::H3Config& cfg = d.cfg;
  const std::vector<h3::TensorSpec>& specs = d.specs;
  std::optional<Error>& refused = d.refused;
  const bool planning = o.vram_budget.given() || o.budget.given();
  auto f = flag_int(o.frames, range::frames, 0);
  auto w = flag_int(o.width, range::width, 0);
  auto h = flag_int(o.height, range::height, 0);
  auto l = flag_int(o.text_tokens, range::text_tokens, 0);  // not given: no text rows (describing only)
  auto c = flag_int(o.slice_tokens, range::slice_tokens, 8192);
  for (auto* e : {&f, &w, &h, &l, &c})
    if (!e->ok()) return e->error();
  auto g = h3::clip_geometry(*f, *w, *h, *l);
  if (!g.ok()) return g.error();
  const int64_t S = g->tokens();
  out["clip"] = {{"frames_requested", *f}, {"frames", g->frames},         {"width", g->width},
                 {"height", g->height},    {"T", g->T},                   {"Hl", g->Hl},
                 {"Wl", g->Wl},            {"A", g->A},                   {"text_tokens", g->text_tokens},
                 {"video_tokens", g->video_tokens()}, {"audio_rows", g->audio_rows()}, {"S", S}};
  json jb = json::array();
  for (const auto& m : h3::h3_buffer_table(cfg, S, g->video_tokens()))
    jb.push_back({{"what", m.what}, {"dtype", dtype_name(m.dtype)}, {"shape", m.shape}, {"bytes", m.bytes()}});
  out["buffers"] = jb;
  // The activation arena of two plans, from the one planner (exec::plan_memory, knobs
  // mode): exactly the buffer lists forward allocates, per block phase.
  h3::Conditioning cond;
  cond.geometry = *g;
  json jp = json::array();
  for (const int64_t slice : {int64_t{0}, *c}) {
    auto t = activation_table_json(cfg, specs, cond, slice);
    if (!t.ok()) return t.error();
    jp.push_back(std::move(*t));
  }
  out["block_memory"] = jp;
  if (planning) {
    auto dr = dry_run(o, cfg, specs, *g, numerics);
    if (!dr.ok()) return dr.error();
    out["dry_run"] = dr->j;
    refused = dr->refused;
  }
  return Status();
}

void print_weights(const InfoOptions& o, const Described& d) {
  const h3::H3Config& cfg = d.cfg;
  const std::unique_ptr<h3::H3FileSource>& file = d.file;
  const std::vector<std::string>& notes = d.notes;
  const std::vector<Held>& held = d.held;
  const json& jg = d.jg;
  const int64_t total_params = d.total_params, total_bytes = d.total_bytes;
  const auto& by_dtype = d.by_dtype;
  const int64_t block0_stream = d.block0_stream;
  if (file)
    std::printf("checkpoint  %s (%s)\n", o.file.c_str(), format_bytes(file->file().file_size()).c_str());
  else
    std::printf("preset      %s\n", o.preset.c_str());
  std::printf("config      %s\n", h3::h3_config_summary(cfg).c_str());
  std::printf("weights\n%s", h3::quant_census_text(h3::quant_census(cfg)).c_str());
  std::printf("form        %s\n", cfg.curve_form() ? "curve (pruned): AdaLN linears fp32, fed by adaln_t_table"
                                                    : "unpruned: time embedder, AdaLN linears bf16");
  if (file)
    for (const auto& [k, v] : file->file().metadata())
      std::printf("metadata    %s = %s\n", printable_text(k).c_str(),  // a file's bytes: escaped
                  printable_text(v.size() > 120 ? v.substr(0, 117) + "..." : v).c_str());
  for (const auto& n : notes) std::printf("note        %s\n", printable_text(n).c_str());
  std::printf("\n%-10s %8s %14s %16s %12s\n", "group", "tensors", "parameters", "", "bytes");
  for (auto g : kGroups) {
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
}

void print_clip(const json& out) {
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
    std::printf("\nactivations, %s: peak %s predicted (%s phase; persistent %s, of which residual x %s)\n",
                bm["plan"].get<std::string>().c_str(), format_bytes(bm["peak_bytes"].get<uint64_t>()).c_str(),
                bm["peak_phase"].get<std::string>().c_str(), format_bytes(bm["persistent_bytes"].get<uint64_t>()).c_str(),
                format_bytes(bm["residual_bytes"].get<uint64_t>()).c_str());
    const size_t persistent_n = bm["persistent_count"].get<size_t>();
    const auto print_buffers = [](const json& live, size_t from, size_t to) {
      for (size_t i = from; i < to; ++i)
        std::printf(" %s %s%s;", live[i]["what"].get<std::string>().c_str(), live[i]["dtype"].get<std::string>().c_str(),
                    shape_json_str(live[i]["shape"].get<std::vector<int64_t>>()).c_str());
    };
    if (!bm["phases"].empty()) {
      std::printf("  %-10s %12s:", "persistent", format_bytes(bm["persistent_bytes"].get<uint64_t>()).c_str());
      print_buffers(bm["phases"][0]["live"], 0, persistent_n);
      std::printf("\n");
    }
    for (const auto& ph : bm["phases"]) {
      std::printf("  %-10s %12s:", ("+ " + ph["name"].get<std::string>()).c_str(),
                  format_bytes(ph["phase_bytes"].get<uint64_t>()).c_str());
      print_buffers(ph["live"], persistent_n, ph["live"].size());
      std::printf("\n");
    }
  }
  if (out.contains("dry_run")) print_dry_run(out["dry_run"]);
}

}  // namespace

int run_describe(const InfoOptions& o, const Numerics& numerics) {
  const bool clip_asked = o.frames.given() || o.width.given() || o.height.given();
  Described d;
  if (Status s = load_source(o, d); !s.ok()) return fail(s.error());
  describe_weights(o, d);
  if (clip_asked)
    if (Status s = describe_clip(o, numerics, d); !s.ok()) return fail(s.error());
  if (o.as_json) {
    std::printf("%s\n", d.out.dump(2).c_str());
    return d.refused ? fail(*d.refused) : 0;
  }
  print_weights(o, d);
  if (clip_asked) print_clip(d.out);
  std::fflush(stdout);
  return d.refused ? fail(*d.refused) : 0;
}

}  // namespace ls::cli::info
