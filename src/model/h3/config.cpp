// H3 presets, tensor table, config detection/validation, synthetic weights, clip
// geometry (h3-model.md §1, §6.3).
#include "model/h3/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/hash.h"
#include "core/thread_pool.h"

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

// ---- tensor table (§1.3) --------------------------------------------------------------

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* tensor_role_name(TensorRole r) {
  switch (r) {
    case TensorRole::patch_embed: return "patch_embed";
    case TensorRole::text_proj: return "text_proj";
    case TensorRole::time_embedder: return "time_embedder";
    case TensorRole::adaln_table: return "adaln_table";
    case TensorRole::adaln: return "adaln";
    case TensorRole::rope: return "rope";
    case TensorRole::refiner: return "refiner";
    case TensorRole::block: return "block";
    case TensorRole::head: return "head";
    case TensorRole::unused: return "unused";
  }
  return "?";
}

const char* group_name(TensorSpec::Group g) {
  switch (g) {
    case TensorSpec::Group::blocks: return "blocks";
    case TensorSpec::Group::adaln: return "adaln";
    case TensorSpec::Group::heads: return "heads";
    case TensorSpec::Group::refiner: return "refiner";
    case TensorSpec::Group::embed: return "embed";
    case TensorSpec::Group::other: return "other";
  }
  return "?";
}

// Groups, for parameter counting:
//   blocks  - everything of blocks.{i} except the AdaLN projection (and gate_compress)
//   adaln   - blocks.{i}.adaln_proj.* and final_layer.adaln_proj.* (timestep-only work:
//             precomputed once per schedule, never streamed per step; DESIGN.md §2)
//   heads   - final_layer.norm, video_out and audio_out (incl. a PDD bank on both)
//   refiner - token_refiner.* (runs once per sampling run)
//   embed   - patch projections, condition_proj, time embedder / curve table, rope
//   other   - blocks.{i}.attn.to_gate_compress (VSA only; unused by the dense forward)
std::vector<TensorSpec> h3_tensor_specs(const H3Config& c) {
  using G = TensorSpec::Group;
  const int64_t D = c.hidden, I = c.inner(), F = c.ffn, Dh = c.head_dim, t = c.time_embed_dim;
  const DType bf = DType::bf16, f32 = DType::f32, ad = c.adaln_dtype();
  std::vector<TensorSpec> s;
  s.reserve(static_cast<size_t>(20 + 8 * c.refiner_layers + 12 * c.num_layers));
  using R = TensorRole;
  // Role from the name's family (the one place names become roles), block from the caller.
  auto add = [&](std::string name, DType dt, std::vector<int64_t> shape, G g, int64_t block = -1) {
    R r = R::unused;
    auto has = [&](const char* p) { return name.rfind(p, 0) == 0; };
    if (has("video_patch_proj.") || has("audio_patch_proj.")) r = R::patch_embed;
    else if (has("condition_proj.")) r = R::text_proj;
    else if (has("time_embedder.")) r = R::time_embedder;
    else if (name == "adaln_t_table") r = R::adaln_table;
    else if (name == "rope.inv_freq") r = R::rope;
    else if (has("token_refiner.")) r = R::refiner;
    else if (g == G::adaln) r = R::adaln;
    else if (has("final_layer.")) r = R::head;
    else if (g == G::blocks) r = R::block;
    s.push_back(TensorSpec{std::move(name), dt, std::move(shape), g, r, block});
  };
  // Top level.
  add("video_patch_proj.weight", f32, {D, c.video_patch_dim()}, G::embed);
  add("video_patch_proj.bias", f32, {D}, G::embed);
  add("audio_patch_proj.weight", f32, {D, c.audio_latents_dim}, G::embed);
  add("audio_patch_proj.bias", f32, {D}, G::embed);
  add("condition_proj.weight", bf, {D, c.text_dim}, G::embed);
  add("condition_proj.bias", bf, {D}, G::embed);
  if (c.curve_form()) {
    add("adaln_t_table", f32, {c.adaln_curve_grid, t}, G::embed);
  } else {
    add("time_embedder.proj_in.weight", f32, {c.time_embed_hidden, c.timestep_input_dim}, G::embed);
    add("time_embedder.proj_in.bias", f32, {c.time_embed_hidden}, G::embed);
    add("time_embedder.proj_out.weight", f32, {t, c.time_embed_hidden}, G::embed);
    add("time_embedder.proj_out.bias", f32, {t}, G::embed);
  }
  add("rope.inv_freq", f32, {c.rope_inv_freq_len}, G::embed);
  add("final_layer.norm.weight", bf, {D}, G::heads);
  add("final_layer.adaln_proj.linear.weight", ad, {2 * D, t}, G::adaln);
  add("final_layer.adaln_proj.linear.bias", ad, {2 * D}, G::adaln);
  add("final_layer.video_out.weight", f32, {c.pdd_heads * c.video_patch_dim(), D}, G::heads);
  add("final_layer.video_out.bias", f32, {c.pdd_heads * c.video_patch_dim()}, G::heads);
  add("final_layer.audio_out.weight", f32, {c.pdd_heads * c.audio_latents_dim, D}, G::heads);
  add("final_layer.audio_out.bias", f32, {c.pdd_heads * c.audio_latents_dim}, G::heads);
  // Token refiner.
  for (int64_t b = 0; b < c.refiner_layers; ++b) {
    const std::string p = "token_refiner.blocks." + std::to_string(b) + ".";
    add(p + "norm1.weight", bf, {D}, G::refiner, b);
    add(p + "attn.qkv_proj.weight", bf, {3 * I, D}, G::refiner, b);
    add(p + "attn.q_norm.weight", bf, {Dh}, G::refiner, b);
    add(p + "attn.k_norm.weight", bf, {Dh}, G::refiner, b);
    add(p + "attn.out_proj.weight", bf, {D, I}, G::refiner, b);
    add(p + "norm2.weight", bf, {D}, G::refiner, b);
    add(p + "mlp.fc1.weight", bf, {2 * F, D}, G::refiner, b);
    add(p + "mlp.fc2.weight", bf, {D, F}, G::refiner, b);
  }
  if (c.refiner_layers > 0) add("token_refiner.final_norm.weight", bf, {D}, G::refiner);
  // DiT blocks.
  for (int64_t b = 0; b < c.num_layers; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    add(p + "norm1.weight", bf, {D}, G::blocks, b);
    add(p + "attn.qkv_proj.weight", bf, {3 * I, D}, G::blocks, b);
    add(p + "attn.q_norm.weight", bf, {Dh}, G::blocks, b);
    add(p + "attn.k_norm.weight", bf, {Dh}, G::blocks, b);
    add(p + "attn.out_proj.weight", bf, {D, I}, G::blocks, b);
    if (c.gate_compress) add(p + "attn.to_gate_compress.weight", bf, {I, D}, G::other, b);
    add(p + "norm2.weight", bf, {D}, G::blocks, b);
    add(p + "mlp.fc1.weight", bf, {2 * F, D}, G::blocks, b);
    add(p + "mlp.fc2.weight", bf, {D, F}, G::blocks, b);
    add(p + "adaln_proj.linear.weight", ad, {18 * D, t}, G::adaln, b);
    add(p + "adaln_proj.linear.bias", ad, {18 * D}, G::adaln, b);
  }
  if (!c.quant.any()) {
    append_lora_side_specs(c, s);
    return s;
  }
  // Quantised linears (quant.h): the weight in its stored dtype, then its side tensors.
  std::vector<TensorSpec> q;
  q.reserve(s.size() + 3 * c.quant.linears.size());
  for (TensorSpec& ts : s) {
    const bool weight = ts.name.size() > 7 && ts.name.compare(ts.name.size() - 7, 7, ".weight") == 0;
    const LinearQuant* lq = weight ? c.quant.find(ts.name.substr(0, ts.name.size() - 7)) : nullptr;
    if (!lq) {
      q.push_back(std::move(ts));
      continue;
    }
    const std::string m = ts.name.substr(0, ts.name.size() - 7);
    ts.dtype = lq->format == WeightFormat::int8_convrot ? DType::i8 : DType::f8e4m3;
    const int64_t blk = ts.block;
    TensorSpec scale{m + ".weight_scale", f32, lq->scale_shape, ts.group, ts.role, ts.block};
    q.push_back(std::move(ts));
    q.push_back(std::move(scale));
    if (lq->has_input_scale) q.push_back(TensorSpec{m + ".input_scale", f32, lq->input_scale_shape, G::other, R::unused, blk});
    if (!lq->comfy_quant.empty())
      q.push_back(TensorSpec{m + ".comfy_quant", lq->comfy_quant_dtype, {static_cast<int64_t>(lq->comfy_quant.size())}, G::other,
                             R::unused, blk});
  }
  append_lora_side_specs(c, q);
  return q;
}

void append_lora_side_specs(const H3Config& c, std::vector<TensorSpec>& specs) {
  for (const auto& [m, rank] : c.lora_side) {
    const TensorSpec* w = nullptr;
    for (const TensorSpec& ts : specs)
      if (ts.name == m + ".weight") w = &ts;
    LS_CHECK_MSG(w != nullptr && w->shape.size() == 2, "LoRA side path on " + m + ", which has no 2-D weight");
    const TensorSpec base = *w;  // specs grows below
    specs.push_back(TensorSpec{m + ".lora_side_down", DType::f32, {base.shape[1], rank}, base.group, base.role, base.block});
    specs.push_back(TensorSpec{m + ".lora_side_up", DType::f32, {base.shape[0], rank}, base.group, base.role, base.block});
  }
}

// ---- detection (§1.2) -----------------------------------------------------------------

namespace {

bool starts_with(const std::string& s, std::string_view p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

// Number of consecutive "<prefix>{n}." blocks from n = 0 (stops at the first gap).
int64_t count_consecutive_blocks(const std::map<std::string, const TensorInfo*>& keys, const std::string& prefix) {
  std::set<int64_t> present;
  for (auto it = keys.lower_bound(prefix); it != keys.end() && starts_with(it->first, prefix); ++it) {
    const std::string& k = it->first;
    size_t i = prefix.size(), j = i;
    while (j < k.size() && k[j] >= '0' && k[j] <= '9') ++j;
    if (j == i || j >= k.size() || k[j] != '.' || j - i > 9) continue;
    if (k[i] == '0' && j - i > 1) continue;  // "blocks.01." is not block 1
    present.insert(std::stoll(k.substr(i, j - i)));
  }
  int64_t n = 0;
  while (present.count(n)) ++n;
  return n;
}

}  // namespace

std::string detect_key_prefix(const std::vector<TensorInfo>& tensors) {
  const char* candidates[] = {"model.diffusion_model.", "model.model.", "net."};
  int64_t counts[3] = {0, 0, 0};
  for (const auto& t : tensors)
    for (int i = 0; i < 3; ++i)
      if (starts_with(t.name, candidates[i])) { ++counts[i]; break; }
  int top = 0;  // first maximum, like Python's max over an insertion-ordered dict
  for (int i = 1; i < 3; ++i)
    if (counts[i] > counts[top]) top = i;
  std::string prefix = counts[top] > 5 ? candidates[top] : "model.";
  for (const auto& t : tensors)
    if (starts_with(t.name, prefix)) return prefix;
  return "";  // stripping would leave nothing: keys are used as they are
}

namespace {

// Applies "config.transformer" JSON overrides (ComfyUI constructor names).
Status apply_overrides(H3Config& c, const std::string& json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error(ErrorCode::invalid_file, "checkpoint metadata config.transformer is not a JSON object");
  // Every value is bounded BEFORE it is used in any arithmetic or allocation (issue 28,
  // item 7: latents_dim 2^63-1 overflowed, num_layers 2^31-1 allocated the tensor table
  // before validation). The bounds are far above any H3 (the 33 B model: hidden 6144,
  // 48 blocks) and keep every product of two of them inside int64.
  constexpr int64_t kDim = int64_t{1} << 20;  // widths (hidden, ffn, text_dim, ...)
  struct Field {
    const char* key;
    int64_t* dst;
    int64_t lo, hi;
  };
  const Field ints[] = {
      {"hidden_size", &c.hidden, 1, kDim},
      {"num_layers", &c.num_layers, 1, 1000},
      {"token_refiner_num_layers", &c.refiner_layers, 0, 1000},
      {"num_attention_heads", &c.heads, 1, 4096},
      {"attention_head_dim", &c.head_dim, 1, 4096},
      {"ffn_hidden_size", &c.ffn, 1, kDim},
      {"latents_dim", &c.latents_dim, 1, 65536},
      {"audio_latents_dim", &c.audio_latents_dim, 1, 65536},
      {"text_dim", &c.text_dim, 1, kDim},
      {"timestep_input_dim", &c.timestep_input_dim, 1, kDim},
      {"time_embed_hidden_size", &c.time_embed_hidden, 1, kDim},
      {"time_embed_dim", &c.time_embed_dim, 1, kDim},
      {"rope_inv_freq_len", &c.rope_inv_freq_len, 1, 4096},
      {"pdd_heads", &c.pdd_heads, 1, 64},
  };
  const auto out_of_range = [](const std::string& key, const nlohmann::json& v, int64_t lo, int64_t hi) {
    return make_error(ErrorCode::invalid_file, "checkpoint metadata config.transformer." + key + " is " + v.dump() +
                                                   ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
  };
  // An integer in [lo, hi] (an unsigned JSON number above INT64_MAX is out of range too).
  // (nlohmann holds every non-negative integer as unsigned.) lo >= 0 here.
  const auto bounded = [](const nlohmann::json& v, int64_t lo, int64_t hi) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      return u >= static_cast<uint64_t>(lo) && u <= static_cast<uint64_t>(hi);
    }
    const int64_t x = v.get<int64_t>();
    return x >= lo && x <= hi;
  };
  const int64_t blocks_in_file = c.num_layers;  // counted from the tensors by the caller
  for (const Field& f : ints) {
    auto it = j.find(f.key);
    if (it == j.end()) continue;
    if (!it->is_number_integer())
      return make_error(ErrorCode::invalid_file,
                        std::string("checkpoint metadata config.transformer.") + f.key + " is not an integer");
    if (!bounded(*it, f.lo, f.hi)) return out_of_range(f.key, *it, f.lo, f.hi);
    *f.dst = it->get<int64_t>();
  }
  // A block count that disagrees with the file's blocks.N.* tensors: refused, not run
  // with the first N blocks (issue 28: num_layers 1 on a 2-block file ran one block).
  if (blocks_in_file > 0 && c.num_layers != blocks_in_file)
    return make_error(ErrorCode::invalid_file,
                      "checkpoint metadata config.transformer.num_layers is " + std::to_string(c.num_layers) +
                          " but the file holds " + std::to_string(blocks_in_file) + " DiT blocks (blocks.0 .. blocks." +
                          std::to_string(blocks_in_file - 1) + "): the metadata and the tensors disagree");
  if (auto it = j.find("adaln_curve_grid"); it != j.end()) {
    if (it->is_null())
      c.adaln_curve_grid = 0;
    else if (!it->is_number_integer())
      return make_error(ErrorCode::invalid_file, "checkpoint metadata config.transformer.adaln_curve_grid is not an integer");
    else if (!bounded(*it, 2, kDim))
      return out_of_range("adaln_curve_grid", *it, 2, kDim);
    else
      c.adaln_curve_grid = it->get<int64_t>();
  }
  if (auto it = j.find("gate_compress"); it != j.end()) {
    if (!it->is_boolean())
      return make_error(ErrorCode::invalid_file, "checkpoint metadata config.transformer.gate_compress is not a boolean");
    c.gate_compress = it->get<bool>();
  }
  // patch_size is hard-coded (1,2,2) in the model; a file claiming another is unsupported.
  if (auto it = j.find("patch_size"); it != j.end()) {
    if (*it != nlohmann::json::array({1, 2, 2}))
      return make_error(ErrorCode::unsupported, "checkpoint metadata asks for patch_size " + it->dump() +
                                                    "; H3 is implemented for (1, 2, 2) only");
  }
  return Status();
}

}  // namespace

Expected<H3Config> detect_h3_config(const std::vector<TensorInfo>& tensors, const std::string& transformer_metadata_json) {
  H3Config c;
  c.key_prefix = detect_key_prefix(tensors);
  std::map<std::string, const TensorInfo*> keys;  // stripped name -> info
  for (const auto& t : tensors)
    if (starts_with(t.name, c.key_prefix)) keys[t.name.substr(c.key_prefix.size())] = &t;

  auto find = [&](const std::string& k) -> const TensorInfo* {
    auto it = keys.find(k);
    return it == keys.end() ? nullptr : it->second;
  };
  const std::string where = c.key_prefix.empty() ? std::string() : " (under key prefix '" + c.key_prefix + "')";
  if (!find("video_patch_proj.weight") || !find("audio_patch_proj.weight"))
    return make_error(ErrorCode::unsupported,
                      "not an H3 checkpoint: it has no video_patch_proj.weight and audio_patch_proj.weight" + where);
  // Every tensor the detection reads, with the rank it must have.
  auto need = [&](const std::string& k, size_t rank) -> Expected<const TensorInfo*> {
    const TensorInfo* t = find(k);
    if (!t) return make_error(ErrorCode::invalid_file, "H3 checkpoint lacks " + k + where + ", needed to detect the model's dimensions");
    if (t->shape.size() != rank)
      return make_error(ErrorCode::invalid_file, "H3 checkpoint tensor " + k + " has shape " + shape_string(t->shape) +
                                                     ", expected " + std::to_string(rank) + " dimensions");
    for (int64_t d : t->shape)
      if (d <= 0) return make_error(ErrorCode::invalid_file, "H3 checkpoint tensor " + k + " has an empty shape " + shape_string(t->shape));
    return t;
  };

  c.num_layers = count_consecutive_blocks(keys, "blocks.");
  c.refiner_layers = count_consecutive_blocks(keys, "token_refiner.blocks.");
  if (c.num_layers == 0) return make_error(ErrorCode::invalid_file, "H3 checkpoint has no blocks.0.* tensors" + where);

  LS_ASSIGN_OR_RETURN(const TensorInfo* vpp, need("video_patch_proj.weight", 2));
  LS_ASSIGN_OR_RETURN(const TensorInfo* app, need("audio_patch_proj.weight", 2));
  LS_ASSIGN_OR_RETURN(const TensorInfo* vout, need("final_layer.video_out.weight", 2));
  LS_ASSIGN_OR_RETURN(const TensorInfo* aout, need("final_layer.audio_out.weight", 2));
  LS_ASSIGN_OR_RETURN(const TensorInfo* cp, need("condition_proj.weight", 2));
  // The residual width D, as ComfyUI reads it: video_patch_proj.weight.shape[0]. Four
  // other tensors state it too (the audio projection's and condition_proj's rows, both
  // heads' columns); when they disagree the shape error names the tensor that is the
  // odd one out (a transposed video_patch_proj.weight [96, D] is blamed on itself, not
  // on the heads that then look wrong).
  {
    const std::pair<const char*, const TensorInfo*> says_d[] = {
        {"video_patch_proj.weight rows", vpp},  {"audio_patch_proj.weight rows", app},
        {"condition_proj.weight rows", cp},     {"final_layer.video_out.weight columns", vout},
        {"final_layer.audio_out.weight columns", aout}};
    auto d_of = [](size_t i, const TensorInfo* t) { return i < 3 ? t->shape[0] : t->shape[1]; };
    std::map<int64_t, int> votes;
    for (size_t i = 0; i < 5; ++i) ++votes[d_of(i, says_d[i].second)];
    int64_t D = vpp->shape[0];
    for (const auto& [d, n] : votes)
      if (n > votes[D]) D = d;  // the width most of them state (ComfyUI's on a tie)
    for (size_t i = 0; i < 5; ++i) {
      const auto& [what, t] = says_d[i];
      if (d_of(i, t) == D) continue;
      const std::string name(what, std::string_view(what).find(' '));
      const std::string want = i < 3 ? "[" + std::to_string(D) + ", *]" : "[*, " + std::to_string(D) + "]";
      const bool transposed = (i < 3 ? t->shape[1] : t->shape[0]) == D;
      return make_error(ErrorCode::invalid_file,
                        "H3 checkpoint tensor " + name + " has shape " + shape_string(t->shape) + ", expected " + want +
                            ": the other tensors that state the hidden width say " + std::to_string(D) +
                            (transposed ? " (is " + name + " stored transposed?)" : ""));
    }
    c.hidden = D;
  }
  // Latent widths from the patch projections (their input columns), which are the same
  // with or without a PDD bank. (§1.2: ComfyUI reads latents_dim = video_out rows // 4
  // and audio_latents_dim = audio_out rows, which mis-detects a banked file.)
  if (vpp->shape[1] % 4 != 0)
    return make_error(ErrorCode::invalid_file, "H3 checkpoint tensor video_patch_proj.weight has shape " +
                                                   shape_string(vpp->shape) + ": its " + std::to_string(vpp->shape[1]) +
                                                   " input columns are not a multiple of 4 (patch 1x2x2)");
  c.latents_dim = vpp->shape[1] / 4;
  c.audio_latents_dim = app->shape[1];
  // PDD head bank (§2.12 step 4): both heads banked with the same n, n = head rows /
  // latent width (video_out [n * 4C, D], audio_out [n * Ca, D]); n = 1 is no bank.
  {
    const int64_t pv = c.video_patch_dim(), pa = c.audio_latents_dim;
    auto heads_disagree = [&](const std::string& why) {
      return make_error(ErrorCode::invalid_file,
                        "H3 checkpoint heads final_layer.video_out.weight " + shape_string(vout->shape) +
                            " and final_layer.audio_out.weight " + shape_string(aout->shape) + " " + why +
                            " (the patch projections give latent widths " + std::to_string(pv) + " video, " +
                            std::to_string(pa) + " audio; a PDD bank of n heads is [n*" + std::to_string(pv) +
                            ", D] and [n*" + std::to_string(pa) + ", D], the same n on both)");
    };
    if (vout->shape[0] % pv != 0) return heads_disagree("do not fit: video_out's rows are not a multiple of " + std::to_string(pv));
    if (aout->shape[0] % pa != 0) return heads_disagree("do not fit: audio_out's rows are not a multiple of " + std::to_string(pa));
    const int64_t nv = vout->shape[0] / pv, na = aout->shape[0] / pa;
    if (nv != na)
      return heads_disagree("disagree: a PDD bank of " + std::to_string(nv) + " video heads but " + std::to_string(na) +
                            " audio heads");
    c.pdd_heads = nv;
  }
  LS_ASSIGN_OR_RETURN(const TensorInfo* qn, need("blocks.0.attn.q_norm.weight", 1));
  c.head_dim = qn->shape[0];
  LS_ASSIGN_OR_RETURN(const TensorInfo* qkv, need("blocks.0.attn.qkv_proj.weight", 2));
  if (qkv->shape[0] % (3 * c.head_dim) != 0)
    return make_error(ErrorCode::invalid_file, "blocks.0.attn.qkv_proj.weight has " + std::to_string(qkv->shape[0]) +
                                                   " rows, not a multiple of 3 * head_dim = " + std::to_string(3 * c.head_dim));
  c.heads = qkv->shape[0] / (3 * c.head_dim);
  LS_ASSIGN_OR_RETURN(const TensorInfo* fc1, need("blocks.0.mlp.fc1.weight", 2));
  if (fc1->shape[0] % 2 != 0)
    return make_error(ErrorCode::invalid_file, "blocks.0.mlp.fc1.weight has an odd row count " + std::to_string(fc1->shape[0]));
  c.ffn = fc1->shape[0] / 2;
  c.text_dim = cp->shape[1];
  if (const TensorInfo* table = find("adaln_t_table")) {
    LS_ASSIGN_OR_RETURN(table, need("adaln_t_table", 2));
    c.adaln_curve_grid = table->shape[0];
    c.time_embed_dim = table->shape[1];
  } else {
    LS_ASSIGN_OR_RETURN(const TensorInfo* pin, need("time_embedder.proj_in.weight", 2));
    LS_ASSIGN_OR_RETURN(const TensorInfo* pout, need("time_embedder.proj_out.weight", 2));
    c.timestep_input_dim = pin->shape[1];
    c.time_embed_hidden = pin->shape[0];
    c.time_embed_dim = pout->shape[0];
  }
  LS_ASSIGN_OR_RETURN(const TensorInfo* inv, need("rope.inv_freq", 1));
  c.rope_inv_freq_len = inv->shape[0];
  c.gate_compress = find("blocks.0.attn.to_gate_compress.weight") != nullptr;
  if (!transformer_metadata_json.empty()) LS_TRY(apply_overrides(c, transformer_metadata_json));
  LS_TRY(check_h3_config(c));
  return c;
}

Status validate_h3_tensors(const H3Config& cfg, const std::vector<TensorInfo>& tensors) {
  return validate_h3_tensors(cfg, tensors, false);
}

Status validate_h3_tensors(const H3Config& cfg, const std::vector<TensorInfo>& tensors, bool allow_dtype_conversion) {
  std::map<std::string, const TensorInfo*> keys;
  for (const auto& t : tensors) {
    if (!starts_with(t.name, cfg.key_prefix)) continue;
    // Quantisation side tensors must be described by cfg.quant (detect_quant_layout,
    // which open_h3_checkpoint runs); a config detected from shapes alone has none.
    const std::string stripped = t.name.substr(cfg.key_prefix.size());
    for (std::string_view side : {".comfy_quant", ".weight_scale", ".input_scale"}) {
      if (!ends_with(stripped, side)) continue;
      if (!cfg.quant.find(stripped.substr(0, stripped.size() - side.size())))
        return make_error(ErrorCode::unsupported,
                          "quantised tensor " + t.name +
                              " is not described by the config: detect the file's quantised layers first "
                              "(detect_quant_layout; open_h3_checkpoint does)");
    }
    keys[stripped] = &t;
  }
  for (const TensorSpec& s : h3_tensor_specs(cfg)) {
    const std::string full = cfg.key_prefix + s.name;
    auto it = keys.find(s.name);
    if (it == keys.end())
      return make_error(ErrorCode::invalid_file, "checkpoint lacks tensor " + full + " (expected " + dtype_name(s.dtype) +
                                                     " " + shape_string(s.shape) + ")");
    const TensorInfo& t = *it->second;
    if (t.shape != s.shape)
      return make_error(ErrorCode::invalid_file, "checkpoint tensor " + full + " has shape " + shape_string(t.shape) +
                                                     ", expected " + shape_string(s.shape) + " for the detected config");
    if (t.dtype != s.dtype) {
      // f8e4m3 widens exactly ("raw" fp8 files without scales: ComfyUI upcasts them).
      const bool convertible =
          (t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f8e4m3) &&
          (s.dtype == DType::f32 || s.dtype == DType::bf16);
      if (!convertible || !allow_dtype_conversion)
        return make_error(ErrorCode::unsupported,
                          "checkpoint tensor " + full + " is stored as " + dtype_name(t.dtype) + ", declared " +
                              dtype_name(s.dtype) +
                              (convertible ? " (allow dtype conversion to load it converted to the declared dtype)"
                                           : " (no conversion exists)"));
    }
  }
  return Status();
}

// ---- synthetic weights ----------------------------------------------------------------
//
// Value of element i of tensor `name` under `seed`: a counter-based hash, so any piece
// of a tensor can be produced alone:
//   key  = splitmix64(fnv1a64(name) ^ splitmix64(seed))
//   bits = splitmix64(key + (i + 1) * 0x9E3779B97F4A7C15)   (= position i of a splitmix stream)
//   n    = (u0 + u1 + u2 + u3 - 2) * sqrt(3)  with u_k = the four 16-bit chunks / 65536
// n is an Irwin-Hall approximation of N(0, 1) (mean 0, variance 1, |n| <= 2*sqrt(3)). Only
// +, *, / and sqrt are used (all correctly rounded IEEE operations, no libm), so the
// values are the same bits on every machine.
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double approx_normal(uint64_t bits) {
  const double sum = static_cast<double>(bits & 0xffff) + static_cast<double>((bits >> 16) & 0xffff) +
                     static_cast<double>((bits >> 32) & 0xffff) + static_cast<double>(bits >> 48);
  // Each chunk is uniform on {0..65535}; (c + 0.5) / 65536 is uniform on (0, 1).
  return ((sum + 2.0) / 65536.0 - 2.0) * 1.7320508075688772;
}

enum class InitKind { normal, norm_weight, inv_freq, curve_table };
struct Init {
  InitKind kind = InitKind::normal;
  double mean = 0.0;
  double stddev = 0.0;
};

// The scale of each tensor kind, chosen so a forward pass over synthetic weights keeps
// activations in a realistic range through 50 blocks:
//  - input-side linears (qkv, fc1, patch/condition projections, heads): N(0, 1/fan_in),
//    so a unit-RMS input gives a unit-RMS output;
//  - output-side linears (out_proj, fc2): 0.5/sqrt(fan_in), and the AdaLN gates are
//    ~0.1, so each block adds ~0.05 of the residual's scale;
//  - norm weights 1 + N(0, 0.05); biases N(0, 0.02);
//  - AdaLN linears give shift/scale/gate ~ N(0, 0.1): weight std 0.1/sqrt(t) / rms(input),
//    where the input is silu(t_emb) ~ 0.3 RMS (unpruned) or the ~0.5 RMS curve table;
//  - a PDD bank (video_out [n*4C, D] and audio_out [n*Ca, D], ComfyUI's shape) gets the
//    head's scale in every row block; ComfyUI reads block 0 as the full head and later
//    blocks as offsets from it, so the effective head of a synthetic bank is larger than
//    a trained one's; bank files are for plumbing and parity tests. Block 0 of a bank
//    holds the same values as the unbanked head (a value depends on name and index);
//  - rope.inv_freq: the exact fp32 values 10000^(-i/len);
//  - adaln_t_table: a smooth post-SiLU-like curve over the grid per column (below).
Init synthetic_init(const TensorSpec& s) {
  const std::string& n = s.name;
  const int64_t fan_in = s.shape.size() == 2 ? s.shape[1] : 1;
  const double inv_sqrt_fan = 1.0 / std::sqrt(static_cast<double>(fan_in));
  if (n == "rope.inv_freq") return {InitKind::inv_freq, 0, 0};
  if (n == "adaln_t_table") return {InitKind::curve_table, 0, 0};
  if (ends_with(n, "norm1.weight") || ends_with(n, "norm2.weight") || ends_with(n, "_norm.weight") ||
      ends_with(n, "final_norm.weight") || n == "final_layer.norm.weight")
    return {InitKind::norm_weight, 1.0, 0.05};
  const bool adaln = n.find("adaln_proj") != std::string::npos;
  if (ends_with(n, ".bias")) return {InitKind::normal, 0.0, adaln ? 0.05 : 0.02};
  if (adaln) {
    const bool curve = s.dtype == DType::f32;  // AdaLN linears are fp32 exactly in curve form
    return {InitKind::normal, 0.0, 0.1 * inv_sqrt_fan / (curve ? 0.5 : 0.3)};
  }
  if (ends_with(n, "attn.out_proj.weight") || ends_with(n, "mlp.fc2.weight"))
    return {InitKind::normal, 0.0, 0.5 * inv_sqrt_fan};
  return {InitKind::normal, 0.0, inv_sqrt_fan};
}

// Column j of the curve table: a cubic z(x) in x = g / (grid - 1) with hashed
// coefficients, passed through silu_like(z) = z * (0.5 + 0.5 * z / sqrt(1 + z^2)) (a
// SiLU look-alike built from exact IEEE operations: -> z for large z, -> 0 for very
// negative z, minimum about -0.2).
float curve_table_value(uint64_t key, int64_t grid, int64_t k, int64_t idx) {
  const int64_t g = idx / k, j = idx % k;
  const uint64_t col = splitmix64(key ^ static_cast<uint64_t>(j));
  const double a = approx_normal(splitmix64(col + 1)), b = approx_normal(splitmix64(col + 2));
  const double c = approx_normal(splitmix64(col + 3)), d = approx_normal(splitmix64(col + 4));
  const double x = static_cast<double>(g) / static_cast<double>(grid - 1);
  const double z = a + x * (b + x * (c + x * d));
  return static_cast<float>(z * (0.5 + 0.5 * z / std::sqrt(1.0 + z * z)));
}

}  // namespace

void fill_synthetic(const TensorSpec& spec, uint64_t seed, int64_t begin, int64_t count, void* out) {
  LS_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel());
  LS_CHECK(dtype_is_float(spec.dtype));
  const Init init = synthetic_init(spec);
  const uint64_t key = splitmix64(fnv1a64(spec.name.data(), spec.name.size()) ^ splitmix64(seed));
  const DType dt = spec.dtype;
  const int64_t grain = 1 << 15;
  if (init.kind == InitKind::normal || init.kind == InitKind::norm_weight) {
    // The bulk of every model: typed loops (no per-element dtype dispatch). The value
    // is the same fp32 number either way; bf16 rounds it to nearest even (dtype.h).
    auto value = [&](int64_t idx) {
      const uint64_t bits = splitmix64(key + static_cast<uint64_t>(idx + 1) * 0x9E3779B97F4A7C15ull);
      return static_cast<float>(init.mean + init.stddev * approx_normal(bits));
    };
    parallel_for(count, grain, [&](int64_t a, int64_t b) {
      if (dt == DType::bf16) {
        uint16_t* o = static_cast<uint16_t*>(out);
        for (int64_t i = a; i < b; ++i) o[i] = f32_to_bf16(value(begin + i));
      } else if (dt == DType::f32) {
        float* o = static_cast<float*>(out);
        for (int64_t i = a; i < b; ++i) o[i] = value(begin + i);
      } else {
        for (int64_t i = a; i < b; ++i) store_from_f32(out, dt, i, value(begin + i));
      }
    });
    return;
  }
  parallel_for(count, grain, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t idx = begin + i;
      float v;
      if (init.kind == InitKind::inv_freq)
        // fp32 10000^(-i/len): computed in double, rounded once to fp32.
        v = static_cast<float>(std::pow(10000.0, -static_cast<double>(idx) / static_cast<double>(spec.shape[0])));
      else
        v = curve_table_value(key, spec.shape[0], spec.shape[1], idx);
      store_from_f32(out, dt, i, v);
    }
  });
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
