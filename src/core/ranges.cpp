// The range table and the number grammar of every door (ranges.h).
#include "core/ranges.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ls::ranges {
namespace {

__extension__ typedef unsigned __int128 u128;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string quoted(std::string_view text) {
  if (text.empty()) return "an empty value";
  std::string q(1, '\'');
  q.append(text);
  q += '\'';
  return q;
}

// "1 EiB", "64 MiB", "1536 B": exact, the largest 1024-unit that divides the value.
std::string bytes_text(uint64_t v) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && v != 0 && v % 1024 == 0) v /= 1024, ++u;
  return std::to_string(v) + " " + kUnits[u];
}

// 2^63-1 and large powers of two written as such (0..2^63-1, 0..2^40).
std::string int_text(int64_t v) {
  if (v == INT64_MAX) return "2^63-1";
  for (int k = 20; k < 63; ++k)
    if (v == (int64_t{1} << k)) return "2^" + std::to_string(k);
  return std::to_string(v);
}

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

Error float_error(std::string_view what, std::string_view text, const FloatRange& r) {
  return Error{ErrorCode::invalid_argument,
               std::string(what) + " must be a finite number in " + describe(r) + " (got " + quoted(text) + ")"};
}

constexpr Entry I(const char* name, IntRange r, const char* unit, const char* meaning) {
  return Entry{name, Kind::integer, r, {}, {}, unit, meaning};
}
constexpr Entry F(const char* name, FloatRange r, const char* unit, const char* meaning) {
  return Entry{name, Kind::real, {}, r, {}, unit, meaning};
}
constexpr Entry S(const char* name, SizeRange r, const char* unit, const char* meaning) {
  return Entry{name, Kind::size, {}, {}, r, unit, meaning};
}

// The table: one row per quantity. Where a door has a special value outside the range
// (0 = the default, -1 = all blocks), the door says so next to its field.
constexpr Entry kTable[] = {
    I("frames", frames, "pixel frames", "frames of the clip, snapped up to 17j+5"),
    I("width", width, "pixels", "clip width, a multiple of 32"),
    I("height", height, "pixels", "clip height, a multiple of 32"),
    I("text_tokens", text_tokens, "tokens", "rows of the text states"),
    I("seed", seed, "", "a seed (sampler, noise augmentation, synthetic weights)"),
    I("steps", steps, "steps", "sampling steps"),
    I("kv_tile", kv_tile, "keys", "keys per attention tile (numerics; 0 at the C and Python doors = the device's)"),
    I("mlp_chunk", chunk, "rows", "rows per MLP / patch-embedding slice (0 = all)"),
    I("attn_chunk", chunk, "rows", "rows per attention slice, two-pass (0 = stock attention)"),
    I("final_chunk", chunk, "rows", "rows per final-layer slice (0 = all)"),
    I("kv_chunk", kv_chunk, "keys", "keys per streamed K/V chunk (0 = about 4096)"),
    I("threads", threads, "threads", "CPU threads of the process-wide pool (0 = all cores)"),
    I("blocks", blocks, "blocks", "DiT blocks of a synthetic model (0 at the C and Python doors = the preset's)"),
    I("resident_blocks", resident_blocks, "blocks", "blocks kept on the device (-1 at the C and Python doors = all)"),
    I("slots", slots, "slots", "slots for streamed blocks (2 = prefetch)"),
    I("prefetch", prefetch, "", "vram budget: 0 one block slot, 1 the planner's choice, 2 always two"),
    I("pdd_heads", pdd_heads, "heads", "PDD video head bank size"),
    I("slice_tokens", slice_tokens, "rows", "rows per slice of a memory table (info)"),
    F("sigma", sigma, "", "the video sigma of a denoiser call"),
    F("sample_sigma", sample_sigma, "", "one sigma of a sampling schedule (descending, terminal 0 allowed)"),
    F("cfg", cfg, "", "guidance scale (1 = one forward per step)"),
    F("vis_aug", aug, "", "video noise-augmentation strength (1 = none)"),
    F("aud_aug", aug, "", "audio noise-augmentation strength (1 = none)"),
    F("shift_video", shift, "", "video flow shift"),
    F("shift_audio", shift, "", "audio flow shift"),
    F("audio_scale", audio_scale, "", "audio carry scale (1 = no carry)"),
    F("lora_strength", lora_strength, "", "a LoRA's strength (FILE:STRENGTH)"),
    S("vram_budget", budget, "bytes", "ONE device budget: weights, tables, activations, workspace"),
    S("activation_budget", budget, "bytes", "activation memory budget: the largest slices that fit"),
};

}  // namespace

std::span<const Entry> table() { return kTable; }

const Entry* find(std::string_view name) {
  for (const Entry& e : kTable)
    if (name == e.name) return &e;
  return nullptr;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
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

std::string describe(const IntRange& r) { return int_text(r.lo) + ".." + int_text(r.hi); }

std::string describe(const FloatRange& r) {
  std::string d(1, r.lo_open ? '(' : '[');
  d += number_text(r.lo);
  d += ", ";
  d += number_text(r.hi);
  d += r.hi_open ? ')' : ']';
  return d;
}

std::string describe(const SizeRange& r) { return bytes_text(r.lo) + ".." + bytes_text(r.hi); }

std::string describe(const Entry& e) {
  switch (e.kind) {
    case Kind::integer: return describe(e.i);
    case Kind::real: return describe(e.f);
    case Kind::size: return describe(e.s);
  }
  return "";
}

Expected<int64_t> parse_int(std::string_view what, std::string_view text, const IntRange& r) {
  auto fail = [&]() {
    return Error{ErrorCode::invalid_argument,
                 std::string(what) + " must be an integer in " + describe(r) + " (got " + quoted(text) + ")"};
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

Expected<float> parse_float32(std::string_view what, std::string_view text, const FloatRange& r) {
  const std::string s(text);
  float v = 0;
  if (float_syntax(text, r.lo < 0)) v = std::strtof(s.c_str(), nullptr);  // the "C" locale
  if (!float_syntax(text, r.lo < 0) || !in_range(static_cast<double>(v), r)) return float_error(what, text, r);
  return v;
}

Expected<double> parse_float(std::string_view what, std::string_view text, const FloatRange& r) {
  if (!float_syntax(text, r.lo < 0)) return float_error(what, text, r);
  const std::string s(text);
  const double v = std::strtod(s.c_str(), nullptr);  // the "C" locale: LayerStream never sets another
  if (!in_range(v, r)) return float_error(what, text, r);
  return v;
}

Expected<uint64_t> parse_size(std::string_view what_name, std::string_view text, const SizeRange& r) {
  const std::string what = std::string(what_name) + " must be a size in " + describe(r) +
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
  int sh = -1;
  if (unit.empty() || unit == "B") sh = 0;
  else if (unit == "K" || unit == "KIB") sh = 10;
  else if (unit == "M" || unit == "MIB") sh = 20;
  else if (unit == "G" || unit == "GIB") sh = 30;
  else if (unit == "T" || unit == "TIB") sh = 40;
  else if (unit == "KB" || unit == "MB" || unit == "GB" || unit == "TB")
    return Error{ErrorCode::invalid_argument, what + "; decimal units (KB, MB, GB, TB) are not accepted: every size "
                                                     "in LayerStream is 1024-based, write " +
                                                  std::string(1, unit[0]) + " or " + std::string(1, unit[0]) +
                                                  "iB (got " + quoted(text) + ")"};
  if (sh < 0) return fail();
  if (sh == 0 && has_point) return fail();  // a fraction of a byte
  if (overflow) return fail();
  // Exact: whole * 2^sh + floor(frac * 2^sh / frac_scale), in 128 bits.
  const u128 v = (static_cast<u128>(whole) << sh) + ((static_cast<u128>(frac) << sh) / frac_scale);
  if (v < r.lo || v > r.hi) return fail();
  return static_cast<uint64_t>(v);
}

Expected<double> parse_named(std::string_view name, std::string_view what, std::string_view text) {
  const Entry* e = find(name);
  if (!e) return Error{ErrorCode::invalid_argument, "no quantity named '" + std::string(name) + "' in the range table"};
  switch (e->kind) {
    case Kind::integer: {
      LS_ASSIGN_OR_RETURN(int64_t v, parse_int(what, text, e->i));
      return static_cast<double>(v);
    }
    case Kind::real: return parse_float(what, text, e->f);
    case Kind::size: {
      LS_ASSIGN_OR_RETURN(uint64_t v, parse_size(what, text, e->s));
      return static_cast<double>(v);
    }
  }
  return Error{ErrorCode::invalid_argument, "bad range table entry"};
}

Status check_int(std::string_view what, int64_t v, const IntRange& r) {
  if (v >= r.lo && v <= r.hi) return {};
  return parse_int(what, std::to_string(v), r).error();
}

Status check_float(std::string_view what, double v, const FloatRange& r) {
  if (in_range(v, r)) return {};
  return float_error(what, number_text(v), r);
}

Status check_size(std::string_view what, uint64_t v, const SizeRange& r) {
  if (v >= r.lo && v <= r.hi) return {};
  return parse_size(what, std::to_string(v), r).error();
}

}  // namespace ls::ranges
