// Small helpers shared by the tools/cmd_*.cpp subcommands: ONE strict parser for every
// numeric flag and ONE range per quantity, shared by every command (issue 11).
//
// What the parser accepts (everything else is an invalid_argument naming the flag, the
// accepted range and the text as given, which the commands turn into exit code 2):
//   integer: decimal digits only ("22", "0", "007"); a leading '-' only when the range
//            has negative values (no range here does); no '+', no spaces, no hex ("0x10"),
//            no exponent, nothing empty, nothing out of range (no silent wrap).
//   float:   [-]DIGITS[.DIGITS][e[+|-]DIGITS] or [-].DIGITS[...]; the '-' only when the
//            range has negative values; no '+', spaces, hex floats, "inf" or "nan"; the
//            value must be finite and inside the range (so --cfg 1e99 is refused).
//   size:    bytes as an integer ("123456", "123456B") or a number with a 1024-based
//            unit: K, M, G, T or KiB, MiB, GiB, TiB, any case ("512M", "3G", "3.5GiB");
//            the result is rounded down to whole bytes. Decimal units (KB, MB, GB, TB)
//            are refused as ambiguous: every size in LayerStream is 1024-based.
//
// Flags are bound to text (FlagText) rather than to C++ numbers, so that CLI11's own
// conversions (which accept hex, '+', and use other exit codes) never see them; the
// add_*_flag helpers still give --help the type, the range, the unit and the default.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/numerics.h"
#include "model/lora.h"
#include "core/status.h"

namespace ls::api {
struct WeightsSpec;
}

namespace ls::tools {

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

// The accepted range of every numeric quantity of the CLI, the same in every command.
namespace range {
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
inline constexpr IntRange pdd_heads{1, 64};              // PDD video head bank size
inline constexpr IntRange slice_tokens{1, 100000000};    // info: rows per slice of a memory table
inline constexpr FloatRange sigma{0.0, 1.0, true, false};  // (0, 1]
// Guidance scale: 1 = no guidance (one forward per step), 0 = the negative prompt alone;
// above 100 the velocities are dominated by rounding of (positive - negative), so larger
// values are refused rather than run (they gave all-NaN outputs at 1e99).
inline constexpr FloatRange cfg{0.0, 100.0};
// Every memory budget (--budget, --vram-budget): 1 byte .. 1 EiB.
inline constexpr SizeRange budget{1, uint64_t{1} << 60};
}  // namespace range

// "1..100000", "(0, 1]", "1 B..1 EiB": the range as the error messages and --help print it.
std::string describe(const IntRange& r);
std::string describe(const FloatRange& r);
std::string describe(const SizeRange& r);

// The parsers. `flag` names the flag in the message ("--frames").
Expected<int64_t> parse_int(std::string_view flag, std::string_view text, const IntRange& r);
Expected<double> parse_float(std::string_view flag, std::string_view text, const FloatRange& r);
Expected<uint64_t> parse_size(std::string_view flag, std::string_view text, const SizeRange& r = range::budget);
// A float32 quantity (--sigma): the text read as a float (strtof, one rounding), checked
// against the range as a float (a tiny positive text that rounds to 0 is refused).
Expected<float> parse_float32(std::string_view flag, std::string_view text, const FloatRange& r);
// The same as parse_int(flag, text, {lo, hi}) (for values whose range depends on the
// input, such as a keyframe's frame index).
Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

// A numeric flag bound as text, and whether it was given on the command line at all
// (an empty value, `--kv-tile ''`, is given: it is refused, never taken as the default).
struct FlagText {
  std::string name;  // "--kv-tile" (for messages)
  std::string text;
  CLI::Option* opt = nullptr;
  bool given() const { return opt != nullptr && opt->count() > 0; }
};

// A FILE / NAME flag bound as text (given() tells `-o ''` from no -o).
CLI::Option* add_text_flag(CLI::App& app, const std::string& names, FlagText& f, const std::string& type,
                           const std::string& desc, const std::string& def = "", bool required = false);

// Adds `names` ("--frames", "-o,--output") bound to f.text. --help shows
//   --frames INT 1..100000=22 REQUIRED   pixel frames, ...
// (type and range, then the default when `def` is not empty). `required` makes CLI11
// require it (a usage error, exit 2, when missing).
CLI::Option* add_int_flag(CLI::App& app, const std::string& names, FlagText& f, const IntRange& r,
                          const std::string& desc, const std::string& def = "", bool required = false);
CLI::Option* add_float_flag(CLI::App& app, const std::string& names, FlagText& f, const FloatRange& r,
                            const std::string& desc, const std::string& def = "", bool required = false);
// Sizes: type "SIZE", and the description says the units are 1024-based.
CLI::Option* add_size_flag(CLI::App& app, const std::string& names, FlagText& f, const SizeRange& r,
                           const std::string& desc, const std::string& def = "");

// The flag's value: `def` when it was not given, else the parsed text (an error when the
// text is not a number of the range, an empty text included).
Expected<int64_t> flag_int(const FlagText& f, const IntRange& r, int64_t def);
Expected<double> flag_float(const FlagText& f, const FloatRange& r, double def);
Expected<float> flag_float32(const FlagText& f, const FloatRange& r, float def);
Expected<uint64_t> flag_size(const FlagText& f, const SizeRange& r, uint64_t def);

// ---- numerics (src/backend/numerics.h, docs/numerics.md "The numerics settings") ------
// The bit-changing settings of a run come from flags; the developer variables below are
// read HERE (std::getenv; the library never reads the environment) and mapped onto the
// same struct by ls::apply_developer_variables (numerics.h, the one table of them), each
// use announced by one line on stderr and listed in NumericsChoice::from_env (for the
// report):
//   LAYERSTREAM_ATTENTION      = auto|native|cudnn|hopper -> --attention (when not given)
//   LAYERSTREAM_GEMM_F32       = lanes16|cublaslt      -> --gemm-f32 (when not given)
//   LAYERSTREAM_ATTN_VARIANT   = 4x2|4x1|8x1           -> Numerics::native_variant
//   LAYERSTREAM_CUDNN_QCHUNK   = multiple of 64 in [64, 65536] -> Numerics::cudnn_q_chunk
//   LAYERSTREAM_CUDNN_FORM     = unified|composite|composite-f32p -> Numerics::cudnn_form
//   LAYERSTREAM_CUDNN_CONFIG   = N (>= 0)              -> Numerics::cudnn_skip_configs
//   LAYERSTREAM_GEMM_CANDIDATE = i | K:i,K:i           -> Numerics::gemm_candidate
//   LAYERSTREAM_GEMM_VERBOSE / LAYERSTREAM_CUDNN_VERBOSE = 1 -> Diagnostics (no bit changes)
// An unset or empty variable is not used; a value outside its set is a usage error
// (exit 2), never silently the default.
struct NumericsFlags {
  FlagText attention;  // --attention auto|native|cudnn|hopper
  FlagText gemm_f32;   // --gemm-f32 lanes16|cublaslt
};
// Adds --attention and --gemm-f32 to a subcommand (bound to f, which must outlive the parse).
void add_numerics_flags(CLI::App& app, NumericsFlags& f);

// The weights' flags of forward and generate:
//   --lora FILE[:STRENGTH] (repeatable, applied in the order given) and --lora-dtype
//   auto|f32|f16 (the LoRA merge's compute dtype, a numerics setting: auto = ComfyUI's
//   choice for the device, f16 on CUDA and f32 on the CPU);
//   --format (synthetic weights in ComfyUI's quantised layouts, with --preset) and
//   --precision preserve|fp8|fp8-dynamic (fp8: lossy conversion at load).
struct LoraFlags {
  std::vector<std::string> loras;
  FlagText dtype;
};
void add_lora_flags(CLI::App& app, LoraFlags& f);
struct WeightFlags {
  FlagText format, precision;
};
void add_weight_flags(CLI::App& app, WeightFlags& f);
// Puts what the flags give into `spec` (model_file: --model was given). invalid_argument
// (exit 2) naming the flag: a malformed --lora, an unknown --lora-dtype or --precision,
// --lora-dtype without --lora, --format with a model file.
Status apply_weight_flags(const LoraFlags& lf, const WeightFlags& wf, bool model_file, api::WeightsSpec& spec);

struct NumericsChoice {
  Numerics numerics;                  // as asked (not yet resolved: Backend::set_numerics resolves)
  Diagnostics diagnostics;
  std::vector<std::string> from_env;  // "LAYERSTREAM_ATTENTION=native", each variable used
};
// The run's numerics: the flags, then the developer variables for what no flag gave;
// kv_tile is the caller's --kv-tile (0 when not given: the backend's default). Prints
// "<command>: using developer variable LAYERSTREAM_X=v (-> ...)" on stderr for each
// variable used (and one naming a variable that a given flag overrides), unless quiet.
// invalid_argument (exit 2) for a bad flag or variable value, naming it.
Expected<NumericsChoice> numerics_from_flags_and_env(std::string_view command, const NumericsFlags& f,
                                                     int64_t kv_tile = 0, bool quiet = false);

// --devices LIST of forward and generate (sequence parallel, docs/multi-gpu.md): CUDA
// devices "cuda:0,cuda:1,..." ("cuda" = "cuda:0"), or "cpu*N" for N in-process CPU ranks
// (1..64; a plain "cpu" is one rank). Returns one backend name per rank, rank 0 first.
// invalid_argument naming `flag` and the text: an empty or unknown entry, a device given
// twice, CPU and CUDA mixed, a bad N. (Whether the count divides the model's heads is
// the planner's check, once the model is known: exec::check_ranks.)
Expected<std::vector<std::string>> parse_devices(std::string_view flag, std::string_view text);

// Checks every output path given with io::check_output_path before any work starts (an
// empty path, `-o ''`, is refused), that no two of them are the same file, and that none
// is one of the run's input files (flag, path as given: --model, --lora FILE[:S], ...),
// compared by device and inode after links (io::check_outputs_against_inputs).
Status check_output_paths(const std::vector<std::pair<std::string, std::string>>& flag_and_path,
                          const std::vector<std::pair<std::string, std::string>>& inputs = {});

// Exit codes of every command (docs/checkpoints.md, README "Exit codes"): 0 ok; 2 a
// usage error (bad or contradictory flags, caught before any file is opened or any work
// starts); 1 everything at run time (unreadable or invalid files, I/O failures, a budget
// too small for the clip, non-finite values, allocation failures).
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;
// 2 for ErrorCode::invalid_argument (a flag's value or combination) and out_of_budget (a
// --budget / --vram-budget below the clip's minimum: refused from the flags, before any
// work); 1 for every other code (files, I/O, device, memory, non-finite values).
int exit_code_for(const Error& e);
// Prints "<command>: error: <message>" on stderr and returns exit_code_for(e).
int report_error(std::string_view command, const Error& e);

}  // namespace ls::tools
