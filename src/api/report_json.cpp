#include "api/report_json.h"

#include <layerstream_version.h>

#include "core/dtype.h"

namespace ls::api {

std::string plan_paths(const exec::Plan& p) {
  if (p.stock()) return "stock plan (no slicing)";
  std::string s = p.two_pass_attention() ? "two-pass attention (" + std::to_string(p.attn_slice) + "-row slices)"
                                         : "stock attention";
  s += p.sliced_mlp() ? ", sliced MLP (" + std::to_string(p.mlp_slice) + ")" : ", stock MLP";
  s += p.sliced_head() ? ", sliced head (" + std::to_string(p.final_slice) + ")" : ", stock head";
  return s;
}

nlohmann::json budget_plan_json(const exec::BudgetPlan& bp) {
  return {{"budget_bytes", bp.budget_bytes},
          {"step", bp.step},
          {"resident_blocks", bp.resident_blocks},
          {"slots", bp.slots},
          {"one_slot_chosen", bp.one_slot_chosen},
          {"exposed_transfer_seconds", bp.exposed_transfer_seconds},
          {"kv_offload", bp.kv_offload},
          {"residual_offload", bp.residual_offload},
          {"predicted_peak_bytes", bp.predicted_peak_bytes},
          {"pcie_bytes_per_forward", bp.pcie_bytes_per_forward()},
          {"describe", bp.describe()}};
}

nlohmann::json plan_json(const exec::Plan& p) {
  nlohmann::json j;
  j["describe"] = p.describe();
  j["paths"] = plan_paths(p);
  j["knobs"] = {{"mlp_chunk_tokens", p.knobs.mlp_chunk_tokens},
                {"attn_chunk_tokens", p.knobs.attn_chunk_tokens},
                {"final_chunk_tokens", p.knobs.final_chunk_tokens},
                {"kv_tile", p.knobs.kv_tile}};
  j["S"] = p.sizes.S;
  j["target_rows"] = p.sizes.target_rows;
  j["attn_slice"] = p.attn_slice;
  j["mlp_slice"] = p.mlp_slice;
  j["final_slice"] = p.final_slice;
  j["kv_tile"] = p.kv_tile;
  j["two_pass_attention"] = p.two_pass_attention();
  j["sliced_mlp"] = p.sliced_mlp();
  j["sliced_head"] = p.sliced_head();
  j["stock"] = p.stock();
  j["predicted_peak_bytes"] = p.predicted_peak_bytes;
  j["stock_peak_bytes"] = p.stock_peak_bytes;
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& ph : p.phases) {
    nlohmann::json bufs = nlohmann::json::array();
    for (const auto& b : ph.buffers)
      bufs.push_back({{"what", b.what}, {"dtype", dtype_name(b.dtype)}, {"rows", b.rows}, {"cols", b.cols},
                      {"bytes", b.bytes()}});
    phases.push_back({{"name", ph.name}, {"bytes", ph.bytes()}, {"buffers", bufs}});
  }
  j["phases"] = phases;
  return j;
}

nlohmann::json version_json() {
  nlohmann::json backends = nlohmann::json::array();
  const std::string list = LS_BACKENDS;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    if (e > b) backends.push_back(list.substr(b, e - b));
    b = e + 1;
  }
  return {{"version", LS_VERSION}, {"git_commit", LS_GIT_COMMIT}, {"build_type", LS_BUILD_TYPE}, {"backends", backends}};
}

std::string version_line() {
  std::string backends;
  for (const char c : std::string(LS_BACKENDS)) backends += c == ',' ? std::string(", ") : std::string(1, c);
  std::string bt = LS_BUILD_TYPE;
  return std::string("layerstream ") + LS_VERSION + " (commit " + LS_GIT_COMMIT + ", " +
         (bt.empty() ? std::string("default") : bt) + " build, backends: " + backends + ")";
}

}  // namespace ls::api
