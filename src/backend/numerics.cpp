// Numerics (numerics.h): names, the backend-independent validator, the one-line
// description and the JSON form of the settings.
#include "backend/numerics.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace ls {

namespace {

bool known_variant(const std::string& v) { return v.empty() || v == "4x1" || v == "8x1" || v == "4x2"; }
bool known_form(const std::string& f) {
  return f.empty() || f == "unified" || f == "composite" || f == "composite-f32p";
}

// A whole decimal integer (optional sign), no trailing text.
bool parse_i64(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

Error bad(const std::string& what) { return make_error(ErrorCode::invalid_argument, "numerics: " + what); }

}  // namespace

const char* to_string(AttentionAlgorithm a) {
  switch (a) {
    case AttentionAlgorithm::backend_default: return "auto";
    case AttentionAlgorithm::native: return "native";
    case AttentionAlgorithm::cudnn: return "cudnn";
    case AttentionAlgorithm::hopper: return "hopper";
    case AttentionAlgorithm::int8: return "int8";
  }
  return "?";
}

const char* to_string(GemmF32Order g) {
  switch (g) {
    case GemmF32Order::lanes16: return "lanes16";
    case GemmF32Order::cublaslt: return "cublaslt";
  }
  return "?";
}

Expected<AttentionAlgorithm> parse_attention(const std::string& s) {
  if (s == "auto" || s == "default" || s.empty()) return AttentionAlgorithm::backend_default;
  if (s == "native") return AttentionAlgorithm::native;
  if (s == "cudnn") return AttentionAlgorithm::cudnn;
  if (s == "hopper") return AttentionAlgorithm::hopper;
  if (s == "int8") return AttentionAlgorithm::int8;
  return bad("attention '" + s + "': expected auto, native, cudnn, hopper or int8");
}

Expected<GemmF32Order> parse_gemm_f32(const std::string& s) {
  if (s == "lanes16" || s.empty()) return GemmF32Order::lanes16;
  if (s == "cublaslt") return GemmF32Order::cublaslt;
  return bad("fp32 GEMM order '" + s + "': expected lanes16 or cublaslt");
}

Expected<std::map<int64_t, int>> parse_gemm_candidate(const std::string& s) {
  std::map<int64_t, int> m;
  if (s.empty()) return m;
  const auto index = [&](const std::string& t) -> Expected<int> {
    int64_t v = 0;
    if (!parse_i64(t, &v) || v < 0 || v > 1000)
      return bad("gemm candidate '" + s + "': the index '" + t + "' is not an integer in [0, 1000]");
    return static_cast<int>(v);
  };
  if (s.find(':') == std::string::npos) {
    LS_ASSIGN_OR_RETURN(const int i, index(s));
    m[-1] = i;
    return m;
  }
  std::istringstream is(s);
  std::string item;
  while (std::getline(is, item, ',')) {
    const size_t c = item.find(':');
    int64_t k = -1;  // "*:i": every K without an entry of its own
    if (c == std::string::npos || (item.substr(0, c) != "*" && (!parse_i64(item.substr(0, c), &k) || k < 1)))
      return bad("gemm candidate '" + s + "': '" + item + "' is not K:i with K >= 1 (expected i or K:i,K:i)");
    LS_ASSIGN_OR_RETURN(const int i, index(item.substr(c + 1)));
    m[k] = i;
  }
  return m;
}

std::string format_gemm_candidate(const std::map<int64_t, int>& m) {
  if (m.size() == 1 && m.begin()->first == -1) return std::to_string(m.begin()->second);
  std::string s;
  for (const auto& [k, i] : m) {
    if (!s.empty()) s += ',';
    s += (k == -1 ? std::string("*") : std::to_string(k)) + ":" + std::to_string(i);
  }
  return s;
}

Status validate(const Numerics& n) {
  const int a = static_cast<int>(n.attention), g = static_cast<int>(n.gemm_f32);
  if (a < 0 || a > static_cast<int>(AttentionAlgorithm::int8))
    return bad("attention algorithm " + std::to_string(a) +
               " is not one of auto (0), native (1), cudnn (2), hopper (3), int8 (4)");
  if (g < 0 || g > static_cast<int>(GemmF32Order::cublaslt))
    return bad("fp32 GEMM order " + std::to_string(g) + " is not one of lanes16 (0), cublaslt (1)");
  if (n.kv_tile < 0)
    return bad("kv_tile " + std::to_string(n.kv_tile) + ": needs >= 1 keys per tile (or 0: the backend's default)");
  // int8: tiles never straddle a statistics block (V's scale changes there), so a run's
  // kv_tile divides kInt8StatBlock (a power of two up to 4096; the op alone takes any tile
  // up to kInt8MaxKvTile over keys of one block, docs/int8-attention.md §4.4).
  if (n.attention == AttentionAlgorithm::int8 && n.kv_tile > 0 && kInt8StatBlock % n.kv_tile != 0)
    return bad("kv_tile " + std::to_string(n.kv_tile) + " with attention int8: needs a divisor of " +
               std::to_string(kInt8StatBlock) + " (a power of two up to " + std::to_string(kInt8StatBlock) +
               "; the statistics block, which tiles never straddle)");
  if (n.cudnn_q_chunk < 64 || n.cudnn_q_chunk > 65536 || n.cudnn_q_chunk % 64 != 0)
    return bad("cudnn_q_chunk " + std::to_string(n.cudnn_q_chunk) + ": needs a multiple of 64 in [64, 65536] (default " +
               std::to_string(kDefaultCudnnQChunk) + ")");
  if (!known_variant(n.native_variant))
    return bad("native_variant '" + n.native_variant + "': expected 4x2 (the default), 4x1 or 8x1");
  if (!known_form(n.cudnn_form))
    return bad("cudnn_form '" + n.cudnn_form + "': expected unified, composite, composite-f32p or empty (auto)");
  if (n.cudnn_skip_configs < 0 || n.cudnn_skip_configs > 1000)
    return bad("cudnn_skip_configs " + std::to_string(n.cudnn_skip_configs) + ": needs an integer in [0, 1000]");
  for (const auto& [k, i] : n.gemm_candidate) {
    if (k != -1 && k < 1)
      return bad("gemm_candidate key K " + std::to_string(k) + ": needs K >= 1 (or -1: every K)");
    if (i < 0) return bad("gemm_candidate index " + std::to_string(i) + " for K " + std::to_string(k) + ": needs >= 0");
  }
  return Status();
}

std::string describe(const Numerics& n) {
  std::ostringstream os;
  os << "attention " << to_string(n.attention) << ", kv_tile ";
  if (n.kv_tile > 0) os << n.kv_tile;
  else os << "default";
  os << ", fp32 GEMM " << to_string(n.gemm_f32);
  if (!n.native_variant.empty() && n.native_variant != kDefaultNativeVariant) os << ", native variant " << n.native_variant;
  if (n.cudnn_q_chunk != kDefaultCudnnQChunk) os << ", cudnn q_chunk " << n.cudnn_q_chunk;
  if (!n.cudnn_form.empty()) os << ", cudnn form " << n.cudnn_form;
  if (n.cudnn_skip_configs != 0) os << ", cudnn skip " << n.cudnn_skip_configs << " configs";
  if (!n.gemm_candidate.empty()) os << ", gemm candidate " << format_gemm_candidate(n.gemm_candidate);
  return os.str();
}

Status apply_developer_variables(const VariableLookup& lookup, Numerics* n, Diagnostics* d,
                                 std::vector<std::string>* used, const std::vector<std::string>& skip) {
  const auto get = [&](const char* name) -> const char* {
    for (const std::string& s : skip)
      if (s == name) return nullptr;
    const char* v = lookup(name);
    if (v == nullptr || v[0] == '\0') return nullptr;
    used->push_back(std::string(name) + "=" + v);
    return v;
  };
  const auto var_error = [](const char* name, const char* v, const std::string& why) {
    return Status(make_error(ErrorCode::invalid_argument, std::string("developer variable ") + name + "=" + v + ": " + why));
  };
  const auto integer = [&](const char* name, const char* v, int64_t lo, int64_t hi, int64_t mult,
                           int64_t* out) -> Status {
    int64_t x = 0;
    if (!parse_i64(v, &x) || x < lo || x > hi || x % mult != 0)
      return var_error(name, v,
                       (mult > 1 ? "needs a multiple of " + std::to_string(mult) + " in [" : "needs an integer in [") +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *out = x;
    return Status();
  };
  if (const char* v = get("LAYERSTREAM_ATTENTION")) {
    auto a = parse_attention(v);
    if (!a.ok()) return var_error("LAYERSTREAM_ATTENTION", v, a.error().message);
    n->attention = *a;
  }
  if (const char* v = get("LAYERSTREAM_GEMM_F32")) {
    auto g = parse_gemm_f32(v);
    if (!g.ok()) return var_error("LAYERSTREAM_GEMM_F32", v, g.error().message);
    n->gemm_f32 = *g;
  }
  if (const char* v = get("LAYERSTREAM_ATTN_VARIANT")) {
    if (!known_variant(v)) return var_error("LAYERSTREAM_ATTN_VARIANT", v, "expected 4x2 (the default), 4x1 or 8x1");
    n->native_variant = v;
  }
  if (const char* v = get("LAYERSTREAM_CUDNN_QCHUNK"))
    LS_TRY(integer("LAYERSTREAM_CUDNN_QCHUNK", v, 64, 65536, 64, &n->cudnn_q_chunk));
  if (const char* v = get("LAYERSTREAM_CUDNN_FORM")) {
    if (!known_form(v)) return var_error("LAYERSTREAM_CUDNN_FORM", v, "expected unified, composite or composite-f32p");
    n->cudnn_form = v;
  }
  if (const char* v = get("LAYERSTREAM_CUDNN_CONFIG"))
    LS_TRY(integer("LAYERSTREAM_CUDNN_CONFIG", v, 0, 1000, 1, &n->cudnn_skip_configs));
  if (const char* v = get("LAYERSTREAM_GEMM_CANDIDATE")) {
    auto m = parse_gemm_candidate(v);
    if (!m.ok()) return var_error("LAYERSTREAM_GEMM_CANDIDATE", v, m.error().message);
    n->gemm_candidate = *m;
  }
  if (const char* v = get("LAYERSTREAM_GEMM_VERBOSE")) d->gemm_verbose = std::string(v) != "0";
  if (const char* v = get("LAYERSTREAM_CUDNN_VERBOSE")) d->cudnn_verbose = std::string(v) != "0";
  return Status();
}

void to_json(nlohmann::json& j, const Numerics& n) {
  j = nlohmann::json{{"attention", to_string(n.attention)},
                     {"kv_tile", n.kv_tile},
                     {"gemm_f32", to_string(n.gemm_f32)},
                     {"native_variant", n.native_variant},
                     {"cudnn_q_chunk", n.cudnn_q_chunk},
                     {"cudnn_form", n.cudnn_form},
                     {"cudnn_skip_configs", n.cudnn_skip_configs},
                     {"gemm_candidate", format_gemm_candidate(n.gemm_candidate)}};
}

void to_json(nlohmann::json& j, const Diagnostics& d) {
  j = nlohmann::json{{"gemm_verbose", d.gemm_verbose}, {"cudnn_verbose", d.cudnn_verbose}};
}

}  // namespace ls
