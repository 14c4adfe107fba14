// The cost of a LoRA (issue 17; docs/lora.md): one forward of a model of --blocks DiT
// blocks (default 1: one block plus the embedding and the head, which a LoRA does not
// touch) with synthetic weights, without a LoRA and with a LoRA of each --ranks on every
// block's four linears (qkv_proj, out_proj, fc1, fc2), for each --formats:
//   bf16  the LoRA is merged into the weights (once, on the host, at engine creation);
//   int8  int8 ConvRot weights (synthetic_quant_layout): the LoRA runs as the side path
//         (Backend::lora_side after every quantised linear, per slice).
// Reports per (format, rank): median forward ms over --iters after --warmup and its
// difference from the run without a LoRA; engine creation seconds (includes the merge /
// the side factors' construction where weights are copied to the device) and the first
// forward's ms (on the host-resident CPU path the merge happens there, on first read); the side tensors' bytes (device memory the side path
// adds: f32 factors, streamed with their block); the device peak LayerStream held; and
// whether the LoRA changed the output (it must). Timing: the engine's own wall time per
// forward (RunReport::wall_seconds, synchronised). JSON out.
//
// Usage: bench_lora [--device cpu|cuda] [--preset small|h3] [--blocks 1] [--frames 9]
//                   [--width 64] [--height 64] [--text-tokens 16] [--ranks 16,64,128]
//                   [--formats bf16,int8] [--iters 3] [--warmup 1] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/backend.h"
#include "bench_json.h"
#include "core/dtype.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "model/h3/quant.h"
#include "model/lora_source.h"

using namespace ls;

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}
std::vector<std::string> parse_words(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(item);
  return v;
}

// A PEFT-style LoRA of rank r on the four linears of every block (bf16, alpha = r).
bool write_lora(const std::string& path, const h3::H3Config& cfg, int64_t r, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  struct E {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<E> es;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& s : h3::h3_tensor_specs(cfg)) shapes[s.name] = s.shape;
  for (int64_t b = 0; b < cfg.num_layers; ++b)
    for (const char* l : {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"}) {
      const std::string m = h3::h3_block_key(b, l);
      const auto& sh = shapes.at(m + ".weight");
      es.push_back({"diffusion_model." + m + ".lora_B.weight", {sh[0], r}});
      es.push_back({"diffusion_model." + m + ".lora_A.weight", {r, sh[1]}});
      es.push_back({"diffusion_model." + m + ".alpha", {}});
    }
  SafetensorsWriter w(path);
  for (const E& e : es)
    if (!w.declare(e.name, e.shape.empty() ? DType::f32 : DType::bf16, e.shape).ok()) return false;
  if (!w.begin().ok()) return false;
  for (const E& e : es) {
    if (e.shape.empty()) {
      const float a = static_cast<float>(r);
      if (!w.write_tensor(e.name, &a, 4).ok()) return false;
      continue;
    }
    std::vector<uint16_t> v(static_cast<size_t>(e.shape[0] * e.shape[1]));
    for (auto& h : v) h = f32_to_bf16(nd(rng));
    if (!w.write_tensor(e.name, v.data(), v.size() * 2).ok()) return false;
  }
  return w.commit().ok();
}

struct Row {
  std::string format;
  int64_t rank = 0;
  double forward_ms = 0, first_ms = 0, create_s = 0;
  uint64_t side_bytes = 0, device_peak = 0;
  bool changed = false;
  std::string describe;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", preset = "small", json, ranks_s = "16,64,128", formats_s = "bf16,int8";
  int64_t blocks = 1, frames = 9, width = 64, height = 64, text_tokens = 16;
  int iters = 3, warmup = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_lora: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") device = next();
    else if (a == "--preset") preset = next();
    else if (a == "--blocks") blocks = std::stoll(next());
    else if (a == "--frames") frames = std::stoll(next());
    else if (a == "--width") width = std::stoll(next());
    else if (a == "--height") height = std::stoll(next());
    else if (a == "--text-tokens") text_tokens = std::stoll(next());
    else if (a == "--ranks") ranks_s = next();
    else if (a == "--formats") formats_s = next();
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr, "bench_lora: unknown argument %s (see the usage at the top of bench/bench_lora.cpp)\n", a.c_str());
      return 2;
    }
  }
  auto be = make_backend(device);
  if (!be.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", be.error().message.c_str());
    return 1;
  }
  Backend& B = **be;
  auto cfg0 = h3::h3_preset(preset);
  if (!cfg0.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", cfg0.error().message.c_str());
    return 2;
  }
  h3::H3Config cfg = *cfg0;
  cfg.num_layers = blocks;
  auto geo = h3::clip_geometry(frames, width, height, text_tokens);
  if (!geo.ok()) {
    std::fprintf(stderr, "bench_lora: %s\n", geo.error().message.c_str());
    return 2;
  }
  h3::Conditioning cond;
  cond.geometry = *geo;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = nd(rng);
    return v;
  };
  const auto& g = cond.geometry;
  std::vector<float> video = randn(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl));
  std::vector<float> audio = randn(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A));
  std::vector<float> text = randn(static_cast<size_t>(g.text_tokens * cfg.text_dim));
  const TensorView vv(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
  const TensorView av(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A});
  const TensorView tv(text.data(), DType::f32, {g.text_tokens, cfg.text_dim});
  const float sigma = 0.8f;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("bench_lora_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("bench_lora: %s, %s, S = %" PRId64 " tokens, %s\n", B.name().c_str(), h3::h3_config_summary(cfg).c_str(),
              g.tokens(), device.c_str());

  std::vector<Row> rows;
  std::vector<int64_t> ranks = parse_list(ranks_s);
  ranks.insert(ranks.begin(), 0);
  for (const std::string& fmt : parse_words(formats_s)) {
    const h3::SyntheticFormat sf = fmt == "int8" ? h3::SyntheticFormat::int8_convrot : h3::SyntheticFormat::bf16;
    std::vector<float> base_video;
    for (int64_t r : ranks) {
      Row row;
      row.format = fmt;
      row.rank = r;
      std::unique_ptr<h3::H3TensorSource> src = std::make_unique<h3::H3SyntheticSource>(cfg, 11, sf);
      if (r > 0) {
        const std::string lp = (dir / ("r" + std::to_string(r) + ".safetensors")).string();
        if (!std::filesystem::exists(lp) && !write_lora(lp, cfg, r, 100 + static_cast<uint64_t>(r))) {
          std::fprintf(stderr, "bench_lora: cannot write %s\n", lp.c_str());
          return 1;
        }
        auto set = lora::LoraSet::open({lora::LoraFile{lp, 1.0}}, src->specs());
        if (!set.ok()) {
          std::fprintf(stderr, "bench_lora: %s\n", set.error().message.c_str());
          return 1;
        }
        auto w = lora::LoraSource::wrap(std::move(src), std::move(*set),
                                        device == "cpu" ? lora::MergeDtype::f32 : lora::MergeDtype::f16);
        if (!w.ok()) {
          std::fprintf(stderr, "bench_lora: %s\n", w.error().message.c_str());
          return 1;
        }
        src = std::move(*w);
      }
      for (const auto& s : src->specs())
        if (s.name.find(".lora_side_") != std::string::npos)
          row.side_bytes += static_cast<uint64_t>(s.numel()) * static_cast<uint64_t>(dtype_size(s.dtype));
      row.describe = src->describe();
      const auto t0 = std::chrono::steady_clock::now();
      auto e = exec::Engine::create(*src, B);
      if (!e.ok()) {
        std::fprintf(stderr, "bench_lora: %s\n", e.error().message.c_str());
        return 1;
      }
      row.create_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto t = (*e)->refine_text(tv);
      Status ps = t.ok() ? (*e)->precompute_adaln({sigma}, cond) : t.status();
      exec::PlanKnobs knobs;
      knobs.kv_tile = B.default_kv_tile();  // the backend's tile (cuDNN: 8192; CPU: 1024)
      auto plan = exec::make_plan(src->cfg(), cond, knobs);
      if (!ps.ok() || !plan.ok()) {
        std::fprintf(stderr, "bench_lora: %s\n", !ps.ok() ? ps.message().c_str() : plan.error().message.c_str());
        return 1;
      }
      std::vector<double> ms;
      std::vector<float> out;
      for (int it = 0; it < warmup + iters; ++it) {
        auto f = (*e)->forward(cond, *t, vv, av, sigma, *plan);
        if (!f.ok()) {
          std::fprintf(stderr, "bench_lora: %s\n", f.error().message.c_str());
          return 1;
        }
        if (it == 0) row.first_ms = f->report.wall_seconds * 1e3;
        if (it >= warmup) ms.push_back(f->report.wall_seconds * 1e3);
        row.device_peak = std::max<uint64_t>(row.device_peak, f->report.device_peak_bytes);
        out = std::move(f->video);
      }
      row.forward_ms = median(ms);
      if (r == 0) base_video = out;
      else row.changed = out.size() != base_video.size() ||
                         std::memcmp(out.data(), base_video.data(), out.size() * sizeof(float)) != 0;
      double base = row.forward_ms;
      for (const Row& x : rows)
        if (x.format == fmt && x.rank == 0) base = x.forward_ms;
      std::printf("  %-5s rank %4" PRId64 ": forward %9.2f ms (%+8.2f), first forward %9.2f ms, engine creation %.2f s, "
                  "side tensors %.1f MiB, device peak %.1f MiB%s\n",
                  fmt.c_str(), r, row.forward_ms, row.forward_ms - base, row.first_ms, row.create_s,
                  static_cast<double>(row.side_bytes) / (1 << 20), static_cast<double>(row.device_peak) / (1 << 20),
                  r > 0 && !row.changed ? "  (OUTPUT UNCHANGED!)" : "");
      rows.push_back(row);
    }
  }
  std::filesystem::remove_all(dir);
  bool ok = true;
  std::string j = "{\n  \"bench\": \"bench_lora\",\n  \"backend\": \"" + B.name() + "\",\n  \"config\": \"" +
                  h3::h3_config_summary(cfg) + "\",\n  \"tokens\": " + std::to_string(g.tokens()) +
                  ",\n  \"iters\": " + std::to_string(iters) + ",\n  \"runs\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    double base = 0;
    for (const Row& x : rows)
      if (x.format == r.format && x.rank == 0) base = x.forward_ms;
    if (r.rank > 0 && !r.changed) ok = false;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "    {\"format\": \"%s\", \"rank\": %" PRId64 ", \"forward_ms\": %.3f, \"added_ms\": %.3f, "
                  "\"first_forward_ms\": %.3f, \"engine_create_s\": %.3f, \"side_tensor_bytes\": %" PRIu64 ", \"device_peak_bytes\": %" PRIu64
                  ", \"output_changed\": %s}%s\n",
                  r.format.c_str(), r.rank, r.forward_ms, r.forward_ms - base, r.first_ms, r.create_s, r.side_bytes, r.device_peak,
                  r.changed ? "true" : "false", i + 1 < rows.size() ? "," : "");
    j += buf;
  }
  j += "  ]\n}\n";
  if (!json.empty() && !bench::write_json_text(json, j)) {
    std::fprintf(stderr, "bench_lora: cannot write %s\n", json.c_str());
    return 1;
  }
  if (json.empty()) std::fputs(j.c_str(), stdout);
  return ok ? 0 : 1;
}
