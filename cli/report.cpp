#include "cli/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "api/report_json.h"

#include "core/arena.h"  // format_bytes
#include "io/output_file.h"

namespace ls::cli {


std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

RunPeaks run_peaks(const sample::GenerateResult& r) {
  RunPeaks p;
  p.predicted = r.plan.predicted_peak_bytes;
  p.stock = r.plan.stock_peak_bytes;
  if (r.negative_plan) {
    p.predicted = std::max<uint64_t>(p.predicted, r.negative_plan->predicted_peak_bytes);
    p.stock = std::max<uint64_t>(p.stock, r.negative_plan->stock_peak_bytes);
  }
  for (const auto& f : r.forwards) p.measured = std::max<uint64_t>(p.measured, f.report.measured_peak_bytes);
  return p;
}

std::string plan_paths(const exec::Plan& p) { return api::plan_paths(p); }

std::string generate_status_line(const std::string& label, const sample::GenerateResult& r) {
  const RunPeaks pk = run_peaks(r);
  const size_t forwards = r.forwards.size();
  const int64_t steps = r.forwards.empty() ? 0 : r.forwards.back().step + 1;
  std::string s = "[LayerStream] " + (label.empty() ? std::string() : label + ": ") + plan_paths(r.plan);
  s += "; S " + std::to_string(r.plan.sizes.S);
  if (r.negative_plan && r.negative_plan->sizes.S != r.plan.sizes.S)
    s += " (negative " + std::to_string(r.negative_plan->sizes.S) + ")";
  s += ", kv_tile " + std::to_string(r.plan.kv_tile);
  s += "; activation peak " + format_bytes(pk.measured) + " measured / " + format_bytes(pk.predicted) +
       " predicted vs stock " + format_bytes(pk.stock);
  if (pk.stock > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%+.1f %%)",
                  100.0 * (static_cast<double>(pk.predicted) - static_cast<double>(pk.stock)) / static_cast<double>(pk.stock));
    s += buf;
  }
  const bool pre = !r.forwards.empty() && r.forwards.front().report.adaln_precomputed;
  s += "; AdaLN tables " + format_bytes(r.adaln_table_bytes) + (pre ? " precomputed" : " per call");
  char t[160];
  std::snprintf(t, sizeof t, "; %lld steps x %d forward%s = %zu forwards in %.2f s (%.3f s/forward)",
                static_cast<long long>(steps), r.guided() ? 2 : 1, r.guided() ? "s" : "", forwards, r.total_seconds,
                forwards ? r.sampling_seconds / static_cast<double>(forwards) : 0.0);
  s += t;
  if (!r.forwards.empty()) s += " on " + r.forwards.front().report.backend;
  return s;
}

nlohmann::json budget_plan_json(const exec::BudgetPlan& bp) { return api::budget_plan_json(bp); }

nlohmann::json plan_json(const exec::Plan& p) { return api::plan_json(p); }

nlohmann::json run_json(const std::string& label, const sample::GenerateResult& r) {
  const RunPeaks pk = run_peaks(r);
  nlohmann::json j;
  j["label"] = label;
  j["status_line"] = generate_status_line(label, r);
  j["plan"] = plan_json(r.plan);
  if (r.negative_plan) j["negative_plan"] = plan_json(*r.negative_plan);
  j["peaks"] = {{"measured_bytes", pk.measured}, {"predicted_bytes", pk.predicted}, {"stock_predicted_bytes", pk.stock}};
  j["adaln_table_bytes"] = r.adaln_table_bytes;
  j["seconds"] = {{"refine_text", r.refine_seconds},
                  {"adaln_precompute", r.adaln_seconds},
                  {"sampling", r.sampling_seconds},
                  {"total", r.total_seconds}};
  nlohmann::json fw = nlohmann::json::array();
  for (const auto& f : r.forwards) {
    nlohmann::json e = nlohmann::json::parse(f.report.to_json(), nullptr, /*allow_exceptions=*/false);
    if (e.is_discarded()) e = nlohmann::json::object();
    e["step"] = f.step;
    e["prompt"] = f.prompt == sample::Prompt::positive ? "positive" : "negative";
    e["sigma"] = f.sigma;
    fw.push_back(e);
  }
  j["forwards"] = fw;
  j["output"] = {{"video_fnv1a64", hex64(fnv1a64(r.video.data(), r.video.size() * sizeof(float)))},
                 {"audio_fnv1a64", hex64(fnv1a64(r.audio.data(), r.audio.size() * sizeof(float)))},
                 {"video_values", r.video.size()},
                 {"audio_values", r.audio.size()}};
  return j;
}

Status write_json_file(const std::string& path, const nlohmann::json& j, std::string_view what) {
  return io::write_output_file(path, j.dump(2) + "\n", what);
}

nlohmann::json version_json() { return api::version_json(); }

std::string version_line() { return api::version_line(); }

int64_t count_nonfinite(const float* p, size_t n) {
  int64_t c = 0;
  for (size_t i = 0; i < n; ++i) c += !std::isfinite(p[i]);
  return c;
}

Expected<int64_t> check_outputs_finite(const char* cmd, const std::vector<float>& video, const std::vector<float>& audio,
                                       const std::string& what, bool allow) {
  const int64_t bad_v = count_nonfinite(video.data(), video.size());
  const int64_t bad_a = count_nonfinite(audio.data(), audio.size());
  const int64_t n = bad_v + bad_a;
  if (n > 0) {
    const std::string msg = std::to_string(n) + " non-finite values (NaN or inf) in the " + what + " (video " +
                            std::to_string(bad_v) + " of " + std::to_string(video.size()) + ", audio " +
                            std::to_string(bad_a) + " of " + std::to_string(audio.size()) + ")";
    if (!allow) return Error{ErrorCode::nonfinite, msg + "; nothing written (--allow-nonfinite writes the output anyway)"};
    std::fprintf(stderr, "%s: warning: %s; written anyway (--allow-nonfinite)\n", cmd, msg.c_str());
  }
  return n;
}

Error nothing_written(Error e) {
  if (e.code == ErrorCode::nonfinite)
    e.message += e.message.find("--allow-nonfinite") == std::string::npos
                     ? " (nothing written; --allow-nonfinite writes the output anyway)"
                     : " (nothing written)";
  return e;
}

std::string backend_kind(const std::string& name) {
  const size_t e = name.find_first_of(": ");
  return e == std::string::npos ? name : name.substr(0, e);
}

}  // namespace ls::cli
