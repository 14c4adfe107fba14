#include "cli_util.h"  // (not "tools/...": tests/test_cli_parse.cpp compiles this file in)

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api/session.h"
#include "core/printable.h"
#include "io/output_file.h"

namespace ls::tools {
namespace {

__extension__ typedef unsigned __int128 u128;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string quoted(std::string_view text) {
  return text.empty() ? std::string("an empty value") : "'" + std::string(text) + "'";
}

std::string num(double v) {
  // The shortest text that reads back as v, without an exponent where one is not needed
  // (100, not 1e+02; 0.1, not 0.10000000000000001).
  std::string first;
  for (int p = 1; p <= 17; ++p) {
    char b[40];
    std::snprintf(b, sizeof b, "%.*g", p, v);
    if (std::strtod(b, nullptr) != v) continue;
    if (std::string(b).find('e') == std::string::npos) return b;
    if (first.empty()) first = b;
  }
  if (!first.empty()) return first;
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// "1 EiB", "64 MiB", "1536 B": exact, the largest 1024-unit that divides the value.
std::string bytes_text(uint64_t v) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && v != 0 && v % 1024 == 0) v /= 1024, ++u;
  return std::to_string(v) + " " + kUnits[u];
}

// The long name of "-o,--output" ("--output"), else the first name.
std::string flag_name(const std::string& names) {
  std::string first, pick;
  size_t b = 0;
  while (b <= names.size()) {
    size_t e = names.find(',', b);
    if (e == std::string::npos) e = names.size();
    std::string n = names.substr(b, e - b);
    if (first.empty()) first = n;
    if (pick.empty() && n.rfind("--", 0) == 0) pick = n;
    b = e + 1;
  }
  return pick.empty() ? first : pick;
}

std::string opts_text(const std::string& type, const std::string& def, bool required) {
  std::string s = type;
  if (!def.empty()) s += " [" + def + "]";
  if (required) s += " REQUIRED";
  return s;
}

}  // namespace

namespace {
// 2^63-1 and large powers of two written as such (0..2^63-1, 0..2^40).
std::string int_text(int64_t v) {
  if (v == INT64_MAX) return "2^63-1";
  for (int k = 20; k < 63; ++k)
    if (v == (int64_t{1} << k)) return "2^" + std::to_string(k);
  return std::to_string(v);
}
}  // namespace

std::string describe(const IntRange& r) { return int_text(r.lo) + ".." + int_text(r.hi); }

std::string describe(const FloatRange& r) {
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) + (r.hi_open ? ")" : "]");
}

std::string describe(const SizeRange& r) { return bytes_text(r.lo) + ".." + bytes_text(r.hi); }

Expected<int64_t> parse_int(std::string_view flag, std::string_view text, const IntRange& r) {
  auto fail = [&]() {
    return Error{ErrorCode::invalid_argument,
                 std::string(flag) + " must be an integer in " + describe(r) + " (got " + quoted(text) + ")"};
  };
  size_t i = 0;
  if (!text.empty() && text[0] == '-' && r.lo < 0) i = 1;  // a sign only where the range is signed
  if (i == text.size()) return fail();
  for (size_t k = i; k < text.size(); ++k)
    if (!is_digit(text[k])) return fail();
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < r.lo || v > r.hi) return fail();
  return v;
}

Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  return parse_int(std::string_view(flag), std::string_view(text), IntRange{lo, hi});
}

namespace {
// [-]DIGITS[.DIGITS][e[+|-]DIGITS] or [-].DIGITS[...]: checked here so that strtod's
// extras (spaces, '+', hex floats, inf, nan) never get through.
bool float_syntax(std::string_view text, bool signed_range) {
  size_t i = 0;
  if (!text.empty() && text[0] == '-' && signed_range) i = 1;
  size_t digits = 0;
  while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < text.size() && is_digit(text[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == text.size();
}
bool in_range(double v, const FloatRange& r) {
  if (!std::isfinite(v)) return false;
  const bool lo_ok = r.lo_open ? v > r.lo : v >= r.lo;
  const bool hi_ok = r.hi_open ? v < r.hi : v <= r.hi;
  return lo_ok && hi_ok;
}
}  // namespace

Expected<float> parse_float32(std::string_view flag, std::string_view text, const FloatRange& r) {
  const std::string s(text);
  float v = 0;
  if (float_syntax(text, r.lo < 0)) v = std::strtof(s.c_str(), nullptr);  // the "C" locale
  if (!float_syntax(text, r.lo < 0) || !in_range(static_cast<double>(v), r))
    return Error{ErrorCode::invalid_argument,
                 std::string(flag) + " must be a finite number in " + describe(r) + " (got " + quoted(text) + ")"};
  return v;
}

Expected<double> parse_float(std::string_view flag, std::string_view text, const FloatRange& r) {
  auto fail = [&]() {
    return Error{ErrorCode::invalid_argument,
                 std::string(flag) + " must be a finite number in " + describe(r) + " (got " + quoted(text) + ")"};
  };
  if (!float_syntax(text, r.lo < 0)) return fail();
  const std::string s(text);
  const double v = std::strtod(s.c_str(), nullptr);  // the "C" locale: the CLI never sets another
  if (!in_range(v, r)) return fail();
  return v;
}

Expected<uint64_t> parse_size(std::string_view flag, std::string_view text, const SizeRange& r) {
  const std::string what = std::string(flag) + " must be a size in " + describe(r) +
                           ": bytes, or a number with a 1024-based unit K, M, G, T (the same as KiB, MiB, GiB, "
                           "TiB), e.g. 512M, 3G, 3.5GiB";
  auto fail = [&]() { return Error{ErrorCode::invalid_argument, what + " (got " + quoted(text) + ")"}; };
  size_t i = 0;
  uint64_t whole = 0;
  size_t whole_digits = 0;
  bool overflow = false;
  while (i < text.size() && is_digit(text[i])) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) overflow = true;
    else whole = whole * 10 + d;
    ++i, ++whole_digits;
  }
  uint64_t frac = 0, frac_scale = 1;  // the fraction frac / frac_scale, up to 18 digits
  size_t frac_digits = 0;
  bool has_point = false;
  if (i < text.size() && text[i] == '.') {
    has_point = true;
    ++i;
    while (i < text.size() && is_digit(text[i])) {
      if (frac_digits < 18) frac = frac * 10 + static_cast<uint64_t>(text[i] - '0'), frac_scale *= 10;
      ++i, ++frac_digits;
    }
  }
  if (whole_digits + frac_digits == 0) return fail();
  std::string unit;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return fail();
    unit += static_cast<char>(c >= 'a' ? c - 'a' + 'A' : c);
  }
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KIB") shift = 10;
  else if (unit == "M" || unit == "MIB") shift = 20;
  else if (unit == "G" || unit == "GIB") shift = 30;
  else if (unit == "T" || unit == "TIB") shift = 40;
  else if (unit == "KB" || unit == "MB" || unit == "GB" || unit == "TB")
    return Error{ErrorCode::invalid_argument, what + "; decimal units (KB, MB, GB, TB) are not accepted: every size "
                                                     "in LayerStream is 1024-based, write " +
                                                  std::string(1, unit[0]) + " or " + std::string(1, unit[0]) +
                                                  "iB (got " + quoted(text) + ")"};
  if (shift < 0) return fail();
  if (shift == 0 && has_point) return fail();  // a fraction of a byte
  if (overflow) return fail();
  // Exact: whole * 2^shift + floor(frac * 2^shift / frac_scale), in 128 bits.
  const u128 v = (static_cast<u128>(whole) << shift) + ((static_cast<u128>(frac) << shift) / frac_scale);
  if (v < r.lo || v > r.hi) return fail();
  return static_cast<uint64_t>(v);
}

CLI::Option* add_text_flag(CLI::App& app, const std::string& names, FlagText& f, const std::string& type,
                           const std::string& desc, const std::string& def, bool required) {
  f.name = flag_name(names);
  f.opt = app.add_option(names, f.text, desc);
  f.opt->type_name(type)->option_text(opts_text(type, def, required));
  if (required) f.opt->required();
  return f.opt;
}

CLI::Option* add_int_flag(CLI::App& app, const std::string& names, FlagText& f, const IntRange& r,
                          const std::string& desc, const std::string& def, bool required) {
  f.name = flag_name(names);
  f.opt = app.add_option(names, f.text, desc);
  f.opt->type_name("INT")->option_text(opts_text("INT " + describe(r), def, required));
  if (required) f.opt->required();
  return f.opt;
}

CLI::Option* add_float_flag(CLI::App& app, const std::string& names, FlagText& f, const FloatRange& r,
                            const std::string& desc, const std::string& def, bool required) {
  f.name = flag_name(names);
  f.opt = app.add_option(names, f.text, desc);
  f.opt->type_name("FLOAT")->option_text(opts_text("FLOAT in " + describe(r), def, required));
  if (required) f.opt->required();
  return f.opt;
}

CLI::Option* add_size_flag(CLI::App& app, const std::string& names, FlagText& f, const SizeRange& r,
                           const std::string& desc, const std::string& def) {
  f.name = flag_name(names);
  f.opt = app.add_option(names, f.text, desc + " (bytes or K/M/G/T = KiB/MiB/GiB/TiB, 1024-based; " + describe(r) + ")");
  f.opt->type_name("SIZE")->option_text(opts_text("SIZE", def, false));
  return f.opt;
}

Expected<int64_t> flag_int(const FlagText& f, const IntRange& r, int64_t def) {
  if (!f.given()) return def;
  return parse_int(std::string_view(f.name), std::string_view(f.text), r);
}

Expected<double> flag_float(const FlagText& f, const FloatRange& r, double def) {
  if (!f.given()) return def;
  return parse_float(f.name, f.text, r);
}

Expected<uint64_t> flag_size(const FlagText& f, const SizeRange& r, uint64_t def) {
  if (!f.given()) return def;
  return parse_size(f.name, f.text, r);
}

Expected<float> flag_float32(const FlagText& f, const FloatRange& r, float def) {
  if (!f.given()) return def;
  return parse_float32(f.name, f.text, r);
}

Status check_output_paths(const std::vector<std::pair<std::string, std::string>>& flag_and_path,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<io::NamedPath> outs, ins;
  for (const auto& [flag, path] : flag_and_path) outs.push_back({flag, path});
  for (const auto& [flag, path] : inputs) ins.push_back({flag, path});
  return io::check_outputs_against_inputs(outs, ins);
}

int exit_code_for(const Error& e) {
  return e.code == ErrorCode::invalid_argument || e.code == ErrorCode::out_of_budget ? kExitUsage : kExitRuntime;
}

int report_error(std::string_view command, const Error& e) {
  // The CLI's error sink: file bytes quoted in the message are escaped here, in one place.
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(command.size()), command.data(),
               printable_text(e.message).c_str());
  return exit_code_for(e);
}

// ---- numerics ----------------------------------------------------------------------

void add_numerics_flags(CLI::App& app, NumericsFlags& f) {
  add_text_flag(app, "--attention", f.attention, "auto|native|cudnn|hopper",
                "attention algorithm (numerics: changes output bits): auto = the backend's default for the model "
                "(CUDA: hopper for head dim 128 on an sm_90 GPU, else cudnn where built, else native; CPU: "
                "native, the reference); hopper = the sm_90a kernel (CUDA on Hopper, head dim 128); the run's "
                "numerics line names the one that ran",
                "auto");
  add_text_flag(app, "--gemm-f32", f.gemm_f32, "lanes16|cublaslt",
                "fp32 GEMM order (numerics: changes output bits): lanes16 = the CPU reference's order (CUDA gives "
                "the CPU's bytes); cublaslt = the pinned cuBLASLt path (CUDA only)",
                "lanes16");
}

Expected<NumericsChoice> numerics_from_flags_and_env(std::string_view command, const NumericsFlags& f, int64_t kv_tile,
                                                     bool quiet) {
  NumericsChoice c;
  c.numerics.kv_tile = kv_tile;
  const auto note = [&](const std::string& line) {
    if (!quiet) std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(command.size()), command.data(), line.c_str());
  };
  // The flags first; a developer variable for what no flag gave (the mapping: numerics.h,
  // apply_developer_variables, the one place that knows the variables).
  std::vector<std::string> skip;
  const auto flag = [&](const FlagText& fl, const char* var, auto parse, auto& field) -> Status {
    if (!fl.given()) return Status();
    auto p = parse(fl.text);
    if (!p.ok()) return Error{ErrorCode::invalid_argument, fl.name + ": " + p.error().message};
    field = *p;
    skip.push_back(var);
    if (const char* v = std::getenv(var); v != nullptr && v[0] != '\0')
      note(std::string("developer variable ") + var + "=" + v + " ignored: " + fl.name + " " + fl.text + " given");
    return Status();
  };
  LS_TRY(flag(f.attention, "LAYERSTREAM_ATTENTION", parse_attention, c.numerics.attention));
  LS_TRY(flag(f.gemm_f32, "LAYERSTREAM_GEMM_F32", parse_gemm_f32, c.numerics.gemm_f32));
  LS_TRY(apply_developer_variables([](const char* name) -> const char* { return std::getenv(name); }, &c.numerics,
                                   &c.diagnostics, &c.from_env, skip));
  for (const std::string& e : c.from_env) note("using developer variable " + e);
  // Field ranges and names (the backend then says what it cannot honour).
  if (Status s = validate(c.numerics); !s.ok()) {
    std::string where = c.from_env.empty() ? std::string() : " (from the environment:";
    for (const std::string& e : c.from_env) where += " " + e;
    if (!c.from_env.empty()) where += ")";
    return Error{ErrorCode::invalid_argument, s.message() + where};
  }
  return c;
}

void add_lora_flags(CLI::App& app, LoraFlags& f) {
  app.add_option("--lora", f.loras,
                 "A LoRA to merge into the weights (ComfyUI's key formats and formula), optionally with a strength: "
                 "FILE or FILE:STRENGTH; repeatable, applied in the order given")
      ->type_name("FILE[:STRENGTH]");
  add_text_flag(app, "--lora-dtype", f.dtype, "auto|f32|f16|bf16",
                "Compute dtype of the LoRA merge (numerics: changes bits): auto = ComfyUI's for the device (f16 on "
                "CUDA, f32 on the CPU); bf16 = ComfyUI's cast-time merge (dynamic VRAM / lowvram, docs/lora.md)",
                "auto");
}

void add_weight_flags(CLI::App& app, WeightFlags& f) {
  add_text_flag(app, "--format", f.format, "FORMAT",
                "With --preset: the synthetic weights in ComfyUI's layouts: bf16, int8-convrot (the pruned int8 "
                "ConvRot files), int8-convrot-full (+ the AdaLN linears at group 64), int8-convrot-skip-edges "
                "(int8-convrot with blocks 0, 1, L-2, L-1 in bf16) or fp8 (fp8_scaled e4m3); a "
                "--model file has its own",
                "bf16");
  add_text_flag(app, "--precision", f.precision, "MODE",
                "preserve = the weights as stored; fp8 = convert the bf16 qkv, fc1 and fc2 weights to fp8 e4m3 once at "
                "load (per-tensor amax/448, LOSSY, changes the output); fp8-dynamic = the same with a per-row "
                "activation scale (lossy, not ComfyUI's numerics)",
                "preserve");
}

Status apply_weight_flags(const LoraFlags& lf, const WeightFlags& wf, bool model_file, api::WeightsSpec& spec) {
  for (const std::string& a : lf.loras) {
    LS_ASSIGN_OR_RETURN(lora::LoraFile f, lora::parse_lora_arg(a));
    spec.loras.push_back(std::move(f));
  }
  if (lf.dtype.given() && lf.dtype.text != "auto") {
    lora::MergeDtype dt{};
    if (!lora::parse_merge_dtype(lf.dtype.text, &dt))
      return make_error(ErrorCode::invalid_argument,
                        "--lora-dtype must be auto, f32, f16 or bf16, got \"" + lf.dtype.text + "\"");
    spec.lora_dtype = dt;
    if (spec.loras.empty()) return make_error(ErrorCode::invalid_argument, "--lora-dtype has no effect without --lora");
  }
  if (wf.format.given()) {
    if (model_file)
      return make_error(ErrorCode::invalid_argument,
                        "--format goes with --preset (synthetic weights); a --model file has its own format (its "
                        ".comfy_quant tensors say it)");
    spec.weights_format = wf.format.text;
  }
  if (wf.precision.given()) {
    if (wf.precision.text != "preserve" && wf.precision.text != "fp8" && wf.precision.text != "fp8-dynamic")
      return make_error(ErrorCode::invalid_argument,
                        "--precision must be preserve, fp8 or fp8-dynamic, got \"" + wf.precision.text + "\"");
    spec.precision = wf.precision.text;
  }
  return Status();
}

Expected<std::vector<std::string>> parse_devices(std::string_view flag, std::string_view text) {
  auto d = api::parse_devices(std::string(text));
  if (!d.ok()) return Error{ErrorCode::invalid_argument, std::string(flag) + " " + d.error().message};
  return d;
}

}  // namespace ls::tools
