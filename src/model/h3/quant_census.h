// The quantisation census of a model (`layerstream info`, the node's status line, the
// API's info): quantised linears by format and ConvRot group, and the bytes the engine
// holds per dtype (from the tensor table, h3_tensor_specs: declared dtypes, which is
// what the weight store uploads; a quantised file's f16 AdaLN counts as its declared f32).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/h3/config.h"

namespace ls::h3 {

struct QuantCensus {
  struct Linears {
    std::string format;   // "int8_convrot", "fp8_e4m3"
    int64_t group = 0;    // int8: G; fp8: 0
    int64_t count = 0;    // linears
    int64_t with_input_scale = 0;  // fp8: how many carry a static input_scale
    uint64_t weight_bytes = 0;     // their weights + weight_scale tensors
  };
  std::vector<Linears> quantised;  // by (format, group), ascending
  int64_t plain_linears = 0;       // linear weights kept in float (bf16 / f32)
  bool mixed_ops = false;          // ComfyUI's mixed ops: declared-f32 linears held as bf16
  struct Bytes {
    std::string dtype;  // "bf16", "f32", "i8", "f8e4m3", "u8"
    int64_t tensors = 0;
    uint64_t bytes = 0;
  };
  std::vector<Bytes> by_dtype;  // every tensor of the table, by declared dtype (descending bytes)
  uint64_t total_bytes = 0;
};
QuantCensus quant_census(const H3Config& cfg);

// "bf16", "int8_convrot g256", "int8_convrot g256+g64", "fp8_e4m3", "int8_convrot g256 + fp8_e4m3".
std::string checkpoint_format_label(const QuantCensus& c);
// Lines for `info`, each starting with two spaces:
//   format: int8_convrot g256+g64 (250 quantised linears, 2 plain; ComfyUI mixed ops: f32 linears held as bf16)
//   int8_convrot g256: 200 linears, 1.2 GiB
//   bytes: i8 17.9 GiB (200 tensors), bf16 ..., f32 ...
std::string quant_census_text(const QuantCensus& c);
// {"format": label, "mixed_ops": b, "plain_linears": n,
//  "quantised": [{"format", "group", "linears", "with_input_scale", "weight_bytes"}],
//  "bytes_by_dtype": [{"dtype", "tensors", "bytes"}], "total_bytes": n}
nlohmann::ordered_json quant_census_json(const QuantCensus& c);

}  // namespace ls::h3
