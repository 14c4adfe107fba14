// LoRA files as ComfyUI applies them to H3 (issue 17): key mapping, validation and the
// exact merge of bf16 / f16 / f32 weights.
//
// Keys (ComfyUI comfy/lora.py, model_lora_keys_unet for MiniMaxH3; no lora_convert.py
// conversion matches H3 names): a LoRA names a layer `m` (a model tensor name without
// ".weight", e.g. "blocks.3.attn.qkv_proj") as
//   "diffusion_model." + m  |  m  |  "lora_unet_" + m with '.' -> '_'
// followed by one of the pair suffixes ComfyUI's LoRA adapter accepts (up, then down):
//   .lora_up.weight/.lora_down.weight (kohya), .lora_B.weight/.lora_A.weight (PEFT /
//   diffusers), _lora.up.weight/_lora.down.weight, .lora.up.weight/.lora.down.weight,
//   .lora_B/.lora_A, .lora_linear_layer.up.weight/.down.weight, .lora_B.default.weight/
//   .lora_A.default.weight; optional ".alpha" (scalar); or a full ".diff" (+ ".diff_b" for
//   the bias) or ".set_weight" (+ ".set_bias" for the bias, which wins over ".diff_b"; a
//   set of the final heads may enlarge them into a PDD head bank, see lora_source.h).
//   Adapters this engine does not apply yet are refused by name
//   (DoRA ".dora_scale", LoCon ".lora_mid", LoHa, LoKr, GLoRA, OFT, BOFT, ".reshape_weight"
//   layer enlargement, ".w_norm"/".b_norm"); a key that maps onto no layer is refused.
//
// The merge (comfy/model_patcher.py patch_weight_to_device + comfy/lora.py
// calculate_weight + comfy/float.py stochastic_rounding, at ComfyUI 08d0e510): with T the
// LoRA compute dtype (comfy.model_management.lora_compute_dtype: fp16 on NVIDIA GPUs that
// run fp16, fp32 otherwise; MergeDtype here, an explicit numerics setting),
//   w_T = T(w)                                          (the stored weight, rounded to T)
//   for each patch, in the order the LoRAs are given:
//     lora: d[o][i] = sum_k up[o][k] * down[k][i]      (fp32; k ascending, no FMA: ComfyUI's
//                                                        torch.mm order is its BLAS's)
//           s = fl32(strength * (alpha / rank))        (double product; alpha absent: 1)
//           w_T = T(fl32(w_T + T(fl32(s * d))))
//     diff: w_T = T(fl32(w_T + T(fl32(fl32(strength) * T(diff)))))
//     set:  w_T = T(value)
//   out = stored dtype(w_T)                             (round to nearest even; for bf16 from
//                                                        fp16 this is a second rounding)
// MergeDtype::bf16 is ComfyUI's other path, the one its dynamic VRAM (the NVIDIA default)
// and lowvram modules take: model_patcher.LowVramPatch patches at cast time with
// intermediate_dtype = the cast weight's dtype (bf16 for H3), and LoRAAdapter casts the
// factors to it before its torch.mm, whose bf16 result is rounded once (cuBLAS: fp32
// accumulation, one rounding; modelled here with the k-ascending fp32 sum):
//     lora: d = T(sum_k T(up[o][k]) * T(down[k][i]));  w_T = T(fl32(w_T + T(fl32(s * d))))
//     diff / set as above with T = bf16.
// Every step is elementwise after the rank-r product, so a merge of any row range of a
// weight gives the bytes of the whole merge (the weight stream merges block by block).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/config.h"

namespace ls::lora {

enum class MergeDtype : uint8_t { f32 = 0, f16 = 1, bf16 = 2 };
const char* merge_dtype_name(MergeDtype d);  // "f32", "f16", "bf16"
// "f32" | "f16" | "bf16" -> the dtype; false for anything else.
bool parse_merge_dtype(const std::string& s, MergeDtype* out);

struct LoraFile {
  std::string path;
  double strength = 1.0;
};
// "FILE" or "FILE:STRENGTH": the last ':' followed by a decimal number splits (the
// grammar of every door, core/ranges.h; strength in -100..100, ComfyUI's LoraLoader
// range). A tail that strtod would read as a number but the grammar refuses ("0x10",
// "+2", " 1", "inf", "1e9") is an invalid_argument; any other tail is part of the path.
Expected<LoraFile> parse_lora_arg(const std::string& arg);

struct Patch {
  enum class Kind : uint8_t { lora, diff, set };
  Kind kind = Kind::lora;
  std::string file;  // for messages
  std::string key;   // the LoRA's key base, e.g. "lora_unet_blocks_0_attn_qkv_proj"
  double strength = 1.0;
  // lora: up fp32 [out, rank], down fp32 [rank, in] (stored values widened exactly);
  // alpha_over_rank = alpha / rank, or 1 when the file has no alpha.
  std::vector<float> up, down;
  int64_t out = 0, rank = 0, in = 0;
  double alpha_over_rank = 1.0;
  // diff / set: the full tensor's stored values widened exactly, and its shape: the
  // target's, except for a set that enlarges a final head into a PDD bank (is_pdd_head_tensor).
  std::vector<float> full;
  std::vector<int64_t> shape;
};

// final_layer.{video,audio}_out.{weight,bias}: the tensors a set patch may enlarge (a PDD
// head bank; ComfyUI PR #15908 lets .set_weight change a weight's shape and adds .set_bias).
bool is_pdd_head_tensor(const std::string& name);

class LoraSet {
 public:
  // Opens every file and maps every key onto a tensor of `model` (TensorSpec names are
  // without the checkpoint's key prefix). Errors name the file and the key.
  static Expected<LoraSet> open(const std::vector<LoraFile>& files, const std::vector<h3::TensorSpec>& model);

  bool empty() const { return patches_.empty(); }
  bool touches(const std::string& tensor) const { return patches_.count(tensor) != 0; }
  // Target tensors (model names) in name order, and the patches of one of them.
  std::vector<std::string> targets() const;
  const std::vector<Patch>& patches(const std::string& tensor) const;
  size_t patch_count() const;
  const std::vector<LoraFile>& files() const { return files_; }
  // "2 LoRAs: a.safetensors x1.00 (200 layers), b.safetensors x0.50 (50 layers)"
  std::string describe() const;

  // Rows [row0, row0 + n) of the patched `tensor`: w holds those rows of the stored
  // weight (host, bf16 | f16 | f32, 1-D for biases or 2-D [n, in], contiguous), out the
  // same shape and dtype (may alias w). Tensors without patches are copied.
  Status merge(const std::string& tensor, int64_t row0, const TensorView& w, const TensorView& out,
               MergeDtype dt) const;

 private:
  std::vector<LoraFile> files_;
  std::map<std::string, std::vector<Patch>> patches_;  // target -> patches in file order
  std::map<std::string, size_t> per_file_;             // file -> layers patched
};

}  // namespace ls::lora
