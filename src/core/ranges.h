// The ONE range table and number grammar of every door (issue 28 item 6, issue 27 item 1).
//
// Every numeric quantity a user can give LayerStream (a CLI flag, an ls_engine_params /
// ls_clip / ls_memory_request field, a Python keyword, a ComfyUI node input) has one
// entry here: its name, its range, its unit and what it means. The CLI (cli/cli_util.h),
// the C API (src/api/c_api*.cpp: ls_engine_create, the clip, denoise, plan) and Python
// (through the C API: ls_parse_value, ls_parse_size, ls_range_at) all consult it, so a
// value refused at one door is refused at every door with the same message (the name is
// each door's spelling: "--kv-tile", "numerics.kv_tile", "kv_tile").
//
// The grammar (text from a flag, a Python value written as text, a node's string):
//   integer: decimal digits only ("22", "0", "007"); a leading '-' only when the range
//            has negative values; no '+', no spaces, no hex ("0x10"), no exponent,
//            nothing empty, nothing out of range (no silent wrap).
//   float:   [-]DIGITS[.DIGITS][e[+|-]DIGITS] or [-].DIGITS[...]; the '-' only when the
//            range has negative values; no '+', spaces, hex floats ("0x1p4"), "inf" or
//            "nan"; the value must be finite and inside the range (so 1e99 is refused
//            where the range ends lower).
//   size:    bytes as an integer ("123456", "123456B") or a number with a 1024-based unit:
//            K, M, G, T or KiB, MiB, GiB, TiB, any case ("512M", "3G", "3.5GiB"); rounded
//            down to whole bytes. Decimal units (KB, MB, GB, TB) are refused as ambiguous:
//            every size in LayerStream is 1024-based.
// Values that arrive as numbers (the C API's fields) are checked by the same rules
// (check_int / check_float / check_size write the value as text and parse it), so the
// message is the same one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace ls::ranges {

struct IntRange {
  int64_t lo = 0, hi = 0;
};
struct FloatRange {
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;  // (lo, hi] etc.
};
struct SizeRange {
  uint64_t lo = 0, hi = 0;
};

// The accepted range of every numeric quantity, the same at every door.
inline constexpr IntRange frames{1, 100000};             // pixel frames (snapped up to 17j+5)
inline constexpr IntRange width{32, 65536};              // pixels (multiples of 32: checked by clip_geometry)
inline constexpr IntRange height{32, 65536};
inline constexpr IntRange text_tokens{1, 1000000};       // text tokens L
inline constexpr IntRange seed{0, INT64_MAX};            // every seed: 0..2^63-1 (exact in a signed 64-bit integer)
inline constexpr IntRange steps{1, 1000};                // sampling steps (the flow table has 1000 timesteps)
inline constexpr IntRange kv_tile{1, int64_t{1} << 30};  // keys per attention tile
inline constexpr IntRange chunk{0, int64_t{1} << 40};    // rows per MLP / attention / final slice (0 = all)
inline constexpr IntRange kv_chunk{0, int64_t{1} << 40}; // keys per streamed K/V chunk (0 = about 4096)
inline constexpr IntRange threads{0, 4096};              // CPU threads (0 = all cores)
inline constexpr IntRange blocks{1, 1000};               // DiT blocks of a synthetic model
inline constexpr IntRange resident_blocks{0, 1000};      // blocks kept on the device
inline constexpr IntRange slots{1, 2};                   // slots for streamed blocks
inline constexpr IntRange prefetch{0, 2};                // vram budget: 0 one slot, 1 planner's choice, 2 always two
inline constexpr IntRange pdd_heads{1, 64};              // PDD video head bank size
inline constexpr IntRange slice_tokens{1, 100000000};    // info: rows per slice of a memory table
inline constexpr FloatRange sigma{0.0, 1.0, true, false};  // (0, 1]: a call's video sigma
inline constexpr FloatRange sample_sigma{0.0, 1.0};       // [0, 1]: one sigma of a schedule (terminal 0)
// Guidance scale: 1 = no guidance (one forward per step), 0 = the negative prompt alone;
// above 100 the velocities are dominated by rounding of (positive - negative), so larger
// values are refused rather than run (they gave all-NaN outputs at 1e99).
inline constexpr FloatRange cfg{0.0, 100.0};
// Noise-augmentation strengths (ls_clip.vis_aug / aud_aug): 1 = no augmentation.
inline constexpr FloatRange aug{0.0, 1.0};
// Flow shifts (ls_clip.shift_video / shift_audio) and the audio carry scale: ComfyUI's
// ModelSamplingSD3 shift widget spans 0..100; 0 is no schedule.
inline constexpr FloatRange shift{0.0, 100.0, true, false};
inline constexpr FloatRange audio_scale{0.0, 100.0, true, false};
// A LoRA's strength: ComfyUI's LoraLoader widget range (strength_model -100..100).
inline constexpr FloatRange lora_strength{-100.0, 100.0};
// Every memory budget (--budget, --vram-budget, activation_budget, vram_budget): 1 byte .. 1 EiB.
inline constexpr SizeRange budget{1, uint64_t{1} << 60};

enum class Kind { integer, real, size };

// One row of the table: what `ls_range_at` and layerstream.ranges() list.
struct Entry {
  const char* name;     // "kv_tile"
  Kind kind;
  IntRange i{};         // kind integer
  FloatRange f{};       // kind real
  SizeRange s{};        // kind size
  const char* unit;     // "keys", "bytes", "" (a plain number)
  const char* meaning;  // one line
};

std::span<const Entry> table();
// The entry of that name, or nullptr.
const Entry* find(std::string_view name);

// "1..100000", "(0, 1]", "1 B..1 EiB": the range as the messages and --help print it.
std::string describe(const IntRange& r);
std::string describe(const FloatRange& r);
std::string describe(const SizeRange& r);
std::string describe(const Entry& e);

// The parsers (the grammar above). `what` names the quantity in the message, in the
// door's spelling ("--frames", "frames"). invalid_argument:
//   "<what> must be an integer in 1..100000 (got '0x10')".
Expected<int64_t> parse_int(std::string_view what, std::string_view text, const IntRange& r);
Expected<double> parse_float(std::string_view what, std::string_view text, const FloatRange& r);
// A float32 quantity (sigma): the text read as a float (strtof, one rounding), checked
// against the range as a float (a tiny positive text that rounds to 0 is refused).
Expected<float> parse_float32(std::string_view what, std::string_view text, const FloatRange& r);
Expected<uint64_t> parse_size(std::string_view what, std::string_view text, const SizeRange& r = budget);
// By the table's name: the text parsed by the entry's kind and range, returned as a
// double (integers and sizes up to 2^53 are exact; the C API's ls_parse_value).
Expected<double> parse_named(std::string_view name, std::string_view what, std::string_view text);

// Numbers that arrive as numbers (the C API's fields), checked by the same rules: the
// value written as text ("-3", "1e+30", "nan") and parsed, so the message is the parser's.
Status check_int(std::string_view what, int64_t v, const IntRange& r);
Status check_float(std::string_view what, double v, const FloatRange& r);
Status check_size(std::string_view what, uint64_t v, const SizeRange& r = budget);

// The shortest text that reads back as v ("100", "0.1", "1e+30", "nan", "inf").
std::string number_text(double v);

}  // namespace ls::ranges
