#include "api/session.h"

#include "io/mapping_guard.h"

#include "model/h3/quant.h"
#include "model/lora_source.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace ls::api {

Expected<std::unique_ptr<Session>> Session::open_backend(const std::string& device, const Numerics& numerics,
                                                         const Diagnostics& diagnostics) {
  LS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(device, numerics, diagnostics));
  return std::unique_ptr<Session>(new Session(std::shared_ptr<Backend>(std::move(be))));
}

Expected<std::unique_ptr<Session>> Session::open_backends(const std::vector<std::string>& devices,
                                                          const Numerics& numerics, const Diagnostics& diagnostics) {
  if (devices.empty()) return make_error(ErrorCode::invalid_argument, "no device given");
  LS_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, open_backend(devices[0], numerics, diagnostics));
  for (size_t i = 1; i < devices.size(); ++i) {
    LS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(devices[i], numerics, diagnostics));
    s->peers_.push_back(std::shared_ptr<Backend>(std::move(be)));
  }
  return s;
}

Expected<std::vector<std::string>> parse_devices(const std::string& given) {
  auto bad = [&](const std::string& why) {
    return Error{ErrorCode::invalid_argument,
                 "'" + given + "': " + why +
                     " (expected CUDA devices cuda:0,cuda:1,... or cpu*N for N in-process CPU ranks)"};
  };
  if (given.empty()) return bad("no device");
  if (given.rfind("cpu*", 0) == 0) {
    const std::string ns = given.substr(4);
    const bool digits = !ns.empty() && ns.size() <= 2 && ns.find_first_not_of("0123456789") == std::string::npos;
    const int n = digits ? std::stoi(ns) : 0;
    if (n < 1 || n > 64) return bad("N must be an integer in 1..64");
    return std::vector<std::string>(static_cast<size_t>(n), "cpu");
  }
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = given.find(',', at);
    const std::string d = given.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::string name;
    if (d == "cpu") {
      name = "cpu";
    } else if (d == "cuda") {
      name = "cuda:0";
    } else if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 8 &&
               d.find_first_not_of("0123456789", 5) == std::string::npos) {
      name = "cuda:" + std::to_string(std::stoi(d.substr(5)));
    } else {
      return bad(d.empty() ? "an empty entry" : "unknown device '" + d + "'");
    }
    for (const auto& e : out) {
      if (e == name) return bad(name == "cpu" ? "cpu is given twice (use cpu*N for N CPU ranks)" : name + " is given twice");
      if ((e == "cpu") != (name == "cpu")) return bad("CPU and CUDA devices cannot be mixed");
    }
    out.push_back(name);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::unique_ptr<Session> Session::with_backend(std::shared_ptr<Backend> backend) {
  LS_CHECK(backend != nullptr);
  return std::unique_ptr<Session>(new Session(std::move(backend)));
}

Session::~Session() {
  engine_.reset();  // the engine holds views into the source and the backends
  source_.reset();
  peers_.clear();
}

Status Session::load_weights(const WeightsSpec& spec) {
  engine_.reset();
  source_.reset();
  std::unique_ptr<h3::H3TensorSource> src;
  if (!spec.model_path.empty()) {
    LS_ASSIGN_OR_RETURN(auto f, h3::open_h3_checkpoint(spec.model_path));
    src = std::move(f);
  } else {
    LS_ASSIGN_OR_RETURN(h3::H3Config cfg, h3::h3_preset(spec.preset));
    if (spec.blocks > 0) cfg.num_layers = spec.blocks;  // full width, fewer blocks (as make-model --blocks)
    LS_ASSIGN_OR_RETURN(h3::SyntheticFormat sf, h3::parse_synthetic_format(spec.weights_format));
    LS_TRY(h3::synthetic_quant_layout(cfg, sf).status());  // a clear refusal before any work
    src = std::make_unique<h3::H3SyntheticSource>(cfg, spec.weights_seed, sf);
  }
  if (spec.precision != "preserve" && spec.precision != "fp8" && spec.precision != "fp8-dynamic")
    return make_error(ErrorCode::invalid_argument,
                      "precision must be preserve, fp8 (lossy) or fp8-dynamic (lossy), got \"" + spec.precision + "\"");
  if (!spec.loras.empty()) {
    // Merged once per tensor on first read (model/lora_source.h): never per slice or step.
    LS_ASSIGN_OR_RETURN(lora::LoraSet set, lora::LoraSet::open(spec.loras, src->specs()));
    const lora::MergeDtype dt =
        spec.lora_dtype ? *spec.lora_dtype : (device_is_cpu() ? lora::MergeDtype::f32 : lora::MergeDtype::f16);
    LS_ASSIGN_OR_RETURN(auto wrapped, lora::LoraSource::wrap(std::move(src), std::move(set), dt));
    src = std::move(wrapped);
  }
  if (spec.precision != "preserve") src = h3::fp8_convert_source(std::move(src), spec.precision == "fp8-dynamic");
  // Sequence parallel splits the heads evenly: a device list whose length does not
  // divide them is refused here, before any work (the message names the counts that do).
  LS_TRY(exec::check_ranks(src->cfg(), ranks()));
  // attention auto may resolve per head dim (CUDA: hopper at 128 on sm_90): every rank's
  // backend learns the model before any plan reads its numerics (kv_tile) or an engine
  // takes its workspace (workspace_bytes() follows the numerics).
  LS_TRY(backend_->set_model_head_dim(src->cfg().head_dim));
  for (const auto& p : peers_) LS_TRY(p->set_model_head_dim(src->cfg().head_dim));
  source_ = std::move(src);
  return io::check_mapped_files();  // a file truncated while it was validated or merged
}

int64_t Session::resolve_kv_tile(int64_t kv_tile) const {
  // 0 -> the backend's resolved numerics (Backend::default_kv_tile() == numerics().kv_tile).
  return kv_tile > 0 ? kv_tile : backend_->default_kv_tile();
}

exec::PlanRequest Session::plan_request(const h3::Conditioning& cond, const std::vector<float>& sigmas,
                                        const MemorySpec& memory, const h3::Conditioning* widest,
                                        const exec::CallLayout* layout) const {
  LS_CHECK(source_ != nullptr);
  exec::PlanRequest q;
  q.cfg = &config();
  q.tensors = &source_->specs();  // the dtypes the source holds (and the device would)
  q.cond = &cond;
  q.widest = widest;
  q.layout = layout;
  q.sigmas = sigmas;
  q.mode = memory.mode;
  if (memory.mode == MemoryMode::total_budget) {
    q.knobs.kv_tile = memory.knobs.kv_tile;  // only kv_tile: the rest is the planner's choice
    q.budget_bytes = memory.total_budget;
  } else {
    q.knobs = memory.knobs;
    q.residency = memory.residency;
    q.budget_bytes = memory.mode == MemoryMode::activation_budget ? memory.activation_budget : 0;
  }
  q.prefetch = memory.prefetch;
  q.adaptive_slots = memory.adaptive_slots;
  q.device = device_profile();  // kv_tile 0 -> default_kv_tile() (resolve_kv_tile)
  q.knobs.ranks = ranks();      // every plan is one rank's
  return q;
}

Expected<RunPlan> Session::plan(const h3::Conditioning& cond, const std::vector<float>& sigmas,
                                const MemorySpec& memory, const h3::Conditioning* widest,
                                const exec::CallLayout* layout) const {
  return exec::plan_memory(plan_request(cond, sigmas, memory, widest, layout));
}

Expected<RunPlan> Session::plan_sampling(const sample::GenerateRequest& req, const MemorySpec& memory) const {
  LS_CHECK(source_ != nullptr);
  if (memory.mode != MemoryMode::total_budget) {
    // The prompts' plans come from plan_generation (exec::plan_memory per prompt).
    RunPlan rp;
    rp.mode = memory.mode;
    rp.knobs = memory.knobs;
    rp.knobs.kv_tile = resolve_kv_tile(memory.knobs.kv_tile);
    rp.knobs.ranks = ranks();
    rp.residency = memory.residency;
    rp.budget_bytes = memory.mode == MemoryMode::activation_budget ? memory.activation_budget : 0;
    return rp;
  }
  // Planned for the longer of the two prompts (the negative one may have another L, so
  // another S); every buffer grows with S at fixed slices, so the same slices, offload
  // choices and weight residency fit the shorter prompt too.
  const bool guided = !sample::cfg_is_one(req.cfg);
  if (guided && !req.negative.empty() && req.negative.size(0) > req.cond.geometry.text_tokens) {
    h3::Conditioning widest = req.cond;
    widest.geometry.text_tokens = req.negative.size(0);
    widest.text_token_tags.clear();  // the tags describe the positive prompt
    return plan(req.cond, req.sigmas, memory, &widest);
  }
  return plan(req.cond, req.sigmas, memory);
}

void Session::apply(const RunPlan& rp, sample::GenerateRequest& req) {
  req.knobs = rp.knobs;
  req.budget_bytes = rp.mode == MemoryMode::activation_budget ? rp.budget_bytes : 0;
}

Expected<sample::GeneratePlans> Session::plan_generation(const sample::GenerateRequest& req) const {
  sample::GenerateRequest r = req;
  r.knobs.ranks = ranks();  // every plan of the session is one rank's
  return sample::plan_generation(config(), r);
}

Expected<sample::GenerateResult> Session::generate(const sample::GenerateRequest& req,
                                                   const sample::GenerateHooks& hooks) {
  LS_CHECK(engine_ != nullptr);
  sample::GenerateRequest r = req;
  r.knobs.ranks = ranks();  // every plan of the session is one rank's
  LS_ASSIGN_OR_RETURN(sample::GenerateResult out, sample::generate(*engine_, r, hooks));
  LS_TRY(io::check_mapped_files());  // a weights file truncated under us (io/mapping_guard.h)
  return out;
}

Expected<uint64_t> Session::minimum_budget(const h3::Conditioning& cond, const std::vector<float>& sigmas,
                                           const MemorySpec& memory) const {
  return exec::minimum_budget(plan_request(cond, sigmas, memory));
}

void Session::sample_driver_memory() {
  uint64_t f = 0, t = 0;
  if (have_info_ && backend_->device_memory_info(&f, &t).ok()) min_free_ = std::min(min_free_, f);
}

Status Session::create_engine(const RunPlan& rp, exec::EngineOptions options) {
  LS_CHECK(source_ != nullptr);
  engine_.reset();  // its device memory goes back before the next one takes any
  // Device memory as the driver sees it, before LayerStream takes any (CUDA).
  uint64_t total = 0;
  have_info_ = backend_->device_memory_info(&free0_, &total).ok();
  min_free_ = free0_;
  options.residency.resident_blocks = rp.residency.resident_blocks;
  options.residency.slots = rp.residency.slots;
  options.peer_backends.clear();
  for (const auto& p : peers_) options.peer_backends.push_back(p.get());
  LS_ASSIGN_OR_RETURN(engine_, exec::Engine::create(*source_, *backend_, options));
  sample_driver_memory();
  return io::check_mapped_files();  // resident weights copied from a truncated file
}

void Session::drop_engine() { engine_.reset(); }

Expected<exec::ForwardResult> Session::denoise(const DenoiseCall& call, DenoiseTimes* times) {
  LS_CHECK(engine_ != nullptr && call.cond != nullptr && call.plan != nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  // One layout for the call's steps (the tables' check, the precompute, prepare, forward).
  std::optional<exec::CallLayout> own_layout;
  const exec::CallLayout& layout = call.layout ? *call.layout : own_layout.emplace(config(), *call.cond, /*for_forward=*/true);
  exec::RefinedText own;
  const exec::RefinedText* text = call.refined;
  // The planner counts the text refinement, the AdaLN precompute and the steps as
  // separate peaks (exec/planner.h): the activation arena a previous call kept is freed
  // before either of the first two runs, so they never stack on it (issue 25: a budget
  // held at the first call and exceeded by one block's AdaLN weight at every later one).
  if (!text) {
    engine_->release_activations();
    LS_ASSIGN_OR_RETURN(own, engine_->refine_text(call.text));
    text = &own;
    sample_driver_memory();
  }
  const std::vector<float> sigmas = call.precompute_sigmas.empty() ? std::vector<float>{call.sigma} : call.precompute_sigmas;
  // Tables are kept while they are the ones these sigmas need (the same timesteps): a
  // sampling run computes them once and its AdaLN weights cross to the device once.
  const bool reuse = engine_->has_adaln_tables(sigmas, *call.cond, layout);
  if (!reuse) {
    engine_->release_activations();
    LS_TRY(engine_->precompute_adaln(sigmas, *call.cond, layout));
    sample_driver_memory();
  }
  if (times) times->adaln_tables_computed = !reuse;
  LS_TRY(engine_->prepare(*call.cond, layout, *call.plan));  // arenas and pinned buffers before the call
  sample_driver_memory();
  if (times)
    times->refine_precompute_prepare_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (call.before_forward) call.before_forward();
  LS_ASSIGN_OR_RETURN(exec::ForwardResult r,
                      engine_->forward(*call.cond, layout, *text, call.video, call.audio, call.sigma, *call.plan,
                                       call.outputs));
  sample_driver_memory();
  // A weights file truncated under us read as zeros: nothing computed from it leaves.
  LS_TRY(io::check_mapped_files());
  return r;
}

}  // namespace ls::api
