// H3 model configuration, tensor table, presets and clip geometry (h3-model.md §1, §6).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/h3/quant.h"

namespace ls::h3 {

struct H3Config {
  int64_t hidden = 5376;               // D, residual width
  int64_t num_layers = 50;             // DiT blocks
  int64_t refiner_layers = 2;          // token refiner blocks
  int64_t heads = 56;                  // H
  int64_t head_dim = 128;              // Dh; attention inner width I = H * Dh
  int64_t ffn = 14336;                 // F (fc1 out = 2F)
  int64_t latents_dim = 24;            // video latent channels (patch dim = 4 * this)
  int64_t audio_latents_dim = 32;      // audio latent channels
  int64_t text_dim = 5120;             // condition_proj input width
  int64_t timestep_input_dim = 256;    // sinusoid width (unpruned form)
  int64_t time_embed_hidden = 5376;    // time MLP hidden (unpruned form)
  int64_t time_embed_dim = 2688;       // t_emb width (= k of the curve table in curve form)
  int64_t rope_inv_freq_len = 16;      // frequencies per axis: 3 axes -> 3*len pairs, rot_dim 6*len
  int64_t adaln_curve_grid = 0;        // 0 = unpruned (time embedder); else curve table [grid, k]
  bool gate_compress = false;          // VSA checkpoints carry an unused to_gate_compress linear
  int64_t pdd_heads = 1;               // n of the PDD head bank (video_out rows = n * 4 * latents_dim)
  std::string key_prefix;              // prefix stripped from every key ("" for bare keys)
  // Which linears are stored quantised (int8 ConvRot / fp8 e4m3) and ComfyUI's dtype
  // policy for such files (model/h3/quant.h). Empty for a bf16 checkpoint. Not part of
  // the dimensions: h3_config_json leaves it out. h3_tensor_specs adds the side tensors.
  QuantLayout quant;
  // LoRA side paths (issue 17; model/lora_source.h): quantised linear <m> -> the rank R of
  // its side factors <m>.lora_side_down f32 [K, R] and <m>.lora_side_up f32 [N, R], which
  // h3_tensor_specs appends with the weight's role, group and block. Set by lora::LoraSource
  // only; empty otherwise. Not a dimension: h3_config_json leaves it out.
  std::map<std::string, int64_t> lora_side;

  int64_t inner() const { return heads * head_dim; }          // I
  int64_t video_patch_dim() const { return latents_dim * 4; }  // patch (1,2,2)
  int64_t rope_pairs() const { return 3 * rope_inv_freq_len; } // P; rot_dim = 2P
  bool curve_form() const { return adaln_curve_grid > 0; }
  DType adaln_dtype() const { return curve_form() ? DType::f32 : DType::bf16; }
};

// Presets: "tiny" (tests, the built-in default), "small" (CPU clips of a few thousand
// tokens), "h3" (the real 33 B dimensions). Unknown name -> error listing the valid ones.
Expected<H3Config> h3_preset(const std::string& name);
// The curve ("pruned") form of a config: no time embedder, AdaLN linears in fp32 fed
// by an adaln_t_table [grid, k] (Comfy-Org pruned files: grid 1025, k 8).
H3Config h3_curve_form(H3Config cfg, int64_t grid = 1025, int64_t k = 8);
// Checks a config's dimensions are usable (positive, rot_dim 6*len <= head_dim, ...).
Status check_h3_config(const H3Config& cfg);
// One line: "hidden 5376, 50 blocks (+2 refiner), 56x128 heads, ffn 14336, ...".
std::string h3_config_summary(const H3Config& cfg);
// The config as a JSON object with ComfyUI's constructor names (hidden_size,
// num_layers, ...), the format detect_h3_config reads as metadata overrides. The
// curve form leaves out the time embedder's widths (it has none), so two configs that
// describe the same checkpoint give the same string.
std::string h3_config_json(const H3Config& cfg);

// Every tensor a checkpoint of this config holds, with real key names, shapes and
// declared dtypes (h3-model.md §1.3), in a stable order (top level, refiner, blocks).
// A linear quantised in cfg.quant has its weight's stored dtype (i8 | f8e4m3), followed by
//   <m>.weight_scale  f32, shape as stored, the weight's role, group and block
//   <m>.input_scale   f32 scalar (fp8, when present)      role unused, read on the host at open
//   <m>.comfy_quant   u8 [len] (when the file has it)    role unused, read on the host at open
// What a tensor is for (the executor, the planner and the weight store select tensors
// by role and block index, never by matching names).
enum class TensorRole : uint8_t {
  patch_embed,     // video_patch_proj.*, audio_patch_proj.*
  text_proj,       // condition_proj.*
  time_embedder,   // time_embedder.* (AdaLN precompute only)
  adaln_table,     // adaln_t_table (curve form; AdaLN precompute only)
  adaln,           // blocks.N.adaln_proj.*, final_layer.adaln_proj.* (AdaLN precompute only)
  rope,            // rope.inv_freq (host-side only)
  refiner,         // token_refiner.* (text refinement only)
  block,           // blocks.N.{norm1, attn.*, norm2, mlp.*}: what the block steps read
  head,            // final_layer.{norm, video_out, audio_out}
  unused,          // present in files, never read (attn.to_gate_compress)
};
const char* tensor_role_name(TensorRole r);  // "patch_embed", "block", ...

struct TensorSpec {
  std::string name;        // without key_prefix
  DType dtype;
  std::vector<int64_t> shape;
  enum class Group { blocks, adaln, heads, refiner, embed, other } group;
  TensorRole role = TensorRole::unused;
  int64_t block = -1;      // blocks.N.* and token_refiner.blocks.N.*: N; else -1
  int64_t numel() const;
};
std::vector<TensorSpec> h3_tensor_specs(const H3Config& cfg);
// Appends to `specs` the LoRA side tensors of cfg.lora_side (after everything else, in
// cfg.lora_side's name order); each takes the role, group and block of <m>.weight in specs.
void append_lora_side_specs(const H3Config& cfg, std::vector<TensorSpec>& specs);
const char* group_name(TensorSpec::Group g);  // "blocks", "adaln", ...

// What a checkpoint holds (name with prefix, dtype, shape), e.g. from SafetensorsReader.
struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
// Config from tensor shapes (h3-model.md §1.2), including key prefix detection and
// safetensors metadata overrides (config.transformer JSON). Error names what is missing.
Expected<H3Config> detect_h3_config(const std::vector<TensorInfo>& tensors,
                                    const std::string& transformer_metadata_json = "");
// Every expected tensor present with the right shape and dtype; the error names the
// first that is wrong (and how).
Status validate_h3_tensors(const H3Config& cfg, const std::vector<TensorInfo>& tensors);
// Same; with allow_dtype_conversion, a float tensor stored in another float dtype than
// declared (bf16/f16/f32) is accepted (the loader converts it on use).
Status validate_h3_tensors(const H3Config& cfg, const std::vector<TensorInfo>& tensors,
                           bool allow_dtype_conversion);
// The key prefix ComfyUI's loader would strip (§1.2): the dominant one of
// "model.diffusion_model.", "model.model.", "net." if it starts more than 5 keys, else
// "model."; "" when no key starts with the chosen prefix (keys are used as they are).
std::string detect_key_prefix(const std::vector<TensorInfo>& tensors);

// Deterministic synthetic weights: the values make-model writes for tensor `spec`
// under `seed`, generated in pieces (element range [begin, begin + count)) so a 66 GB
// model never needs to be in memory. Same (spec.name, seed, index) -> same value,
// whatever the piece boundaries. Values are scaled so activations stay in a
// realistic range through 50 blocks. `out` has spec.dtype.
void fill_synthetic(const TensorSpec& spec, uint64_t seed, int64_t begin, int64_t count, void* out);

// ---- clip geometry (h3-model.md §6.3) -----------------------------------------------
struct ClipGeometry {
  int64_t frames = 0;       // pixel frames, snapped up to 17j + 5
  int64_t width = 0, height = 0;  // pixels (multiples of 32)
  int64_t T = 0;            // latent frames
  int64_t Hl = 0, Wl = 0;   // latent height / width (pixels / 16)
  int64_t A = 0;            // audio latent frames
  int64_t text_tokens = 0;  // L
  int64_t video_tokens() const { return T * (Hl / 2) * (Wl / 2); }
  int64_t audio_rows() const { return 2 * A; }
  int64_t tokens() const { return text_tokens + audio_rows() + video_tokens(); }  // S for t2va
};
// The most tokens (video rows + 2 x audio frames + text) a clip may have: clip_geometry
// refuses more (invalid_argument) before anything is sized by it.
inline constexpr int64_t kMaxClipTokens = int64_t{1} << 24;
// Snaps frames up to the 17j+5 grid; width/height must be positive multiples of 32.
Expected<ClipGeometry> clip_geometry(int64_t frames, int64_t width, int64_t height, int64_t text_tokens);

}  // namespace ls::h3
