// Numerics: every setting that may change output bits, in one struct (DESIGN.md §1).
// Memory knobs (slices, budgets, residency, offload) are NOT here: they never change a
// bit. Everything here may, like the seed of a sampler, so it comes in with the params
// (never from the environment: nothing under src/ reads one), is handed to the backend
// (Backend::set_numerics), printed in the status line and stored in every JSON report
// and output file's metadata (describe / to_json of Backend::numerics(), the RESOLVED
// settings).
//
// Defaults per backend (Backend::numerics() after resolution; docs/numerics.md, "The
// numerics settings"):
//   CPU:  attention native (the reference), kv_tile 1024, fp32 GEMM lanes16; the CUDA
//         kernel knobs must stay at their defaults (refused otherwise).
//   CUDA: attention hopper for a model of head dim 128 on an sm_90 device in a build with
//         the Hopper kernel (Backend::set_model_head_dim, called by Session::load_weights;
//         kv_tile 8192), else cudnn where the build has cuDNN (kv_tile 8192), else native
//         (kv_tile 1024; native_variant "4x2"); fp32 GEMMs lanes16 (the CPU reference's
//         order, so the CPU's bytes); bf16 GEMMs the heuristic's first admissible
//         cuBLASLt algorithm per shape; cuDNN: 2048 queries per call, graph form auto.
//
// Usage:
//   ls::Numerics n;                        // every field at "the backend's default"
//   n.attention = ls::AttentionAlgorithm::native;
//   LS_TRY(backend.set_numerics(n, {}));   // validated; refused if it cannot be honoured
//   std::string line = ls::describe(backend.numerics());  // "attention native, kv_tile 1024, ..."
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace ls {

enum class AttentionAlgorithm {
  backend_default,  // resolved by the backend: cudnn where built (CUDA), else native
  native,           // the built-in flash kernel (CUDA) / the reference (CPU)
  cudnn,            // cuDNN's fused SDPA, one call per key tile, tiles merged in fp32 (CUDA + cuDNN)
  hopper,           // the sm_90a kernel (TMA, wgmma, warp-specialised), head dim 128 (CUDA on Hopper)
  int8,             // INT8 Q/K/V, u8 P, rotated + centred K, fp32 softmax (docs/int8-attention.md; CPU, CUDA sm_80+)
};

enum class GemmF32Order {
  lanes16,   // the CPU reference's order: 16 lanes, then a fixed tree (CUDA gives the CPU's bytes)
  cublaslt,  // pinned cuBLASLt / SIMT path (CUDA only; another order, other bits)
};

struct Numerics {
  AttentionAlgorithm attention = AttentionAlgorithm::backend_default;
  int64_t kv_tile = 0;  // keys per attention tile; 0 = the resolved algorithm's default
  GemmF32Order gemm_f32 = GemmF32Order::lanes16;
  // Developer / experiment knobs of the CUDA kernels; each may change bits.
  std::string native_variant;      // native kernel warp layout: "" (= "4x2", the default), "4x1", "8x1"
  int64_t cudnn_q_chunk = 2048;    // cuDNN path: queries per staged chunk, multiple of 64 in [64, 65536]
  std::string cudnn_form;          // cuDNN graph form: "" (auto), "unified", "composite", "composite-f32p"
  int64_t cudnn_skip_configs = 0;  // cuDNN: skip the first N heuristic engine configs
  std::map<int64_t, int> gemm_candidate;  // K -> cuBLASLt candidate index (-1 key: every K); empty = heuristic's first

  bool operator==(const Numerics&) const = default;
};

// Diagnostics that never change a bit (logging only).
struct Diagnostics {
  bool gemm_verbose = false;   // print each GEMM pin
  bool cudnn_verbose = false;  // print cuDNN graph building steps

  bool operator==(const Diagnostics&) const = default;
};

// The default cuDNN query chunk (Numerics::cudnn_q_chunk) and native kernel variant
// (what Numerics::native_variant "" resolves to on CUDA).
constexpr int64_t kDefaultCudnnQChunk = 2048;
constexpr const char* kDefaultNativeVariant = "4x2";
// The largest kv_tile of attention int8: 255 * 127 * 65536 < 2^31 (docs/int8-attention.md §4.4).
constexpr int64_t kInt8MaxKvTile = 65536;
// The default kv_tile of attention int8 on every backend: the CUDA kernels fold the
// softmax state once per 128-key block, so 128 is the one tile they run (docs/int8-attention.md §7).
constexpr int64_t kInt8DefaultKvTile = 128;
// The statistics block of attention int8 (contract v3, docs/int8-attention.md §1-§3): V's
// per-channel scale is taken per absolute block of this many keys (keys [4096 b, 4096 (b + 1))
// of the sequence), and K's centre over block 0, so a block's keys can be quantised as soon
// as the block's own keys have been seen. A key range that crosses a block boundary needs
// a kv_tile dividing it (tiles never straddle blocks).
constexpr int64_t kInt8StatBlock = 4096;
// K's scale groups of attention int8 (contract v4, docs/int8-attention.md §3): key j (absolute)
// is in group (j / 128, j % 8), the 16 keys of one 128-key tile that share j % 8 (fewer in the
// sequence's last, partial tile); they share one scale sk, the row scale of the group's largest
// |y|. Those are exactly the keys whose scores one thread of the CUDA kernels' MMA fragments
// holds together (key % 8 in {2t, 2t + 1}), so a thread needs 2-4 scales per tile, and the
// score is one FFMA of the integer dot product (docs §4.2). A prepare call starts at a multiple
// of kInt8KeyGroupTile and covers whole tiles, but for the sequence's last.
constexpr int64_t kInt8KeyGroupTile = 128;
constexpr int64_t kInt8KeyGroupStride = 8;
// The number of statistics blocks of a sequence of S keys (at least 1).
constexpr int64_t int8_stat_blocks(int64_t S) { return S <= kInt8StatBlock ? 1 : (S + kInt8StatBlock - 1) / kInt8StatBlock; }

const char* to_string(AttentionAlgorithm a);  // "auto", "native", "cudnn", "hopper", "int8"
const char* to_string(GemmF32Order g);        // "lanes16", "cublaslt"

// Names as the CLI and the C API spell them. invalid_argument with the accepted names.
Expected<AttentionAlgorithm> parse_attention(const std::string& s);  // "auto" | "native" | "cudnn" | "hopper" | "int8"
Expected<GemmF32Order> parse_gemm_f32(const std::string& s);         // "lanes16" | "cublaslt"
// "i" (every K) or "K:i,K:i" (GEMMs with that K; "*:i" every other K); "" = none.
Expected<std::map<int64_t, int>> parse_gemm_candidate(const std::string& s);
std::string format_gemm_candidate(const std::map<int64_t, int>& m);  // inverse of parse_gemm_candidate

// invalid_argument (a message naming the field, the value and what is accepted) unless
// every field is in range on some backend: kv_tile 0 (the default) or >= 1 (int8: <= 65536);
// cudnn_q_chunk a multiple of 64 in [64, 65536]; native_variant "", "4x2", "4x1" or
// "8x1"; cudnn_form "", "unified", "composite" or "composite-f32p"; cudnn_skip_configs
// >= 0; gemm_candidate keys K >= 1 or -1, indices >= 0; enums in range. Whether a
// backend can honour the settings is Backend::set_numerics's question.
Status validate(const Numerics& n);

// One line: "attention cudnn, kv_tile 8192, fp32 GEMM lanes16" (+ every CUDA knob that
// differs from its default: "native variant 4x1", "cudnn q_chunk 1024", "cudnn form
// composite", "cudnn skip 2 configs", "gemm candidate 5376:1").
std::string describe(const Numerics& n);

// The developer variables of the front-ends (the CLI, the benchmarks), mapped onto the
// struct in ONE place. The library never reads the environment: `lookup` is the caller's
// (the C library lookup, in cli/ and bench/ only); it returns null for an unset variable, and an empty
// value counts as unset. Each variable used is appended to `used` as "NAME=value":
//   LAYERSTREAM_ATTENTION      auto|native|cudnn|hopper|int8 -> attention
//   LAYERSTREAM_GEMM_F32       lanes16|cublaslt           -> gemm_f32
//   LAYERSTREAM_ATTN_VARIANT   4x2|4x1|8x1                -> native_variant
//   LAYERSTREAM_CUDNN_QCHUNK   multiple of 64 in [64, 65536] -> cudnn_q_chunk
//   LAYERSTREAM_CUDNN_FORM     unified|composite|composite-f32p -> cudnn_form
//   LAYERSTREAM_CUDNN_CONFIG   N in [0, 1000]             -> cudnn_skip_configs
//   LAYERSTREAM_GEMM_CANDIDATE i | K:i,K:i                -> gemm_candidate
//   LAYERSTREAM_GEMM_VERBOSE, LAYERSTREAM_CUDNN_VERBOSE (not "0") -> Diagnostics
// `skip` names variables to leave alone (the CLI's --attention / --gemm-f32 given).
// invalid_argument naming the variable for a value outside its set.
using VariableLookup = std::function<const char*(const char*)>;
Status apply_developer_variables(const VariableLookup& lookup, Numerics* n, Diagnostics* d,
                                 std::vector<std::string>* used, const std::vector<std::string>& skip = {});

// Every field, by name (nlohmann's ADL hook: `nlohmann::json j = numerics;`):
//   {"attention": "cudnn", "kv_tile": 8192, "gemm_f32": "lanes16", "native_variant": "",
//    "cudnn_q_chunk": 2048, "cudnn_form": "", "cudnn_skip_configs": 0, "gemm_candidate": ""}
void to_json(nlohmann::json& j, const Numerics& n);
void to_json(nlohmann::json& j, const Diagnostics& d);

}  // namespace ls
