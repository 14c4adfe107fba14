// H3 config detection from tensor shapes and checkpoint validation (h3-model.md §1.2;
// config.h).
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

namespace {

// The residual width D, as ComfyUI reads it: video_patch_proj.weight.shape[0]. Four
// other tensors state it too (the audio projection's and condition_proj's rows, both
// heads' columns); when they disagree the shape error names the tensor that is the
// odd one out (a transposed video_patch_proj.weight [96, D] is blamed on itself, not
// on the heads that then look wrong).
Expected<int64_t> detect_hidden(const TensorInfo* vpp, const TensorInfo* app, const TensorInfo* cp,
                                const TensorInfo* vout, const TensorInfo* aout) {
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
    const std::string d = std::to_string(D);
    std::string want = "[";
    want += i < 3 ? d + ", *]" : "*, " + d + "]";
    const bool transposed = (i < 3 ? t->shape[1] : t->shape[0]) == D;
    return make_error(ErrorCode::invalid_file,
                      "H3 checkpoint tensor " + name + " has shape " + shape_string(t->shape) + ", expected " + want +
                          ": the other tensors that state the hidden width say " + std::to_string(D) +
                          (transposed ? " (is " + name + " stored transposed?)" : ""));
  }
  return D;
}

// PDD head bank (§2.12 step 4): both heads banked with the same n, n = head rows /
// latent width (video_out [n * 4C, D], audio_out [n * Ca, D]); n = 1 is no bank.
Expected<int64_t> detect_pdd_heads(const H3Config& c, const TensorInfo* vout, const TensorInfo* aout) {
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
  return nv;
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
  LS_ASSIGN_OR_RETURN(c.hidden, detect_hidden(vpp, app, cp, vout, aout));
  // Latent widths from the patch projections (their input columns), which are the same
  // with or without a PDD bank. (§1.2: ComfyUI reads latents_dim = video_out rows // 4
  // and audio_latents_dim = audio_out rows, which mis-detects a banked file.)
  if (vpp->shape[1] % 4 != 0)
    return make_error(ErrorCode::invalid_file, "H3 checkpoint tensor video_patch_proj.weight has shape " +
                                                   shape_string(vpp->shape) + ": its " + std::to_string(vpp->shape[1]) +
                                                   " input columns are not a multiple of 4 (patch 1x2x2)");
  c.latents_dim = vpp->shape[1] / 4;
  c.audio_latents_dim = app->shape[1];
  LS_ASSIGN_OR_RETURN(c.pdd_heads, detect_pdd_heads(c, vout, aout));
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

}  // namespace ls::h3
