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
//
// Quantised (int8 ConvRot / fp8 e4m3) linears are not merged (ComfyUI requantises the
// patched weight with seeded stochastic rounding, which cannot be reproduced): their LoRA
// patches become a side path (backend.h, Backend::lora_side). The source then declares, per
// such linear <m>, two more tensors with <m>.weight's role, group and block (cfg().lora_side,
// h3::append_lora_side_specs), so they stream in the block slot with the weight and the
// planner counts their bytes:
//   <m>.lora_side_down  f32 [K, R]  down_p^T of every patch p, concatenated along R in order
//   <m>.lora_side_up    f32 [N, R]  fl32(s_p * up_p), s_p = fl32(strength * alpha / rank)
// R is the patches' ranks summed, padded with zero columns to the largest such sum over
// the blocks for that linear (e.g. every blocks.N.attn.qkv_proj): the weight store's block
// slots need every block laid out alike. A block the LoRAs do not touch gets all-zero
// factors (its outputs keep their values; a -0 becomes +0). Made once on first get().
// The int8-full files' quantised AdaLN linears (blocks.N.adaln_proj.linear) take side paths
// too, with the AdaLN role: read once per run by the AdaLN precompute (transient copies),
// never streamed, so each keeps its own R and untouched blocks get none.
//
// PDD LoRAs (ComfyUI PR #15908; docs/lora.md "PDD LoRAs"): a .set_weight / .set_bias that
// enlarges final_layer.video_out / audio_out into a bank of n heads. The source replaces the
// four head specs with the bank's shapes and sets cfg().pdd_heads = n, and hands out the bank
// (fp32(T(value)), the stored heads unread); pdd_bank() refuses a bank ComfyUI's FinalLayer
// could not run (one head, two n, a bias not enlarged, rows no multiple of the head width,
// another patch on a banked head).
//
// Merge dtype per tensor (merge_dtype_of): the given one, except in the bf16 (cast-time)
// mode, where fp32 weights merge in f32 (ComfyUI casts them to fp32 before LowVramPatch) and
// a PDD bank in f16 (ComfyUI force-loads a resizing module through its whole-weight path).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "model/h3/checkpoint.h"
#include "model/lora.h"

namespace ls::lora {

class LoraSource final : public h3::H3TensorSource {
 public:
  // side_path: patches of int8 / fp8 linears become side paths (the engine); false (the
  // merge-lora tool, which writes merged weights) refuses them. Refused either way, naming
  // the layer: a full-rank patch (.diff, .set_weight) on a quantised weight, a side rank
  // above kLoraSideMaxRank, a PDD bank that does not fit (pdd_bank).
  static Expected<std::unique_ptr<LoraSource>> wrap(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras,
                                                    MergeDtype dtype, bool side_path = true);
  const h3::H3Config& cfg() const override { return cfg_; }
  TensorView get(const std::string& name) const override;
  bool has(const std::string& name) const override { return side_.count(name) != 0 || inner_->has(name); }
  void release(const std::string& name) const override;
  std::string describe() const override;

  const LoraSet& loras() const { return loras_; }
  MergeDtype merge_dtype() const { return dtype_; }
  const h3::H3TensorSource& inner() const { return *inner_; }
  // Quantised linears with a side path, and the ones merged ("LoRA: merged" / "side path").
  size_t side_path_layers() const { return cfg_.lora_side.size(); }
  size_t merged_tensors() const { return merge_.size(); }
  // The merge dtype of one tensor (the bf16 cast-time mode depends on the tensor, see above).
  MergeDtype merge_dtype_of(const std::string& name) const;

 private:
  LoraSource(std::unique_ptr<h3::H3TensorSource> inner, LoraSet loras, MergeDtype dtype, h3::H3Config cfg,
             std::map<std::string, std::vector<int64_t>> resized);
  // The head tensors a PDD LoRA enlarges (name -> bank shape), with cfg.pdd_heads set to the
  // bank's n; empty without one. Refuses a bank ComfyUI's FinalLayer could not run.
  static Expected<std::map<std::string, std::vector<int64_t>>> pdd_bank(const h3::H3TensorSource& inner,
                                                                        const LoraSet& loras, h3::H3Config& cfg);

  // Fills the side factor `name` (<m>.lora_side_down | _up) into bytes.
  void make_side(const std::string& name, std::vector<unsigned char>& bytes) const;
  std::unique_ptr<h3::H3TensorSource> inner_;
  h3::H3Config cfg_;                         // inner_->cfg() + lora_side (+ pdd_heads of a PDD LoRA)
  std::map<std::string, std::vector<int64_t>> resized_;  // PDD bank tensors -> their bank shape
  std::map<std::string, std::string> side_;  // side tensor name -> its linear <m>
  std::set<std::string> merge_;              // patched tensors merged (bf16 / f16 / f32)
  LoraSet loras_;
  MergeDtype dtype_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<unsigned char>> merged_;
};

}  // namespace ls::lora
