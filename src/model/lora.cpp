// LoRA key mapping, validation and merge; see lora.h for the rules and the arithmetic.
#include "model/lora.h"

#include "io/finite_scan.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "core/dtype.h"
#include "core/ranges.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

namespace ls::lora {

const char* merge_dtype_name(MergeDtype d) {
  return d == MergeDtype::f16 ? "f16" : d == MergeDtype::bf16 ? "bf16" : "f32";
}

bool parse_merge_dtype(const std::string& s, MergeDtype* out) {
  if (s == "f32") *out = MergeDtype::f32;
  else if (s == "f16") *out = MergeDtype::f16;
  else if (s == "bf16") *out = MergeDtype::bf16;
  else return false;
  return true;
}

Expected<LoraFile> parse_lora_arg(const std::string& arg) {
  LoraFile f;
  f.path = arg;
  const size_t colon = arg.rfind(':');
  if (colon != std::string::npos && colon + 1 < arg.size()) {
    // The strength by the grammar and range of every door (core/ranges.h: decimal, no
    // '+', spaces, hex or hex floats; ComfyUI's LoraLoader range -100..100).
    const std::string tail = arg.substr(colon + 1);
    auto v = ranges::parse_float("--lora " + arg + ": the strength", tail, ranges::lora_strength);
    if (v.ok()) {
      f.path = arg.substr(0, colon);
      f.strength = *v;
    } else {
      // A tail that strtod would read as a number ("0x10", "+2", " 1", "inf", "1e9") is a
      // malformed strength, refused; anything else is part of the file name.
      char* end = nullptr;
      errno = 0;
      (void)std::strtod(tail.c_str(), &end);
      if (end != nullptr && end != tail.c_str() && *end == '\0') return v.error();
    }
  }
  if (f.path.empty()) return make_error(ErrorCode::invalid_argument, "--lora " + arg + ": no file named");
  return f;
}

namespace {

// The up/down suffix pairs of ComfyUI's LoRA adapter, in the order it tries them.
struct PairStyle {
  const char* up;
  const char* down;
};
constexpr PairStyle kPairs[] = {
    {".lora_up.weight", ".lora_down.weight"},
    {"_lora.up.weight", "_lora.down.weight"},
    {".lora_B.weight", ".lora_A.weight"},
    {".lora.up.weight", ".lora.down.weight"},
    {".lora_B", ".lora_A"},
    {".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"},
    {".lora_B.default.weight", ".lora_A.default.weight"},
};
// Other suffixes this loader understands (read or refused with a reason).
constexpr const char* kOther[] = {".alpha", ".diff", ".diff_b", ".set_weight", ".set_bias", ".w_norm", ".b_norm",
                                  ".dora_scale", ".lora_mid.weight", ".reshape_weight"};
// Adapters of ComfyUI's weight_adapter list (and LyCORIS) not applied here: a marker
// suffix -> the adapter's name.
constexpr std::pair<const char*, const char*> kUnsupported[] = {
    {".hada_w1_a", "LoHa"}, {".hada_w1_b", "LoHa"}, {".hada_w2_a", "LoHa"}, {".hada_w2_b", "LoHa"},
    {".hada_t1", "LoHa"},   {".hada_t2", "LoHa"},   {".lokr_w1", "LoKr"},   {".lokr_w2", "LoKr"},
    {".lokr_w1_a", "LoKr"}, {".lokr_w1_b", "LoKr"}, {".lokr_w2_a", "LoKr"}, {".lokr_w2_b", "LoKr"},
    {".lokr_t2", "LoKr"},   {".a1.weight", "GLoRA"}, {".a2.weight", "GLoRA"}, {".b1.weight", "GLoRA"},
    {".b2.weight", "GLoRA"}, {".oft_blocks", "OFT"}, {".oft_diag", "OFT"},   {".boft_blocks", "BOFT"},
    {".rescale", "OFT/BOFT"},
};

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::char_traits<char>::length(suf);
  return s.size() > n && s.compare(s.size() - n, n, suf) == 0;
}

// The longest known suffix of `name` (a LoRA tensor key), or "".
std::string known_suffix(const std::string& name) {
  std::string best;
  auto consider = [&](const char* s) {
    if (ends_with(name, s) && std::char_traits<char>::length(s) > best.size()) best = s;
  };
  for (const PairStyle& p : kPairs) {
    consider(p.up);
    consider(p.down);
  }
  for (const char* s : kOther) consider(s);
  return best;
}

const char* unsupported_adapter(const std::string& name) {
  for (const auto& [suf, what] : kUnsupported)
    if (ends_with(name, suf)) return what;
  return nullptr;
}

// Stored values widened to fp32 (exact for every float dtype a LoRA holds).
Expected<std::vector<float>> widen(const SafetensorsReader& r, const SafetensorsEntry& e, const std::string& file) {
  if (!(e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16))
    return make_error(ErrorCode::unsupported, "LoRA " + file + ": tensor " + e.name + " is " + dtype_name(e.dtype) +
                                                  "; LoRA tensors must be F32, BF16 or F16");
  LS_ASSIGN_OR_RETURN(TensorView v, r.try_view(e));
  std::vector<float> out(static_cast<size_t>(e.numel()));
  for (int64_t i = 0; i < e.numel(); ++i) out[static_cast<size_t>(i)] = load_as_f32(v.data, e.dtype, i);
  return out;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// Whether a set patch of shape `patch` may replace `target` (ComfyUI PR #15908: a set may
// change a weight's shape). The engine runs a resized tensor only as a PDD head bank: the
// final heads' weights ([n * out, D], same columns) and biases ([n * out]); LoraSource
// checks that the banks fit each other.
bool set_may_resize(const h3::TensorSpec& target, const std::vector<int64_t>& patch) {
  return is_pdd_head_tensor(target.name) && patch.size() == target.shape.size() && !patch.empty() && patch[0] > 0 &&
         (patch.size() == 1 || (patch.size() == 2 && patch[1] == target.shape[1]));
}

}  // namespace

bool is_pdd_head_tensor(const std::string& name) {
  return name == "final_layer.video_out.weight" || name == "final_layer.video_out.bias" ||
         name == "final_layer.audio_out.weight" || name == "final_layer.audio_out.bias";
}

namespace {

using KeyParts = std::map<std::string, const SafetensorsEntry*>;  // suffix -> entry of one layer key

// The key map: every alias ComfyUI gives a model tensor.
std::map<std::string, const h3::TensorSpec*> lora_key_map(const std::vector<h3::TensorSpec>& model) {
  std::map<std::string, const h3::TensorSpec*> key_map;
  for (const h3::TensorSpec& s : model) {
    if (ends_with(s.name, ".weight")) {
      const std::string m = s.name.substr(0, s.name.size() - 7);
      std::string flat = m;
      std::replace(flat.begin(), flat.end(), '.', '_');
      key_map["diffusion_model." + m] = &s;
      key_map[m] = &s;
      key_map["lora_unet_" + flat] = &s;
    } else {
      key_map["diffusion_model." + s.name] = &s;
      key_map[s.name] = &s;
    }
  }
  return key_map;
}

// A file's tensors by layer key: base key -> suffix -> entry. Other adapters and keys
// that are no LoRA tensor are refused.
Expected<std::map<std::string, KeyParts>> group_keys(const SafetensorsReader& reader, const std::string& path) {
  std::map<std::string, KeyParts> groups;
  for (const SafetensorsEntry& e : reader.entries()) {
    if (const char* what = unsupported_adapter(e.name))
      return make_error(ErrorCode::unsupported, std::string("LoRA ") + path + ": " + e.name + " is a " + what +
                                                    " adapter; this engine applies plain LoRA (up/down), diff "
                                                    "and set patches only");
    const std::string suf = known_suffix(e.name);
    if (suf.empty())
      return make_error(ErrorCode::invalid_file,
                        "LoRA " + path + ": key " + e.name +
                            " is no LoRA tensor this loader knows (expected a layer name followed by "
                            ".lora_up.weight / .lora_down.weight, .lora_B.weight / .lora_A.weight, .alpha, .diff, ...)");
    groups[e.name.substr(0, e.name.size() - suf.size())][suf] = &e;
  }
  return groups;
}

// The up / down pair of `base` (with its alpha) as a LoRA patch of `target`.
Status read_pair(const SafetensorsReader& reader, const std::string& path, const std::string& base,
                 const KeyParts& parts, const PairStyle& style, const h3::TensorSpec& target, Patch& p) {
  if (parts.count(style.down) == 0)
    return make_error(ErrorCode::invalid_file, "LoRA " + path + ": " + base + style.up + " has no " + base + style.down);
  const SafetensorsEntry& up = *parts.at(style.up);
  const SafetensorsEntry& down = *parts.at(style.down);
  if (target.shape.size() != 2 || up.shape.size() != 2 || down.shape.size() != 2 || up.shape[0] != target.shape[0] ||
      down.shape[1] != target.shape[1] || up.shape[1] != down.shape[0] || up.shape[1] <= 0)
    return make_error(ErrorCode::invalid_file,
                      "LoRA " + path + ": " + base + " up " + shape_str(up.shape) + " x down " + shape_str(down.shape) +
                          " does not make the layer " + target.name + " " + shape_str(target.shape) +
                          " (up must be [out, rank], down [rank, in])");
  p.kind = Patch::Kind::lora;
  p.out = up.shape[0];
  p.rank = up.shape[1];
  p.in = down.shape[1];
  LS_ASSIGN_OR_RETURN(p.up, widen(reader, up, path));
  LS_ASSIGN_OR_RETURN(p.down, widen(reader, down, path));
  if (parts.count(".alpha") != 0) {
    const SafetensorsEntry& a = *parts.at(".alpha");
    if (a.numel() != 1)
      return make_error(ErrorCode::invalid_file,
                        "LoRA " + path + ": " + a.name + " must be a scalar, is " + shape_str(a.shape));
    LS_ASSIGN_OR_RETURN(std::vector<float> av, widen(reader, a, path));
    // ComfyUI: alpha = lora[alpha].item() / rank, a Python (double) division.
    p.alpha_over_rank = static_cast<double>(av[0]) / static_cast<double>(p.rank);
  }
  return Status();
}

// The weight patch of one layer key: what ComfyUI's load_lora keeps for it (set, else
// diff, else w_norm, else the up / down pair); nullopt when the key holds only a bias
// patch or an alpha.
Expected<std::optional<Patch>> weight_patch(const SafetensorsReader& reader, const LoraFile& f, const std::string& base,
                                            const KeyParts& parts, const h3::TensorSpec& target) {
  auto has = [&](const char* s) { return parts.count(s) != 0; };
  Patch p;
  p.file = f.path;
  p.key = base;
  p.strength = f.strength;
  const SafetensorsEntry* full = nullptr;
  Patch::Kind kind = Patch::Kind::lora;
  if (has(".set_weight")) {
    full = parts.at(".set_weight");
    kind = Patch::Kind::set;
  } else if (has(".diff")) {
    full = parts.at(".diff");
    kind = Patch::Kind::diff;
  } else if (has(".w_norm")) {
    full = parts.at(".w_norm");
    kind = Patch::Kind::diff;
  }
  if (full != nullptr) {
    if (full->shape != target.shape && !(kind == Patch::Kind::set && set_may_resize(target, full->shape)))
      return make_error(ErrorCode::invalid_file,
                        "LoRA " + f.path + ": " + full->name + " is " + shape_str(full->shape) + ", the layer " +
                            target.name + " is " + shape_str(target.shape) +
                            (kind == Patch::Kind::set
                                 ? " (a .set_weight may enlarge only final_layer.video_out / audio_out into a PDD "
                                   "head bank, keeping the columns)"
                                 : ""));
    p.kind = kind;
    p.shape = full->shape;
    LS_ASSIGN_OR_RETURN(p.full, widen(reader, *full, f.path));
    return std::optional<Patch>(std::move(p));
  }
  const PairStyle* style = nullptr;
  for (const PairStyle& s : kPairs)
    if (has(s.up)) {
      style = &s;
      break;
    }
  if (style == nullptr) {
    // Only a bias patch, an alpha, or a lone down half.
    const bool bias_only = has(".diff_b") || has(".b_norm") || has(".set_bias");
    if (!bias_only)
      return make_error(ErrorCode::invalid_file, "LoRA " + f.path + ": " + base + parts.begin()->first +
                                                     " has no up half (e.g. " + base + ".lora_up.weight)");
    return std::optional<Patch>();
  }
  LS_TRY(read_pair(reader, f.path, base, parts, *style, target, p));
  if (p.up.empty()) return std::optional<Patch>();
  return std::optional<Patch>(std::move(p));
}

// The bias patch of <module>.bias (ComfyUI: to_load[x] minus ".weight", + ".bias"):
// load_lora registers b_norm, then diff_b, then set_bias (PR #15908) under that key, so
// the last one present wins. Returns the bias tensor's name with the patch; nullopt
// without a bias patch.
Expected<std::optional<std::pair<std::string, Patch>>> bias_patch(
    const SafetensorsReader& reader, const LoraFile& f, const std::string& base, const KeyParts& parts,
    const h3::TensorSpec& target, const std::map<std::string, const h3::TensorSpec*>& by_name) {
  auto has = [&](const char* s) { return parts.count(s) != 0; };
  const char* bias_suffix = has(".set_bias") ? ".set_bias" : has(".diff_b") ? ".diff_b" : has(".b_norm") ? ".b_norm"
                                                                                                         : nullptr;
  if (bias_suffix == nullptr) return std::optional<std::pair<std::string, Patch>>();
  const bool set_bias = std::string(bias_suffix) == ".set_bias";
  if (!ends_with(target.name, ".weight"))
    return make_error(ErrorCode::invalid_file, "LoRA " + f.path + ": " + base + bias_suffix + " names no layer weight");
  const std::string bias_name = target.name.substr(0, target.name.size() - 7) + ".bias";
  auto b = by_name.find(bias_name);
  if (b == by_name.end())
    return make_error(ErrorCode::invalid_file, "LoRA " + f.path + ": " + base + bias_suffix + " patches " + bias_name +
                                                   ", which the model does not have");
  const SafetensorsEntry& e = *parts.at(bias_suffix);
  if (e.shape != b->second->shape && !(set_bias && set_may_resize(*b->second, e.shape)))
    return make_error(ErrorCode::invalid_file,
                      "LoRA " + f.path + ": " + e.name + " is " + shape_str(e.shape) + ", the bias " + bias_name +
                          " is " + shape_str(b->second->shape) +
                          (set_bias ? " (a .set_bias may enlarge only the final heads' biases into a PDD bank)" : ""));
  Patch bp;
  bp.kind = set_bias ? Patch::Kind::set : Patch::Kind::diff;
  bp.shape = e.shape;
  bp.file = f.path;
  bp.key = base + bias_suffix;
  bp.strength = f.strength;
  LS_ASSIGN_OR_RETURN(bp.full, widen(reader, e, f.path));
  return std::optional<std::pair<std::string, Patch>>(std::in_place, bias_name, std::move(bp));
}

}  // namespace

Expected<LoraSet> LoraSet::open(const std::vector<LoraFile>& files, const std::vector<h3::TensorSpec>& model) {
  const std::map<std::string, const h3::TensorSpec*> key_map = lora_key_map(model);
  std::map<std::string, const h3::TensorSpec*> by_name;
  for (const h3::TensorSpec& s : model) by_name[s.name] = &s;

  LoraSet set;
  set.files_ = files;
  for (const LoraFile& f : files) {
    if (!std::isfinite(f.strength))
      return make_error(ErrorCode::invalid_argument, "LoRA " + f.path + ": the strength must be finite");
    LS_ASSIGN_OR_RETURN(auto reader, SafetensorsReader::open(f.path));
    if (!reader->unsupported_tensors().empty())
      return make_error(ErrorCode::unsupported, "LoRA " + f.path + ": tensor " + reader->unsupported_tensors()[0] +
                                                    " has a dtype this loader cannot read");
    if (reader->entries().empty()) return make_error(ErrorCode::invalid_file, "LoRA " + f.path + " holds no tensors");
    // Factors, diffs and alphas in one pass (LoRA files are small): a NaN or inf here is
    // refused at load on every weight format (issue 28, item 4: merged into an int8 / fp8
    // layer, it used to vanish in the requantisation and give finite output).
    for (const SafetensorsEntry& e : reader->entries()) LS_TRY(io::require_finite(*reader, e, "LoRA " + f.path));
    LS_ASSIGN_OR_RETURN(const auto groups, group_keys(*reader, f.path));
    std::map<std::string, std::string> target_key;  // target -> the base that patches it (duplicates)
    auto claim = [&](const std::string& target, const std::string& base) -> Status {
      auto [it, fresh] = target_key.emplace(target, base);
      if (!fresh)
        return make_error(ErrorCode::invalid_file, "LoRA " + f.path + ": keys " + it->second + " and " + base +
                                                       " both patch " + target);
      return Status();
    };
    for (const auto& [base, parts] : groups) {
      auto target_it = key_map.find(base);
      if (target_it == key_map.end())
        return make_error(ErrorCode::invalid_file,
                          "LoRA " + f.path + ": key " + base + "* matches no layer of the model (H3 LoRA keys name a layer "
                              "as diffusion_model.blocks.N.attn.qkv_proj, blocks.N.attn.qkv_proj or "
                              "lora_unet_blocks_N_attn_qkv_proj)");
      const h3::TensorSpec& target = *target_it->second;
      for (const char* refused : {".dora_scale", ".lora_mid.weight", ".reshape_weight"})
        if (parts.count(refused) != 0)
          return make_error(ErrorCode::unsupported,
                            "LoRA " + f.path + ": " + base + refused + " (" +
                                (std::string(refused) == ".dora_scale"       ? "DoRA"
                                 : std::string(refused) == ".lora_mid.weight" ? "LoCon/Tucker mid weight"
                                                                              : "enlarging a layer") +
                                ") is not supported yet");
      LS_ASSIGN_OR_RETURN(std::optional<Patch> p, weight_patch(*reader, f, base, parts, target));
      if (p) {
        LS_TRY(claim(target.name, base));
        set.patches_[target.name].push_back(std::move(*p));
      }
      LS_ASSIGN_OR_RETURN(auto bias, bias_patch(*reader, f, base, parts, target, by_name));
      if (bias) {
        LS_TRY(claim(bias->first, bias->second.key));
        set.patches_[bias->first].push_back(std::move(bias->second));
      }
    }
    set.per_file_[f.path] = target_key.size();
  }
  return set;
}

std::vector<std::string> LoraSet::targets() const {
  std::vector<std::string> t;
  for (const auto& [name, p] : patches_) t.push_back(name);
  return t;
}

const std::vector<Patch>& LoraSet::patches(const std::string& tensor) const {
  static const std::vector<Patch> kNone;
  auto it = patches_.find(tensor);
  return it == patches_.end() ? kNone : it->second;
}

size_t LoraSet::patch_count() const {
  size_t n = 0;
  for (const auto& [name, p] : patches_) n += p.size();
  return n;
}

std::string LoraSet::describe() const {
  std::string s = std::to_string(files_.size()) + (files_.size() == 1 ? " LoRA: " : " LoRAs: ");
  for (size_t i = 0; i < files_.size(); ++i) {
    const LoraFile& f = files_[i];
    char buf[32];
    std::snprintf(buf, sizeof buf, " x%.2f", f.strength);
    auto it = per_file_.find(f.path);
    s += (i ? ", " : "") + f.path + buf + " (" + std::to_string(it == per_file_.end() ? 0 : it->second) + " tensors)";
  }
  return s;
}

Status LoraSet::merge(const std::string& tensor, int64_t row0, const TensorView& w, const TensorView& out,
                      MergeDtype dt) const {
  LS_CHECK_MSG(w.is_contiguous() && out.is_contiguous() && w.dtype == out.dtype && w.numel() == out.numel() &&
                   w.ndim == out.ndim && (w.ndim == 1 || w.ndim == 2),
               "lora merge: " + w.shape_str() + " -> " + out.shape_str());
  if (!(w.dtype == DType::bf16 || w.dtype == DType::f16 || w.dtype == DType::f32))
    return make_error(ErrorCode::unsupported, std::string("LoRA on ") + tensor + ": weights stored as " +
                                                  dtype_name(w.dtype) + " are merged only as bf16, f16 or f32");
  const int64_t rows = w.size(0);
  const int64_t cols = w.ndim == 2 ? w.size(1) : 1;
  const auto& ps = patches(tensor);
  // T(x): a value rounded to the compute dtype. cast_factors: the bf16 (cast-time) path
  // rounds the LoRA factors to T before the rank product and the product once after it.
  const bool cast_factors = dt == MergeDtype::bf16;
  auto T = [dt](float x) {
    return dt == MergeDtype::f16 ? f16_to_f32(f32_to_f16(x)) : dt == MergeDtype::bf16 ? round_bf16(x) : x;
  };
  // The factors the rank product reads: the stored values, or (cast_factors) their T
  // roundings, made once per call rather than once per output row.
  std::vector<std::vector<float>> up_t(ps.size()), down_t(ps.size());
  if (cast_factors)
    for (size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].kind != Patch::Kind::lora) continue;
      for (float x : ps[i].up) up_t[i].push_back(T(x));
      for (float x : ps[i].down) down_t[i].push_back(T(x));
    }
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(static_cast<size_t>(cols)), d(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t row = row0 + r;  // row of the whole tensor (1-D: element index)
      for (int64_t c = 0; c < cols; ++c) acc[static_cast<size_t>(c)] = T(load_as_f32(w.data, w.dtype, r * cols + c));
      for (size_t pi = 0; pi < ps.size(); ++pi) {
        const Patch& p = ps[pi];
        if (p.kind == Patch::Kind::set) {
          for (int64_t c = 0; c < cols; ++c) acc[static_cast<size_t>(c)] = T(p.full[static_cast<size_t>(row * cols + c)]);
        } else if (p.kind == Patch::Kind::diff) {
          const float s = static_cast<float>(p.strength);
          for (int64_t c = 0; c < cols; ++c) {
            const float v = T(s * T(p.full[static_cast<size_t>(row * cols + c)]));
            acc[static_cast<size_t>(c)] = T(acc[static_cast<size_t>(c)] + v);
          }
        } else {
          LS_CHECK(p.in == cols && row < p.out);
          // d = up[row, :] @ down: k ascending, one fp32 multiply and one fp32 add per step.
          std::fill(d.begin(), d.end(), 0.0f);
          const float* up = (cast_factors ? up_t[pi] : p.up).data() + row * p.rank;
          const float* down = (cast_factors ? down_t[pi] : p.down).data();
          for (int64_t k = 0; k < p.rank; ++k) {
            const float a = up[k];
            const float* dk = down + k * p.in;
            for (int64_t c = 0; c < cols; ++c) d[static_cast<size_t>(c)] = d[static_cast<size_t>(c)] + a * dk[c];
          }
          if (cast_factors)
            for (int64_t c = 0; c < cols; ++c) d[static_cast<size_t>(c)] = T(d[static_cast<size_t>(c)]);
          const float s = static_cast<float>(p.strength * p.alpha_over_rank);
          for (int64_t c = 0; c < cols; ++c) {
            const float v = T(s * d[static_cast<size_t>(c)]);
            acc[static_cast<size_t>(c)] = T(acc[static_cast<size_t>(c)] + v);
          }
        }
      }
      for (int64_t c = 0; c < cols; ++c) store_from_f32(out.data, out.dtype, r * cols + c, acc[static_cast<size_t>(c)]);
    }
  });
  return Status();
}

}  // namespace ls::lora
