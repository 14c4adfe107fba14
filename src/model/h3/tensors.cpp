// The H3 tensor table (h3-model.md §1.3): every tensor of a config, with its role and
// block (config.h).
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
  // A block's bf16 attention and MLP tensors (refiner and DiT blocks alike), in table
  // order; the DiT block's gate_compress projection between the two halves.
  auto add_block = [&](const std::string& p, G g, int64_t b, bool gate_compress) {
    add(p + "norm1.weight", bf, {D}, g, b);
    add(p + "attn.qkv_proj.weight", bf, {3 * I, D}, g, b);
    add(p + "attn.q_norm.weight", bf, {Dh}, g, b);
    add(p + "attn.k_norm.weight", bf, {Dh}, g, b);
    add(p + "attn.out_proj.weight", bf, {D, I}, g, b);
    if (gate_compress) add(p + "attn.to_gate_compress.weight", bf, {I, D}, G::other, b);
    add(p + "norm2.weight", bf, {D}, g, b);
    add(p + "mlp.fc1.weight", bf, {2 * F, D}, g, b);
    add(p + "mlp.fc2.weight", bf, {D, F}, g, b);
  };
  // Token refiner.
  for (int64_t b = 0; b < c.refiner_layers; ++b)
    add_block("token_refiner.blocks." + std::to_string(b) + ".", G::refiner, b, /*gate_compress=*/false);
  if (c.refiner_layers > 0) add("token_refiner.final_norm.weight", bf, {D}, G::refiner);
  // DiT blocks.
  for (int64_t b = 0; b < c.num_layers; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    add_block(p, G::blocks, b, c.gate_compress);
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

}  // namespace ls::h3
