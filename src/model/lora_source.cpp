// See lora_source.h.
#include "model/lora_source.h"

#include <algorithm>

#include "backend/backend.h"

namespace ls::lora {

namespace {
bool is_quantised(DType d) { return d == DType::i8 || d == DType::f8e4m3; }
// "blocks.7.attn.qkv_proj" -> "attn.qkv_proj" (the linear's place in every block).
std::string block_kind(const std::string& m) {
  const size_t dot = m.find('.', 7);  // after "blocks."
  return m.substr(dot + 1);
}
}  // namespace

LoraSource::LoraSource(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras, MergeDtype dtype, h3::H3Config cfg,
                       std::map<std::string, std::vector<int64_t>> resized)
    : inner_(std::move(inner)), cfg_(std::move(cfg)), resized_(std::move(resized)), loras_(std::move(loras)),
      dtype_(dtype) {
  std::vector<h3::TensorSpec> specs = inner_->specs();
  for (h3::TensorSpec& s : specs) {
    auto r = resized_.find(s.name);
    if (r != resized_.end()) s.shape = r->second;  // the PDD bank's shape (cfg_.pdd_heads follows)
  }
  h3::append_lora_side_specs(cfg_, specs);
  set_specs(std::move(specs));
  for (const auto& [m, rank] : cfg_.lora_side) {
    side_[m + ".lora_side_down"] = m;
    side_[m + ".lora_side_up"] = m;
  }
  for (const std::string& t : loras_.targets())
    if (!t.ends_with(".weight") || cfg_.lora_side.count(t.substr(0, t.size() - 7)) == 0) merge_.insert(t);
}

Expected<std::unique_ptr<LoraSource>> LoraSource::wrap(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras,
                                                       MergeDtype dtype, bool side_path) {
  h3::H3Config cfg = inner->cfg();
  LS_CHECK_MSG(cfg.lora_side.empty(), "LoRA sources do not nest: merge the LoRA lists instead");
  std::map<std::string, int64_t> kind_rank;  // "attn.qkv_proj" -> the largest summed rank over the blocks
  for (const std::string& t : loras.targets()) {
    const h3::TensorSpec* s = inner->spec(t);
    if (s == nullptr)
      return make_error(ErrorCode::invalid_argument, "LoRA patches " + t + ", which this model does not have");
    if (s->dtype == DType::bf16 || s->dtype == DType::f16 || s->dtype == DType::f32) continue;  // merged
    const std::string stored = dtype_name(s->dtype);
    if (!is_quantised(s->dtype))
      return make_error(ErrorCode::unsupported, "LoRA patches " + t + ", stored as " + stored +
                                                    ": only bf16 / f16 / f32 weights (merged) and int8 / fp8 weights "
                                                    "(side path) take a LoRA");
    if (!side_path)
      return make_error(ErrorCode::unsupported,
                        "LoRA patches " + t + ", stored as " + stored +
                            ": a LoRA cannot be merged into a quantised weight bit-reproducibly (ComfyUI requantises "
                            "it with seeded stochastic rounding); run the engine with --lora instead, which applies "
                            "it as a side path on the layer's input");
    const std::string m = t.substr(0, t.size() - 7);
    // The side path serves the blocks' quantised linears (streamed with the block) and the
    // blocks' quantised AdaLN linears (the int8-full files' blocks.N.adaln_proj.linear, read
    // once per run by the AdaLN precompute through transient copies).
    const bool adaln = s->role == h3::TensorRole::adaln && s->block >= 0;
    if ((s->role != h3::TensorRole::block && !adaln) || !t.ends_with(".weight") || cfg.quant.find(m) == nullptr)
      return make_error(ErrorCode::unsupported,
                        "LoRA patches " + t + ", a quantised " + h3::tensor_role_name(s->role) +
                            " linear: the LoRA side path covers the DiT blocks' quantised linears (qkv_proj, "
                            "out_proj, fc1, fc2, adaln_proj.linear); this linear has none");
    int64_t rank = 0;
    for (const Patch& p : loras.patches(t)) {
      if (p.kind != Patch::Kind::lora)
        return make_error(ErrorCode::unsupported,
                          "LoRA " + p.file + ": " + p.key + (p.kind == Patch::Kind::diff ? " (.diff)" : " (.set_weight)") +
                              " is a full-rank patch of " + t + ", stored as " + stored +
                              ": only low-rank (up / down) patches run as a side path on quantised weights");
      rank += p.rank;
    }
    if (adaln) {
      // Not streamed through the block slots: each AdaLN linear keeps its own rank, and the
      // blocks no LoRA touches get no side path at all.
      if (rank > kLoraSideMaxRank)
        return make_error(ErrorCode::unsupported, "LoRAs on " + m + " (quantised) add up to rank " + std::to_string(rank) +
                                                      "; the side path takes at most rank " +
                                                      std::to_string(kLoraSideMaxRank) +
                                                      " per layer (all LoRAs given summed): use fewer or smaller LoRAs");
      cfg.lora_side[m] = rank;
      continue;
    }
    int64_t& kr = kind_rank[block_kind(m)];
    kr = std::max(kr, rank);
  }
  LS_ASSIGN_OR_RETURN(auto resized, pdd_bank(*inner, loras, cfg));
  for (const auto& [kind, rank] : kind_rank) {
    if (rank > kLoraSideMaxRank)
      return make_error(ErrorCode::unsupported, "LoRAs on blocks.N." + kind + " (quantised) add up to rank " +
                                                    std::to_string(rank) + "; the side path takes at most rank " +
                                                    std::to_string(kLoraSideMaxRank) +
                                                    " per layer (all LoRAs given summed): use fewer or smaller LoRAs");
    // Every block's linear of this kind gets a side path of this rank (uniform block slots).
    for (int64_t b = 0; b < cfg.num_layers; ++b) {
      const std::string m = "blocks." + std::to_string(b) + "." + kind;
      const h3::TensorSpec* s = inner->spec(m + ".weight");
      if (s != nullptr && is_quantised(s->dtype) && cfg.quant.find(m) != nullptr) cfg.lora_side[m] = rank;
    }
  }
  return std::unique_ptr<LoraSource>(
      new LoraSource(std::move(inner), std::move(loras), dtype, std::move(cfg), std::move(resized)));
}

Expected<std::map<std::string, std::vector<int64_t>>> LoraSource::pdd_bank(const h3::H3TensorSource& inner,
                                                                          const LoraSet& loras, h3::H3Config& cfg) {
  // The four head tensors' shapes after the LoRAs (a resizing set replaces the shape).
  struct Head {
    const char* name;
    int64_t width;  // rows of one head: 4C (video) or Ca (audio)
  };
  const Head heads[] = {{"final_layer.video_out.weight", cfg.video_patch_dim()},
                        {"final_layer.video_out.bias", cfg.video_patch_dim()},
                        {"final_layer.audio_out.weight", cfg.audio_latents_dim},
                        {"final_layer.audio_out.bias", cfg.audio_latents_dim}};
  std::map<std::string, std::vector<int64_t>> resized;
  int64_t rows[4] = {0, 0, 0, 0};
  std::string by[4];  // the patch that sets the shape, for messages
  for (int h = 0; h < 4; ++h) {
    const h3::TensorSpec* s = inner.spec(heads[h].name);
    LS_CHECK_MSG(s != nullptr, std::string("an H3 model without ") + heads[h].name);
    rows[h] = s->shape[0];
    const std::vector<Patch>& ps = loras.patches(heads[h].name);
    for (const Patch& p : ps) {
      if (p.kind != Patch::Kind::set || p.shape == s->shape) continue;
      // ComfyUI applies a key's patches in order to a weight whose shape the set changed:
      // a patch before it is overwritten, one after it meets a head of another shape (a
      // LoRA pair then fails, logged, and is skipped). Neither is what the files mean.
      if (ps.size() != 1)
        return make_error(ErrorCode::unsupported,
                          "LoRA " + p.file + ": " + p.key + " enlarges " + heads[h].name + " into a PDD head bank " +
                              "[" + std::to_string(p.shape[0]) + (p.shape.size() == 2 ? ", " + std::to_string(p.shape[1]) : "") +
                              "], and " + std::to_string(ps.size() - 1) +
                              " other patch(es) patch that head too: give the PDD LoRA alone on the heads");
      rows[h] = p.shape[0];
      by[h] = p.file + ": " + p.key;
      resized[heads[h].name] = p.shape;
    }
  }
  if (resized.empty()) return resized;
  // ComfyUI's FinalLayer (PR #15908): n = video_out rows // out_features; _pdd_head reshapes
  // both heads' weights to [n, -1, D] and biases to [n, -1]. A bank that does not give each
  // of the four tensors n blocks of its head's width is not a bank ComfyUI can run.
  auto what = [&](int h) {
    return std::string(heads[h].name) + " [" + std::to_string(rows[h]) + (h % 2 == 0 ? ", D]" : "]") +
           (by[h].empty() ? " (not enlarged)" : " (from " + by[h] + ")");
  };
  auto refuse = [&](const std::string& why) {
    std::string all;
    for (int h = 0; h < 4; ++h) all += (h ? "; " : "") + what(h);
    return make_error(ErrorCode::invalid_file, "PDD head bank: " + why + " (" + all +
                                                   "). ComfyUI banks both heads with one n: video_out [n*" +
                                                   std::to_string(heads[0].width) + ", D] + bias [n*" +
                                                   std::to_string(heads[0].width) + "], audio_out [n*" +
                                                   std::to_string(heads[2].width) + ", D] + bias [n*" +
                                                   std::to_string(heads[2].width) + "] (set_weight / set_bias)");
  };
  for (int h = 0; h < 4; ++h)
    if (rows[h] % heads[h].width != 0)
      return refuse(std::string(heads[h].name) + "'s rows are not a multiple of its head width " +
                    std::to_string(heads[h].width));
  const int64_t n = rows[0] / heads[0].width;
  for (int h = 1; h < 4; ++h)
    if (rows[h] / heads[h].width != n) {
      if (h % 2 == 1 && by[h].empty() && !by[h - 1].empty())
        return refuse(std::string(heads[h].name) + " is missing: ComfyUI's _pdd_head reads the bias as n = " +
                      std::to_string(n) + " blocks too, so the file must carry its .set_bias");
      return refuse(std::string(heads[h].name) + " holds " + std::to_string(rows[h] / heads[h].width) +
                    " heads, video_out.weight " + std::to_string(n));
    }
  cfg.pdd_heads = n;
  return resized;
}

MergeDtype LoraSource::merge_dtype_of(const std::string& name) const {
  if (dtype_ != MergeDtype::bf16) return dtype_;
  // The cast-time path (ComfyUI's dynamic VRAM): a module ComfyUI force-loads because its
  // LoRA resizes it (the PDD bank) goes through patch_weight_to_device in its LoRA compute
  // dtype, fp16 on the NVIDIA GPUs where dynamic VRAM runs; an fp32 weight (the fp32
  // islands: heads, patch projections, time embedder) is cast to fp32, its patches computed
  // in fp32; the bf16 weights' patches in bf16.
  if (resized_.count(name) != 0) return MergeDtype::f16;
  const h3::TensorSpec* s = inner_->spec(name);
  return s != nullptr && s->dtype == DType::f32 ? MergeDtype::f32 : MergeDtype::bf16;
}

void LoraSource::make_side(const std::string& name, std::vector<unsigned char>& bytes) const {
  const std::string& m = side_.at(name);
  const h3::TensorSpec& s = *spec(name);
  const int64_t rows = s.shape[0], R = s.shape[1];
  bytes.assign(static_cast<size_t>(rows * R) * sizeof(float), 0);  // zero columns past the patches' ranks
  float* f = reinterpret_cast<float*>(bytes.data());
  const bool down = name.ends_with("_down");
  int64_t off = 0;  // first column of the patch
  for (const Patch& p : loras_.patches(m + ".weight")) {
    LS_CHECK(p.kind == Patch::Kind::lora && off + p.rank <= R);
    if (down) {
      LS_CHECK(p.in == rows);
      for (int64_t r = 0; r < p.rank; ++r)  // down_p [rank, K] -> columns [off, off + rank) of [K, R]
        for (int64_t k = 0; k < rows; ++k) f[k * R + off + r] = p.down[static_cast<size_t>(r * p.in + k)];
    } else {
      LS_CHECK(p.out == rows);
      // s_p as the merge computes it: the double product rounded to fp32 once.
      const float sp = static_cast<float>(p.strength * p.alpha_over_rank);
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t r = 0; r < p.rank; ++r) f[n * R + off + r] = sp * p.up[static_cast<size_t>(n * p.rank + r)];
    }
    off += p.rank;
  }
}

TensorView LoraSource::get(const std::string& name) const {
  const bool side = side_.count(name) != 0;
  if (!side && merge_.count(name) == 0) return inner_->get(name);
  std::lock_guard<std::mutex> lock(mu_);
  if (side) {
    auto it = merged_.find(name);
    if (it == merged_.end()) {
      std::vector<unsigned char> bytes;
      make_side(name, bytes);
      it = merged_.emplace(name, std::move(bytes)).first;
    }
    const h3::TensorSpec& s = *spec(name);
    return TensorView::contiguous(it->second.data(), DType::f32, s.shape.data(), 2);
  }
  if (resized_.count(name) != 0) {
    // A PDD bank: the set patch is the tensor's only patch and replaces all of it, so the
    // stored head is never read; the merge starts from zeros of the bank's shape.
    const h3::TensorSpec& sp = *spec(name);
    auto it = merged_.find(name);
    if (it == merged_.end()) {
      std::vector<unsigned char> bytes(static_cast<size_t>(sp.numel()) * static_cast<size_t>(dtype_size(sp.dtype)), 0);
      const TensorView out = TensorView::contiguous(bytes.data(), sp.dtype, sp.shape.data(), static_cast<int>(sp.shape.size()));
      Status s = loras_.merge(name, 0, out, out, merge_dtype_of(name));
      LS_CHECK_MSG(s.ok(), "LoRA PDD bank " + name + ": " + s.message());
      it = merged_.emplace(name, std::move(bytes)).first;
    }
    return TensorView::contiguous(it->second.data(), sp.dtype, sp.shape.data(), static_cast<int>(sp.shape.size()));
  }
  const TensorView w = inner_->get(name);
  auto it = merged_.find(name);
  if (it == merged_.end()) {
    std::vector<unsigned char> bytes(static_cast<size_t>(w.nbytes()));
    TensorView out = w;
    out.data = bytes.data();
    Status s = loras_.merge(name, 0, w, out, merge_dtype_of(name));
    // Every way a merge can fail was checked by LoraSet::open and wrap().
    LS_CHECK_MSG(s.ok(), "LoRA merge of " + name + ": " + s.message());
    it = merged_.emplace(name, std::move(bytes)).first;
  }
  TensorView v = w;
  v.data = it->second.data();
  return v;
}

void LoraSource::release(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    merged_.erase(name);
  }
  if (side_.count(name) == 0) inner_->release(name);
}

std::string LoraSource::describe() const {
  std::string how;
  if (!merge_.empty())
    how = std::string("LoRA: merged in ") +
          (dtype_ == MergeDtype::bf16 ? "bf16 (cast-time; fp32 weights in f32)" : merge_dtype_name(dtype_));
  if (!resized_.empty()) how += "; PDD head bank of " + std::to_string(cfg_.pdd_heads) + " heads from the LoRA";
  if (!cfg_.lora_side.empty())
    how += (how.empty() ? "" : "; ") + std::string("LoRA: side path (int8/fp8) on ") +
           std::to_string(cfg_.lora_side.size()) + " layers";
  return inner_->describe() + " + " + loras_.describe() + " (" + how + ")";
}

}  // namespace ls::lora
