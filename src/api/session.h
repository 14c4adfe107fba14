// api::Session: the ONE place for the chain every front-end runs (issue 12)
//
//   checkpoint | preset (+ weights seed, blocks)   -> H3 config + tensor source
//   device name                                    -> Backend -> exec::device_profile
//                                                     (workspace bytes, default kv_tile)
//   memory: a total device budget | an activation  -> exec::plan_memory (the ONE planner,
//           budget | explicit knobs                   exec/planner.h): residency + Plan
//   -> Plan -> Engine::create -> refine text -> precompute AdaLN -> prepare -> forward
//
// The C API (include/layerstream/layerstream.h, src/api/c_api*.cpp), `layerstream
// forward`, `layerstream generate` and bench_budget all call it; none of them repeats
// the chain. The steps are separate calls (open_backend, load_weights, plan,
// create_engine, denoise) so a front-end can refuse its own flags between them in the
// order it always has (the CLI's messages and exit codes do not change).
//
// Exactness: nothing here changes an output bit. The memory choices (budget, residency,
// slices, offload) never do (DESIGN.md §1); kv_tile, the one numerics input planned
// here, is resolved once (MemorySpec::knobs.kv_tile 0 -> Backend::default_kv_tile())
// and goes into every plan of the session.
//
// Driver memory: around every stage of denoise() the session samples the device's free
// memory (Backend::device_memory_info, CUDA) so driver_used_bytes() says how much the
// device lost between before Engine::create and the fullest moment sampled.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/numerics.h"
#include "core/status.h"
#include "core/tensor.h"
#include "exec/budget_plan.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "exec/planner.h"
#include "model/h3/checkpoint.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"
#include "model/lora.h"
#include "sample/generate.h"

namespace ls::api {

// Where the weights come from: a checkpoint file, or a preset's synthetic weights (the
// values make-model writes for that seed).
struct WeightsSpec {
  std::string model_path;     // non-empty: an H3 checkpoint (.safetensors)
  std::string preset;         // else: "tiny" | "small" | "h3"
  uint64_t weights_seed = 0;  // preset only
  int64_t blocks = 0;         // preset only: > 0 = this many DiT blocks (full width)
  // LoRAs merged into the weights (model/lora.h), in this order, with ComfyUI's formula
  // in lora_dtype (a numerics setting; unset = ComfyUI's for the device: f16 on a GPU,
  // f32 on the CPU). The source's describe() names them and the dtype.
  std::vector<lora::LoraFile> loras;
  std::optional<lora::MergeDtype> lora_dtype;
  // preset only: the synthetic weights in ComfyUI's layouts ("bf16", "int8-convrot",
  // "int8-convrot-full", "fp8"), the values make-model --format writes.
  std::string weights_format = "bf16";
  // "preserve" (the weights as stored) | "fp8": bf16 qkv, fc1, fc2 converted to fp8 e4m3
  // once at load (per-tensor amax/448; LOSSY, opt-in) | "fp8-dynamic": the same with a
  // per-row activation scale (not ComfyUI's numerics). After the LoRAs, as ComfyUI merges
  // LoRAs before converting.
  std::string precision = "preserve";
};

// The planner's modes (exec/planner.h): knobs, activation_budget, total_budget.
using MemoryMode = exec::MemoryMode;

struct MemorySpec {
  MemoryMode mode = MemoryMode::knobs;
  // Slices, offloads, kv_tile (0 = the backend's default). In total_budget mode only
  // kv_tile is read; the rest comes from the budget plan.
  exec::PlanKnobs knobs;
  exec::Residency residency;        // knobs / activation_budget mode
  uint64_t activation_budget = 0;   // activation_budget mode
  uint64_t total_budget = 0;        // total_budget mode
  bool prefetch = true;             // total_budget mode: 2 block slots (else 1)
  bool adaptive_slots = true;       // total_budget mode, prefetch: 1 slot where offloading exposes less (exec::BudgetOptions)
};

// What the planning chain chose for one run: exec::plan_memory's result (plan: the
// activation Plan; residency: what Engine::create gets; knobs: resolved, kv_tile set and
// in total_budget mode the budget plan's slices and offloads, which every other
// conditioning of the run plans with; budget: the total-budget decision record; peak:
// the predicted device peak by component; minimum_budget_bytes: the mode's minimum).
using RunPlan = exec::PlanResult;

// One denoiser call's inputs (host fp32 latents; raw or refined text).
struct DenoiseCall {
  const h3::Conditioning* cond = nullptr;
  TensorView text;                             // raw text states host f32|bf16 [L, text_dim] ...
  const exec::RefinedText* refined = nullptr;  // ... or refined ones (then `text` is ignored)
  TensorView video;                            // fp32 [latents_dim, T, Hl, Wl]
  TensorView audio;                            // fp32 [audio_latents_dim, 2, A]
  // (video and audio may also be f32|bf16 strided views on the engine's device.)
  exec::ForwardOutputs outputs;                // optional device outputs (exec/engine.h)
  float sigma = 0;
  // Sigmas whose AdaLN tables are precomputed before the call (empty = {sigma}); tables
  // already held for the same timesteps are kept (Engine::has_adaln_tables).
  std::vector<float> precompute_sigmas;
  const exec::Plan* plan = nullptr;
  // The call's layout of *cond (exec::CallLayout, for_forward), built once per call and
  // also handed to plan(); null: denoise() builds one for its own steps.
  const exec::CallLayout* layout = nullptr;
  std::function<void()> before_forward;  // optional: after prepare(), just before forward()
};

struct DenoiseTimes {
  double refine_precompute_prepare_seconds = 0;  // refine + precompute + prepare
  bool adaln_tables_computed = false;            // false: the held tables were the call's (kept)
};

// A device list for Session::open_backends (docs/multi-gpu.md): "cuda:0,cuda:1,..."
// ("cuda" = "cuda:0") or "cpu*N" (N in-process CPU ranks, 1..64; "cpu" = one rank); one
// backend name per rank. invalid_argument naming the text: an empty or unknown entry, a
// device given twice, CPU and CUDA mixed, a bad N.
Expected<std::vector<std::string>> parse_devices(const std::string& text);

class Session {
 public:
  // Step 1: the backend ("cpu", "cuda", "cuda:N"), or one shared with another session
  // (a benchmark's warm-up model on the same device).
  // The backend with its numerics (Backend::set_numerics validates and resolves them:
  // backend_default -> the device's algorithm, kv_tile 0 -> its default).
  static Expected<std::unique_ptr<Session>> open_backend(const std::string& device, const Numerics& numerics = {},
                                                         const Diagnostics& diagnostics = {});
  static std::unique_ptr<Session> with_backend(std::shared_ptr<Backend> backend);
  // Sequence parallel (docs/multi-gpu.md): one backend per rank, devices[0] is rank 0
  // (backend()); one entry is open_backend. Every plan of the session is then one rank's
  // (PlanKnobs::ranks = ranks(); budgets are per rank) and the engine runs every rank.
  // Errors: make_backend's for a device, the engine's (Engine::create) for the group.
  static Expected<std::unique_ptr<Session>> open_backends(const std::vector<std::string>& devices,
                                                          const Numerics& numerics = {},
                                                          const Diagnostics& diagnostics = {});
  int64_t ranks() const { return 1 + static_cast<int64_t>(peers_.size()); }
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Backend& backend() const { return *backend_; }
  const std::shared_ptr<Backend>& shared_backend() const { return backend_; }
  bool device_is_cpu() const { return backend_->device().kind == DeviceKind::cpu; }

  // Step 2: the weights (a file is opened and checked; a preset's weights are made
  // lazily by the synthetic source). With several devices (open_backends) their count
  // must divide the model's heads (invalid_argument otherwise). Tells the backends the
  // model's head dim (Backend::set_model_head_dim): attention auto may then resolve to an
  // algorithm for that head dim (CUDA: hopper at 128 on sm_90), which numerics() and every
  // report record. A backend shared with another session (with_backend) takes the last
  // loaded model's: share one only between models of one head dim.
  Status load_weights(const WeightsSpec& spec);
  bool has_weights() const { return source_ != nullptr; }
  const h3::H3TensorSource& source() const { return *source_; }
  const h3::H3Config& config() const { return source_->cfg(); }

  // kv_tile 0 -> this backend's default_kv_tile().
  int64_t resolve_kv_tile(int64_t kv_tile) const;
  // The device facts the planner takes: this backend's workspace_bytes() and
  // default_kv_tile() (exec::device_profile).
  exec::DeviceProfile device_profile() const { return exec::device_profile(*backend_); }
  // The planner's request for `memory` on this session's model (tensors: the source's
  // table with its dtypes) and device; cond, widest and sigmas as plan() takes them.
  exec::PlanRequest plan_request(const h3::Conditioning& cond, const std::vector<float>& sigmas,
                                 const MemorySpec& memory, const h3::Conditioning* widest = nullptr,
                                 const exec::CallLayout* layout = nullptr) const;

  // Step 3: plan one conditioning (exec::plan_memory). `sigmas`: every sigma the run
  // evaluates (the schedule, or the one call's sigma): the modulation tables a total
  // budget must hold.
  // `widest`, if given, is planned instead of `cond` under a total budget (the longer
  // of two prompts: every buffer grows with S at fixed slices, so the same slices,
  // offloads and residency fit the shorter one; RunPlan::plan is then widest's).
  // `layout`, if given, is cond's for the whole call (the same one DenoiseCall::layout
  // hands to the engine): planned from, never rebuilt.
  Expected<RunPlan> plan(const h3::Conditioning& cond, const std::vector<float>& sigmas, const MemorySpec& memory,
                         const h3::Conditioning* widest = nullptr, const exec::CallLayout* layout = nullptr) const;
  // A sampling run's memory choices (`layerstream generate`, ls_engine_generate): in
  // total_budget mode plan() (exec::plan_memory) over every sigma of req.sigmas, for the longer
  // of the two prompts when CFG uses a negative prompt of another length (RunPlan::plan
  // is then that prompt's plan); in the other modes nothing is planned yet (the
  // prompts' plans come from plan_generation). apply() puts the choices into a request.
  Expected<RunPlan> plan_sampling(const sample::GenerateRequest& req, const MemorySpec& memory) const;
  static void apply(const RunPlan& rp, sample::GenerateRequest& req);
  // sample::plan_generation on this session's model: the prompts' plans, no work.
  Expected<sample::GeneratePlans> plan_generation(const sample::GenerateRequest& req) const;
  // A whole sampling run on the engine (sample::generate).
  Expected<sample::GenerateResult> generate(const sample::GenerateRequest& req, const sample::GenerateHooks& hooks = {});
  // The smallest budget of the mode for `cond` (exec::minimum_budget: total
  // min_total_budget, activation min_activation_budget, knobs 0).
  Expected<uint64_t> minimum_budget(const h3::Conditioning& cond, const std::vector<float>& sigmas,
                                    const MemorySpec& memory) const;

  // Step 4: the engine, with rp's residency over `options` (the other fields of
  // options.residency, e.g. release_source, are kept). Replaces (destroys first) an
  // earlier engine of this session. Samples driver memory before and after.
  Status create_engine(const RunPlan& rp, exec::EngineOptions options = {});
  bool has_engine() const { return engine_ != nullptr; }
  exec::Engine& engine() const { return *engine_; }
  void drop_engine();

  // Step 5: one denoiser call: refine (unless refined text is given), precompute the
  // AdaLN tables (unless the held ones are those of call.precompute_sigmas), prepare the
  // plan's arenas, forward. Driver memory is sampled after every stage.
  Expected<exec::ForwardResult> denoise(const DenoiseCall& call, DenoiseTimes* times = nullptr);

  // Device memory the driver reports lost since before the last create_engine (0 when
  // the backend has no device memory to report).
  bool has_driver_memory_info() const { return have_info_; }
  uint64_t driver_used_bytes() const { return have_info_ ? free0_ - min_free_ : 0; }
  void sample_driver_memory();

 private:
  explicit Session(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {}
  std::shared_ptr<Backend> backend_;
  std::vector<std::shared_ptr<Backend>> peers_;  // ranks 1 .. N-1 (open_backends)
  std::unique_ptr<h3::H3TensorSource> source_;
  std::unique_ptr<exec::Engine> engine_;
  bool have_info_ = false;
  uint64_t free0_ = 0, min_free_ = 0;
};

}  // namespace ls::api
