// Quantised H3 checkpoints, the model side (see quant.h).
#include "model/h3/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "core/dtype.h"
#include "core/hadamard.h"
#include "core/thread_pool.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"

namespace ls::h3 {

namespace {

bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool starts_with(const std::string& s, std::string_view p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// "blocks.N.<suffix>" / "token_refiner.blocks.N.<suffix>": the suffix, or "" when the
// name is neither (or N is not a block index the config has).
std::string block_suffix(const H3Config& cfg, const std::string& linear, bool* refiner) {
  for (const auto& [prefix, count, is_ref] :
       {std::tuple<const char*, int64_t, bool>{"blocks.", cfg.num_layers, false},
        std::tuple<const char*, int64_t, bool>{"token_refiner.blocks.", cfg.refiner_layers, true}}) {
    if (!starts_with(linear, prefix)) continue;
    const size_t a = std::string_view(prefix).size(), dot = linear.find('.', a);
    if (dot == std::string::npos || dot == a) return "";
    int64_t n = 0;
    for (size_t i = a; i < dot; ++i) {
      if (linear[i] < '0' || linear[i] > '9' || n > 1000000) return "";
      n = n * 10 + (linear[i] - '0');
    }
    if (n >= count) return "";
    *refiner = is_ref;
    return linear.substr(dot + 1);
  }
  return "";
}

constexpr const char* kBigLinears[] = {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"};

}  // namespace

const LinearQuant* QuantLayout::find(const std::string& linear) const {
  auto it = linears.find(linear);
  return it == linears.end() ? nullptr : &it->second;
}

bool held_as_bf16(const QuantLayout& q, const TensorSpec& s) {
  if (!q.mixed_ops || s.dtype != DType::f32) return false;
  if (s.role == TensorRole::adaln_table || s.role == TensorRole::rope) return false;  // buffers stay fp32
  return !(ends_with(s.name, ".weight_scale") || ends_with(s.name, ".input_scale"));
}

bool quantisable_linear(const H3Config& cfg, const std::string& linear) {
  bool refiner = false;
  const std::string suffix = block_suffix(cfg, linear, &refiner);
  if (suffix.empty()) return false;
  for (const char* b : kBigLinears)
    if (suffix == b) return true;
  return !refiner && suffix == "adaln_proj.linear" && !cfg.curve_form();
}

// ---- detection ------------------------------------------------------------------------

namespace {

// One quantised layer <m> being detected: its tensors (null where absent) and the two
// refusals, each naming the layer.
struct QuantLayer {
  const std::string& pre;
  const std::string& m;
  const TensorInfo* w;
  const TensorInfo* sc;
  const TensorInfo* cq;
  const TensorInfo* is;
  Error bad(const std::string& msg) const {
    return make_error(ErrorCode::invalid_file, "quantised layer " + pre + m + ": " + msg);
  }
  Error unsupported(const std::string& msg) const {
    return make_error(ErrorCode::unsupported, "quantised layer " + pre + m + ": " + msg);
  }
};

// What <m>.comfy_quant says (stored into lq.comfy_quant*), or without one what the
// weight's dtype implies (fp8 files may carry none).
struct QuantFields {
  std::string format;
  int64_t group = 256;
  bool convrot = false;
};
Expected<QuantFields> quant_fields(const QuantLayer& l, LinearQuant& lq, const TensorBytesReader& read) {
  const std::string& pre = l.pre;
  const std::string& m = l.m;
  const TensorInfo* cq = l.cq;
  const TensorInfo* w = l.w;
  QuantFields q;
  if (cq) {
    if (cq->dtype != DType::u8 && cq->dtype != DType::i8)
      return l.bad("comfy_quant is stored as " + std::string(dtype_name(cq->dtype)) + ", expected U8 (JSON bytes)");
    if (cq->shape.size() != 1) return l.bad("comfy_quant has shape " + shape_string(cq->shape) + ", expected [len]");
    lq.comfy_quant_dtype = cq->dtype;
    const std::vector<uint8_t> bytes = read(pre + m + ".comfy_quant");
    lq.comfy_quant.assign(bytes.begin(), bytes.end());
    nlohmann::json j = nlohmann::json::parse(lq.comfy_quant, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return l.bad("comfy_quant is not a JSON object: '" + lq.comfy_quant.substr(0, 80) + "'");
    auto f = j.find("format");
    if (f == j.end() || !f->is_string()) return l.bad("comfy_quant has no \"format\" string: " + j.dump());
    q.format = f->get<std::string>();
    // convrot / convrot_groupsize / full_precision_matrix_mult at the top level or under "params".
    auto field = [&](const char* name) -> const nlohmann::json* {
      if (auto it = j.find(name); it != j.end()) return &*it;
      if (auto p = j.find("params"); p != j.end() && p->is_object())
        if (auto it = p->find(name); it != p->end()) return &*it;
      return nullptr;
    };
    if (const nlohmann::json* c = field("convrot")) {
      if (!c->is_boolean()) return l.bad("comfy_quant \"convrot\" is not a boolean: " + j.dump());
      q.convrot = c->get<bool>();
    }
    if (const nlohmann::json* g = field("convrot_groupsize")) {
      if (!g->is_number_integer()) return l.bad("comfy_quant \"convrot_groupsize\" is not an integer: " + j.dump());
      q.group = g->get<int64_t>();
    }
    if (const nlohmann::json* fp = field("full_precision_matrix_mult"); fp && fp->is_boolean() && fp->get<bool>())
      return l.unsupported("comfy_quant asks for full_precision_matrix_mult (dequantise and run in bf16), "
                           "which LayerStream does not implement");
  } else if (w->dtype == DType::f8e4m3) {
    q.format = "float8_e4m3fn";
  } else if (w->dtype == DType::i8) {
    return l.bad("int8 weight without " + pre + m + ".comfy_quant: the ConvRot rotation and group are unknown");
  } else {
    return l.bad("has a " + std::string(l.sc ? "weight_scale" : "input_scale") + " but its weight is " +
                 dtype_name(w->dtype) + " and there is no comfy_quant saying how it is quantised");
  }
  return q;
}

// The weight format of a comfy_quant format name (only the two the engine runs).
Expected<WeightFormat> weight_format_of(const QuantLayer& l, const QuantFields& q) {
  if (q.format == "int8_tensorwise") {
    if (!q.convrot)
      return l.unsupported("int8_tensorwise without ConvRot rotation is not supported (LayerStream runs the "
                           "ConvRot files: \"convrot\": true)");
    return WeightFormat::int8_convrot;
  }
  if (q.format == "float8_e4m3fn") return WeightFormat::fp8_e4m3;
  static const std::set<std::string> known = {"float8_e5m2",  "nvfp4",          "mxfp8",
                                              "convrot_w4a4", "asym_w4a8_int8", "awq_w4a16"};
  return l.unsupported((known.count(q.format) ? "format '" : "unknown format '") + q.format +
                       "' is not supported (supported: int8_tensorwise with convrot, float8_e4m3fn)");
}

// The int8 ConvRot layer's group and per-row scales [N, 1] | [N] (no input scale).
Status check_int8_scales(const QuantLayer& l, LinearQuant& lq, int64_t group, int64_t N, int64_t K) {
  const TensorInfo* sc = l.sc;
  if (!hadamard_group_ok(group) || K % group != 0)
    return l.bad("ConvRot group " + std::to_string(group) + " must be a power of 4 (4 .. " +
                 std::to_string(kMaxHadamardGroup) + ") dividing the weight's " + std::to_string(K) + " input features");
  lq.group = group;
  if (!sc) return l.bad("int8 weight without " + l.pre + l.m + ".weight_scale (f32 [" + std::to_string(N) + ", 1])");
  if (sc->dtype != DType::f32) return l.bad("weight_scale is " + std::string(dtype_name(sc->dtype)) + ", expected F32");
  const bool per_row = sc->shape == std::vector<int64_t>{N, 1} || sc->shape == std::vector<int64_t>{N};
  if (!per_row)
    return l.bad("weight_scale has shape " + shape_string(sc->shape) + ", expected [" + std::to_string(N) +
                 ", 1] (one scale per output row of the " + shape_string(l.w->shape) + " weight)" +
                 (numel_of(sc->shape) == 1 ? "; a per-tensor scale is not supported with ConvRot" : ""));
  lq.scale_shape = sc->shape;
  if (l.is) return l.bad("an int8 layer has an input_scale (activations are quantised per row)");
  return Status();
}

// The fp8 layer's per-tensor weight scale and optional static input scale (read here).
Status check_fp8_scales(const QuantLayer& l, LinearQuant& lq, const TensorBytesReader& read) {
  const TensorInfo* sc = l.sc;
  const TensorInfo* is = l.is;
  if (!sc) return l.bad("fp8 weight without " + l.pre + l.m + ".weight_scale (f32 scalar)");
  if (sc->dtype != DType::f32) return l.bad("weight_scale is " + std::string(dtype_name(sc->dtype)) + ", expected F32");
  if (numel_of(sc->shape) != 1 || sc->shape.size() > 1)
    return l.bad("weight_scale has shape " + shape_string(sc->shape) +
                 ", expected a per-tensor scalar ([] or [1]; per-row fp8 scales are not supported)");
  lq.scale_shape = sc->shape;
  if (is) {
    if (is->dtype != DType::f32 || numel_of(is->shape) != 1 || is->shape.size() > 1)
      return l.bad("input_scale is " + std::string(dtype_name(is->dtype)) + " " + shape_string(is->shape) +
                   ", expected an F32 scalar");
    const std::vector<uint8_t> b = read(l.pre + l.m + ".input_scale");
    LS_CHECK(b.size() == 4);
    float v;
    std::memcpy(&v, b.data(), 4);
    if (!(std::isfinite(v) && v > 0.0f))
      return l.bad("input_scale is " + std::to_string(v) + ", expected a positive finite number");
    lq.has_input_scale = true;
    lq.input_scale_shape = is->shape;
    lq.input_scale = v;
  }
  return Status();
}

// One quantised layer <m>: its format, where it may run, its weight and scales.
Expected<LinearQuant> detect_linear(const H3Config& cfg, const QuantLayer& l, const TensorBytesReader& read) {
  const std::string& m = l.m;
  const TensorInfo* w = l.w;
  if (!w) return l.bad("has quantisation tensors but no " + l.pre + m + ".weight");
  LinearQuant lq;
  LS_ASSIGN_OR_RETURN(const QuantFields q, quant_fields(l, lq, read));
  LS_ASSIGN_OR_RETURN(lq.format, weight_format_of(l, q));
  if (!quantisable_linear(cfg, m))
    return l.unsupported(std::string("LayerStream runs quantised weights only in the block linears "
                                     "(attn.qkv_proj, attn.out_proj, mlp.fc1, mlp.fc2 of the DiT and refiner "
                                     "blocks) and blocks.N.adaln_proj.linear of the unpruned form") +
                         (cfg.curve_form() && ends_with(m, "adaln_proj.linear")
                              ? " (this file is in the curve form: its AdaLN input is fp32)"
                              : ""));
  if (w->shape.size() != 2) return l.bad("weight has shape " + shape_string(w->shape) + ", expected [N, K]");
  const int64_t N = w->shape[0], K = w->shape[1];
  const DType want = lq.format == WeightFormat::int8_convrot ? DType::i8 : DType::f8e4m3;
  if (w->dtype != want)
    return l.bad("weight is stored as " + std::string(dtype_name(w->dtype)) + ", but comfy_quant says " + q.format +
                 " (" + dtype_safetensors_name(want) + ")");
  if (lq.format == WeightFormat::int8_convrot) LS_TRY(check_int8_scales(l, lq, q.group, N, K));
  else LS_TRY(check_fp8_scales(l, lq, read));
  return lq;
}

}  // namespace

Expected<QuantLayout> detect_quant_layout(const H3Config& cfg, const std::vector<TensorInfo>& tensors,
                                          const TensorBytesReader& read) {
  const std::string& pre = cfg.key_prefix;
  std::map<std::string, const TensorInfo*> keys;  // stripped
  for (const TensorInfo& t : tensors) {
    if (t.name == "scaled_fp8" || ends_with(t.name, ".scaled_fp8") || ends_with(t.name, ".scale_weight") ||
        ends_with(t.name, ".scale_input"))
      return make_error(ErrorCode::unsupported,
                        "legacy scaled-fp8 checkpoint (found " + t.name +
                            "): its .scale_weight / .scale_input layout is not supported; convert it to ComfyUI's "
                            "current layout (.weight_scale / .input_scale / .comfy_quant), as ComfyUI's "
                            "convert_old_quants does at load, and save it again");
    if (starts_with(t.name, pre)) keys[t.name.substr(pre.size())] = &t;
  }
  auto info = [&](const std::string& k) -> const TensorInfo* {
    auto it = keys.find(k);
    return it == keys.end() ? nullptr : it->second;
  };

  // The quantised layers: every <m>.comfy_quant, every <m>.weight_scale, and every
  // I8 / F8_E4M3 <m>.weight.
  std::set<std::string> layers;
  for (const auto& [k, t] : keys) {
    if (ends_with(k, ".comfy_quant")) layers.insert(k.substr(0, k.size() - 12));
    else if (ends_with(k, ".weight_scale")) layers.insert(k.substr(0, k.size() - 13));
    else if (ends_with(k, ".input_scale")) layers.insert(k.substr(0, k.size() - 12));
    else if (ends_with(k, ".weight") && (t->dtype == DType::i8 || t->dtype == DType::f8e4m3))
      layers.insert(k.substr(0, k.size() - 7));
  }

  QuantLayout q;
  for (const std::string& m : layers) {
    const QuantLayer l{pre, m, info(m + ".weight"), info(m + ".weight_scale"), info(m + ".comfy_quant"),
                       info(m + ".input_scale")};
    LS_ASSIGN_OR_RETURN(LinearQuant lq, detect_linear(cfg, l, read));
    q.linears.emplace(m, std::move(lq));
  }
  // ComfyUI loads the whole model with its mixed-precision ops when any layer carries a
  // comfy_quant (quant.h); fp8 files without one get the same policy here (they are
  // ComfyUI fp8_scaled files).
  q.mixed_ops = q.any();
  return q;
}

// ---- synthetic layouts ----------------------------------------------------------------

Expected<SyntheticFormat> parse_synthetic_format(const std::string& name) {
  std::string n = name;
  std::replace(n.begin(), n.end(), '_', '-');
  if (n == "bf16") return SyntheticFormat::bf16;
  if (n == "int8-convrot" || n == "int8") return SyntheticFormat::int8_convrot;
  if (n == "int8-convrot-full" || n == "int8-full") return SyntheticFormat::int8_convrot_full;
  if (n == "int8-convrot-skip-edges" || n == "int8-skip-edges") return SyntheticFormat::int8_convrot_skip_edges;
  if (n == "fp8" || n == "fp8-e4m3" || n == "fp8-scaled") return SyntheticFormat::fp8;
  return make_error(ErrorCode::invalid_argument, "unknown weight format '" + name +
                                                     "' (valid: bf16, int8-convrot, int8-convrot-full, "
                                                     "int8-convrot-skip-edges, fp8)");
}

const char* synthetic_format_name(SyntheticFormat f) {
  switch (f) {
    case SyntheticFormat::bf16: return "bf16";
    case SyntheticFormat::int8_convrot: return "int8-convrot";
    case SyntheticFormat::int8_convrot_full: return "int8-convrot-full";
    case SyntheticFormat::int8_convrot_skip_edges: return "int8-convrot-skip-edges";
    case SyntheticFormat::fp8: return "fp8";
  }
  return "?";
}

std::vector<int64_t> skip_edges_blocks(int64_t num_layers) {
  std::vector<int64_t> b;
  for (int64_t i : {int64_t{0}, int64_t{1}, num_layers - 2, num_layers - 1})
    if (i >= 0 && i < num_layers && std::find(b.begin(), b.end(), i) == b.end()) b.push_back(i);
  return b;
}

Expected<QuantLayout> synthetic_quant_layout(const H3Config& cfg, SyntheticFormat f,
                                             const std::vector<int64_t>& bf16_blocks) {
  if (f == SyntheticFormat::int8_convrot_skip_edges) {
    std::vector<int64_t> b = skip_edges_blocks(cfg.num_layers);
    b.insert(b.end(), bf16_blocks.begin(), bf16_blocks.end());
    return synthetic_quant_layout(cfg, SyntheticFormat::int8_convrot, b);
  }
  for (int64_t b : bf16_blocks)
    if (b < 0 || b >= cfg.num_layers)
      return make_error(ErrorCode::invalid_argument, "bf16 block " + std::to_string(b) + " is not a block of this model (0.." +
                                                         std::to_string(cfg.num_layers - 1) + ")");
  QuantLayout q;
  if (f == SyntheticFormat::bf16) return q;
  const int64_t D = cfg.hidden, I = cfg.inner(), F = cfg.ffn;
  if (f == SyntheticFormat::int8_convrot_full && cfg.curve_form())
    return make_error(ErrorCode::unsupported,
                      "int8-convrot-full quantises blocks.N.adaln_proj.linear, which the curve (pruned) form feeds "
                      "fp32; use int8-convrot with the curve form");
  auto int8 = [&](const std::string& m, int64_t N, int64_t K, int64_t G) -> Status {
    if (G == 0) {
      for (int64_t g : {256, 64, 16, 4})
        if (K % g == 0) {
          G = g;
          break;
        }
    }
    if (G == 0 || K % G != 0)
      return Status(make_error(ErrorCode::unsupported, "int8 ConvRot: " + m + " has " + std::to_string(K) +
                                                           " input features, which no ConvRot group divides"));
    LinearQuant l;
    l.format = WeightFormat::int8_convrot;
    l.group = G;
    l.scale_shape = {N, 1};
    l.comfy_quant = "{\"format\":\"int8_tensorwise\",\"convrot\":true,\"convrot_groupsize\":" + std::to_string(G) + "}";
    q.linears.emplace(m, std::move(l));
    return Status();
  };
  for (int64_t b = 0; b < cfg.num_layers; ++b) {
    if (std::find(bf16_blocks.begin(), bf16_blocks.end(), b) != bf16_blocks.end()) continue;  // kept in bf16
    const std::string p = "blocks." + std::to_string(b) + ".";
    const std::pair<std::string, std::pair<int64_t, int64_t>> big[] = {{p + "attn.qkv_proj", {3 * I, D}},
                                                                         {p + "attn.out_proj", {D, I}},
                                                                         {p + "mlp.fc1", {2 * F, D}},
                                                                         {p + "mlp.fc2", {D, F}}};
    for (const auto& [m, nk] : big) {
      if (f == SyntheticFormat::fp8) {
        LinearQuant l;
        l.format = WeightFormat::fp8_e4m3;
        l.scale_shape = {};
        l.comfy_quant = "{\"format\":\"float8_e4m3fn\"}";
        if (!ends_with(m, "mlp.fc2")) {  // as Comfy-Org's fp8_scaled file: no input_scale on fc2
          l.has_input_scale = true;
          l.input_scale_shape = {};
          l.input_scale = kSyntheticFp8InputScale;
        }
        q.linears.emplace(m, std::move(l));
      } else {
        LS_TRY(int8(m, nk.first, nk.second, 0));
      }
    }
    if (f == SyntheticFormat::int8_convrot_full) LS_TRY(int8(p + "adaln_proj.linear", 18 * D, cfg.time_embed_dim, 64));
  }
  q.mixed_ops = true;
  return q;
}

// ---- quantisers -----------------------------------------------------------------------

void quantise_int8_convrot_rows(const uint16_t* w, int64_t rows, int64_t K, int64_t G, int8_t* q, float* scale) {
  LS_CHECK(K % G == 0);
  std::vector<float> v(static_cast<size_t>(K)), tmp(static_cast<size_t>(G));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* wr = w + r * K;
    for (int64_t k = 0; k < K; ++k) v[static_cast<size_t>(k)] = bf16_to_f32(wr[k]);
    for (int64_t g = 0; g < K; g += G) hadamard_f32(v.data() + g, tmp.data(), G);
    float amax = 0.0f;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    // Eager quantize_int8_rowwise on fp32 values: scale = (amax / 127) clamped to 1e-30;
    // the quotient is an fp32 IEEE division, rounded half to even (rint in the default mode).
    const float s = std::max(amax / 127.0f, 1e-30f);
    scale[r] = s;
    int8_t* qr = q + r * K;
    for (int64_t k = 0; k < K; ++k) {
      const float t = std::nearbyint(v[static_cast<size_t>(k)] / s);
      qr[k] = static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, t)));
    }
  }
}

float fp8_scale_from_amax(float amax) { return amax > 0.0f ? amax / 448.0f : 1.0f; }

// Element-wise, so split over the thread pool (50 H3 blocks are 19 G weights: one core
// takes minutes); the bytes do not depend on the split.
void quantise_fp8(const uint16_t* w, int64_t n, float s, uint8_t* q) {
  parallel_for(n, int64_t{1} << 16, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const float x = bf16_to_f32(w[i]) / s;
      q[i] = f32_to_f8e4m3(std::min(448.0f, std::max(-448.0f, x)));  // NaN stays NaN (0x7f)
    }
  });
}

// max(a, NaN) keeps a, so NaNs are skipped and the max of the rest is exact in any order:
// per-range maxima combine to the serial result.
float bf16_amax(const uint16_t* w, int64_t n) {
  std::mutex mu;
  float amax = 0.0f;
  parallel_for(n, int64_t{1} << 16, [&](int64_t a, int64_t b) {
    float m = 0.0f;
    for (int64_t i = a; i < b; ++i) m = std::max(m, std::fabs(bf16_to_f32(w[i])));
    std::lock_guard<std::mutex> lk(mu);
    amax = std::max(amax, m);
  });
  return amax;
}

// ---- synthetic tensors ----------------------------------------------------------------

namespace {
// The bf16 spec a quantised weight is made from (every quantisable linear is bf16 in the
// plain table).
TensorSpec bf16_spec_of(const TensorSpec& s) {
  TensorSpec b = s;
  b.dtype = DType::bf16;
  return b;
}
}  // namespace

float synthetic_fp8_weight_scale(const TensorSpec& bf16_spec, uint64_t seed) {
  const int64_t n = bf16_spec.numel(), piece = int64_t{1} << 22;
  std::vector<uint16_t> buf(static_cast<size_t>(std::min(n, piece)));
  float amax = 0.0f;
  for (int64_t a = 0; a < n; a += piece) {
    const int64_t c = std::min(piece, n - a);
    fill_synthetic(bf16_spec, seed, a, c, buf.data());
    amax = std::max(amax, bf16_amax(buf.data(), c));
  }
  return fp8_scale_from_amax(amax);
}

void fill_synthetic_tensor(const H3Config& cfg, const TensorSpec& s, uint64_t seed, int64_t begin, int64_t count,
                           void* out, const float* fp8_weight_scale) {
  LS_CHECK(begin >= 0 && count >= 0 && begin + count <= s.numel());
  auto linear_of = [&](std::string_view suffix) -> const LinearQuant* {
    if (!ends_with(s.name, suffix)) return nullptr;
    return cfg.quant.find(s.name.substr(0, s.name.size() - suffix.size()));
  };
  if (const LinearQuant* lq = linear_of(".comfy_quant")) {
    std::memcpy(out, lq->comfy_quant.data() + begin, static_cast<size_t>(count));
    return;
  }
  if (const LinearQuant* lq = linear_of(".input_scale")) {
    LS_CHECK(count <= 1);
    if (count == 1) std::memcpy(out, &lq->input_scale, 4);
    return;
  }
  const LinearQuant* wq = linear_of(".weight");
  const LinearQuant* sq = wq ? nullptr : linear_of(".weight_scale");
  if (!wq && !sq) {
    fill_synthetic(s, seed, begin, count, out);
    if (held_as_bf16(cfg.quant, s)) {
      float* o = static_cast<float*>(out);
      for (int64_t i = 0; i < count; ++i) o[i] = round_bf16(o[i]);
    }
    return;
  }
  const std::string m = s.name.substr(0, s.name.rfind(".weight"));
  const LinearQuant& lq = wq ? *wq : *sq;
  // The plain bf16 weight [N, K] of the same name.
  TensorSpec ws;
  if (wq) {
    ws = bf16_spec_of(s);
  } else {
    const std::vector<TensorSpec> plain = [&] {
      H3Config c = cfg;
      c.quant = QuantLayout();
      return h3_tensor_specs(c);
    }();
    auto it = std::find_if(plain.begin(), plain.end(), [&](const TensorSpec& t) { return t.name == m + ".weight"; });
    LS_CHECK(it != plain.end());
    ws = *it;
  }
  const int64_t N = ws.shape[0], K = ws.shape[1];
  if (lq.format == WeightFormat::int8_convrot) {
    // Whole rows: weight elements [begin, begin + count) = rows [begin / K, ...); scales = rows.
    const int64_t r0 = wq ? begin / K : begin, nr = wq ? count / K : count;
    if (wq) LS_CHECK_MSG(begin % K == 0 && count % K == 0, "int8 synthetic weights are made in whole rows");
    // The scales of rows just quantised for the weight (the synthetic source asks for
    // <m>.weight, then <m>.weight_scale): kept so the scale request does not rotate and
    // quantise the whole weight a second time. Same values: the same rows, seed, group.
    struct ScaleCache {
      std::mutex mu;
      std::string key;
      std::vector<float> scales;
    };
    static ScaleCache cache;
    const std::string key = m + "|" + std::to_string(seed) + "|" + std::to_string(N) + "x" + std::to_string(K) + "|g" +
                            std::to_string(lq.group) + "|" + std::to_string(r0) + "+" + std::to_string(nr);
    if (sq) {
      std::lock_guard<std::mutex> lk(cache.mu);
      if (cache.key == key) {
        std::memcpy(out, cache.scales.data(), static_cast<size_t>(nr) * 4);
        return;
      }
    }
    std::vector<uint16_t> w(static_cast<size_t>(nr * K));
    fill_synthetic(ws, seed, r0 * K, nr * K, w.data());
    std::vector<int8_t> qv(static_cast<size_t>(nr * K));
    std::vector<float> sc(static_cast<size_t>(nr));
    // Rows are quantised alone (per-row scale): split over the thread pool.
    parallel_for(nr, std::max<int64_t>(1, (int64_t{1} << 16) / K), [&](int64_t a, int64_t b) {
      quantise_int8_convrot_rows(w.data() + a * K, b - a, K, lq.group, qv.data() + a * K, sc.data() + a);
    });
    if (wq) std::memcpy(out, qv.data(), qv.size());
    else std::memcpy(out, sc.data(), sc.size() * 4);
    std::lock_guard<std::mutex> lk(cache.mu);
    cache.key = key;
    cache.scales = std::move(sc);
    return;
  }
  const float sw = fp8_weight_scale ? *fp8_weight_scale : synthetic_fp8_weight_scale(ws, seed);
  if (sq) {
    LS_CHECK(count <= 1);
    if (count == 1) std::memcpy(out, &sw, 4);
    return;
  }
  std::vector<uint16_t> w(static_cast<size_t>(count));
  fill_synthetic(ws, seed, begin, count, w.data());
  quantise_fp8(w.data(), count, sw, static_cast<uint8_t*>(out));
}

// ---- --precision fp8 --------------------------------------------------------------------

namespace {

class Fp8ConvertSource final : public H3TensorSource {
 public:
  Fp8ConvertSource(std::unique_ptr<H3TensorSource> inner, bool dynamic)
      : inner_(std::move(inner)), cfg_(inner_->cfg()), dynamic_(dynamic) {
    for (int64_t b = 0; b < cfg_.num_layers; ++b)
      for (const char* l : {"attn.qkv_proj", "mlp.fc1", "mlp.fc2"}) {
        const std::string m = h3_block_key(b, l);
        if (cfg_.quant.find(m)) continue;  // already quantised in the file: kept
        LinearQuant q;
        q.format = WeightFormat::fp8_e4m3;
        q.scale_shape = {1};
        q.dynamic_act = dynamic;
        cfg_.quant.linears.emplace(m, std::move(q));
        converted_layers_.insert(m);
      }
    set_specs(h3_tensor_specs(cfg_));
  }
  const H3Config& cfg() const override { return cfg_; }
  bool has(const std::string& name) const override { return spec(name) != nullptr; }
  TensorView get(const std::string& name) const override {
    const TensorSpec* s = spec(name);
    LS_CHECK_MSG(s != nullptr, "fp8-converted H3 source has no tensor '" + name + "'");
    const bool weight = ends_with(name, ".weight"), scale = ends_with(name, ".weight_scale");
    const std::string m = name.substr(0, name.rfind(weight ? ".weight" : ".weight_scale"));
    if (!(weight || scale) || !converted_layers_.count(m)) return inner_->get(name);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = q_.find(m);
    if (it == q_.end() && (weight || !scale_.count(m))) {
      const TensorView w = inner_->get(m + ".weight");  // bf16 [N, K], contiguous host view
      LS_CHECK(w.dtype == DType::bf16 && w.is_contiguous());
      const int64_t n = w.numel();
      const float sw = fp8_scale_from_amax(bf16_amax(w.ptr<uint16_t>(), n));
      std::vector<uint8_t> q(static_cast<size_t>(n));
      quantise_fp8(w.ptr<uint16_t>(), n, sw, q.data());
      inner_->release(m + ".weight");
      scale_[m] = sw;
      it = q_.emplace(m, std::move(q)).first;
    }
    void* p = weight ? static_cast<void*>(it->second.data()) : static_cast<void*>(&scale_.at(m));
    return TensorView::contiguous(p, s->dtype, s->shape.data(), static_cast<int>(s->shape.size()));
  }
  // Drops the converted weight bytes (the 4-byte scale stays: a later get of either
  // converts again only if the weight is asked for).
  void release(const std::string& name) const override {
    if (ends_with(name, ".weight")) {
      std::lock_guard<std::mutex> lk(mu_);
      q_.erase(name.substr(0, name.size() - 7));
    }
    inner_->release(name);
  }
  std::string describe() const override {
    return inner_->describe() + ", lossy --precision fp8: " + std::to_string(converted_layers_.size()) +
           " bf16 qkv/fc1/fc2 weights converted to fp8 e4m3 (per-tensor amax/448, " +
           (dynamic_ ? "activations with a per-row amax/448 scale)" : "activations at scale 1)");
  }

 private:
  std::unique_ptr<H3TensorSource> inner_;
  H3Config cfg_;
  bool dynamic_ = false;
  std::set<std::string> converted_layers_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<uint8_t>> q_;  // <m> -> f8e4m3 [N, K]
  mutable std::map<std::string, float> scale_;            // <m> -> s_w (std::map: stable addresses)
};

}  // namespace

std::unique_ptr<H3TensorSource> fp8_convert_source(std::unique_ptr<H3TensorSource> inner, bool dynamic_activations) {
  LS_CHECK(inner != nullptr);
  return std::make_unique<Fp8ConvertSource>(std::move(inner), dynamic_activations);
}

}  // namespace ls::h3
