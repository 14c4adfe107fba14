// The executor in phases (issue 12 part 3): fences as handles from the backend's pool,
// weights selected by role and block from the tensor table, the plan's kv_tile checked
// against the backend's numerics, the refiner's kv_tile taken from them, the typed phase
// buffers checked against the plan, and the run report's JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "exactness_util.h"
#include "exec/buffers.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "exec/weights.h"
#include "model/h3/checkpoint.h"

namespace ls::test {
namespace {

// ---- fences ---------------------------------------------------------------------------

TEST(ExecFences, HandlesComeFromAPoolAndGoBack) {
  auto be = make_cpu_backend();
  EXPECT_EQ(be->fences_held(), 0);
  std::vector<Backend::Fence> all;
  for (int i = 0; i < Backend::kFences; ++i) {
    auto f = be->take_fence();
    ASSERT_TRUE(f.ok()) << f.error().message;
    all.push_back(std::move(*f));
  }
  EXPECT_EQ(be->fences_held(), Backend::kFences);
  // Distinct ids, all of the pool.
  std::vector<bool> seen(Backend::kFences, false);
  for (const auto& f : all) {
    ASSERT_TRUE(f.valid());
    ASSERT_GE(f.id(), 0);
    ASSERT_LT(f.id(), Backend::kFences);
    EXPECT_FALSE(seen[static_cast<size_t>(f.id())]) << "fence " << f.id() << " handed out twice";
    seen[static_cast<size_t>(f.id())] = true;
  }
  // Exhausted: an error a caller can act on, not a shared fence.
  auto none = be->take_fence();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(none.error().message.find("fences"), std::string::npos) << none.error().message;
  // A moved handle owns the fence; the source is empty and gives nothing back.
  const int id = all[3].id();
  Backend::Fence moved = std::move(all[3]);
  EXPECT_FALSE(all[3].valid());
  EXPECT_EQ(moved.id(), id);
  EXPECT_EQ(be->fences_held(), Backend::kFences);
  EXPECT_TRUE(moved.signal(Queue::compute).ok());
  EXPECT_TRUE(moved.wait(Queue::transfer).ok());
  EXPECT_TRUE(moved.host_wait().ok());
  moved.reset();
  EXPECT_EQ(be->fences_held(), Backend::kFences - 1);
  auto again = be->take_fence();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id(), id);  // the freed one
  all.clear();
  again->reset();
  EXPECT_EQ(be->fences_held(), 0);
}

using Case = SmallCase;

Case make_case(uint64_t seed = 5) { return small_case(seed, 9); }

// A backend whose numerics say kv_tile `tile` (every other field the default).
std::unique_ptr<Backend> cpu_with_tile(int64_t tile) {
  auto be = make_cpu_backend();
  Numerics n;
  n.kv_tile = tile;
  EXPECT_TRUE(be->set_numerics(n, {}).ok());
  return be;
}

exec::PlanKnobs offload_knobs(int64_t tile) {
  exec::PlanKnobs k;
  k.kv_tile = tile;
  k.attn_chunk_tokens = 5;
  k.mlp_chunk_tokens = 7;
  k.final_chunk_tokens = 3;
  k.kv_offload = true;
  k.residual_offload = true;
  k.kv_chunk_rows = 2 * tile;
  return k;
}

// A streaming engine holds its 4 slot fences for its life; a forward with K/V offload
// takes 8 more, and with residual offload 4 more (its two slice buffers' ready / done),
// and gives them back when it returns; destroying the engine frees all.
TEST(ExecFences, EngineAndKvOffloadTakeAndReturnHandles) {
  Case c = make_case();
  h3::H3SyntheticSource src(c.cfg, 3);
  auto be = cpu_with_tile(4);
  std::vector<int> held_during;
  {
    exec::EngineOptions eo;
    eo.residency.resident_blocks = 1;
    eo.residency.slots = 2;
    eo.progress = [&](int64_t, int64_t) { held_during.push_back(be->fences_held()); };
    auto eng = exec::Engine::create(src, *be, eo);
    ASSERT_TRUE(eng.ok()) << eng.error().message;
    EXPECT_EQ(be->fences_held(), 4);
    auto text = (*eng)->refine_text(c.in.text_view(c.cfg, c.cond));
    ASSERT_TRUE(text.ok()) << text.error().message;
    EXPECT_EQ(be->fences_held(), 4);
    auto plan = exec::make_plan(c.cfg, c.cond, offload_knobs(4));
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    auto r = (*eng)->forward(c.cond, *text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), 0.8f, *plan);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_GT(r->report.pcie_kv_bytes, 0u);
    EXPECT_EQ(be->fences_held(), 4);
    ASSERT_EQ(held_during.size(), static_cast<size_t>(c.cfg.num_layers));
    for (int h : held_during) EXPECT_EQ(h, 4 + 8 + 4);
  }
  EXPECT_EQ(be->fences_held(), 0);
}

// ---- weights by role and block ------------------------------------------------------

// The synthetic model plus extra tensors of a given role in every block: what a
// quantised checkpoint adds (role block) or a file carries unread (role unused).
class ExtraTensorSource final : public h3::H3TensorSource {
 public:
  ExtraTensorSource(const h3::H3TensorSource& base, h3::TensorRole role, const std::string& suffix)
      : base_(base), suffix_(suffix) {
    std::vector<h3::TensorSpec> specs = base.specs();
    const h3::TensorSpec* norm = base.spec(h3::h3_block_key(0, "norm1.weight"));
    EXPECT_NE(norm, nullptr);
    for (int64_t i = 0; i < base.cfg().num_layers; ++i) {
      h3::TensorSpec s = *norm;  // bf16 [D]
      s.name = h3::h3_block_key(i, suffix);
      s.role = role;
      s.block = i;
      specs.push_back(s);
      std::vector<uint16_t> v(static_cast<size_t>(s.numel()));
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<uint16_t>(0x3f80 + (i * 7 + static_cast<int64_t>(k)) % 64);
      data_[s.name] = std::move(v);
    }
    set_specs(std::move(specs));
  }
  const h3::H3Config& cfg() const override { return base_.cfg(); }
  TensorView get(const std::string& name) const override {
    auto it = data_.find(name);
    if (it == data_.end()) return base_.get(name);
    return TensorView(const_cast<uint16_t*>(it->second.data()), DType::bf16, {base_.cfg().hidden});
  }
  bool has(const std::string& name) const override { return spec(name) != nullptr; }
  std::string describe() const override { return base_.describe() + " + " + suffix_; }
  const std::vector<uint16_t>& extra(int64_t block) const { return data_.at(h3::h3_block_key(block, suffix_)); }

 private:
  const h3::H3TensorSource& base_;
  std::string suffix_;
  std::map<std::string, std::vector<uint16_t>> data_;
};

uint64_t aligned(int64_t bytes) { return Arena::aligned_bytes(static_cast<size_t>(bytes)); }

// A tensor of role `block` rides in the block's slot and in the resident arena (so a
// quantised layer's scales travel with it, with no name pattern to update); a tensor of
// role `unused` under the same "blocks.N." names never reaches the device.
TEST(ExecWeights, SlotsAndResidentArenaFollowTheRoles) {
  Case c = make_case();
  h3::H3SyntheticSource base(c.cfg, 3);
  exec::Residency streamed;
  streamed.resident_blocks = 1;
  streamed.slots = 2;
  streamed.release_source = false;
  auto be = make_cpu_backend();
  auto plain = exec::WeightStore::create(base, *be, streamed, be->memory());
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  const uint64_t extra_bytes = aligned(c.cfg.hidden * 2);

  ExtraTensorSource scaled(base, h3::TensorRole::block, "attn.qkv_proj.weight_scale");
  auto ws = exec::WeightStore::create(scaled, *be, streamed, be->memory());
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  EXPECT_EQ((*ws)->slot_bytes(), (*plain)->slot_bytes() + extra_bytes);
  EXPECT_EQ((*ws)->device_bytes(), (*plain)->device_bytes() + 3 * extra_bytes);  // 2 slots + resident block 0
  ASSERT_TRUE((*ws)->begin_forward().ok());
  for (int64_t i = 0; i < c.cfg.num_layers; ++i) {
    auto g = (*ws)->acquire_block(i);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const TensorView v = (*g)(h3::h3_block_key(i, "attn.qkv_proj.weight_scale"));
    ASSERT_EQ(v.numel(), c.cfg.hidden);
    EXPECT_EQ(std::memcmp(v.data, scaled.extra(i).data(), scaled.extra(i).size() * 2), 0) << "block " << i;
    ASSERT_TRUE((*ws)->release_block(i).ok());
  }

  ExtraTensorSource unused(base, h3::TensorRole::unused, "attn.lora_down.weight");
  auto wu = exec::WeightStore::create(unused, *be, streamed, be->memory());
  ASSERT_TRUE(wu.ok()) << wu.error().message;
  EXPECT_EQ((*wu)->slot_bytes(), (*plain)->slot_bytes());
  EXPECT_EQ((*wu)->device_bytes(), (*plain)->device_bytes());
}

// ---- kv_tile: the plan's is the backend's ---------------------------------------------

TEST(ExecKvTile, APlanWithAnotherKvTileIsRefused) {
  Case c = make_case();
  h3::H3SyntheticSource src(c.cfg, 3);
  auto be = make_cpu_backend();  // kv_tile 1024
  auto eng = exec::Engine::create(src, *be);
  ASSERT_TRUE(eng.ok());
  auto text = (*eng)->refine_text(c.in.text_view(c.cfg, c.cond));
  ASSERT_TRUE(text.ok());
  exec::PlanKnobs k;
  k.kv_tile = 16;
  auto plan = exec::make_plan(c.cfg, c.cond, k);
  ASSERT_TRUE(plan.ok());
  const Status prep = (*eng)->prepare(c.cond, *plan);
  ASSERT_FALSE(prep.ok());
  EXPECT_EQ(prep.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(prep.error().message.find("kv_tile 16"), std::string::npos) << prep.error().message;
  EXPECT_NE(prep.error().message.find("kv_tile 1024"), std::string::npos) << prep.error().message;
  auto r = (*eng)->forward(c.cond, *text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), 0.8f, *plan);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("kv_tile"), std::string::npos) << r.error().message;
  // The backend's numerics at 16: accepted, and the report says 16.
  Numerics n = be->numerics();
  n.kv_tile = 16;
  ASSERT_TRUE(be->set_numerics(n, be->diagnostics()).ok());
  EXPECT_TRUE((*eng)->prepare(c.cond, *plan).ok());
  auto ok = (*eng)->forward(c.cond, *text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), 0.8f, *plan);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->report.kv_tile, 16);
  EXPECT_NE(ok->report.numerics.find("kv_tile 16"), std::string::npos) << ok->report.numerics;
}

// The refiner walks its keys in the backend's kv_tile (not a fixed 1024): L = 1000
// tokens in tiles of one key differ from one tile of all keys (many merge roundings in
// fp32, enough to move bf16 outputs), and the default (1024) is one tile of all keys.
TEST(ExecKvTile, TheRefinerTakesTheBackendsKvTile) {
  Case c = make_case();
  ASSERT_GE(c.cfg.refiner_layers, 1);
  h3::H3SyntheticSource src(c.cfg, 3);
  std::mt19937_64 rng(17);
  const int64_t L = 1000;
  std::vector<float> states = randn(rng, static_cast<size_t>(L * c.cfg.text_dim), 2.0f);
  const TensorView text(states.data(), DType::f32, {L, c.cfg.text_dim});
  auto refine = [&](int64_t tile) {
    auto be = tile > 0 ? cpu_with_tile(tile) : make_cpu_backend();
    auto eng = exec::Engine::create(src, *be);
    EXPECT_TRUE(eng.ok());
    auto t = (*eng)->refine_text(text);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
    return t.ok() ? t->bf16 : std::vector<uint16_t>();
  };
  const auto def = refine(0), one_tile = refine(L), tiled = refine(1);
  ASSERT_FALSE(def.empty());
  EXPECT_EQ(def, one_tile);
  EXPECT_NE(def, tiled);
}

// ---- typed phase buffers ------------------------------------------------------------

// Every phase's typed struct gives the plan's list, for every placement; the sum of the
// largest phase and the persistent buffers is the predicted peak.
TEST(ExecBuffers, TypedPhasesAreThePlansLists) {
  Case c = make_case();
  for (const exec::PlanKnobs& k : {exec::PlanKnobs{}, offload_knobs(4), [] {
         exec::PlanKnobs r = offload_knobs(4);
         r.kv_offload = false;
         return r;
       }()}) {
    auto p = exec::make_plan(c.cfg, c.cond, k);
    ASSERT_TRUE(p.ok()) << p.error().message;
    SCOPED_TRACE(p->describe());
    const exec::AttnSpecs a = exec::attention_specs(c.cfg, *p);
    EXPECT_EQ(a.kind, !p->two_pass_attention() ? exec::AttentionKind::stock
                      : p->kv_offload          ? exec::AttentionKind::offloaded_kv
                                               : exec::AttentionKind::resident_kv);
    EXPECT_EQ(a.residual_slice.has_value(), p->residual_offload);
    uint64_t max_phase = 0;
    for (const exec::PlanPhase& ph : {exec::embed_specs(c.cfg, *p).phase(), a.phase(), exec::mlp_specs(c.cfg, *p).phase(),
                                      exec::final_specs(c.cfg, *p).phase()}) {
      const exec::PlanPhase& planned = p->phase(ph.name);
      ASSERT_EQ(ph.buffers.size(), planned.buffers.size()) << ph.name;
      for (size_t i = 0; i < ph.buffers.size(); ++i) EXPECT_EQ(ph.buffers[i].what, planned.buffers[i].what);
      max_phase = std::max(max_phase, ph.bytes());
    }
    EXPECT_EQ(exec::sum_bytes(exec::persistent_specs(c.cfg, *p).list()) + max_phase, p->predicted_peak_bytes);
  }
}

// A plan whose lists were edited by hand is a bug the executor catches before any work.
TEST(ExecBuffersDeathTest, AnEditedPlanIsCaught) {
  Case c = make_case();
  auto p = exec::make_plan(c.cfg, c.cond, offload_knobs(4));
  ASSERT_TRUE(p.ok());
  exec::Plan edited = *p;
  for (auto& ph : edited.phases)
    if (ph.name == "attn") ph.buffers.pop_back();
  EXPECT_DEATH((void)exec::attention_specs(c.cfg, edited), "attn");
}

// ---- the report's JSON ----------------------------------------------------------------

TEST(ExecReport, JsonHasEveryKeyInOrderAndEscapesStrings) {
  exec::RunReport r;
  r.S = 123;
  r.kv_tile = 16;
  r.wall_seconds = 0.25;
  r.backend = "cuda:0 (NVIDIA \"H200\")";
  r.numerics = "attention native, kv_tile 16, \\ \"odd\"";
  r.phase_seconds = {{"mlp", 1.5}, {"embed", 0.5}};
  r.kv_offload = true;
  const nlohmann::json j = nlohmann::json::parse(r.to_json(), nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.to_json();
  EXPECT_EQ(j["S"], 123);
  EXPECT_EQ(j["kv_tile"], 16);
  EXPECT_EQ(j["backend"], r.backend);
  EXPECT_EQ(j["numerics"], r.numerics);
  EXPECT_EQ(j["kv_offload"], true);
  EXPECT_DOUBLE_EQ(j["wall_seconds"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["phase_seconds"]["mlp"].get<double>(), 1.5);
  // The key order of the report format (what the CLI's --json and the C API print).
  const std::vector<std::string> keys = {
      "two_pass_attention", "sliced_mlp", "sliced_head", "stock", "S", "target_rows", "attn_slice", "mlp_slice",
      "final_slice", "kv_tile", "predicted_peak_bytes", "measured_peak_bytes", "stock_peak_bytes", "adaln_table_bytes",
      "adaln_precomputed", "wall_seconds", "backend", "numerics", "resident_blocks", "streamed_blocks", "slots",
      "kv_offload", "residual_offload", "kv_chunk", "pcie_weight_bytes", "pcie_kv_bytes", "pcie_residual_bytes",
      "device_weight_bytes", "device_held_bytes", "device_peak_bytes", "pinned_host_bytes", "phase_seconds"};
  const nlohmann::ordered_json o = nlohmann::ordered_json::parse(r.to_json());
  std::vector<std::string> got;
  for (const auto& [k, v] : o.items()) got.push_back(k);
  EXPECT_EQ(got, keys);
  // Not profiled: an empty object.
  exec::RunReport plain;
  EXPECT_TRUE(nlohmann::json::parse(plain.to_json())["phase_seconds"].is_object());
}

}  // namespace
}  // namespace ls::test
