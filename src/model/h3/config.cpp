// H3 presets, config checks and descriptions, clip geometry (h3-model.md §1, §6.3).
// The tensor table is tensors.cpp, detection and validation detect.cpp, synthetic
// weights synthetic.cpp (all declared in config.h).
#include "model/h3/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ls::h3 {

// ---- presets --------------------------------------------------------------------------

Expected<H3Config> h3_preset(const std::string& name) {
  H3Config c;  // defaults = the real H3 dimensions (§1.1)
  if (name == "h3") return c;
  if (name == "tiny") {
    c.hidden = 128;
    c.num_layers = 2;
    c.refiner_layers = 1;
    c.heads = 2;
    c.head_dim = 64;
    c.ffn = 256;
    c.latents_dim = 24;
    c.audio_latents_dim = 32;
    c.text_dim = 96;
    c.timestep_input_dim = 256;
    c.time_embed_hidden = 128;
    c.time_embed_dim = 64;
    c.rope_inv_freq_len = 8;  // 24 pairs, rot_dim 48 <= head_dim 64
    return c;
  }
  if (name == "small") {
    c.hidden = 512;
    c.num_layers = 4;
    c.refiner_layers = 2;
    c.heads = 4;
    c.head_dim = 128;
    c.ffn = 1408;
    c.text_dim = 256;
    c.timestep_input_dim = 256;
    c.time_embed_hidden = 512;
    c.time_embed_dim = 256;
    c.rope_inv_freq_len = 16;
    return c;
  }
  return make_error(ErrorCode::invalid_argument,
                    "unknown model preset '" + name + "' (valid presets: tiny, small, h3)");
}

H3Config h3_curve_form(H3Config cfg, int64_t grid, int64_t k) {
  cfg.adaln_curve_grid = grid;
  cfg.time_embed_dim = k;
  return cfg;
}

Status check_h3_config(const H3Config& c) {
  auto bad = [](const std::string& m) { return Status(make_error(ErrorCode::unsupported, "H3 config: " + m)); };
  const std::pair<const char*, int64_t> positive[] = {
      {"hidden", c.hidden},          {"heads", c.heads},
      {"head_dim", c.head_dim},      {"ffn", c.ffn},
      {"latents_dim", c.latents_dim}, {"audio_latents_dim", c.audio_latents_dim},
      {"text_dim", c.text_dim},      {"time_embed_dim", c.time_embed_dim},
      {"rope_inv_freq_len", c.rope_inv_freq_len}, {"pdd_heads", c.pdd_heads}};
  for (const auto& [n, v] : positive)
    if (v <= 0) return bad(std::string(n) + " must be positive (is " + std::to_string(v) + ")");
  if (c.num_layers < 1) return bad("needs at least one DiT block (num_layers is " + std::to_string(c.num_layers) + ")");
  if (c.refiner_layers < 0) return bad("refiner_layers is negative");
  if (!c.curve_form() && (c.timestep_input_dim <= 0 || c.timestep_input_dim % 2 != 0 || c.time_embed_hidden <= 0))
    return bad("time embedder needs an even positive timestep_input_dim and a positive time_embed_hidden");
  if (c.curve_form() && c.adaln_curve_grid < 2) return bad("adaln_curve_grid must be at least 2");
  if (2 * c.rope_pairs() > c.head_dim)
    return bad("rotary width 6*rope_inv_freq_len = " + std::to_string(2 * c.rope_pairs()) +
               " exceeds head_dim " + std::to_string(c.head_dim));
  if (c.head_dim % 2 != 0) return bad("head_dim must be even");
  return Status();
}

std::string h3_config_summary(const H3Config& c) {
  std::ostringstream o;
  o << "hidden " << c.hidden << ", " << c.num_layers << " blocks (+" << c.refiner_layers << " refiner), " << c.heads
    << "x" << c.head_dim << " heads, ffn " << c.ffn << ", latents " << c.latents_dim << "/" << c.audio_latents_dim
    << ", text_dim " << c.text_dim << ", rope " << c.rope_inv_freq_len << "/axis";
  if (c.curve_form())
    o << ", AdaLN curve table [" << c.adaln_curve_grid << ", " << c.time_embed_dim << "] (fp32)";
  else
    o << ", time embedder " << c.timestep_input_dim << "->" << c.time_embed_hidden << "->" << c.time_embed_dim;
  if (c.pdd_heads > 1) o << ", PDD bank " << c.pdd_heads;
  if (c.gate_compress) o << ", gate_compress";
  if (!c.key_prefix.empty()) o << ", key prefix '" << c.key_prefix << "'";
  return o.str();
}

std::string h3_config_json(const H3Config& c) {
  nlohmann::ordered_json j;
  j["hidden_size"] = c.hidden;
  j["num_layers"] = c.num_layers;
  j["token_refiner_num_layers"] = c.refiner_layers;
  j["num_attention_heads"] = c.heads;
  j["attention_head_dim"] = c.head_dim;
  j["ffn_hidden_size"] = c.ffn;
  j["latents_dim"] = c.latents_dim;
  j["audio_latents_dim"] = c.audio_latents_dim;
  j["text_dim"] = c.text_dim;
  if (!c.curve_form()) {  // the curve form has no time embedder: its widths mean nothing
    j["timestep_input_dim"] = c.timestep_input_dim;
    j["time_embed_hidden_size"] = c.time_embed_hidden;
  }
  j["time_embed_dim"] = c.time_embed_dim;
  j["rope_inv_freq_len"] = c.rope_inv_freq_len;
  if (c.curve_form())
    j["adaln_curve_grid"] = c.adaln_curve_grid;
  else
    j["adaln_curve_grid"] = nullptr;
  j["gate_compress"] = c.gate_compress;
  j["pdd_heads"] = c.pdd_heads;
  return j.dump();
}


// ---- clip geometry (§6.3) -------------------------------------------------------------

Expected<ClipGeometry> clip_geometry(int64_t frames, int64_t width, int64_t height, int64_t text_tokens) {
  if (frames <= 0 || frames > 100000)
    return make_error(ErrorCode::invalid_argument, "frames must be in 1..100000 (got " + std::to_string(frames) + ")");
  if (width <= 0 || height <= 0 || width % 32 != 0 || height % 32 != 0 || width > 65536 || height > 65536)
    return make_error(ErrorCode::invalid_argument, "width and height must be positive multiples of 32 up to 65536 (got " +
                                                       std::to_string(width) + "x" + std::to_string(height) + ")");
  if (text_tokens < 0 || text_tokens > 10000000)
    return make_error(ErrorCode::invalid_argument, "text tokens must be in 0..10^7 (got " + std::to_string(text_tokens) + ")");
  ClipGeometry g;
  // Snap up to F = 17j + 5: latent frame k covers 1,4,4,4,4 pixel frames (k mod 5),
  // 17 pixel frames per 5 latent frames; T = 2 for F = 5, else (F - 5) / 17 * 5 + 2.
  const int64_t j = frames <= 5 ? 0 : (frames - 5 + 16) / 17;
  g.frames = 17 * j + 5;
  g.T = j * 5 + 2;
  g.width = width;
  g.height = height;
  g.Hl = height / 16;
  g.Wl = width / 16;
  // A = round(F / 24 * 40) = round(5F / 3); 5F/3 never ends in .5, so floor((10F + 3) / 6).
  g.A = (10 * g.frames + 3) / 6;
  g.text_tokens = text_tokens;
  // An absurd clip is a usage error here, before any per-token table is allocated
  // (issue 28, item 9: a 386 M-token dry run took 65 s and 6 GB to fail). The bound is
  // far above any clip H3 can sample (15 s of 1920x1088 is 0.2 M tokens, 1000 frames of
  // 3840x2176 about 2.4 M); every factor is bounded above, so the product cannot overflow.
  const int64_t video_tokens = g.T * (g.Hl / 2) * (g.Wl / 2);
  const int64_t tokens = video_tokens + 2 * g.A + g.text_tokens;
  if (tokens > kMaxClipTokens)
    return make_error(ErrorCode::invalid_argument,
                      "the clip is too large: " + std::to_string(g.frames) + " frames of " + std::to_string(width) +
                          "x" + std::to_string(height) + " with " + std::to_string(text_tokens) + " text tokens is " +
                          std::to_string(tokens) + " tokens (video " + std::to_string(video_tokens) +
                          "); LayerStream plans at most " + std::to_string(kMaxClipTokens) +
                          " (2^24) tokens per clip: use fewer frames or a smaller size");
  return g;
}

}  // namespace ls::h3
