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

LoraSource::LoraSource(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras, MergeDtype dtype, h3::H3Config cfg)
    : inner_(std::move(inner)), cfg_(std::move(cfg)), loras_(std::move(loras)), dtype_(dtype) {
  std::vector<h3::TensorSpec> specs = inner_->specs();
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
    if (s->role != h3::TensorRole::block || !t.ends_with(".weight") || cfg.quant.find(m) == nullptr)
      return make_error(ErrorCode::unsupported,
                        "LoRA patches " + t + ", a quantised " + h3::tensor_role_name(s->role) +
                            " linear: the LoRA side path covers the DiT blocks' quantised linears (qkv_proj, "
                            "out_proj, fc1, fc2); use a checkpoint whose AdaLN linears are bf16 (the pruned int8 or "
                            "fp8 files) for this LoRA");
    int64_t rank = 0;
    for (const Patch& p : loras.patches(t)) {
      if (p.kind != Patch::Kind::lora)
        return make_error(ErrorCode::unsupported,
                          "LoRA " + p.file + ": " + p.key + (p.kind == Patch::Kind::diff ? " (.diff)" : " (.set_weight)") +
                              " is a full-rank patch of " + t + ", stored as " + stored +
                              ": only low-rank (up / down) patches run as a side path on quantised weights");
      rank += p.rank;
    }
    int64_t& kr = kind_rank[block_kind(m)];
    kr = std::max(kr, rank);
  }
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
  return std::unique_ptr<LoraSource>(new LoraSource(std::move(inner), std::move(loras), dtype, std::move(cfg)));
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
  const TensorView w = inner_->get(name);
  auto it = merged_.find(name);
  if (it == merged_.end()) {
    std::vector<unsigned char> bytes(static_cast<size_t>(w.nbytes()));
    TensorView out = w;
    out.data = bytes.data();
    Status s = loras_.merge(name, 0, w, out, dtype_);
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
  if (!merge_.empty()) how = std::string("LoRA: merged in ") + merge_dtype_name(dtype_);
  if (!cfg_.lora_side.empty())
    how += (how.empty() ? "" : "; ") + std::string("LoRA: side path (int8/fp8) on ") +
           std::to_string(cfg_.lora_side.size()) + " layers";
  return inner_->describe() + " + " + loras_.describe() + " (" + how + ")";
}

}  // namespace ls::lora
