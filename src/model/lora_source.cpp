// See lora_source.h.
#include "model/lora_source.h"

namespace ls::lora {

LoraSource::LoraSource(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras, MergeDtype dtype)
    : inner_(std::move(inner)), loras_(std::move(loras)), dtype_(dtype) {
  set_specs(inner_->specs());
}

Expected<std::unique_ptr<LoraSource>> LoraSource::wrap(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras,
                                                       MergeDtype dtype) {
  for (const std::string& t : loras.targets()) {
    const h3::TensorSpec* s = inner->spec(t);
    if (s == nullptr)
      return make_error(ErrorCode::invalid_argument, "LoRA patches " + t + ", which this model does not have");
    if (!(s->dtype == DType::bf16 || s->dtype == DType::f16 || s->dtype == DType::f32))
      return make_error(ErrorCode::unsupported,
                        "LoRA patches " + t + ", stored as " + dtype_name(s->dtype) +
                            ": LoRAs on quantised (int8 / fp8) weights are not supported yet (ComfyUI requantises them "
                            "with seeded stochastic rounding; the engine's side path is not built)");
  }
  return std::unique_ptr<LoraSource>(new LoraSource(std::move(inner), std::move(loras), dtype));
}

TensorView LoraSource::get(const std::string& name) const {
  if (!loras_.touches(name)) return inner_->get(name);
  std::lock_guard<std::mutex> lock(mu_);
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
  inner_->release(name);
}

std::string LoraSource::describe() const {
  return inner_->describe() + " + " + loras_.describe() + " (merged in " + merge_dtype_name(dtype_) + ")";
}

}  // namespace ls::lora
