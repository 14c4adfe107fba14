// The engine and its executor: the block loop with slices (DESIGN.md §3). The model
// (src/model/h3) says which op runs on which rows; this file owns the slicing, the
// arena and the order of phases:
//
//   persistent: x, RoPE table, modulation rows, final rows
//   embed   : per mlp slice: fp32 patch rows -> fp32 projection -> bf16 into x (text rows copied)
//   blocks  : attention (stock: one fused slice; two-pass: K/V for all slices, then Q/out per
//             slice), then the MLP per slice; x is updated in place
//   final   : per final slice of the target rows: norm, modulation, fp32 head -> host
//   host    : unpatchify, bf16, negate, masks, audio carry transform
//
// Every allocation comes from the activation arena, with the specs of exec/plan.h, so
// the measured peak can never exceed the plan's prediction.
#include "exec/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/arena.h"
#include "core/hash.h"
#include "exec/weights.h"
#include "model/h3/adaln.h"
#include "model/h3/block.h"
#include "model/h3/checkpoint.h"
#include "model/h3/embed.h"
#include "model/h3/final_layer.h"
#include "model/h3/layout.h"
#include "model/h3/rope.h"

namespace ls::exec {

TensorView RefinedText::view() const {
  return TensorView(const_cast<uint16_t*>(bf16.data()), DType::bf16, {L, D});
}

uint64_t ForwardResult::hash() const {
  return fnv1a64(audio.data(), audio.size() * sizeof(float), fnv1a64(video.data(), video.size() * sizeof(float)));
}

// ---- RunReport ------------------------------------------------------------------------

std::string RunReport::status_line() const {
  std::ostringstream os;
  os << "[LayerStream] ";
  if (stock) {
    os << "stock plan (one slice)";
  } else {
    os << (two_pass_attention ? "two-pass attention (" + std::to_string(attn_slice) + "-row slices)" : "stock attention")
       << ", " << (sliced_mlp ? "sliced MLP (" + std::to_string(mlp_slice) + ")" : "stock MLP") << ", "
       << (sliced_head ? "sliced head (" + std::to_string(final_slice) + ")" : "stock head");
  }
  os << "; S " << S << ", kv_tile " << kv_tile << "; activation peak " << format_bytes(measured_peak_bytes)
     << " measured / " << format_bytes(predicted_peak_bytes) << " predicted (stock " << format_bytes(stock_peak_bytes);
  if (stock_peak_bytes > 0 && !stock) {
    char buf[32];
    std::snprintf(buf, sizeof buf, ", %+.1f %%",
                  100.0 * (static_cast<double>(predicted_peak_bytes) - static_cast<double>(stock_peak_bytes)) /
                      static_cast<double>(stock_peak_bytes));
    os << buf;
  }
  os << "); AdaLN tables " << format_bytes(adaln_table_bytes) << (adaln_precomputed ? " (precomputed)" : " (this call)");
  if (streamed_blocks > 0)
    os << "; weights: " << resident_blocks << " blocks resident, " << streamed_blocks << " streamed through " << slots
       << (slots == 2 ? " slots (prefetch)" : " slot");
  if (kv_offload) os << "; K/V offloaded (" << kv_chunk << "-key chunks)";
  if (residual_offload) os << "; residual offloaded";
  const uint64_t pcie = pcie_weight_bytes + pcie_kv_bytes + pcie_residual_bytes;
  if (pcie > 0) os << "; PCIe " << format_bytes(pcie);
  if (device_peak_bytes > 0) os << "; device peak " << format_bytes(device_peak_bytes);
  char t[32];
  std::snprintf(t, sizeof t, "; %.3f s", wall_seconds);
  os << t << " on " << backend;
  return os.str();
}

std::string RunReport::to_json() const {
  std::ostringstream os;
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::string be;
  for (char c : backend) {
    if (c == '"' || c == '\\') be += '\\';
    be += c;
  }
  os << "{\"two_pass_attention\": " << b(two_pass_attention) << ", \"sliced_mlp\": " << b(sliced_mlp)
     << ", \"sliced_head\": " << b(sliced_head) << ", \"stock\": " << b(stock) << ", \"S\": " << S
     << ", \"target_rows\": " << target_rows << ", \"attn_slice\": " << attn_slice << ", \"mlp_slice\": " << mlp_slice
     << ", \"final_slice\": " << final_slice << ", \"kv_tile\": " << kv_tile
     << ", \"predicted_peak_bytes\": " << predicted_peak_bytes << ", \"measured_peak_bytes\": " << measured_peak_bytes
     << ", \"stock_peak_bytes\": " << stock_peak_bytes << ", \"adaln_table_bytes\": " << adaln_table_bytes
     << ", \"adaln_precomputed\": " << b(adaln_precomputed) << ", \"wall_seconds\": " << wall_seconds
     << ", \"backend\": \"" << be << "\", \"numerics\": \"" << numerics << "\", \"resident_blocks\": " << resident_blocks
     << ", \"streamed_blocks\": " << streamed_blocks << ", \"slots\": " << slots << ", \"kv_offload\": " << b(kv_offload)
     << ", \"residual_offload\": " << b(residual_offload) << ", \"kv_chunk\": " << kv_chunk
     << ", \"pcie_weight_bytes\": " << pcie_weight_bytes << ", \"pcie_kv_bytes\": " << pcie_kv_bytes
     << ", \"pcie_residual_bytes\": " << pcie_residual_bytes << ", \"device_weight_bytes\": " << device_weight_bytes
     << ", \"device_held_bytes\": " << device_held_bytes << ", \"device_peak_bytes\": " << device_peak_bytes
     << ", \"pinned_host_bytes\": " << pinned_host_bytes << ", \"phase_seconds\": {";
  bool first = true;
  for (const auto& [k, v] : phase_seconds) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  os << "}}";
  return os.str();
}

// ---- Impl -------------------------------------------------------------------------------

namespace {

// Allocates `spec` with `rows` rows (<= the planned rows) from the arena.
Expected<TensorView> alloc(Arena& arena, const PlannedBuffer& spec, int64_t rows) {
  LS_CHECK_MSG(rows <= spec.rows, "slice of " + std::to_string(rows) + " rows exceeds the planned " + spec.what);
  return arena.alloc(spec.dtype, {rows, spec.cols}, spec.what.c_str());
}

// Host view of rows [a, b) of a contiguous host buffer [*, cols].
template <typename T>
TensorView host_rows(const std::vector<T>& v, DType t, int64_t cols, int64_t a, int64_t b) {
  return TensorView(const_cast<T*>(v.data()) + a * cols, t, {b - a, cols});
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Every device arena of an engine draws from this wrapper, so the engine knows what it
// holds on the device at any moment and at most (RunReport::device_peak_bytes).
class CountingResource final : public MemoryResource {
 public:
  explicit CountingResource(MemoryResource& base) : base_(base) {}
  Device device() const override { return base_.device(); }
  Expected<void*> allocate(size_t bytes) override {
    auto p = base_.allocate(bytes);
    if (p.ok()) {
      held_ += bytes;
      peak_ = std::max(peak_, held_);
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    base_.deallocate(p, bytes);
    held_ -= bytes;
  }
  uint64_t held() const { return held_; }
  uint64_t peak() const { return peak_; }

 private:
  MemoryResource& base_;
  uint64_t held_ = 0, peak_ = 0;
};

// Fences of the K/V offload (WeightStore owns 0-3): pass 1 chunk computed / copied out,
// pass 2 chunk copied in / used, per chunk buffer b in {0, 1}.
constexpr int kFenceKvComputed0 = 4, kFenceKvSaved0 = 6, kFenceKvLoaded0 = 8, kFenceKvUsed0 = 10;

// Named buffer of a planned list (the executor looks buffers up by name, exec/plan.h);
// a missing name is a bug in the plan's lists.
const PlannedBuffer& named(const std::vector<PlannedBuffer>& v, const std::string& what) {
  const PlannedBuffer* b = find_buffer(v, what);
  LS_CHECK_MSG(b != nullptr, "the plan has no buffer '" + what + "'");
  return *b;
}

}  // namespace

// Modulation tables of M timesteps: per block bf16|f32 [M, 18D] (= [3M, 6D]) and the
// final layer's [M, 2D], in their own arena sized exactly.
struct AdalnTables {
  std::vector<double> t;  // ascending
  std::unique_ptr<Arena> arena;
  std::vector<TensorView> blocks;
  TensorView final_table;
  bool precomputed = false;
  uint64_t bytes() const { return arena ? arena->used() : 0; }
};

struct Engine::Impl {
  const h3::H3TensorSource* src = nullptr;
  Backend* be = nullptr;
  std::unique_ptr<CountingResource> dev;  // over be->memory(): every device arena below
  h3::H3Config cfg;
  EngineOptions opts;
  std::unique_ptr<WeightStore> weights;
  std::unique_ptr<Arena> workspace_arena;
  AdalnTables precomputed;  // from precompute_adaln
  AdalnTables call_tables;  // computed by the last forward when precomputed ones did not cover it
  std::unique_ptr<Arena> activations;  // the forward's arena, kept while the plan's peak is unchanged
  std::unique_ptr<Arena> pinned_kv;    // K/V offload: host K, V [S, I] (pinned), kept between calls
  std::unique_ptr<Arena> pinned_x;     // residual offload: host x [S, D] (pinned), kept between calls

  void eval(const std::string& name, int64_t layer, const TensorView& t) const {
    if (opts.eval) opts.eval(name, layer, t);
  }
  Expected<AdalnTables> compute_tables(const std::vector<double>& t_values);
  // The plan's arenas: the device activation arena (capacity = the plan's predicted
  // peak) and, with offload, the pinned host K/V [S, I] x 2 and residual [S, D]. Kept
  // between calls while the sizes stay; pinning gigabytes takes seconds, so prepare()
  // lets a caller pay it before the first step.
  Status ensure_arenas(const Plan& plan);
  // invalid_argument unless `plan` is what make_plan gives for (cfg, cond, plan.knobs).
  Status check_plan(const Conditioning& cond, const Plan& plan) const;
};

Status Engine::Impl::check_plan(const Conditioning& cond, const Plan& plan) const {
  LS_ASSIGN_OR_RETURN(Plan expect, make_plan(cfg, cond, plan.knobs));
  if (expect.sizes != plan.sizes || expect.predicted_peak_bytes != plan.predicted_peak_bytes ||
      expect.attn_slice != plan.attn_slice || expect.mlp_slice != plan.mlp_slice || expect.final_slice != plan.final_slice)
    return make_error(ErrorCode::invalid_argument,
                      "the plan was made for another model or clip (plan S " + std::to_string(plan.sizes.S) +
                          ", this call S " + std::to_string(expect.sizes.S) + "): call make_plan with this conditioning");
  return Status();
}

Status Engine::Impl::ensure_arenas(const Plan& plan) {
  if (!activations || activations->capacity() != Arena::aligned_bytes(plan.predicted_peak_bytes)) {
    activations.reset();
    LS_ASSIGN_OR_RETURN(activations, Arena::create(*dev, plan.predicted_peak_bytes));
  }
  const int64_t S = plan.sizes.S;
  if (plan.residual_offload) {
    const uint64_t need = Arena::aligned_bytes(static_cast<size_t>(S * cfg.hidden * 2));
    if (!pinned_x || pinned_x->capacity() != need) {
      pinned_x.reset();
      LS_ASSIGN_OR_RETURN(pinned_x, Arena::create(be->pinned_host_memory(), need));
    }
  }
  if (plan.kv_offload) {
    const uint64_t need = 2 * Arena::aligned_bytes(static_cast<size_t>(S * cfg.inner() * 2));
    if (!pinned_kv || pinned_kv->capacity() != need) {
      pinned_kv.reset();
      LS_ASSIGN_OR_RETURN(pinned_kv, Arena::create(be->pinned_host_memory(), need));
    }
  }
  return Status();
}

Expected<AdalnTables> Engine::Impl::compute_tables(const std::vector<double>& t_values) {
  const int64_t M = static_cast<int64_t>(t_values.size());
  const int64_t D = cfg.hidden, td = cfg.time_embed_dim;
  const DType adt = cfg.adaln_dtype();
  AdalnTables tab;
  tab.t = t_values;
  // Table arena: per block [M, 18D] + final [M, 2D].
  const uint64_t block_bytes = Arena::aligned_bytes(static_cast<size_t>(M * 18 * D * dtype_size(adt)));
  const uint64_t final_bytes = Arena::aligned_bytes(static_cast<size_t>(M * 2 * D * dtype_size(adt)));
  LS_ASSIGN_OR_RETURN(tab.arena, Arena::create(*dev, block_bytes * static_cast<uint64_t>(cfg.num_layers) + final_bytes));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    LS_ASSIGN_OR_RETURN(TensorView v, tab.arena->alloc(adt, {M, 18 * D}, "AdaLN block table"));
    tab.blocks.push_back(TensorView(v.data, adt, {3 * M, 6 * D}, v.device));
  }
  LS_ASSIGN_OR_RETURN(tab.final_table, tab.arena->alloc(adt, {M, 2 * D}, "AdaLN final table"));

  // Scratch: time-embedding buffers (unpruned) or the curve rows, the AdaLN input, and
  // transient device copies of the AdaLN weights (none on the CPU).
  const bool curve = cfg.curve_form();
  auto ab = [](int64_t n, DType t) { return Arena::aligned_bytes(static_cast<size_t>(n) * static_cast<size_t>(dtype_size(t))); };
  uint64_t scratch = ab(M * td, adt);  // AdaLN input
  if (!curve) {
    scratch += ab(M, DType::f32) + ab(M * cfg.timestep_input_dim, DType::f32) + ab(M * cfg.time_embed_hidden, DType::f32) +
               ab(M * td, DType::f32);
    for (const char* n : {"time_embedder.proj_in.weight", "time_embedder.proj_in.bias", "time_embedder.proj_out.weight",
                          "time_embedder.proj_out.bias"})
      scratch += weights->transient_bytes(n);
  }
  uint64_t max_w = 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    max_w = std::max(max_w, weights->transient_bytes(h3::h3_block_key(i, "adaln_proj.linear.weight")) +
                                weights->transient_bytes(h3::h3_block_key(i, "adaln_proj.linear.bias")));
  max_w = std::max(max_w, weights->transient_bytes("final_layer.adaln_proj.linear.weight") +
                              weights->transient_bytes("final_layer.adaln_proj.linear.bias"));
  scratch += max_w;
  LS_ASSIGN_OR_RETURN(auto sa, Arena::create(*dev, scratch));
  LS_ASSIGN_OR_RETURN(TensorView ain, sa->alloc(adt, {M, td}, "AdaLN input"));
  std::vector<float> t32(t_values.size());
  for (size_t i = 0; i < t_values.size(); ++i) t32[i] = static_cast<float>(t_values[i]);
  if (curve) {
    const std::vector<float> rows = h3::curve_time_embedding(weights->host("adaln_t_table"), t32);
    LS_TRY(be->copy(ain, TensorView(const_cast<float*>(rows.data()), DType::f32, {M, td})));
  } else {
    Arena::Scope te(*sa);
    h3::TimeEmbedScratch s;
    LS_ASSIGN_OR_RETURN(s.t, sa->alloc(DType::f32, {M}, "timesteps"));
    LS_ASSIGN_OR_RETURN(s.sinus, sa->alloc(DType::f32, {M, cfg.timestep_input_dim}, "sinusoid"));
    LS_ASSIGN_OR_RETURN(s.hidden, sa->alloc(DType::f32, {M, cfg.time_embed_hidden}, "time hidden"));
    LS_ASSIGN_OR_RETURN(s.temb, sa->alloc(DType::f32, {M, td}, "t_emb fp32"));
    LS_TRY(be->copy(s.t, TensorView(t32.data(), DType::f32, {M})));
    std::map<std::string, TensorView> tw;
    for (const char* n : {"time_embedder.proj_in.weight", "time_embedder.proj_in.bias", "time_embedder.proj_out.weight",
                          "time_embedder.proj_out.bias"}) {
      LS_ASSIGN_OR_RETURN(tw[n], weights->transient(n, *sa));
    }
    LS_TRY(h3::adaln_input(*be, cfg, [&](const std::string& n) { return tw.at(n); }, s, ain));
  }
  eval("adaln.input", -1, ain);
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    Arena::Scope ws(*sa);
    LS_ASSIGN_OR_RETURN(TensorView w, weights->transient(h3::h3_block_key(i, "adaln_proj.linear.weight"), *sa));
    LS_ASSIGN_OR_RETURN(TensorView b, weights->transient(h3::h3_block_key(i, "adaln_proj.linear.bias"), *sa));
    const TensorView out(tab.blocks[static_cast<size_t>(i)].data, adt, {M, 18 * D}, be->device());
    LS_TRY(h3::adaln_linear(*be, ain, w, b, out));
    eval("adaln.block", i, tab.blocks[static_cast<size_t>(i)]);
    LS_TRY(be->synchronize());  // the host copy may go (read once per run)
    weights->release_source(h3::h3_block_key(i, "adaln_proj.linear.weight"));
  }
  {
    Arena::Scope ws(*sa);
    LS_ASSIGN_OR_RETURN(TensorView w, weights->transient("final_layer.adaln_proj.linear.weight", *sa));
    LS_ASSIGN_OR_RETURN(TensorView b, weights->transient("final_layer.adaln_proj.linear.bias", *sa));
    LS_TRY(h3::adaln_linear(*be, ain, w, b, tab.final_table));
    eval("adaln.final", -1, tab.final_table);
  }
  LS_TRY(be->synchronize());
  return tab;
}

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

const h3::H3Config& Engine::config() const { return impl_->cfg; }
Backend& Engine::backend() const { return *impl_->be; }

Expected<std::unique_ptr<Engine>> Engine::create(const h3::H3TensorSource& weights, Backend& backend,
                                                 const EngineOptions& options) {
  LS_TRY(h3::check_h3_config(weights.cfg()));
  std::unique_ptr<Engine> e(new Engine());
  Impl& m = *e->impl_;
  m.src = &weights;
  m.be = &backend;
  m.cfg = weights.cfg();
  m.opts = options;
  m.dev = std::make_unique<CountingResource>(backend.memory());
  LS_ASSIGN_OR_RETURN(m.weights, WeightStore::create(weights, backend, options.residency, *m.dev));
  const size_t ws = backend.workspace_bytes();
  if (ws > 0) {
    LS_ASSIGN_OR_RETURN(m.workspace_arena, Arena::create(*m.dev, ws));
    LS_ASSIGN_OR_RETURN(void* p, m.workspace_arena->alloc_bytes(ws, "backend workspace"));
    LS_TRY(backend.set_workspace(TensorView(p, DType::u8, {static_cast<int64_t>(ws)}, backend.device())));
  }
  return e;
}

// ---- text refiner --------------------------------------------------------------------------

Expected<RefinedText> Engine::refine_text(const TensorView& text) {
  Impl& m = *impl_;
  const h3::H3Config& cfg = m.cfg;
  if (text.ndim != 2 || text.shape[1] != cfg.text_dim || !text.is_contiguous() || text.device.kind != DeviceKind::cpu ||
      (text.dtype != DType::f32 && text.dtype != DType::bf16))
    return make_error(ErrorCode::invalid_argument, "text states are " + text.shape_str() +
                                                       ", expected contiguous host f32|bf16 [L, " +
                                                       std::to_string(cfg.text_dim) + "]");
  const int64_t L = text.shape[0], D = cfg.hidden;
  RefinedText out;
  out.L = L;
  out.D = D;
  out.bf16.assign(static_cast<size_t>(L * D), 0);
  if (L == 0) return out;
  // The states are cast to bf16 first (ComfyUI casts the fp32 text encoder output).
  std::vector<uint16_t> in(static_cast<size_t>(L * cfg.text_dim));
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = text.dtype == DType::bf16 ? text.ptr<uint16_t>()[i] : f32_to_bf16(text.ptr<float>()[i]);
  Backend& be = *m.be;
  // Text arena: the refiner's activations, plus the text weights the steps never read
  // (condition_proj and the final norm, copied for this call; a refiner block at a time
  // when it does not go through a block slot).
  const bool has_final_norm = m.src->has("token_refiner.final_norm.weight");
  uint64_t text_weight_bytes = 0, block_scratch = 0;
  if (cfg.text_dim != D)
    text_weight_bytes += m.weights->transient_bytes("condition_proj.weight") + m.weights->transient_bytes("condition_proj.bias");
  if (has_final_norm) text_weight_bytes += m.weights->transient_bytes("token_refiner.final_norm.weight");
  for (int64_t i = 0; i < cfg.refiner_layers; ++i) block_scratch = std::max(block_scratch, m.weights->refiner_block_scratch_bytes(i));
  LS_ASSIGN_OR_RETURN(auto arena, Arena::create(*m.dev, refiner_peak_bytes(cfg, L) + text_weight_bytes + block_scratch));
  const auto pers = refiner_persistent_buffers(cfg, L);
  LS_ASSIGN_OR_RETURN(TensorView x, alloc(*arena, pers[0], L));
  const TensorView in_host(in.data(), DType::bf16, {L, cfg.text_dim});
  if (cfg.text_dim != D) {
    Arena::Scope s(*arena);
    const PlanPhase ph = refiner_input_phase(cfg, L);
    LS_ASSIGN_OR_RETURN(TensorView cw, m.weights->transient("condition_proj.weight", *arena));
    LS_ASSIGN_OR_RETURN(TensorView cb, m.weights->transient("condition_proj.bias", *arena));
    LS_ASSIGN_OR_RETURN(TensorView xin, alloc(*arena, ph.buffers[0], L));
    LS_TRY(be.copy(xin, in_host));
    LS_TRY(be.gemm(xin, cw, &cb, x));  // bf16 Linear + bias
    LS_TRY(be.synchronize());          // before the scope frees the copies
  } else {
    LS_TRY(be.copy(x, in_host));
  }
  m.eval("text.embed", -1, x);
  for (int64_t i = 0; i < cfg.refiner_layers; ++i) {
    Arena::Scope s(*arena);
    const PlanPhase ph = refiner_block_phase(cfg, L);
    LS_ASSIGN_OR_RETURN(h3::WeightGetter w, m.weights->refiner_block(i, *arena));
    std::vector<TensorView> b;
    for (const auto& spec : ph.buffers) {
      LS_ASSIGN_OR_RETURN(TensorView v, alloc(*arena, spec, L));
      b.push_back(v);
    }
    LS_TRY(h3::refiner_block(be, cfg, h3::refiner_block_weights(w, i), x, b[0], b[1], b[2], b[3], b[4], 1024));
    LS_TRY(m.weights->release_refiner_block(i));
    LS_TRY(be.synchronize());  // before the scope frees this block's buffers
  }
  // A checkpoint without refiner blocks (tiny test configs) has no final_norm either.
  if (has_final_norm) {
    LS_ASSIGN_OR_RETURN(TensorView fw, m.weights->transient("token_refiner.final_norm.weight", *arena));
    LS_TRY(be.rms_norm(x, fw, 1e-5f, x));
  }
  m.eval("text.refined", -1, x);
  LS_TRY(be.copy(out.view(), x));
  LS_TRY(be.synchronize());
  return out;
}

// ---- AdaLN precompute ------------------------------------------------------------------------

Status Engine::precompute_adaln(const std::vector<float>& sigmas, const Conditioning& cond) {
  Impl& m = *impl_;
  LS_ASSIGN_OR_RETURN(h3::PackedLayout lay, h3::build_layout(m.cfg, cond, /*with_positions=*/false));
  const std::vector<double> all = h3::schedule_timesteps(lay, cond, sigmas);
  m.precomputed = AdalnTables{};
  if (all.empty()) return Status();
  LS_ASSIGN_OR_RETURN(m.precomputed, m.compute_tables(all));
  m.precomputed.precomputed = true;
  return Status();
}

void Engine::drop_adaln_tables() {
  impl_->precomputed = AdalnTables{};
  impl_->call_tables = AdalnTables{};
}

// ---- forward ---------------------------------------------------------------------------------

Status Engine::prepare(const Conditioning& cond, const Plan& plan) {
  Impl& m = *impl_;
  LS_TRY(m.check_plan(cond, plan));
  return m.ensure_arenas(plan);
}

Expected<ForwardResult> Engine::forward(const Conditioning& cond, const RefinedText& text, const TensorView& video,
                                        const TensorView& audio, float sigma, const Plan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  const h3::H3Config& cfg = m.cfg;
  Backend& be = *m.be;
  const int64_t D = cfg.hidden, P = cfg.rope_pairs(), H = cfg.heads, Dh = cfg.head_dim;
  if (!(sigma > 0.0f) || !std::isfinite(sigma))
    return make_error(ErrorCode::invalid_argument, "sigma must be a positive finite value (got " + std::to_string(sigma) + ")");

  // ---- host: layout, timesteps, inputs ----
  LS_ASSIGN_OR_RETURN(h3::PackedLayout lay, h3::build_layout(cfg, cond));
  LS_TRY(m.check_plan(cond, plan));
  if (text.L != lay.L || (text.L > 0 && text.D != D))
    return make_error(ErrorCode::invalid_argument, "refined text has " + std::to_string(text.L) + " tokens of width " +
                                                       std::to_string(text.D) + " but the conditioning says L = " +
                                                       std::to_string(lay.L) + ", hidden " + std::to_string(D));
  h3::Timesteps ts = h3::layout_timesteps(lay, cond, sigma);
  const float carry = cond.audio_scale != 1.0 ? round_bf16(ts.sig.sigma_a_f32 / ts.sig.sigma_v_f32) : 1.0f;
  LS_ASSIGN_OR_RETURN(h3::EmbedInputs inputs, h3::EmbedInputs::prepare(cfg, lay, cond, video, audio, carry));

  // PDD effective heads (host) before any device work. ComfyUI banks both heads with
  // the same n and the same [start, stop) (from the video shift); each head's weights
  // come from its own stream's shift (h3-model.md §2.12 step 4).
  h3::EffectiveHead pdd_v, pdd_a;
  if (cfg.pdd_heads > 1) {
    LS_ASSIGN_OR_RETURN(pdd_v, h3::pdd_effective_head(m.weights->host("final_layer.video_out.weight"),
                                                      m.weights->host("final_layer.video_out.bias"), cfg.pdd_heads,
                                                      cond.sample_sigmas, ts.sig.sigma_v, cond.shift_video, cond.shift_video));
    LS_ASSIGN_OR_RETURN(pdd_a, h3::pdd_effective_head(m.weights->host("final_layer.audio_out.weight"),
                                                      m.weights->host("final_layer.audio_out.bias"), cfg.pdd_heads,
                                                      cond.sample_sigmas, ts.sig.sigma_v, cond.shift_video, cond.shift_audio));
  }

  // ---- modulation tables: the precomputed ones if they cover this call ----
  const AdalnTables* tab = nullptr;
  std::vector<int32_t> remap(ts.unique_t.size());
  if (!m.precomputed.t.empty()) {
    bool covered = true;
    for (size_t i = 0; i < ts.unique_t.size() && covered; ++i) {
      auto it = std::lower_bound(m.precomputed.t.begin(), m.precomputed.t.end(), ts.unique_t[i]);
      covered = it != m.precomputed.t.end() && *it == ts.unique_t[i];
      if (covered) remap[i] = static_cast<int32_t>(it - m.precomputed.t.begin());
    }
    if (covered) tab = &m.precomputed;
  }
  if (!tab) {
    m.call_tables = AdalnTables{};
    LS_ASSIGN_OR_RETURN(m.call_tables, m.compute_tables(ts.unique_t));
    for (size_t i = 0; i < remap.size(); ++i) remap[i] = static_cast<int32_t>(i);
    tab = &m.call_tables;
  }
  for (auto& r : ts.mod_rows) r = remap[static_cast<size_t>(r / 3)] * 3 + r % 3;
  for (auto& r : ts.final_rows) r = remap[static_cast<size_t>(r)];

  // ---- the activation arena: capacity = the plan's predicted peak ----
  // Kept between calls of the same plan (a sampler calls forward once or twice per
  // step with one plan): no device allocation per step.
  LS_TRY(m.ensure_arenas(plan));
  Arena* arena = m.activations.get();
  LS_CHECK(arena->used() == 0);
  arena->reset_peak();
  struct Rewind {
    Arena* a;
    ~Rewind() { a->rewind(Arena::Mark{0}); }
  } rewind_on_exit{arena};
  const int64_t S = lay.S, I = cfg.inner();
  const bool kv_off = plan.kv_offload, res_off = plan.residual_offload;
  LS_CHECK_MSG(!(kv_off || res_off) || plan.two_pass_attention(), "offload needs two-pass attention");
  const auto& pers = plan.persistent;
  // The residual: on the device, or (residual offload) in pinned host memory with one
  // device slice buffer per phase that rows are copied into and out of on the compute
  // queue (so the copies are ordered with the slice's work without fences).
  TensorView x;  // bf16 [S, D]: device, or pinned host with residual offload
  if (!res_off) {
    LS_ASSIGN_OR_RETURN(x, alloc(*arena, named(pers, "residual x"), S));
  } else {
    m.pinned_x->rewind(Arena::Mark{0});
    LS_ASSIGN_OR_RETURN(x, m.pinned_x->alloc(DType::bf16, {S, D}, "host residual x"));
  }
  LS_ASSIGN_OR_RETURN(TensorView rope2, alloc(*arena, named(pers, "rope table"), S));       // bf16 [S, 2P]
  LS_ASSIGN_OR_RETURN(TensorView mod_rows2, alloc(*arena, named(pers, "modulation rows"), S));  // i32 [S, 1]
  LS_ASSIGN_OR_RETURN(TensorView final_rows2, alloc(*arena, named(pers, "final rows"), S));     // i32 [S, 1]
  const TensorView rope(rope2.data, DType::bf16, {S, P, 2}, rope2.device);   // bf16 [S, P, 2]
  const TensorView mod_rows(mod_rows2.data, DType::i32, {S}, mod_rows2.device);
  const TensorView final_rows(final_rows2.data, DType::i32, {S}, final_rows2.device);
  {
    std::vector<uint16_t> rt(static_cast<size_t>(S * P * 2));
    const TensorView inv = m.weights->host("rope.inv_freq");
    h3::rope_table_rows(lay.positions, inv.ptr<float>(), cfg.rope_inv_freq_len, 0, S, rt.data());
    LS_TRY(be.copy(rope, TensorView(rt.data(), DType::bf16, {S, P, 2})));
    LS_TRY(be.copy(mod_rows, TensorView(ts.mod_rows.data(), DType::i32, {S})));
    LS_TRY(be.copy(final_rows, TensorView(ts.final_rows.data(), DType::i32, {S})));
    LS_TRY(be.synchronize());  // the host tables above are freed at scope exit
  }
  uint64_t kv_bytes = 0, res_bytes = 0;
  // Residual rows [a, b) as a device view: x itself, or the phase's slice buffer `rs`
  // after copying the rows in (residual offload).
  auto residual_in = [&](const TensorView& rs, int64_t a, int64_t b) -> Expected<h3::BlockRows> {
    if (!res_off) return h3::BlockRows{x, rope, mod_rows, 0};
    const TensorView d = rs.slice_rows(0, b - a);
    LS_TRY(be.copy_async(d, x.slice_rows(a, b), Queue::compute));
    res_bytes += static_cast<uint64_t>(d.nbytes());
    return h3::BlockRows{d, rope, mod_rows, a};
  };
  // Non-finite check (EngineOptions::check_finite): the residual after each phase, on
  // the device (with residual offload: each slice before it goes back to the host), one
  // reduction per phase or slice; the first phase with a NaN/inf fails the call, naming
  // it. Reads only: never changes a bit.
  const char* phase_name = "embed";
  int64_t phase_block = -1;
  auto where = [&]() {
    return phase_block < 0 ? std::string(phase_name) : "block " + std::to_string(phase_block) + " (" + phase_name + ")";
  };
  auto check_finite = [&](const TensorView& t) -> Status {
    if (!m.opts.check_finite) return Status();
    LS_ASSIGN_OR_RETURN(const int64_t n, be.count_nonfinite(t));
    if (n == 0) return Status();
    (void)be.synchronize();  // nothing in flight when the call returns the error
    return make_error(ErrorCode::nonfinite,
                      std::to_string(n) + " non-finite value(s) (NaN or inf) in the residual stream after " + where() +
                          ", the first phase that produced one; check the checkpoint (`layerstream info --check`), "
                          "the inputs and settings such as --cfg (--allow-nonfinite writes the output anyway)");
  };
  auto residual_out = [&](const h3::BlockRows& r, int64_t a, int64_t b) -> Status {
    if (!res_off) return Status();
    LS_TRY(check_finite(r.x_rows(a, b)));
    LS_TRY(be.copy_async(x.slice_rows(a, b), r.x_rows(a, b), Queue::compute));
    res_bytes += static_cast<uint64_t>((b - a) * D * 2);
    return Status();
  };
  auto phase_slice = [&](const PlanPhase& ph, int64_t rows) -> Expected<TensorView> {
    if (!res_off) return TensorView();
    return alloc(*arena, named(ph.buffers, "residual slice"), rows);
  };
  // Named intermediates see the residual as a whole (host memory with residual offload).
  auto eval_x = [&](const char* name, int64_t layer) -> Status {
    if (!m.opts.eval) return Status();
    if (res_off) LS_TRY(be.synchronize());
    m.eval(name, layer, x);
    return Status();
  };

  // Optional phase profile (EngineOptions::profile): the device is synchronised at each
  // phase boundary, so phases do not overlap each other (a diagnostic, not a timing of
  // the normal run).
  std::map<std::string, double> prof;
  auto prof_t = std::chrono::steady_clock::now();
  // Memory samples (EngineOptions::record_memory): at the end of each phase, what every
  // device arena holds, with the activation arena's high-water mark of that phase (the
  // call's peak is kept in call_peak across the per-phase resets).
  std::vector<MemorySample> samples;
  size_t call_peak = 0;
  uint64_t phase_kv = 0;  // K/V buffers of the phase (two-pass attention), part of its activations
  auto sample = [&](const char* phase, int64_t block) {
    call_peak = std::max(call_peak, arena->peak());
    if (m.opts.record_memory) {
      MemorySample ms;
      ms.phase = phase;
      ms.block = block;
      ms.seconds = seconds_since(t0);
      ms.slots = m.weights->slot_bytes() * static_cast<uint64_t>(m.weights->slots());
      ms.weights = m.weights->device_bytes() - std::min(ms.slots, m.weights->device_bytes());
      ms.activations = arena->peak();
      ms.kv = phase_kv;
      ms.adaln = tab->bytes();
      ms.workspace = m.workspace_arena ? m.workspace_arena->capacity() : 0;
      ms.held = m.dev->held();
      samples.push_back(std::move(ms));
    }
    arena->reset_peak();
    phase_kv = 0;
  };
  auto mark = [&](const char* phase) -> Status {
    if (!m.opts.profile) return Status();
    LS_TRY(be.synchronize());
    const auto now = std::chrono::steady_clock::now();
    prof[phase] += std::chrono::duration<double>(now - prof_t).count();
    prof_t = now;
    return Status();
  };
  LS_TRY(mark("setup"));

  // Streamed block weights: the first copies start now, behind the embedding.
  LS_TRY(m.weights->begin_forward());

  // ---- embed: text rows copied, latent rows projected per slice ----
  {
    Arena::Scope phase(*arena);
    const PlanPhase& ph = plan.phases[0];
    LS_ASSIGN_OR_RETURN(TensorView rs, phase_slice(ph, std::min(S, plan.mlp_slice)));
    const TensorView vw = m.weights->get("video_patch_proj.weight"), vb = m.weights->get("video_patch_proj.bias");
    const TensorView aw = m.weights->get("audio_patch_proj.weight"), ab = m.weights->get("audio_patch_proj.bias");
    std::vector<float> staging;
    for (int64_t a = 0; a < S; a += plan.mlp_slice) {
      const int64_t b = std::min(S, a + plan.mlp_slice);
      Arena::Scope slice(*arena);
      LS_ASSIGN_OR_RETURN(TensorView rows, alloc(*arena, named(ph.buffers, "patch rows"), b - a));  // f32 [n, max(Pv, Pa)]
      LS_ASSIGN_OR_RETURN(TensorView emb, alloc(*arena, named(ph.buffers, "patch embedding"), b - a));  // f32 [n, D]
      // The rows [a, b) of the residual being written: x itself or the slice buffer.
      const h3::BlockRows out = res_off ? h3::BlockRows{rs.slice_rows(0, b - a), rope, mod_rows, a}
                                        : h3::BlockRows{x, rope, mod_rows, 0};
      for (const h3::Segment& s : lay.segments) {
        const int64_t lo = std::max(a, s.start), hi = std::min(b, s.stop);
        if (lo >= hi) continue;
        if (s.kind == h3::SegmentKind::text) {
          LS_TRY(be.copy(out.x_rows(lo, hi), text.view().slice_rows(lo, hi)));
          continue;
        }
        const int64_t w = inputs.width(s), n = hi - lo;
        staging.resize(static_cast<size_t>(n * w));
        inputs.rows(s, lo, hi, staging.data());
        // Contiguous [n, w] views at the sub-range's offset inside the slice buffers.
        const TensorView r(static_cast<float*>(rows.data) + (lo - a) * w, DType::f32, {n, w}, rows.device);
        const TensorView e = emb.slice_rows(lo - a, hi - a);
        LS_TRY(be.copy(r, TensorView(staging.data(), DType::f32, {n, w})));
        LS_TRY(be.gemm(r, s.is_video() ? vw : aw, s.is_video() ? &vb : &ab, e));  // fp32 GEMM + bias
        LS_TRY(be.convert(e, out.x_rows(lo, hi)));                                // -> bf16
      }
      LS_TRY(residual_out(out, a, b));
      LS_TRY(be.synchronize());  // the staging buffer is reused by the next slice
    }
  }
  if (!res_off) LS_TRY(check_finite(x));
  sample("embed", -1);
  LS_TRY(eval_x("x.embed", -1));
  LS_TRY(mark("embed"));

  // ---- the block loop ----
  // K/V offload: host K, V [S, I] (pinned), reused block after block.
  TensorView k_host, v_host;
  if (kv_off) {
    m.pinned_kv->rewind(Arena::Mark{0});
    LS_ASSIGN_OR_RETURN(k_host, m.pinned_kv->alloc(DType::bf16, {S, I}, "host K"));
    LS_ASSIGN_OR_RETURN(v_host, m.pinned_kv->alloc(DType::bf16, {S, I}, "host V"));
  }
  const int64_t n_chunks = kv_off ? (S + plan.kv_chunk - 1) / plan.kv_chunk : 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    LS_ASSIGN_OR_RETURN(h3::WeightGetter wg, m.weights->acquire_block(i));
    const h3::DitBlock blk(be, cfg, h3::dit_block_weights(wg, i), h3::block_tables(tab->blocks[static_cast<size_t>(i)]));
    phase_name = "attention";
    phase_block = i;
    {
      Arena::Scope phase(*arena);
      const PlanPhase& ph = plan.phases[1];
      if (!plan.two_pass_attention()) {
        LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), S));
        LS_ASSIGN_OR_RETURN(TensorView qkv, alloc(*arena, named(ph.buffers, "qkv"), S));
        LS_ASSIGN_OR_RETURN(TensorView o, alloc(*arena, named(ph.buffers, "attention out"), S));
        LS_TRY(blk.attn_fused(h3::BlockRows{x, rope, mod_rows, 0}, h, qkv, o, plan.kv_tile));
      } else if (!kv_off) {
        LS_ASSIGN_OR_RETURN(TensorView rs, phase_slice(ph, plan.attn_slice));
        LS_ASSIGN_OR_RETURN(TensorView k2, alloc(*arena, named(ph.buffers, "K"), S));
        LS_ASSIGN_OR_RETURN(TensorView v2, alloc(*arena, named(ph.buffers, "V"), S));
        phase_kv = static_cast<uint64_t>(k2.nbytes() + v2.nbytes());
        const TensorView k_all = k2.unflatten_last(H, Dh), v_all = v2.unflatten_last(H, Dh);  // bf16 [S, H, Dh]
        // Pass 1: K and V of every row before any residual row changes.
        for (int64_t a = 0; a < S; a += plan.attn_slice) {
          const int64_t b = std::min(S, a + plan.attn_slice);
          Arena::Scope slice(*arena);
          LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
          LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
          LS_TRY(blk.attn_kv(r, a, b, k_all.slice_rows(a, b), v_all.slice_rows(a, b), h));
        }
        LS_TRY(mark("attention pass 1"));
        // Pass 2: per slice Q, attention against all keys, out-projection, gated add.
        for (int64_t a = 0; a < S; a += plan.attn_slice) {
          const int64_t b = std::min(S, a + plan.attn_slice);
          Arena::Scope slice(*arena);
          LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
          LS_ASSIGN_OR_RETURN(TensorView q, alloc(*arena, named(ph.buffers, "Q"), b - a));
          LS_ASSIGN_OR_RETURN(TensorView o, alloc(*arena, named(ph.buffers, "attention out"), b - a));
          LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
          LS_TRY(blk.attn_q_out(r, a, b, k_all, v_all, h, q, o, plan.kv_tile));
          LS_TRY(residual_out(r, a, b));
        }
      } else {
        // K/V offload. Two device chunk buffers per tensor of kv_chunk rows (a multiple
        // of kv_tile, so chunks hold whole key tiles): pass 1 computes chunk c into
        // buffer c % 2 while the transfer queue copies chunk c - 1 out to the host;
        // pass 2 copies chunk g + 1 in while attention runs on chunk g, carrying the
        // fp32 attention state across chunks (bytes equal one call over all keys).
        LS_ASSIGN_OR_RETURN(TensorView rs, phase_slice(ph, plan.attn_slice));
        TensorView kc[2], vc[2];
        for (int j = 0; j < 2; ++j) {
          LS_ASSIGN_OR_RETURN(kc[j], alloc(*arena, named(ph.buffers, "K chunk " + std::to_string(j)), plan.kv_chunk));
          LS_ASSIGN_OR_RETURN(vc[j], alloc(*arena, named(ph.buffers, "V chunk " + std::to_string(j)), plan.kv_chunk));
          phase_kv += static_cast<uint64_t>(kc[j].nbytes() + vc[j].nbytes());
        }
        for (int64_t c = 0; c < n_chunks; ++c) {
          const int64_t k0 = c * plan.kv_chunk, k1 = std::min(S, k0 + plan.kv_chunk);
          const int j = static_cast<int>(c % 2);
          LS_TRY(be.wait(Queue::compute, kFenceKvSaved0 + j));  // chunk c - 2's copy out is done
          for (int64_t a = k0; a < k1; a += plan.attn_slice) {
            const int64_t b = std::min(k1, a + plan.attn_slice);
            Arena::Scope slice(*arena);
            LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
            LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
            LS_TRY(blk.attn_kv(r, a, b, kc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh),
                               vc[j].slice_rows(a - k0, b - k0).unflatten_last(H, Dh), h));
          }
          LS_TRY(be.signal(Queue::compute, kFenceKvComputed0 + j));
          LS_TRY(be.wait(Queue::transfer, kFenceKvComputed0 + j));
          LS_TRY(be.copy_async(k_host.slice_rows(k0, k1), kc[j].slice_rows(0, k1 - k0), Queue::transfer));
          LS_TRY(be.copy_async(v_host.slice_rows(k0, k1), vc[j].slice_rows(0, k1 - k0), Queue::transfer));
          LS_TRY(be.signal(Queue::transfer, kFenceKvSaved0 + j));
          kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * I * 2);
        }
        LS_TRY(mark("attention pass 1"));
        const int64_t n_slices = (S + plan.attn_slice - 1) / plan.attn_slice, total = n_slices * n_chunks;
        auto load = [&](int64_t g) -> Status {  // chunk g % n_chunks into buffer g % 2
          const int64_t c = g % n_chunks, k0 = c * plan.kv_chunk, k1 = std::min(S, k0 + plan.kv_chunk);
          const int j = static_cast<int>(g % 2);
          LS_TRY(be.wait(Queue::transfer, kFenceKvUsed0 + j));  // attention on chunk g - 2 is done
          LS_TRY(be.copy_async(kc[j].slice_rows(0, k1 - k0), k_host.slice_rows(k0, k1), Queue::transfer));
          LS_TRY(be.copy_async(vc[j].slice_rows(0, k1 - k0), v_host.slice_rows(k0, k1), Queue::transfer));
          kv_bytes += static_cast<uint64_t>(2 * (k1 - k0) * I * 2);
          return be.signal(Queue::transfer, kFenceKvLoaded0 + j);
        };
        for (int64_t g = 0; g < std::min<int64_t>(2, total); ++g) LS_TRY(load(g));
        int64_t g = 0;
        for (int64_t a = 0; a < S; a += plan.attn_slice) {
          const int64_t b = std::min(S, a + plan.attn_slice);
          Arena::Scope slice(*arena);
          LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
          LS_ASSIGN_OR_RETURN(TensorView q, alloc(*arena, named(ph.buffers, "Q"), b - a));
          LS_ASSIGN_OR_RETURN(TensorView o, alloc(*arena, named(ph.buffers, "attention out"), b - a));
          LS_ASSIGN_OR_RETURN(TensorView st, alloc(*arena, named(ph.buffers, "attention state"), b - a));
          LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
          LS_TRY(blk.attn_q(r, a, b, h, q));
          AttentionParams ap;
          ap.kv_tile = plan.kv_tile;
          ap.state = TensorView(st.data, DType::f32, {b - a, H, Dh + kAttentionStateExtra}, st.device);
          for (int64_t c = 0; c < n_chunks; ++c, ++g) {
            const int64_t k0 = c * plan.kv_chunk, k1 = std::min(S, k0 + plan.kv_chunk);
            const int j = static_cast<int>(g % 2);
            LS_TRY(be.wait(Queue::compute, kFenceKvLoaded0 + j));
            ap.state_in = c > 0;
            ap.finalize = c == n_chunks - 1;
            LS_TRY(be.attention(q.unflatten_last(H, Dh), kc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh),
                                vc[j].slice_rows(0, k1 - k0).unflatten_last(H, Dh), o.unflatten_last(H, Dh), ap));
            LS_TRY(be.signal(Queue::compute, kFenceKvUsed0 + j));
            if (g + 2 < total) LS_TRY(load(g + 2));
          }
          LS_TRY(blk.attn_out(r, a, b, o, h));
          LS_TRY(residual_out(r, a, b));
        }
      }
      // The phase's buffers are rewound at scope exit and the next phase may reuse the
      // bytes at once: queued work is ordered on the compute queue, and every transfer
      // into or out of these buffers was waited for by compute above. On a backend
      // with queues the transfer queue is idle here except for weight copies.
    }
    if (!res_off) LS_TRY(check_finite(x));
    sample("attention", i);
    LS_TRY(mark(plan.two_pass_attention() ? "attention pass 2" : "attention"));
    LS_TRY(eval_x("block.attn", i));
    phase_name = "mlp";
    {
      Arena::Scope phase(*arena);
      const PlanPhase& ph = plan.phases[2];
      LS_ASSIGN_OR_RETURN(TensorView rs, phase_slice(ph, std::min(S, plan.mlp_slice)));
      for (int64_t a = 0; a < S; a += plan.mlp_slice) {
        const int64_t b = std::min(S, a + plan.mlp_slice);
        Arena::Scope slice(*arena);
        LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
        LS_ASSIGN_OR_RETURN(TensorView u, alloc(*arena, named(ph.buffers, "fc1 out"), b - a));
        LS_ASSIGN_OR_RETURN(TensorView act, alloc(*arena, named(ph.buffers, "swiglu out"), b - a));
        LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
        LS_TRY(blk.mlp(r, a, b, h, u, act));
        LS_TRY(residual_out(r, a, b));
      }
    }
    if (!res_off) LS_TRY(check_finite(x));
    sample("mlp", i);
    LS_TRY(mark("mlp"));
    LS_TRY(m.weights->release_block(i));
    LS_TRY(eval_x("block.mlp", i));
    if (m.opts.progress) {
      // The callback reports finished work: wait for the block's queued work first (one
      // synchronisation per block, next to a block's milliseconds to seconds of work).
      LS_TRY(be.synchronize());
      m.opts.progress(i + 1, cfg.num_layers);
    }
  }
  phase_name = "final layer";
  phase_block = -1;

  // ---- final layer on the target rows [audio | video] ----
  const h3::Segment& sa = lay.target_audio();
  const h3::Segment& sv = lay.target_video();
  const int64_t Pv = cfg.video_patch_dim(), Pa = cfg.audio_latents_dim;
  std::vector<float> vout(static_cast<size_t>(sv.rows() * Pv)), aout(static_cast<size_t>(sa.rows() * Pa));
  {
    Arena::Scope phase(*arena);
    const PlanPhase& ph = plan.phases[3];
    LS_ASSIGN_OR_RETURN(TensorView rs, phase_slice(ph, std::min(S - sa.start, plan.final_slice)));
    TensorView vw = m.weights->get("final_layer.video_out.weight"), vb = m.weights->get("final_layer.video_out.bias");
    TensorView aw = m.weights->get("final_layer.audio_out.weight"), ab = m.weights->get("final_layer.audio_out.bias");
    // PDD: one planned buffer f32 [Pv, D] + [Pv] ("PDD video head" / "PDD video bias",
    // Pv >= Pa) holds the effective head of the stream being projected: the audio head
    // for the target audio rows, then the video head (the audio rows all come first, so
    // it is loaded once each; the copies are ordered with the GEMMs on the compute queue).
    TensorView pdd_w, pdd_b;
    bool pdd_holds_video = false;
    if (cfg.pdd_heads > 1) {
      if (Pa > Pv)
        return make_error(ErrorCode::unsupported, "a PDD head bank with audio head rows (" + std::to_string(Pa) +
                                                      ") wider than the video head's (" + std::to_string(Pv) +
                                                      ") is not supported");
      LS_ASSIGN_OR_RETURN(pdd_w, alloc(*arena, named(ph.buffers, "PDD video head"), Pv));
      LS_ASSIGN_OR_RETURN(TensorView pb, alloc(*arena, named(ph.buffers, "PDD video bias"), Pv));
      pdd_b = TensorView(pb.data, DType::f32, {Pv}, pb.device);
      aw = TensorView(pdd_w.data, DType::f32, {Pa, D}, pdd_w.device);
      ab = TensorView(pdd_b.data, DType::f32, {Pa}, pdd_b.device);
      LS_TRY(be.copy(aw, TensorView(pdd_a.w.data(), DType::f32, {Pa, D})));
      LS_TRY(be.copy(ab, TensorView(pdd_a.b.data(), DType::f32, {Pa})));
    }
    const TensorView shift = tab->final_table.cols(0, D), scale = tab->final_table.cols(D, 2 * D);
    const TensorView norm_w = m.weights->get("final_layer.norm.weight");
    const PlannedBuffer& head_out = named(ph.buffers, "head out");
    const int64_t pw = head_out.cols;
    for (int64_t a = sa.start; a < S; a += plan.final_slice) {
      const int64_t b = std::min(S, a + plan.final_slice);
      Arena::Scope slice(*arena);
      LS_ASSIGN_OR_RETURN(TensorView h, alloc(*arena, named(ph.buffers, "h"), b - a));
      LS_ASSIGN_OR_RETURN(TensorView mod, alloc(*arena, named(ph.buffers, "modulated rows"), b - a));
      LS_ASSIGN_OR_RETURN(TensorView out, alloc(*arena, head_out, b - a));
      LS_ASSIGN_OR_RETURN(const h3::BlockRows r, residual_in(rs, a, b));
      for (const h3::Segment* s : {&sa, &sv}) {
        const int64_t lo = std::max(a, s->start), hi = std::min(b, s->stop);
        if (lo >= hi) continue;
        const bool is_v = s->is_video();
        const int64_t ow = is_v ? Pv : Pa, n = hi - lo;
        if (cfg.pdd_heads > 1 && is_v && !pdd_holds_video) {
          vw = pdd_w;
          vb = pdd_b;
          LS_TRY(be.copy(vw, TensorView(pdd_v.w.data(), DType::f32, {Pv, D})));
          LS_TRY(be.copy(vb, TensorView(pdd_v.b.data(), DType::f32, {Pv})));
          pdd_holds_video = true;
        }
        const TensorView o(static_cast<float*>(out.data) + (lo - a) * pw, DType::f32, {n, ow}, out.device);
        LS_TRY(h3::final_layer_rows(be, r.x_rows(lo, hi), final_rows, lo, hi, shift, scale, norm_w, is_v ? vw : aw,
                                    is_v ? vb : ab, h.slice_rows(lo - a, hi - a), mod.slice_rows(lo - a, hi - a), o));
        std::vector<float>& dst = is_v ? vout : aout;
        LS_TRY(be.copy(host_rows(dst, DType::f32, ow, lo - s->start, hi - s->start), o));
      }
    }
    LS_TRY(be.synchronize());
  }
  sample("final", -1);
  LS_TRY(mark("final"));
  const uint64_t measured = call_peak;
  LS_CHECK_MSG(measured <= plan.predicted_peak_bytes, "activation arena peak above the plan's prediction");

  // ---- host: unpatchify, bf16, negate, masks, audio carry ----
  const h3::ClipGeometry& g = cond.geometry;
  ForwardResult res;
  res.video.assign(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl), 0.0f);
  res.audio.assign(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A), 0.0f);
  // Return [-video.to(bf16), -audio.to(bf16)]: cast first, then negate (exact).
  for (auto& v : vout) v = -round_bf16(v);
  for (auto& v : aout) v = -round_bf16(v);
  for (int64_t r = 0; r < sv.rows(); ++r)
    h3::video_unpatch_row(vout.data() + r * Pv, cfg.latents_dim, g.T, g.Hl, g.Wl, r, res.video.data());
  for (int64_t r = 0; r < sa.rows(); ++r) h3::audio_unrow(aout.data() + r * Pa, cfg.audio_latents_dim, g.A, r, res.audio.data());
  // Masks (§2.2 step 5): out *= the mask model_base hands the model: pooled per 2x2
  // patch (amax) and quantised to ceil(m * 256) / 256, the values that also set the
  // per-row timesteps (h3::pooled_video_mask / pooled_audio_mask), broadcast over the
  // channels (video: also over the patch's 2x2 pixels). A bf16 tensor times a bf16 mask
  // (k/256 is exact in bf16): one rounding to bf16.
  if (!cond.video_mask.empty()) {
    const std::vector<float> pm = h3::pooled_video_mask(cond);  // [T * Hl/2 * Wl/2]
    const int64_t hp = g.Hl / 2, wp = g.Wl / 2, plane = g.T * g.Hl * g.Wl;
    for (int64_t c = 0; c < cfg.latents_dim; ++c)
      for (int64_t t = 0; t < g.T; ++t)
        for (int64_t y = 0; y < g.Hl; ++y)
          for (int64_t w = 0; w < g.Wl; ++w) {
            const float mv = pm[static_cast<size_t>((t * hp + y / 2) * wp + w / 2)];
            float& v = res.video[static_cast<size_t>(c * plane + (t * g.Hl + y) * g.Wl + w)];
            v = round_bf16(v * mv);
          }
  }
  if (!cond.audio_mask.empty()) {
    const std::vector<float> pm = h3::pooled_audio_mask(cond);  // [2A]
    const int64_t plane = 2 * g.A;
    for (int64_t c = 0; c < cfg.audio_latents_dim; ++c)
      for (int64_t i = 0; i < plane; ++i) {
        float& v = res.audio[static_cast<size_t>(c * plane + i)];
        v = round_bf16(v * pm[static_cast<size_t>(i)]);
      }
  }
  // Audio carry (§2.2 step 6): out = (1 - s) * (audio_src * carry) + bf16(1 + (s - 1) * sigma_a) * out,
  // every op a bf16 tensor op (fp32 inside, one rounding).
  if (cond.audio_scale != 1.0) {
    const double s = cond.audio_scale;
    const auto one_minus_s = static_cast<float>(1.0 - s);
    const float coef = round_bf16(1.0f + static_cast<float>(s - 1.0) * ts.sig.sigma_a_f32);
    const std::vector<float>& ain = inputs.audio_in();
    for (size_t i = 0; i < res.audio.size(); ++i) {
      const float t1 = round_bf16(one_minus_s * ain[i]);
      const float t2 = round_bf16(coef * res.audio[i]);
      res.audio[i] = round_bf16(t1 + t2);
    }
  }

  if (m.opts.check_finite) {
    // The residual was finite after the last block; the head, masks or carry may still
    // overflow (or a non-finite condition latent reach the carry term).
    int64_t n = 0;
    for (const std::vector<float>* out : {&res.video, &res.audio})
      for (float v : *out) n += std::isfinite(v) ? 0 : 1;
    if (n > 0)
      return make_error(ErrorCode::nonfinite, std::to_string(n) +
                                                  " non-finite output value(s) (NaN or inf) after the final layer "
                                                  "(the residual stream was finite); --allow-nonfinite writes them anyway");
  }

  RunReport& rep = res.report;
  rep.memory = std::move(samples);
  rep.two_pass_attention = plan.two_pass_attention();
  rep.sliced_mlp = plan.sliced_mlp();
  rep.sliced_head = plan.sliced_head();
  rep.stock = plan.stock();
  rep.S = S;
  rep.target_rows = plan.sizes.target_rows;
  rep.attn_slice = plan.attn_slice;
  rep.mlp_slice = plan.mlp_slice;
  rep.final_slice = plan.final_slice;
  rep.kv_tile = plan.kv_tile;
  rep.predicted_peak_bytes = plan.predicted_peak_bytes;
  rep.measured_peak_bytes = measured;
  rep.stock_peak_bytes = plan.stock_peak_bytes;
  rep.adaln_table_bytes = tab->bytes();
  rep.adaln_precomputed = tab->precomputed;
  rep.backend = be.name();
  rep.numerics = describe(be.numerics());
  rep.phase_seconds = prof;
  rep.resident_blocks = m.weights->resident_blocks();
  rep.streamed_blocks = cfg.num_layers - m.weights->resident_blocks();
  rep.slots = m.weights->slots();
  rep.kv_offload = kv_off;
  rep.residual_offload = res_off;
  rep.kv_chunk = kv_off ? plan.kv_chunk : 0;
  rep.pcie_weight_bytes = m.weights->forward_copy_bytes();
  rep.pcie_kv_bytes = kv_bytes;
  rep.pcie_residual_bytes = res_bytes;
  rep.device_weight_bytes = m.weights->device_bytes();
  rep.device_held_bytes = m.dev->held();
  rep.device_peak_bytes = m.dev->peak();
  rep.pinned_host_bytes = m.weights->pinned_host_bytes() + (m.pinned_kv ? m.pinned_kv->capacity() : 0) +
                          (m.pinned_x ? m.pinned_x->capacity() : 0);
  rep.wall_seconds = seconds_since(t0);
  return res;
}

}  // namespace ls::exec
