// `layerstream info --devices`: the CPU and every CUDA GPU, with the numerics `auto`
// resolves to (cli/info/info.h).
#include <cstdio>
#include <string>

#include <layerstream_version.h>  // LS_BACKENDS

#include "backend/backend.h"
#include "cli/info/info.h"

namespace ls::cli::info {

// One entry per device: the CPU, then cuda:0, cuda:1, ... until the driver says the index
// does not exist (each GPU is opened: a CUDA context each). The numerics are the
// backend's resolution of the flags given (default: auto) for an H3-shaped model (head
// dim 128) and for other head dims, since CUDA's auto depends on it (Backend::set_model_head_dim).
int run_devices(const InfoOptions& o) {
  auto nc = numerics_from_flags_and_env(kCmd, o.numerics, 0, /*quiet=*/true);
  if (!nc.ok()) return fail(nc.error());
  json list = json::array();
  std::string cuda_note;
  const auto describe_device = [&](Backend& be) {
    json d{{"device", be.device().str()}, {"name", be.name()}};
    uint64_t free_b = 0, total_b = 0;
    if (be.device().kind != DeviceKind::cpu && be.device_memory_info(&free_b, &total_b).ok())
      d["memory"] = {{"total_bytes", total_b}, {"free_bytes", free_b}};
    // The attention algorithms this device runs for an H3-shaped model (head dim 128): each
    // set alone (every other setting at its default), then the flags' numerics restored.
    json algos = json::array();
    for (const AttentionAlgorithm a : {AttentionAlgorithm::native, AttentionAlgorithm::cudnn, AttentionAlgorithm::hopper,
                                       AttentionAlgorithm::int8}) {
      Numerics t;
      t.attention = a;
      if (be.set_numerics(t, nc->diagnostics).ok() && be.set_model_head_dim(128).ok()) algos.push_back(to_string(a));
    }
    d["attention_algorithms"] = algos;
    if (Status st = be.set_numerics(nc->numerics, nc->diagnostics); !st.ok()) {
      d["error"] = st.message();
      return d;
    }
    for (const int64_t hd : {int64_t{128}, int64_t{64}}) {
      const std::string key = hd == 128 ? "numerics_head_dim_128" : "numerics_other_head_dims";
      if (Status st = be.set_model_head_dim(hd); !st.ok()) {
        d[key] = {{"error", st.message()}};
        continue;
      }
      d[key] = {{"line", describe(be.numerics())}, {"attention", to_string(be.numerics().attention)}};
    }
    return d;
  };
  auto cpu = make_backend("cpu", nc->numerics, nc->diagnostics);
  if (cpu.ok()) list.push_back(describe_device(**cpu));
  else list.push_back({{"device", "cpu"}, {"error", cpu.error().message}});  // e.g. --attention cudnn
  if (std::string(LS_BACKENDS).find("cuda") == std::string::npos) {
    cuda_note = "this build has no CUDA backend (backends: " LS_BACKENDS ")";
  } else {
    int usable = 0;
    for (int i = 0; i < 1024; ++i) {
      const std::string name = "cuda:" + std::to_string(i);
      auto be = make_backend(name, nc->numerics, nc->diagnostics);
      if (be.ok()) {
        list.push_back(describe_device(**be));
        ++usable;
        continue;
      }
      const std::string& why = be.error().message;
      if (why.find("does not exist") != std::string::npos) break;  // past the last device
      // A device that cannot be used (too old, the numerics refused there), or no driver
      // at all (then no further index can work either): listed with the reason.
      list.push_back({{"device", name}, {"error", why}});
      if (why.find("no usable CUDA device") != std::string::npos) break;
    }
    if (usable == 0) cuda_note = "no usable CUDA device";
  }
  json out{{"backends", LS_BACKENDS}, {"devices", list}};
  if (!cuda_note.empty()) out["note"] = cuda_note;
  if (o.as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("devices of this build (backends: %s)\n", LS_BACKENDS);
  for (const auto& d : list) {
    if (d.contains("error")) {
      std::printf("  %-24s unusable: %s\n", d["device"].get<std::string>().c_str(), d["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("  %s", d["name"].get<std::string>().c_str());
    if (d.contains("memory"))
      std::printf(", %s total, %s free", format_bytes(d["memory"]["total_bytes"].get<uint64_t>()).c_str(),
                  format_bytes(d["memory"]["free_bytes"].get<uint64_t>()).c_str());
    std::printf("\n");
    std::string algos;
    for (const auto& x : d["attention_algorithms"]) algos += (algos.empty() ? "" : ", ") + x.get<std::string>();
    std::printf("    attention algorithms (head dim 128): %s\n", algos.c_str());
    const json& a = d["numerics_head_dim_128"];
    const json& b = d["numerics_other_head_dims"];
    const auto line = [](const json& n) {
      return n.contains("error") ? "refused: " + n["error"].get<std::string>() : n["line"].get<std::string>();
    };
    if (line(a) == line(b)) {
      std::printf("    numerics: %s\n", line(a).c_str());
    } else {
      std::printf("    numerics, head dim 128 (H3): %s\n", line(a).c_str());
      std::printf("    numerics, other head dims:   %s\n", line(b).c_str());
    }
  }
  if (!cuda_note.empty()) std::printf("  (%s)\n", cuda_note.c_str());
  std::fflush(stdout);
  return 0;
}

// Any flag that describes a model, a clip or a dry run (not FILE, --json, the numerics,
// --check, --devices): what --check and --devices refuse.

}  // namespace ls::cli::info
