// The engine: weights, AdaLN tables, text refinement, and the forward's orchestration
// (DESIGN.md §3). The model (src/model/h3) says which op runs on which rows; the
// executor's phases, each in a file of its own, own the slicing:
//
//   persistent : x, RoPE table, modulation rows, final rows (here)
//   embed      : exec/phase_embed     per MLP slice: patch rows -> fp32 projection -> bf16 x
//   blocks     : exec/phase_attention stock | two-pass with K/V resident | K/V offloaded
//                exec/phase_mlp       per MLP slice; x updated in place
//   final      : exec/phase_final     per final slice of the target rows -> host
//   output     : exec/phase_output    PDD bank selection (before), unpatchify, masks,
//                                     audio carry (after), on the host
//
// Every allocation comes from the activation arena, with the typed phase buffers of
// exec/buffers.h (the same structs the plan's lists are made from), so the measured
// peak can never exceed the plan's prediction.
#include "exec/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <thread>

#include "backend/comm.h"
#include "backend/description.h"
#include "core/arena.h"
#include "core/hash.h"
#include "exec/buffers.h"
#include "exec/forward_state.h"
#include "exec/phase_attention.h"
#include "exec/phase_embed.h"
#include "exec/phase_final.h"
#include "exec/phase_mlp.h"
#include "exec/phase_output.h"
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

// ---- Impl -------------------------------------------------------------------------------

namespace {

// The head count KvOffload lays its host buffers out for: H with attention int8 (the
// prepared keys), 0 for bf16 K/V. The pinned arena's size and the offload's views both use
// it, so they cannot disagree.
int64_t kv_offload_int8_heads(const Plan& plan, const h3::H3Config& cfg) {
  return plan.knobs.int8_attention ? cfg.heads : 0;
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

// What one rank's forward hands the caller: its final-layer rows (zero outside this
// rank's target rows) and the host state finish_outputs needs.
struct RankOut {
  std::vector<float> vout, aout;  // f32 [target video rows, Pv], [target audio rows, Pa]
  int64_t row0 = 0, row1 = 0;     // this rank's sequence rows
  int64_t sa_start = 0, sa_stop = 0, sv_start = 0, sv_stop = 0;  // target audio / video segments
  std::optional<h3::Timesteps> ts;
  std::optional<h3::EmbedInputs> inputs;
  std::optional<OutputMapping> om;  // masks and carry for finish_outputs
  RunReport report;
};

struct Engine::Impl {
  const h3::H3TensorSource* src = nullptr;
  Backend* be = nullptr;
  std::unique_ptr<CountingResource> dev;  // over be->memory(): every device arena below
  h3::H3Config cfg;
  EngineOptions opts;
  std::unique_ptr<WeightStore> weights;
  std::unique_ptr<Arena> workspace_arena;
  TensorView workspace_view;  // workspace_arena's bytes, handed to the backend
  // The backend's workspace is a pointer it keeps: each entry point that queues ops binds
  // this engine's own (several engines may share one backend, each with its own arena),
  // and the destructor clears it, so the backend never keeps a view of a freed arena.
  Status bind_workspace() const { return workspace_arena ? be->set_workspace(workspace_view) : Status(); }
  ~Impl() {
    if (workspace_arena && be) (void)be->set_workspace(TensorView{});
  }
  AdalnTables precomputed;  // from precompute_adaln
  AdalnTables call_tables;  // computed by the last forward when precomputed ones did not cover it
  std::unique_ptr<Arena> activations;  // the forward's arena, kept while the plan's peak is unchanged
  std::unique_ptr<Arena> pinned_kv;    // K/V offload: host K, V [S, I] (pinned), kept between calls
  std::unique_ptr<Arena> pinned_x;     // residual offload: host x [S, D] (pinned), kept between calls
  // Sequence parallel (EngineOptions::peer_backends, docs/multi-gpu.md): this rank, the
  // rank count, its communicator (null with one rank). Rank 0's Impl also owns the
  // peers' Impls and the group's communicators.
  int64_t rank = 0, ranks = 1;
  Communicator* comm = nullptr;
  // With several ranks the source is read by every rank's thread: nothing releases a
  // source tensor (a release would free memory another rank may be reading).
  bool keep_sources = false;
  std::vector<std::unique_ptr<Impl>> peers;
  std::vector<std::unique_ptr<Communicator>> comms;
  // (Re)makes the communicator group of rank 0 and the peers (after an abort).
  Status reset_comms();
  // The forward of this rank, up to the final layer's rows (Engine::forward finishes).
  Status forward_rank(const Conditioning& cond, const h3::PackedLayout& lay, const RefinedText& text,
                      const TensorView& video, const TensorView& audio, float sigma, const Plan& plan,
                      const ForwardOutputs& outputs, RankOut& out);
  // forward_rank's steps (defined beside it).
  struct CallHost;
  struct PhaseLog;
  Expected<CallHost> host_call(const Conditioning& cond, const h3::PackedLayout& lay, const RefinedText& text,
                               const TensorView& video, const TensorView& audio, float sigma, const Plan& plan,
                               const ForwardOutputs& outputs);
  Status setup_rows(ForwardState& st, const PersistentSpecs& pers, const CallHost& h, Arena& arena);
  Status run_blocks(ForwardState& st, const AttnSpecs& attn, const MlpSpecs& mlp, const Plan& plan, KvOffload* kv,
                    PhaseLog& log);
  void fill_report(RunReport& rep, const Plan& plan, const ForwardState& st, PhaseLog& log, uint64_t measured) const;

  void eval(const std::string& name, int64_t layer, const TensorView& t) const {
    if (opts.eval) opts.eval(name, layer, t);
  }
  Expected<AdalnTables> compute_tables(const std::vector<double>& t_values);
  // The plan's arenas: the device activation arena (capacity = the plan's predicted
  // peak) and, with offload, the pinned host K/V [S, I] x 2 and residual [S, D]. Kept
  // between calls while the sizes stay; pinning gigabytes takes seconds, so prepare()
  // lets a caller pay it before the first step.
  Status ensure_arenas(const Plan& plan);
  // invalid_argument unless `plan` is what make_plan gives for (cfg, these sizes,
  // plan.knobs) and its kv_tile is the backend's (numerics().kv_tile).
  Status check_plan(const SequenceSizes& sizes, const Plan& plan) const;
  // The modulation tables covering ts.unique_t: the precomputed ones if they cover every
  // timestep of the call, else tables computed now (call_tables). Rewrites ts.mod_rows
  // and ts.final_rows to the chosen tables' rows.
  Expected<const AdalnTables*> tables_for(h3::Timesteps& ts);
};

Status Engine::Impl::reset_comms() {
  std::vector<Backend*> all{be};
  for (const auto& p : peers) all.push_back(p->be);
  comms.clear();
  LS_ASSIGN_OR_RETURN(comms, make_communicator_group(all));
  comm = comms[0].get();
  for (size_t r = 1; r < comms.size(); ++r) peers[r - 1]->comm = comms[r].get();
  return Status();
}

Status Engine::Impl::check_plan(const SequenceSizes& sizes, const Plan& plan) const {
  if (plan.ranks != ranks)
    return make_error(ErrorCode::invalid_argument,
                      "the plan is for " + std::to_string(plan.ranks) + " sequence-parallel rank(s) but the engine runs " +
                          std::to_string(ranks) + ": make the plan with PlanKnobs::ranks = " + std::to_string(ranks));
  LS_ASSIGN_OR_RETURN(Plan expect, make_plan(cfg, sizes, plan.knobs));
  if (expect.sizes != plan.sizes || expect.predicted_peak_bytes != plan.predicted_peak_bytes ||
      expect.attn_slice != plan.attn_slice || expect.mlp_slice != plan.mlp_slice || expect.final_slice != plan.final_slice)
    return make_error(ErrorCode::invalid_argument,
                      "the plan was made for another model or clip (plan S " + std::to_string(plan.sizes.S) +
                          ", this call S " + std::to_string(expect.sizes.S) + "): call make_plan with this conditioning");
  // kv_tile is a numerics setting (DESIGN.md §1.2): the one the backend records in every
  // report and output file must be the one the attention walks.
  // [int8 attention] the plan holds the key pre-pass's buffers exactly when the backend's
  // algorithm runs one (its description says).
  const bool be_int8 = resolved_attention(*be).key_prepass;
  if (plan.knobs.int8_attention != be_int8)
    return make_error(ErrorCode::invalid_argument,
                      std::string("the plan was made ") + (plan.knobs.int8_attention ? "with" : "without") +
                          " the int8 attention buffers but the backend runs " + describe(be->numerics()) +
                          ": plan with PlanKnobs::int8_attention = " + (be_int8 ? "true" : "false") +
                          " (plan_memory sets it from the backend)");
  const int64_t be_tile = be->numerics().kv_tile;
  if (plan.kv_tile != be_tile)
    return make_error(ErrorCode::invalid_argument,
                      "the plan's kv_tile " + std::to_string(plan.kv_tile) + " differs from the backend's kv_tile " +
                          std::to_string(be_tile) + " (" + describe(be->numerics()) +
                          "): make the plan with the backend's default_kv_tile(), or give the backend Numerics with "
                          "kv_tile " + std::to_string(plan.kv_tile) + " (set_numerics, --kv-tile)");
  return Status();
}

Expected<const AdalnTables*> Engine::Impl::tables_for(h3::Timesteps& ts) {
  const AdalnTables* tab = nullptr;
  std::vector<int32_t> remap(ts.unique_t.size());
  if (!precomputed.t.empty()) {
    bool covered = true;
    for (size_t i = 0; i < ts.unique_t.size() && covered; ++i) {
      auto it = std::lower_bound(precomputed.t.begin(), precomputed.t.end(), ts.unique_t[i]);
      covered = it != precomputed.t.end() && *it == ts.unique_t[i];
      if (covered) remap[i] = static_cast<int32_t>(it - precomputed.t.begin());
    }
    if (covered) tab = &precomputed;
  }
  if (!tab) {
    call_tables = AdalnTables{};
    LS_ASSIGN_OR_RETURN(call_tables, compute_tables(ts.unique_t));
    for (size_t i = 0; i < remap.size(); ++i) remap[i] = static_cast<int32_t>(i);
    tab = &call_tables;
  }
  // Table rows: modulation row = t_index * 3 + tag, final row = t_index.
  for (auto& r : ts.mod_rows) r = remap[static_cast<size_t>(r / 3)] * 3 + r % 3;
  for (auto& r : ts.final_rows) r = remap[static_cast<size_t>(r)];
  return tab;
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
    const uint64_t need = KvOffload::host_bytes(S, cfg.inner(), kv_offload_int8_heads(plan, cfg));
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
  // The largest block AdaLN linear copied at once: weight + bias, and for the int8-full
  // files' quantised ones the scale and any LoRA side factors (lora_source.h), which the
  // budget planner counts the same way (tally_weights: every adaln tensor of the block).
  auto adaln_linear_bytes = [&](int64_t i) {
    const std::string m = h3::h3_block_key(i, "adaln_proj.linear");
    uint64_t b = weights->transient_bytes(m + ".weight") + weights->transient_bytes(m + ".bias");
    if (cfg.quant.find(m)) b += weights->transient_bytes(m + ".weight_scale");
    if (cfg.lora_side.count(m))
      b += weights->transient_bytes(m + ".lora_side_down") + weights->transient_bytes(m + ".lora_side_up");
    return b;
  };
  uint64_t max_w = 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i) max_w = std::max(max_w, adaln_linear_bytes(i));
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
    // The full int8 files quantise the blocks' AdaLN linears (group 64, with a bias).
    LinearWeight lw(w);
    const std::string m = h3::h3_block_key(i, "adaln_proj.linear");
    const bool side = cfg.lora_side.count(m) != 0;
    if (cfg.quant.find(m)) {
      LS_ASSIGN_OR_RETURN(TensorView sc, weights->transient(m + ".weight_scale", *sa));
      // A LoRA on the quantised AdaLN linear: its side factors, applied by adaln_linear
      // (linear_lora) on the AdaLN input rows, as the blocks' linears apply theirs.
      TensorView sd, su;
      if (side) {
        LS_ASSIGN_OR_RETURN(sd, weights->transient(m + ".lora_side_down", *sa));
        LS_ASSIGN_OR_RETURN(su, weights->transient(m + ".lora_side_up", *sa));
      }
      lw = h3::h3_linear_weight(
          [&](const std::string& n) {
            if (n.ends_with(".lora_side_down")) return sd;
            if (n.ends_with(".lora_side_up")) return su;
            return n.ends_with(".weight") ? w : sc;
          },
          cfg, m);
    }
    LS_TRY(h3::adaln_linear(*be, ain, lw, b, out));
    eval("adaln.block", i, tab.blocks[static_cast<size_t>(i)]);
    LS_TRY(be->synchronize());  // the host copy may go (read once per run)
    if (!keep_sources) {
      weights->release_source(m + ".weight");
      if (side) {
        weights->release_source(m + ".lora_side_down");
        weights->release_source(m + ".lora_side_up");
      }
    }
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

int64_t Engine::ranks() const { return impl_->ranks; }

// One rank's state: weights through a WeightStore, the backend workspace.
Status Engine::init_rank(Impl& m, const h3::H3TensorSource& weights, Backend& backend, const EngineOptions& options) {
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
    m.workspace_view = TensorView(p, DType::u8, {static_cast<int64_t>(ws)}, backend.device());
    LS_TRY(m.bind_workspace());
  }
  return Status();
}

Expected<std::unique_ptr<Engine>> Engine::create(const h3::H3TensorSource& weights, Backend& backend,
                                                 const EngineOptions& options) {
  LS_TRY(h3::check_h3_config(weights.cfg()));
  std::unique_ptr<Engine> e(new Engine());
  Impl& m = *e->impl_;
  const int64_t N = 1 + static_cast<int64_t>(options.peer_backends.size());
  if (N == 1) {
    LS_TRY(init_rank(m, weights, backend, options));
    return e;
  }
  // Sequence parallel: every rank is an Impl of its own over its backend.
  if (options.eval)
    return make_error(ErrorCode::unsupported,
                      "named intermediates (eval) are not available with " + std::to_string(N) +
                          " sequence-parallel ranks (each rank holds part of the residual): run on one device");
  LS_TRY(check_ranks(weights.cfg(), N));
  const std::string numerics = describe(backend.numerics());
  for (const Backend* p : options.peer_backends) {
    LS_CHECK(p != nullptr);
    if (describe(p->numerics()) != numerics)
      return make_error(ErrorCode::invalid_argument, "rank backends differ in numerics (" + backend.name() + ": " + numerics +
                                                         "; " + p->name() + ": " + describe(p->numerics()) +
                                                         "): every rank must compute with the same settings");
  }
  EngineOptions o = options;
  o.peer_backends.clear();
  o.residency.release_source = false;  // every rank reads the source
  LS_TRY(init_rank(m, weights, backend, o));
  m.ranks = N;
  m.keep_sources = true;
  o.progress = nullptr;  // rank 0 reports progress
  for (int64_t r = 1; r < N; ++r) {
    auto p = std::make_unique<Impl>();
    LS_TRY(init_rank(*p, weights, *options.peer_backends[static_cast<size_t>(r - 1)], o));
    p->rank = r;
    p->ranks = N;
    p->keep_sources = true;
    m.peers.push_back(std::move(p));
  }
  LS_TRY(m.reset_comms());
  return e;
}

// ---- text refiner --------------------------------------------------------------------------

Expected<RefinedText> Engine::refine_text(const TensorView& text) {
  Impl& m = *impl_;
  LS_TRY(m.bind_workspace());
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
  // The refiner's attention walks the keys in tiles of the backend's kv_tile, like the
  // steps' (the resolved numerics' kv_tile: the algorithm's default of
  // backend/description.h unless one was given).
  const int64_t kv_tile = be.numerics().kv_tile;
  // Text arena: the refiner's activations, plus the text weights the steps never read
  // (condition_proj and the final norm, copied for this call; a refiner block at a time
  // when it does not go through a block slot).
  const bool has_final_norm = m.src->has("token_refiner.final_norm.weight");
  uint64_t text_weight_bytes = 0, block_scratch = 0;
  if (cfg.text_dim != D)
    text_weight_bytes += m.weights->transient_bytes("condition_proj.weight") + m.weights->transient_bytes("condition_proj.bias");
  if (has_final_norm) text_weight_bytes += m.weights->transient_bytes("token_refiner.final_norm.weight");
  for (int64_t i = 0; i < cfg.refiner_layers; ++i) block_scratch = std::max(block_scratch, m.weights->refiner_block_scratch_bytes(i));
  const bool int8 = resolved_attention(be).key_prepass;  // [int8 attention] the pre-pass's scratch counted
  LS_ASSIGN_OR_RETURN(auto arena,
                      Arena::create(*m.dev, refiner_peak_bytes(cfg, L, int8) + text_weight_bytes + block_scratch));
  const auto pers = refiner_persistent_buffers(cfg, L);
  LS_ASSIGN_OR_RETURN(TensorView x, alloc_rows(*arena, pers[0], L));
  const TensorView in_host(in.data(), DType::bf16, {L, cfg.text_dim});
  if (cfg.text_dim != D) {
    Arena::Scope s(*arena);
    const PlanPhase ph = refiner_input_phase(cfg, L);
    LS_ASSIGN_OR_RETURN(TensorView cw, m.weights->transient("condition_proj.weight", *arena));
    LS_ASSIGN_OR_RETURN(TensorView cb, m.weights->transient("condition_proj.bias", *arena));
    LS_ASSIGN_OR_RETURN(TensorView xin, alloc_rows(*arena, ph.buffers[0], L));
    LS_TRY(be.copy(xin, in_host));
    LS_TRY(be.gemm(xin, cw, &cb, x));  // bf16 Linear + bias
    LS_TRY(be.synchronize());          // before the scope frees the copies
  } else {
    LS_TRY(be.copy(x, in_host));
  }
  m.eval("text.embed", -1, x);
  for (int64_t i = 0; i < cfg.refiner_layers; ++i) {
    Arena::Scope s(*arena);
    const PlanPhase ph = refiner_block_phase(cfg, L, int8);
    LS_ASSIGN_OR_RETURN(h3::WeightGetter w, m.weights->refiner_block(i, *arena));
    std::vector<TensorView> b;
    for (const auto& spec : ph.buffers) {
      LS_ASSIGN_OR_RETURN(TensorView v, alloc_rows(*arena, spec, std::min(L, spec.rows)));  // int8 scratch: 1 row
      b.push_back(v);
    }
    LS_TRY(h3::refiner_block(be, cfg, h3::refiner_block_weights(w, cfg, i), x, b[0], b[1], b[2], b[3], b[4], kv_tile,
                             int8 ? b[5] : TensorView()));
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
  return precompute_adaln(sigmas, cond, CallLayout(impl_->cfg, cond));
}

Status Engine::precompute_adaln(const std::vector<float>& sigmas, const Conditioning& cond, const CallLayout& layout) {
  Impl& m0 = *impl_;
  LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, layout.get());
  const std::vector<double> all = h3::schedule_timesteps(*lay, cond, sigmas);
  // Every rank holds the tables on its own device (one rank after the other: cheap next
  // to the steps, and no two ranks read the source at once here).
  std::vector<Impl*> ranks{&m0};
  for (const auto& p : m0.peers) ranks.push_back(p.get());
  for (Impl* m : ranks) {
    m->precomputed = AdalnTables{};
    if (all.empty()) continue;
    LS_TRY(m->bind_workspace());
    LS_ASSIGN_OR_RETURN(m->precomputed, m->compute_tables(all));
    m->precomputed.precomputed = true;
  }
  return Status();
}

bool Engine::has_adaln_tables(const std::vector<float>& sigmas, const Conditioning& cond) const {
  return has_adaln_tables(sigmas, cond, CallLayout(impl_->cfg, cond));
}

bool Engine::has_adaln_tables(const std::vector<float>& sigmas, const Conditioning& cond,
                              const CallLayout& layout) const {
  const Impl& m0 = *impl_;
  if (!m0.precomputed.precomputed) return false;
  auto lay = layout.get();
  if (!lay.ok()) return false;
  const std::vector<double> all = h3::schedule_timesteps(**lay, cond, sigmas);
  if (all.empty() || all != m0.precomputed.t) return false;
  for (const auto& p : m0.peers)
    if (!p->precomputed.precomputed || p->precomputed.t != all) return false;
  return true;
}

void Engine::release_activations() {
  impl_->activations.reset();
  impl_->call_tables = AdalnTables{};
  for (const auto& p : impl_->peers) {
    p->activations.reset();
    p->call_tables = AdalnTables{};
  }
}

void Engine::drop_adaln_tables() {
  impl_->precomputed = AdalnTables{};
  impl_->call_tables = AdalnTables{};
  for (const auto& p : impl_->peers) {
    p->precomputed = AdalnTables{};
    p->call_tables = AdalnTables{};
  }
}

// ---- forward ---------------------------------------------------------------------------------

namespace {
// Where forward()'s latents may live: host memory or the engine's device; device outputs
// contiguous f32|bf16 of the clip's shapes; with the audio carry, the audio output on
// the side of the audio input (the carry term reads the input where the output is made).
Status check_io_devices(const Backend& be, const h3::H3Config& cfg, const Conditioning& cond, const TensorView& video,
                        const TensorView& audio, const ForwardOutputs& out) {
  const Device dev = be.device();
  for (const auto& [v, what] : {std::pair<const TensorView*, const char*>{&video, "video input"}, {&audio, "audio input"}})
    if (v->device.kind != DeviceKind::cpu && v->device != dev)
      return make_error(ErrorCode::invalid_argument,
                        std::string(what) + " is on " + v->device.str() + " but the engine runs on " + dev.str());
  const h3::ClipGeometry& g = cond.geometry;
  auto check_out = [&](const TensorView& o, std::initializer_list<int64_t> dims, const char* what) -> Status {
    if (o.empty()) return Status();
    bool ok = o.device == dev && o.is_contiguous() &&
              (o.dtype == DType::f32 || o.dtype == DType::bf16) && o.ndim == static_cast<int>(dims.size());
    int i = 0;
    for (int64_t d : dims) ok = ok && o.shape[static_cast<size_t>(i++)] == d;
    if (!ok)
      return make_error(ErrorCode::invalid_argument, std::string(what) + " is " + o.shape_str() + " on " + o.device.str() +
                                                         ": device outputs are contiguous f32|bf16 latents on " + dev.str());
    return Status();
  };
  LS_TRY(check_out(out.video, {cfg.latents_dim, g.T, g.Hl, g.Wl}, "video output"));
  LS_TRY(check_out(out.audio, {cfg.audio_latents_dim, 2, g.A}, "audio output"));
  if (cond.audio_scale != 1.0 && (out.audio.empty() == (audio.device.kind != DeviceKind::cpu)) &&
      dev.kind != DeviceKind::cpu)
    return make_error(ErrorCode::invalid_argument,
                      "with the audio carry (audio_scale != 1) the audio output and the audio input must both be on " +
                          dev.str() + " or both in host memory");
  return Status();
}
}  // namespace

Status Engine::prepare(const Conditioning& cond, const Plan& plan) { return prepare(cond, CallLayout(impl_->cfg, cond), plan); }

Status Engine::prepare(const Conditioning& /*cond*/, const CallLayout& layout, const Plan& plan) {
  Impl& m = *impl_;
  LS_ASSIGN_OR_RETURN(const SequenceSizes sizes, layout.sizes());
  LS_TRY(m.check_plan(sizes, plan));
  LS_TRY(m.ensure_arenas(plan));
  for (const auto& p : m.peers) LS_TRY(p->ensure_arenas(plan));
  return Status();
}

Expected<ForwardResult> Engine::forward(const Conditioning& cond, const RefinedText& text, const TensorView& video,
                                        const TensorView& audio, float sigma, const Plan& plan,
                                        const ForwardOutputs& outputs) {
  return forward(cond, CallLayout(impl_->cfg, cond, /*for_forward=*/true), text, video, audio, sigma, plan, outputs);
}

Expected<ForwardResult> Engine::forward(const Conditioning& cond, const CallLayout& layout, const RefinedText& text,
                                        const TensorView& video, const TensorView& audio, float sigma, const Plan& plan,
                                        const ForwardOutputs& outputs) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  ForwardResult res;
  if (!(sigma > 0.0f) || !std::isfinite(sigma))
    return make_error(ErrorCode::invalid_argument, "sigma must be a positive finite value (got " + std::to_string(sigma) + ")");
  // The call's layout, built (if it is not yet) before any work; the ranks' threads only read it.
  auto positioned = [&]() -> Expected<const h3::PackedLayout*> {
    LS_ASSIGN_OR_RETURN(const h3::PackedLayout* l, layout.get());
    LS_CHECK_MSG(static_cast<int64_t>(l->positions.size()) == 3 * l->S,
                 "Engine::forward needs the call's layout built for a forward (CallLayout for_forward)");
    return l;
  };
  if (m.peers.empty()) {
    LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, positioned());
    RankOut out;
    LS_TRY(m.forward_rank(cond, *lay, text, video, audio, sigma, plan, outputs, out));
    // ---- host outputs: unpatchify, bf16, negate, masks, audio carry (device outputs:
    // done in run_final, read back for the fingerprint) ----
    LS_TRY(finish_outputs(*m.be, m.cfg, cond, *out.om, outputs.video, outputs.audio, out.vout, out.aout,
                          m.opts.check_finite, res.video, res.audio));
    res.report = std::move(out.report);
    res.report.wall_seconds = seconds_since(t0);
    return res;
  }
  // Sequence parallel: one thread per rank (rank 0 on this one). A rank that fails
  // aborts the group so that no peer waits forever in a collective; the error returned
  // is the first failing rank's own (not a peer's "aborted").
  // The ranks' devices differ, so latents and outputs stay in host memory here.
  if (!outputs.video.empty() || !outputs.audio.empty() || video.device.kind != DeviceKind::cpu ||
      audio.device.kind != DeviceKind::cpu)
    return make_error(ErrorCode::unsupported,
                      "with several devices the latents and outputs must be in host memory (device tensors are "
                      "supported on one device)");
  LS_ASSIGN_OR_RETURN(const h3::PackedLayout* lay, positioned());
  std::vector<Impl*> impls{&m};
  for (const auto& p : m.peers) impls.push_back(p.get());
  const size_t N = impls.size();
  std::vector<RankOut> outs(N);
  std::vector<Status> status(N);
  std::mutex first_mu;
  int first = -1;
  auto run = [&](size_t r) {
    Status s = impls[r]->forward_rank(cond, *lay, text, video, audio, sigma, plan, ForwardOutputs{}, outs[r]);
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(first_mu);
        if (first < 0) first = static_cast<int>(r);
      }
      impls[r]->comm->abort();
    }
    status[r] = std::move(s);
  };
  {
    std::vector<std::thread> threads;
    for (size_t r = 1; r < N; ++r) threads.emplace_back(run, r);
    run(0);
    for (auto& t : threads) t.join();
  }
  if (first >= 0) {
    const Error err = status[static_cast<size_t>(first)].error();
    LS_TRY(m.reset_comms());  // the aborted group cannot be used again
    return err;
  }
  // Gather on the host (the ranks are threads of this process): each rank's target
  // rows into rank 0's buffers, then the host output phase once.
  RankOut& o = outs[0];
  const int64_t Pv = m.cfg.video_patch_dim(), Pa = m.cfg.audio_latents_dim;
  for (size_t r = 1; r < N; ++r) {
    const RankOut& x = outs[r];
    auto take = [&](std::vector<float>& dst, const std::vector<float>& src, int64_t start, int64_t stop, int64_t w) {
      const int64_t lo = std::max(start, x.row0), hi = std::min(stop, x.row1);
      if (lo < hi)
        std::copy(src.begin() + (lo - start) * w, src.begin() + (hi - start) * w, dst.begin() + (lo - start) * w);
    };
    take(o.vout, x.vout, x.sv_start, x.sv_stop, Pv);
    take(o.aout, x.aout, x.sa_start, x.sa_stop, Pa);
  }
  LS_TRY(finish_outputs(*m.be, m.cfg, cond, *o.om, TensorView{}, TensorView{}, o.vout, o.aout, m.opts.check_finite,
                        res.video, res.audio));
  res.report = std::move(o.report);
  RunReport& rep = res.report;
  rep.ranks = static_cast<int64_t>(N);
  for (size_t r = 0; r < N; ++r) {
    const RunReport& x = r == 0 ? rep : outs[r].report;
    rep.rank_measured_peak_bytes.push_back(x.measured_peak_bytes);
    rep.rank_device_peak_bytes.push_back(x.device_peak_bytes);
  }
  rep.measured_peak_bytes = *std::max_element(rep.rank_measured_peak_bytes.begin(), rep.rank_measured_peak_bytes.end());
  rep.device_peak_bytes = *std::max_element(rep.rank_device_peak_bytes.begin(), rep.rank_device_peak_bytes.end());
  rep.wall_seconds = seconds_since(t0);
  return res;
}

// ---- one rank's forward, in steps -------------------------------------------------------

// The host side of one call (forward_rank's first step): the call's packed layout (built
// once per call, Engine::forward), timesteps, embedding inputs, output mapping, PDD heads and the modulation
// tables covering the call, all before any device work.
struct Engine::Impl::CallHost {
  const h3::PackedLayout* lay = nullptr;
  h3::Timesteps ts;
  std::optional<h3::EmbedInputs> inputs;
  std::optional<OutputMapping> om;
  std::optional<PddHeads> pdd;
  const AdalnTables* tab = nullptr;
};

// What a forward records per phase: the phase profile (EngineOptions::profile: the
// device is synchronised at each phase boundary, so phases do not overlap each other; a
// diagnostic, not a timing of the normal run) and the memory samples
// (EngineOptions::record_memory: at the end of each phase, what every device arena
// holds, with the activation arena's high-water mark of that phase; the call's peak is
// kept in call_peak across the per-phase resets).
struct Engine::Impl::PhaseLog {
  const Impl& m;
  Arena& arena;
  ForwardState& st;
  const AdalnTables& tab;
  std::chrono::steady_clock::time_point t0, prof_t;
  std::map<std::string, double> prof;
  std::vector<MemorySample> samples;
  size_t call_peak = 0;

  void sample(const char* phase, int64_t block) {
    call_peak = std::max(call_peak, arena.peak());
    if (m.opts.record_memory) {
      MemorySample ms;
      ms.phase = phase;
      ms.block = block;
      ms.seconds = seconds_since(t0);
      ms.slots = m.weights->slot_bytes() * static_cast<uint64_t>(m.weights->slots());
      ms.weights = m.weights->device_bytes() - std::min(ms.slots, m.weights->device_bytes());
      ms.activations = arena.peak();
      ms.kv = st.phase_kv;
      ms.adaln = tab.bytes();
      ms.workspace = m.workspace_arena ? m.workspace_arena->capacity() : 0;
      ms.held = m.dev->held();
      samples.push_back(std::move(ms));
    }
    arena.reset_peak();
    st.phase_kv = 0;
  }
  // Named intermediates see the residual as a whole (host memory with residual offload).
  Status eval_x(const char* name, int64_t layer) {
    if (!m.opts.eval) return Status();
    if (st.residual_offload) LS_TRY(m.be->synchronize());
    m.eval(name, layer, st.x);
    return Status();
  }
};

Expected<Engine::Impl::CallHost> Engine::Impl::host_call(const Conditioning& cond, const h3::PackedLayout& lay,
                                                         const RefinedText& text, const TensorView& video,
                                                         const TensorView& audio, float sigma, const Plan& plan,
                                                         const ForwardOutputs& outputs) {
  const int64_t D = cfg.hidden;
  CallHost h;
  h.lay = &lay;
  LS_TRY(check_plan(SequenceSizes{h.lay->S, h.lay->target_rows()}, plan));
  if (text.L != h.lay->L || (text.L > 0 && text.D != D))
    return make_error(ErrorCode::invalid_argument, "refined text has " + std::to_string(text.L) + " tokens of width " +
                                                       std::to_string(text.D) + " but the conditioning says L = " +
                                                       std::to_string(h.lay->L) + ", hidden " + std::to_string(D));
  h.ts = h3::layout_timesteps(*h.lay, cond, sigma);
  const float carry = cond.audio_scale != 1.0 ? round_bf16(h.ts.sig.sigma_a_f32 / h.ts.sig.sigma_v_f32) : 1.0f;
  LS_ASSIGN_OR_RETURN(h3::EmbedInputs inputs, h3::EmbedInputs::prepare(cfg, *h.lay, cond, video, audio, carry));
  h.inputs.emplace(std::move(inputs));
  LS_TRY(check_io_devices(*be, cfg, cond, video, audio, outputs));
  h.om.emplace(output_mapping(cond, h.ts, *h.inputs));
  // PDD effective heads (host) before any device work.
  LS_ASSIGN_OR_RETURN(h.pdd, select_pdd_heads(cfg, *weights, cond, h.ts));
  // The modulation tables: the precomputed ones if they cover this call.
  LS_ASSIGN_OR_RETURN(h.tab, tables_for(h.ts));
  return h;
}

// This rank's rows (docs/multi-gpu.md: R = ceil(S / ranks) each, the last ranks shorter;
// all of [0, S) with one rank), the residual (on the device, or with residual offload in
// pinned host memory) and the per-row tables (RoPE, modulation and final-layer rows).
Status Engine::Impl::setup_rows(ForwardState& st, const PersistentSpecs& pers, const CallHost& h, Arena& arena) {
  const int64_t S = h.lay->S, D = cfg.hidden, P = cfg.rope_pairs();
  st.S = S;
  st.R = rank_rows(S, ranks);
  st.row0 = std::min(S, rank * st.R);
  st.row1 = std::min(S, st.row0 + st.R);
  st.comm = ranks > 1 ? comm : nullptr;
  if (!st.residual_offload) {
    LS_ASSIGN_OR_RETURN(st.x, alloc_rows(arena, *pers.x, st.R));
  } else {
    pinned_x->rewind(Arena::Mark{0});
    LS_ASSIGN_OR_RETURN(st.x, pinned_x->alloc(DType::bf16, {S, D}, "host residual x"));
  }
  LS_ASSIGN_OR_RETURN(TensorView rope2, alloc_rows(arena, pers.rope, S));            // bf16 [S, 2P]
  LS_ASSIGN_OR_RETURN(TensorView mod_rows2, alloc_rows(arena, pers.mod_rows, S));      // i32 [S, 1]
  LS_ASSIGN_OR_RETURN(TensorView final_rows2, alloc_rows(arena, pers.final_rows, S));  // i32 [S, 1]
  st.rope = TensorView(rope2.data, DType::bf16, {S, P, 2}, rope2.device);  // bf16 [S, P, 2]
  st.mod_rows = TensorView(mod_rows2.data, DType::i32, {S}, mod_rows2.device);
  st.final_rows = TensorView(final_rows2.data, DType::i32, {S}, final_rows2.device);
  std::vector<uint16_t> rt(static_cast<size_t>(S * P * 2));
  const TensorView inv = weights->host("rope.inv_freq");
  h3::rope_table_rows(h.lay->positions, inv.ptr<float>(), cfg.rope_inv_freq_len, 0, S, rt.data());
  Backend& bk = *be;
  LS_TRY(bk.copy(st.rope, TensorView(rt.data(), DType::bf16, {S, P, 2})));
  LS_TRY(bk.copy(st.mod_rows, TensorView(const_cast<int32_t*>(h.ts.mod_rows.data()), DType::i32, {S})));
  LS_TRY(bk.copy(st.final_rows, TensorView(const_cast<int32_t*>(h.ts.final_rows.data()), DType::i32, {S})));
  return bk.synchronize();  // the host tables above are freed at return
}

// The block loop: per block, attention then MLP on the residual (st), weights acquired
// and released around it, K/V offloaded through kv when the plan says so.
Status Engine::Impl::run_blocks(ForwardState& st, const AttnSpecs& attn, const MlpSpecs& mlp, const Plan& plan,
                                KvOffload* kv, PhaseLog& log) {
  Backend& bk = *be;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    LS_ASSIGN_OR_RETURN(h3::WeightGetter wg, weights->acquire_block(i));
    const h3::DitBlock blk(bk, cfg, h3::dit_block_weights(wg, cfg, i),
                           h3::block_tables(log.tab.blocks[static_cast<size_t>(i)]));
    st.phase_name = "attention";
    st.phase_block = i;
    LS_TRY(run_attention(st, attn, blk, plan.attn_slice, plan.kv_tile, kv));
    LS_TRY(st.check_residual());
    log.sample("attention", i);
    LS_TRY(st.mark(plan.two_pass_attention() ? "attention pass 2" : "attention"));
    LS_TRY(log.eval_x("block.attn", i));
    st.phase_name = "mlp";
    LS_TRY(run_mlp(st, mlp, blk, plan.mlp_slice));
    LS_TRY(st.check_residual());
    log.sample("mlp", i);
    LS_TRY(st.mark("mlp"));
    LS_TRY(weights->release_block(i));
    LS_TRY(log.eval_x("block.mlp", i));
    if (opts.progress) {
      // The callback reports finished work: wait for the block's queued work first (one
      // synchronisation per block, next to a block's milliseconds to seconds of work).
      LS_TRY(bk.synchronize());
      opts.progress(i + 1, cfg.num_layers);
    }
  }
  return Status();
}

// The run report of a finished call (RankOut::report).
void Engine::Impl::fill_report(RunReport& rep, const Plan& plan, const ForwardState& st, PhaseLog& log,
                               uint64_t measured) const {
  rep.memory = std::move(log.samples);
  rep.two_pass_attention = plan.two_pass_attention();
  rep.sliced_mlp = plan.sliced_mlp();
  rep.sliced_head = plan.sliced_head();
  rep.stock = plan.stock();
  rep.S = st.S;
  rep.target_rows = plan.sizes.target_rows;
  rep.attn_slice = plan.attn_slice;
  rep.mlp_slice = plan.mlp_slice;
  rep.final_slice = plan.final_slice;
  rep.kv_tile = plan.kv_tile;
  rep.predicted_peak_bytes = plan.predicted_peak_bytes;
  rep.measured_peak_bytes = measured;
  rep.stock_peak_bytes = plan.stock_peak_bytes;
  rep.adaln_table_bytes = log.tab.bytes();
  rep.adaln_precomputed = log.tab.precomputed;
  rep.backend = be->name();
  rep.numerics = describe(be->numerics());
  rep.phase_seconds = log.prof;
  rep.resident_blocks = weights->resident_blocks();
  rep.streamed_blocks = cfg.num_layers - weights->resident_blocks();
  rep.slots = weights->slots();
  rep.kv_offload = plan.kv_offload;
  rep.residual_offload = plan.residual_offload;
  rep.kv_chunk = plan.kv_offload ? plan.kv_chunk : 0;
  rep.pcie_weight_bytes = weights->forward_copy_bytes();
  rep.pcie_kv_bytes = st.kv_bytes;
  rep.pcie_residual_bytes = st.residual_bytes;
  rep.device_weight_bytes = weights->device_bytes();
  rep.device_held_bytes = dev->held();
  rep.device_peak_bytes = dev->peak();
  rep.pinned_host_bytes = weights->pinned_host_bytes() + (pinned_kv ? pinned_kv->capacity() : 0) +
                          (pinned_x ? pinned_x->capacity() : 0);
  rep.wall_seconds = seconds_since(log.t0);
}

Status Engine::Impl::forward_rank(const Conditioning& cond, const h3::PackedLayout& lay, const RefinedText& text,
                                  const TensorView& video, const TensorView& audio, float sigma, const Plan& plan,
                                  const ForwardOutputs& outputs, RankOut& out) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *this;
  Backend& bk = *m.be;
  LS_TRY(m.bind_workspace());

  // ---- host: the call's layout, timesteps, inputs, tables ----
  LS_ASSIGN_OR_RETURN(CallHost h, m.host_call(cond, lay, text, video, audio, sigma, plan, outputs));
  const AdalnTables* tab = h.tab;

  // ---- the phases' buffers, from the plan ----
  const PersistentSpecs pers = persistent_specs(cfg, plan);
  const EmbedSpecs embed = embed_specs(cfg, plan);
  const AttnSpecs attn = attention_specs(cfg, plan);
  const MlpSpecs mlp = mlp_specs(cfg, plan);
  const FinalSpecs fin = final_specs(cfg, plan);

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
  const bool kv_off = plan.kv_offload, res_off = plan.residual_offload;
  LS_CHECK_MSG(!(kv_off || res_off) || plan.two_pass_attention(), "offload needs two-pass attention");
  ForwardState st(bk, cfg, *arena, res_off, m.opts.check_finite);
  LS_TRY(m.setup_rows(st, pers, h, *arena));

  PhaseLog log{m, *arena, st, *tab, t0, std::chrono::steady_clock::now(), {}, {}, 0};
  if (m.opts.profile)
    st.mark = [&](const char* phase) -> Status {
      LS_TRY(bk.synchronize());
      const auto now = std::chrono::steady_clock::now();
      log.prof[phase] += std::chrono::duration<double>(now - log.prof_t).count();
      log.prof_t = now;
      return Status();
    };
  LS_TRY(st.mark("setup"));

  // Streamed block weights: the first copies start now, behind the embedding.
  LS_TRY(m.weights->begin_forward());

  // ---- embed ----
  LS_TRY(run_embed(st, embed, plan.mlp_slice, *h.lay, *h.inputs, text.view(), *m.weights));
  LS_TRY(st.check_residual());
  log.sample("embed", -1);
  LS_TRY(log.eval_x("x.embed", -1));
  LS_TRY(st.mark("embed"));

  // ---- the block loop ----
  // K/V offload: host K, V (pinned, reused block after block; int8: the prepared keys'
  // layout, about half the bytes) and its fences.
  std::optional<KvOffload> kv;
  if (kv_off) {
    LS_ASSIGN_OR_RETURN(KvOffload k, KvOffload::create(bk, *m.pinned_kv, st.S, cfg.inner(), plan.kv_chunk,
                                                       kv_offload_int8_heads(plan, cfg)));
    kv.emplace(std::move(k));
  }
  LS_TRY(m.run_blocks(st, attn, mlp, plan, kv ? &*kv : nullptr, log));
  st.phase_name = "final layer";
  st.phase_block = -1;

  // ---- final layer on the target rows [audio | video] ----
  std::vector<float> vout, aout;  // f32 [target video rows, Pv], [target audio rows, Pa]
  LS_TRY(run_final(st, fin, plan.final_slice, *h.lay, tab->final_table, *m.weights, h.pdd, *h.om, outputs.video,
                   outputs.audio, vout, aout));
  log.sample("final", -1);
  LS_TRY(st.mark("final"));
  const uint64_t measured = log.call_peak;
  LS_CHECK_MSG(measured <= plan.predicted_peak_bytes, "activation arena peak above the plan's prediction");

  out.row0 = st.row0;
  out.row1 = st.row1;
  out.sa_start = h.lay->target_audio().start;
  out.sa_stop = h.lay->target_audio().stop;
  out.sv_start = h.lay->target_video().start;
  out.sv_stop = h.lay->target_video().stop;
  out.om.emplace(*h.om);
  m.fill_report(out.report, plan, st, log, measured);
  out.vout = std::move(vout);
  out.aout = std::move(aout);
  out.ts = std::move(h.ts);
  out.inputs.emplace(std::move(*h.inputs));
  return Status();
}

}  // namespace ls::exec
