// Quantised H3 checkpoints, the model side (issue 14; comfyui-and-quantized-weights.md
// §2-3): which linears of a file are int8 ConvRot / fp8 e4m3 (per layer, from each
// `<m>.comfy_quant` JSON), the synthetic quantised weights make-model writes, and the
// opt-in bf16 -> fp8 conversion (`--precision fp8`, lossy). The ops that run these
// weights are Backend::linear (backend.h); the numerics are spelled out there.
//
// On-disk layout per quantised linear <m> (ComfyUI's names, "mixed ops"):
//   int8 ConvRot:  <m>.weight I8 [N, K] (rotated per group: W * H_G), <m>.weight_scale
//                  F32 [N, 1] (or [N]), <m>.comfy_quant U8 JSON
//                  {"format":"int8_tensorwise","convrot":true,"convrot_groupsize":G}
//                  (convrot / convrot_groupsize at the top level or under "params")
//   fp8 e4m3:      <m>.weight F8_E4M3 [N, K] (not rotated), <m>.weight_scale F32 scalar
//                  ([] or [1]), optional <m>.input_scale F32 scalar, <m>.comfy_quant
//                  {"format":"float8_e4m3fn"} (optional: Comfy-Org's fp8_scaled file may
//                  carry none; a weight_scale next to an F8_E4M3 weight says it too)
// Everything else keeps its float dtype, but ComfyUI then runs the whole model under its
// mixed-precision ops: every non-quantised Linear weight and bias that is declared f32
// (patch projections, time embedder, curve-form AdaLN, heads) is held as bf16 and widened
// back to fp32 per call (h3-model.md §3.1). QuantLayout::mixed_ops records that; the
// sources apply it (held_as_bf16).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"  // WeightFormat, LinearWeight
#include "core/status.h"
#include "core/tensor.h"

namespace ls::h3 {

struct H3Config;
struct TensorSpec;
struct TensorInfo;

// One quantised linear <m> of a checkpoint.
struct LinearQuant {
  WeightFormat format = WeightFormat::bf16;
  int64_t group = 0;                       // int8_convrot: the ConvRot group G (power of 4 dividing K)
  std::vector<int64_t> scale_shape;        // <m>.weight_scale as stored: int8 [N, 1] | [N]; fp8 [] | [1]
  bool has_input_scale = false;            // fp8: <m>.input_scale present
  std::vector<int64_t> input_scale_shape;  // [] | [1]
  float input_scale = 1.0f;                // fp8: its value (read on the host at open), else 1
  std::string comfy_quant;                 // the <m>.comfy_quant JSON bytes ("" = the file has none)
  DType comfy_quant_dtype = DType::u8;     // as stored (U8; some writers use I8)
  bool dynamic_act = false;                // fp8: per-row amax/448 activation scale (LinearWeight::dynamic_act;
                                           // an engine option, never from a file)
};

struct QuantLayout {
  // "<m>" without ".weight" (e.g. "blocks.3.attn.qkv_proj") -> its format. Empty: bf16 model.
  std::map<std::string, LinearQuant> linears;
  // ComfyUI's mixed-precision ops are in force (any .comfy_quant in the file, or a
  // synthetic quantised model): declared-f32 Linear weights and biases are held as bf16.
  bool mixed_ops = false;
  bool any() const { return !linears.empty(); }
  const LinearQuant* find(const std::string& linear) const;
};

// Whether `spec`'s values are rounded to bf16 (and widened back to its declared f32)
// under layout `q`: mixed_ops, declared f32, a Linear parameter (not adaln_t_table,
// rope.inv_freq or a quantisation side tensor).
bool held_as_bf16(const QuantLayout& q, const TensorSpec& spec);

// The linears a checkpoint may hold quantised (their inputs are bf16 activations):
// blocks.N.{attn.qkv_proj, attn.out_proj, mlp.fc1, mlp.fc2}, blocks.N.adaln_proj.linear
// (unpruned form only: the curve form feeds it fp32), token_refiner.blocks.N.{same 4}.
bool quantisable_linear(const H3Config& cfg, const std::string& linear);

// The per-layer formats of a checkpoint (tensor names with cfg.key_prefix). `read`
// returns the bytes of a tensor (full name), for the .comfy_quant JSON and the fp8
// input_scale values. Errors (invalid_file / unsupported) name the tensor and what is
// wrong: bad JSON, an unknown or unsupported format (by name), a group that is not a
// power of 4 dividing K, a weight_scale of the wrong shape or dtype, an int8 weight
// without a weight_scale or without a .comfy_quant, a quantised tensor the engine cannot
// run quantised, legacy scaled-fp8 markers (.scale_weight / .scale_input / scaled_fp8).
using TensorBytesReader = std::function<std::vector<uint8_t>(const std::string& full_name)>;
Expected<QuantLayout> detect_quant_layout(const H3Config& cfg, const std::vector<TensorInfo>& tensors,
                                          const TensorBytesReader& read);

// The LinearWeight of linear <m> ("blocks.3.mlp.fc2") from a getter of device views,
// with the format of cfg.quant: bf16 (only <m>.weight), int8 (weight_scale viewed as
// f32 [N]) or fp8 (weight_scale f32 [1], input_scale from the layout).
// (Declared in block.h next to the WeightGetter: h3_linear_weight.)

// ---- synthetic quantised models (make-model --format, --random-weights --format) ----
enum class SyntheticFormat : uint8_t {
  bf16,               // the plain synthetic model
  int8_convrot,       // Comfy-Org "pruned" int8: the 4 big linears of every block (200 in h3)
  int8_convrot_full,  // the full int8 files: + blocks.N.adaln_proj.linear at G = 64 (250 in h3)
  fp8,                // Comfy-Org fp8_scaled: the 4 big linears, scalar scales, input_scale on qkv/out/fc1
  // the community int8 "_skip_edges" builds: int8_convrot except blocks 0, 1, L-2, L-1,
  // which stay bf16 (blocks of two layouts in one file: the weight store's per-block slots)
  int8_convrot_skip_edges,
};
// "bf16", "int8-convrot", "int8-convrot-full", "int8-convrot-skip-edges", "fp8" (also "int8_convrot", ...).
Expected<SyntheticFormat> parse_synthetic_format(const std::string& name);
const char* synthetic_format_name(SyntheticFormat f);
// The layout of a synthetic model of format f (unsupported when a K admits no group, or
// int8-convrot-full in the curve form). G = 256 where K % 256 == 0 (every linear of the
// real model), else the largest power of 4 below 256 dividing K (tiny/small presets).
// bf16_blocks: blocks left in bf16 whatever f says (make-model --bf16-blocks; invalid_argument
// for an index outside 0..L-1); int8_convrot_skip_edges adds skip_edges_blocks(L).
Expected<QuantLayout> synthetic_quant_layout(const H3Config& cfg, SyntheticFormat f,
                                             const std::vector<int64_t>& bf16_blocks = {});
// The blocks a "_skip_edges" build keeps in bf16: 0, 1, L-2, L-1 (those that exist, once each).
std::vector<int64_t> skip_edges_blocks(int64_t num_layers);
// The fixed static activation scale of the synthetic fp8 files' qkv/out/fc1: 8/448
// (saturates |x| > 8; not a power of two, so the division is exercised).
constexpr float kSyntheticFp8InputScale = 8.0f / 448.0f;

// Values of synthetic tensor `spec` of config `cfg` (cfg.quant from
// synthetic_quant_layout) for elements [begin, begin + count): plain tensors as
// fill_synthetic (rounded through bf16 when held_as_bf16), a quantised weight / its
// weight_scale / input_scale / comfy_quant from the bf16 synthetic weight of the same
// name. int8 weights: begin and count whole rows (multiples of K). fp8 weights need the
// tensor's scale: pass fp8_weight_scale (synthetic_fp8_weight_scale) or null to compute it.
void fill_synthetic_tensor(const H3Config& cfg, const TensorSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                           void* out, const float* fp8_weight_scale = nullptr);
// s_w of a synthetic fp8 weight (its bf16 synthetic values' amax / 448), in pieces.
float synthetic_fp8_weight_scale(const TensorSpec& bf16_spec, uint64_t seed);

// ---- the quantisers (one definition: synthetic files, --precision fp8, tests) ---------
// int8 ConvRot weight rows, as the published files were made (kitchen's eager
// quantize_int8_convrot_weight): v = the fp32 rotation of each group of G values of the
// row (hadamard_f32, core/hadamard.h: kitchen rotates with an fp32 matmul, whose sums may
// round differently in the last bit; the int8 codes can differ only where v / s lands on
// a .5 tie), s = max(fl32(max|v| / 127), 1e-30), q = clamp(rint(fl32(v / s)), -128, 127).
//   w: bf16 [rows, K]; q: i8 [rows, K]; scale: f32 [rows].
void quantise_int8_convrot_rows(const uint16_t* w, int64_t rows, int64_t K, int64_t G, int8_t* q, float* scale);
// fp8 e4m3 per-tensor weight scale from the amax of |w| (exact over bf16 values):
// fl32(amax / 448); 1 when amax is 0 (an all-zero weight).
float fp8_scale_from_amax(float amax);
// q[i] = e4m3_rn_sat(clamp(fl32(w[i] / s), -448, 448)), IEEE division. w bf16 [n].
void quantise_fp8(const uint16_t* w, int64_t n, float s, uint8_t* q);
// max |w| over bf16 w [n] (exact).
float bf16_amax(const uint16_t* w, int64_t n);

// ---- --precision fp8 (lossy, opt-in; spec §3.2) -----------------------------------------
class H3TensorSource;
// A source that reads `inner` and converts its bf16 attn.qkv_proj, mlp.fc1 and mlp.fc2
// weights of every DiT block to fp8 e4m3 once, on first use (per-tensor s_w = fl32(amax /
// 448), q = e4m3_rn_sat(clamp(fl32(w / s_w), +-448)), activations at scale 1: what
// Zironic's node does on the GPU every block call, done once here). Layers inner already
// holds quantised are kept as they are; out_proj is not converted. cfg() gains the fp8
// layers (mixed_ops unchanged: the fp32 islands of a bf16 model stay fp32). describe()
// says "lossy". Host memory: one converted copy per weight, released with release().
// dynamic_activations: the converted layers quantise activations with a per-row scale
// fl32(max|x_r| / 448) instead of 1 (LinearWeight::dynamic_act: row-independent, no
// clipping of outlier channels, not ComfyUI's numerics); for a second, clearly named
// option ("--precision fp8-dynamic").
std::unique_ptr<H3TensorSource> fp8_convert_source(std::unique_ptr<H3TensorSource> inner,
                                                   bool dynamic_activations = false);

}  // namespace ls::h3
