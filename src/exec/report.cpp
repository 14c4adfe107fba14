// RunReport's status line and JSON (engine.h). The JSON keys and their order are part
// of the report format: the CLI's --json, the C API's report and the benchmarks parse
// them (cli/report.cpp, src/api/c_api_denoise.cpp and c_api_calls.cpp,
// bench/bench_budget.cpp).
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/arena.h"  // format_bytes
#include "exec/engine.h"

namespace ls::exec {

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
  if (ranks > 1) {
    // Sequence parallel: the peaks above are the largest rank's; each rank's here.
    os << "; " << ranks << " ranks (sequence parallel), per-rank activation peak";
    for (size_t r = 0; r < rank_measured_peak_bytes.size(); ++r) os << (r ? " / " : " ") << format_bytes(rank_measured_peak_bytes[r]);
    if (device_peak_bytes > 0) {
      os << ", device peak";
      for (size_t r = 0; r < rank_device_peak_bytes.size(); ++r) os << (r ? " / " : " ") << format_bytes(rank_device_peak_bytes[r]);
    }
  }
  char t[32];
  std::snprintf(t, sizeof t, "; %.3f s", wall_seconds);
  os << t << " on " << backend;
  return os.str();
}

std::string RunReport::to_json() const {
  // ordered_json: the keys in the order below (the order the report always had).
  nlohmann::ordered_json j;
  j["two_pass_attention"] = two_pass_attention;
  j["sliced_mlp"] = sliced_mlp;
  j["sliced_head"] = sliced_head;
  j["stock"] = stock;
  j["S"] = S;
  j["target_rows"] = target_rows;
  j["attn_slice"] = attn_slice;
  j["mlp_slice"] = mlp_slice;
  j["final_slice"] = final_slice;
  j["kv_tile"] = kv_tile;
  j["predicted_peak_bytes"] = predicted_peak_bytes;
  j["measured_peak_bytes"] = measured_peak_bytes;
  j["stock_peak_bytes"] = stock_peak_bytes;
  j["adaln_table_bytes"] = adaln_table_bytes;
  j["adaln_precomputed"] = adaln_precomputed;
  j["wall_seconds"] = wall_seconds;
  j["backend"] = backend;
  j["numerics"] = numerics;
  j["resident_blocks"] = resident_blocks;
  j["streamed_blocks"] = streamed_blocks;
  j["slots"] = slots;
  j["kv_offload"] = kv_offload;
  j["residual_offload"] = residual_offload;
  j["kv_chunk"] = kv_chunk;
  j["pcie_weight_bytes"] = pcie_weight_bytes;
  j["pcie_kv_bytes"] = pcie_kv_bytes;
  j["pcie_residual_bytes"] = pcie_residual_bytes;
  j["device_weight_bytes"] = device_weight_bytes;
  j["device_held_bytes"] = device_held_bytes;
  j["device_peak_bytes"] = device_peak_bytes;
  j["pinned_host_bytes"] = pinned_host_bytes;
  nlohmann::ordered_json phases = nlohmann::ordered_json::object();  // {} when not profiled
  for (const auto& [k, v] : phase_seconds) phases[k] = v;
  j["phase_seconds"] = std::move(phases);
  if (ranks > 1) {  // sequence parallel only (one-device reports keep their keys)
    j["ranks"] = ranks;
    j["rank_measured_peak_bytes"] = rank_measured_peak_bytes;
    j["rank_device_peak_bytes"] = rank_device_peak_bytes;
  }
  return j.dump();
}

}  // namespace ls::exec
