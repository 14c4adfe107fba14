#include "sample/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "exec/planner.h"
#include "sample/noise.h"

namespace ls::sample {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status check_text(const TensorView& t, const h3::H3Config& cfg, const char* what) {
  if (t.empty() || t.ndim != 2)
    return make_error(ErrorCode::invalid_argument, std::string(what) + " text states must be a 2-D tensor [L, text_dim]");
  if (t.dtype != DType::f32 && t.dtype != DType::bf16)
    return make_error(ErrorCode::invalid_argument,
                      std::string(what) + " text states must be f32 or bf16 (got " + dtype_name(t.dtype) + ")");
  if (t.size(1) != cfg.text_dim)
    return make_error(ErrorCode::invalid_argument, std::string(what) + " text states have width " +
                                                       std::to_string(t.size(1)) + " but the model's text_dim is " +
                                                       std::to_string(cfg.text_dim));
  if (t.size(0) < 1)
    return make_error(ErrorCode::invalid_argument, std::string(what) + " text states have no tokens");
  return {};
}

// One prompt's activation plan from the one planner (exec::plan_memory): the activation
// budget mode when the request has a budget, else its knobs. The knobs' kv_tile is the
// resolved one (Session::apply); none is defaulted here (device.default_kv_tile 0), and
// no AdaLN tables are counted (no sigmas: only the activation plan is used). `layout`:
// cond's, built once per run (Prompts).
Expected<exec::Plan> plan_for(const h3::H3Config& cfg, const h3::Conditioning& cond, const exec::CallLayout& layout,
                              const GenerateRequest& req) {
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.cond = &cond;
  q.layout = &layout;
  q.mode = req.budget_bytes > 0 ? exec::MemoryMode::activation_budget : exec::MemoryMode::knobs;
  q.knobs = req.knobs;
  q.budget_bytes = req.budget_bytes;
  q.device.default_kv_tile = 0;
  LS_ASSIGN_OR_RETURN(exec::PlanResult r, exec::plan_memory(q));
  return std::move(r.plan);
}

// The engine as the sampler's velocity model: splits the packed state into the video
// and audio views the engine takes, and packs the velocities back.
class EngineVelocity final : public VelocityModel {
 public:
  EngineVelocity(exec::Engine& engine, const PackedShape& shape, const h3::Conditioning* cond[2],
                 const exec::CallLayout* layout[2], const exec::RefinedText* text[2], const exec::Plan* plan[2],
                 const GenerateHooks& hooks, std::vector<ForwardRecord>& records)
      : engine_(engine), shape_(shape), hooks_(hooks), records_(records) {
    for (int i = 0; i < 2; ++i) {
      cond_[i] = cond[i];
      layout_[i] = layout[i];
      text_[i] = text[i];
      plan_[i] = plan[i];
    }
  }

  Status velocity(std::span<const float> x, float sigma, Prompt prompt, int64_t step, std::span<float> v) override {
    const int p = static_cast<int>(prompt);
    LS_CHECK(cond_[p] && layout_[p] && text_[p] && plan_[p]);
    const h3::H3Config& cfg = engine_.config();
    const h3::ClipGeometry& g = cond_[p]->geometry;
    // The engine reads these views only.
    float* base = const_cast<float*>(x.data());
    const TensorView video(base, DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
    const TensorView audio(base + shape_.video, DType::f32, {cfg.audio_latents_dim, 2, g.A});
    if (hooks_.on_forward_begin) hooks_.on_forward_begin(step, prompt, sigma);
    LS_ASSIGN_OR_RETURN(exec::ForwardResult r, engine_.forward(*cond_[p], *layout_[p], *text_[p], video, audio, sigma, *plan_[p]));
    LS_CHECK(static_cast<int64_t>(r.video.size()) == shape_.video && static_cast<int64_t>(r.audio.size()) == shape_.audio);
    std::copy(r.video.begin(), r.video.end(), v.begin());
    std::copy(r.audio.begin(), r.audio.end(), v.begin() + shape_.video);
    records_.push_back(ForwardRecord{step, prompt, sigma, r.report});
    if (hooks_.on_forward_end) hooks_.on_forward_end(records_.back());
    return {};
  }

 private:
  exec::Engine& engine_;
  PackedShape shape_;
  const h3::Conditioning* cond_[2] = {nullptr, nullptr};
  const exec::CallLayout* layout_[2] = {nullptr, nullptr};
  const exec::RefinedText* text_[2] = {nullptr, nullptr};
  const exec::Plan* plan_[2] = {nullptr, nullptr};
  const GenerateHooks& hooks_;
  std::vector<ForwardRecord>& records_;
};

// The conditioning with the request's seed and schedule filled in.
h3::Conditioning positive_cond(const GenerateRequest& req) {
  h3::Conditioning c = req.cond;
  c.seed = req.seed;
  c.sample_sigmas = req.sigmas;
  return c;
}

// A run's prompts: the positive conditioning, the negative one (CFG), and each one's
// packed layout, built once per run and handed to the planner and to every step. Not
// movable: the layouts point at the conditionings.
struct Prompts {
  h3::Conditioning pos, neg;
  std::optional<exec::CallLayout> pos_layout, own_neg_layout;
  const exec::CallLayout* neg_layout = nullptr;  // pos_layout's when the lengths agree
};

// plan_generation into `p`, its layouts built for a forward when `for_forward`.
Expected<GeneratePlans> plan_prompts(const h3::H3Config& cfg, const GenerateRequest& req, Prompts& p, bool for_forward) {
  LS_TRY(check_text(req.text, cfg, "prompt"));
  if (req.text.size(0) != req.cond.geometry.text_tokens)
    return make_error(ErrorCode::invalid_argument, "the prompt has " + std::to_string(req.text.size(0)) +
                                                       " text tokens but the clip geometry says " +
                                                       std::to_string(req.cond.geometry.text_tokens));
  const bool guided = !cfg_is_one(req.cfg);
  if (!std::isfinite(req.cfg))
    return make_error(ErrorCode::invalid_argument, "--cfg must be a finite number");
  GeneratePlans out;
  p.pos = positive_cond(req);
  p.pos_layout.emplace(cfg, p.pos, for_forward);
  LS_ASSIGN_OR_RETURN(out.positive, plan_for(cfg, p.pos, *p.pos_layout, req));
  if (guided) {
    if (req.negative.empty())
      return make_error(ErrorCode::invalid_argument,
                        "cfg " + std::to_string(req.cfg) + " needs a negative prompt (text states \"negative\")");
    LS_TRY(check_text(req.negative, cfg, "negative prompt"));
    p.neg = p.pos;
    p.neg_layout = &*p.pos_layout;
    const int64_t Ln = req.negative.size(0);
    if (Ln != p.pos.geometry.text_tokens) {
      // Another length: another packed layout (every position shifts with L) and plan.
      p.neg.geometry.text_tokens = Ln;
      p.neg.text_token_tags.clear();  // the tags describe the positive prompt
      p.neg_layout = &p.own_neg_layout.emplace(cfg, p.neg, for_forward);
    }
    LS_ASSIGN_OR_RETURN(exec::Plan np, plan_for(cfg, p.neg, *p.neg_layout, req));
    out.negative_cond = p.neg;
    out.negative = std::move(np);
  }
  return out;
}

}  // namespace

std::vector<float> standin_text_states(uint64_t seed, int which, int64_t L, int64_t width) {
  TorchCpuGenerator g(seed * 2 + static_cast<uint64_t>(which));
  return g.randn(L * width);
}

Expected<GeneratePlans> plan_generation(const h3::H3Config& cfg, const GenerateRequest& req) {
  Prompts p;
  return plan_prompts(cfg, req, p, /*for_forward=*/false);
}

Expected<GenerateResult> generate(exec::Engine& engine, const GenerateRequest& req, const GenerateHooks& hooks) {
  const auto t_start = std::chrono::steady_clock::now();
  const h3::H3Config& cfg = engine.config();
  if (req.sigmas.size() < 2)
    return make_error(ErrorCode::invalid_argument, "the schedule needs at least one step");
  Prompts p;
  LS_ASSIGN_OR_RETURN(GeneratePlans plans, plan_prompts(cfg, req, p, /*for_forward=*/true));
  const h3::Conditioning& pos = p.pos;
  const h3::ClipGeometry& g = pos.geometry;
  const PackedShape shape{cfg.latents_dim * g.T * g.Hl * g.Wl, cfg.audio_latents_dim * 2 * g.A};
  if (!req.initial_latent.empty() && static_cast<int64_t>(req.initial_latent.size()) != shape.total())
    return make_error(ErrorCode::invalid_argument, "the initial latent has " + std::to_string(req.initial_latent.size()) +
                                                       " values; this clip needs " + std::to_string(shape.total()));

  GenerateResult res;
  res.plan = plans.positive;
  res.negative_plan = plans.negative;

  // 1. Refined text, once per prompt for the whole run.
  auto t0 = std::chrono::steady_clock::now();
  LS_ASSIGN_OR_RETURN(exec::RefinedText text_pos, engine.refine_text(req.text));
  exec::RefinedText text_neg;
  if (res.guided()) {
    LS_ASSIGN_OR_RETURN(text_neg, engine.refine_text(req.negative));
  }
  res.refine_seconds = seconds_since(t0);

  // 2. Modulation tables for every sigma of the schedule, before the first step.
  t0 = std::chrono::steady_clock::now();
  LS_TRY(engine.precompute_adaln(req.sigmas, pos, *p.pos_layout));
  res.adaln_seconds = seconds_since(t0);

  // 3. Noise: video then audio from one generator stream.
  const std::vector<float> noise = packed_noise(req.seed, shape.video, shape.audio);

  // 4. The sampler.
  t0 = std::chrono::steady_clock::now();
  const h3::Conditioning* conds[2] = {&pos, res.guided() ? &p.neg : nullptr};
  const exec::CallLayout* layouts[2] = {&*p.pos_layout, res.guided() ? p.neg_layout : nullptr};
  const exec::RefinedText* texts[2] = {&text_pos, res.guided() ? &text_neg : nullptr};
  const exec::Plan* plan_ptrs[2] = {&res.plan, res.guided() ? &*res.negative_plan : nullptr};
  EngineVelocity model(engine, shape, conds, layouts, texts, plan_ptrs, hooks, res.forwards);
  SamplerOptions opts;
  opts.cfg = req.cfg;
  opts.audio_scale = pos.audio_scale;
  LS_ASSIGN_OR_RETURN(std::vector<float> out,
                      sample_flow_euler(model, req.sigmas, noise, req.initial_latent, shape, opts, hooks.on_step));
  res.sampling_seconds = seconds_since(t0);
  for (const ForwardRecord& f : res.forwards)
    res.adaln_table_bytes = std::max<uint64_t>(res.adaln_table_bytes, f.report.adaln_table_bytes);

  res.video.assign(out.begin(), out.begin() + shape.video);
  res.audio.assign(out.begin() + shape.video, out.end());
  res.total_seconds = seconds_since(t_start);
  return res;
}

}  // namespace ls::sample
