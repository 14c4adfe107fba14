// A weight source with LoRAs merged in (issue 17): wraps another H3TensorSource and hands
// out, for every tensor a LoRA patches, ComfyUI's merged weight (model/lora.h), made once
// on first get() into host memory this source owns (release() drops it, like the
// synthetic source's tensors). Every other tensor is the inner source's view.
//
// Where the merge happens: once per tensor per source, on the host, when the weight store
// first reads it (making it resident, or copying a streamed block into its pinned host
// copy), never once per slice or per step. So a run with LoRAs reads exactly the bytes a
// checkpoint with the LoRAs pre-merged holds (`layerstream merge-lora` writes one), and
// every memory knob keeps its bytes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/h3/checkpoint.h"
#include "model/lora.h"

namespace ls::lora {

class LoraSource final : public h3::H3TensorSource {
 public:
  // Fails when a patched tensor is stored in a format the merge does not take (int8 or
  // fp8 weights: ComfyUI requantises them stochastically; not supported yet).
  static Expected<std::unique_ptr<LoraSource>> wrap(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras,
                                                    MergeDtype dtype);
  const h3::H3Config& cfg() const override { return inner_->cfg(); }
  TensorView get(const std::string& name) const override;
  bool has(const std::string& name) const override { return inner_->has(name); }
  void release(const std::string& name) const override;
  std::string describe() const override;

  const LoraSet& loras() const { return loras_; }
  MergeDtype merge_dtype() const { return dtype_; }
  const h3::H3TensorSource& inner() const { return *inner_; }

 private:
  LoraSource(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras, MergeDtype dtype);
  std::unique_ptr<h3::H3TensorSource> inner_;
  LoraSet loras_;
  MergeDtype dtype_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<unsigned char>> merged_;
};

}  // namespace ls::lora
