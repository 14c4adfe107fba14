// H3TensorSource basics and the synthetic source (see checkpoint.h). The file source
// lives in checkpoint_file.cpp, so code that only uses synthetic weights does not pull
// in the safetensors reader.
#include "model/h3/checkpoint.h"

namespace ls::h3 {

std::string h3_block_key(int64_t block, std::string_view suffix) {
  std::string k = "blocks." + std::to_string(block) + ".";
  k.append(suffix);
  return k;
}

std::string h3_refiner_key(int64_t block, std::string_view suffix) {
  std::string k = "token_refiner.blocks." + std::to_string(block) + ".";
  k.append(suffix);
  return k;
}

void H3TensorSource::set_specs(std::vector<TensorSpec> specs) {
  specs_ = std::move(specs);
  spec_index_.clear();
  for (size_t i = 0; i < specs_.size(); ++i) spec_index_.emplace(specs_[i].name, i);
}

const TensorSpec* H3TensorSource::spec(const std::string& name) const {
  auto it = spec_index_.find(name);
  return it == spec_index_.end() ? nullptr : &specs_[it->second];
}

// ---- synthetic ------------------------------------------------------------------------

H3SyntheticSource::H3SyntheticSource(H3Config cfg, uint64_t seed) : cfg_(std::move(cfg)), seed_(seed) {
  LS_CHECK_MSG(check_h3_config(cfg_).ok(), check_h3_config(cfg_).message());
  set_specs(h3_tensor_specs(cfg_));
}

static H3Config with_synthetic_layout(H3Config cfg, SyntheticFormat f) {
  auto q = synthetic_quant_layout(cfg, f);
  LS_CHECK_MSG(q.ok(), q.ok() ? std::string() : q.error().message);
  cfg.quant = std::move(q).value();
  return cfg;
}

H3SyntheticSource::H3SyntheticSource(H3Config cfg, uint64_t seed, SyntheticFormat format)
    : H3SyntheticSource(with_synthetic_layout(std::move(cfg), format), seed) {}

TensorView H3SyntheticSource::get(const std::string& name) const {
  const TensorSpec* s = spec(name);
  LS_CHECK_MSG(s != nullptr, "synthetic H3 source has no tensor '" + name + "'");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    // One host buffer per tensor, filled with the same values make-model writes.
    std::vector<uint8_t> buf(static_cast<size_t>(s->numel() * dtype_size(s->dtype)));
    fill_synthetic_tensor(cfg_, *s, seed_, 0, s->numel(), buf.data());
    it = tensors_.emplace(name, std::move(buf)).first;
  }
  return TensorView::contiguous(it->second.data(), s->dtype, s->shape.data(), static_cast<int>(s->shape.size()));
}

void H3SyntheticSource::release(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  tensors_.erase(name);
}

std::string H3SyntheticSource::describe() const {
  std::string fmt;
  if (cfg_.quant.any()) {
    const LinearQuant& first = cfg_.quant.linears.begin()->second;
    fmt = std::string(", ") + weight_format_name(first.format) + " " + std::to_string(cfg_.quant.linears.size()) +
          " linears";
  }
  return "synthetic weights, seed " + std::to_string(seed_) + fmt + " (" + h3_config_summary(cfg_) + ")";
}

}  // namespace ls::h3
