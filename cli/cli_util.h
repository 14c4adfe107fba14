// Small helpers shared by the cli/cmd_*.cpp subcommands: ONE strict parser for every
// numeric flag and ONE range per quantity, shared by every command (issue 11) and by
// every door of the library (the C API, Python, the node: src/core/ranges.h, issue 28).
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
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/memory_request.h"
#include "core/ranges.h"
#include "backend/numerics.h"
#include "model/lora.h"
#include "core/status.h"
#include "exec/plan.h"


namespace ls::cli {

// The range types, the range of every quantity and the grammar are the library's (the ONE
// table every door consults, src/core/ranges.h): range::frames is ls::ranges::frames.
using ranges::FloatRange;
using ranges::IntRange;
using ranges::SizeRange;
namespace range = ls::ranges;

// "1..100000", "(0, 1]", "1 B..1 EiB": the range as the error messages and --help print it.
using ranges::describe;

// The parsers (ranges.h). `flag` names the flag in the message ("--frames").
using ranges::parse_float;
using ranges::parse_float32;
using ranges::parse_int;
using ranges::parse_size;
// The same as parse_int(flag, text, {lo, hi}) (for values whose range depends on the
// input, such as a keyframe's frame index).
Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

// --keyframe FILE[@FRAME|@last] (forward and generate, one grammar): the suffix after the
// last '@' is split off only when it is a frame ("last" or digits), so a path with '@' in
// it stays whole ("shot@2x.safetensors").
struct KeyframeArg {
  std::string path;
  std::optional<int64_t> frame;  // @FRAME; nullopt: @last, else the file's metadata or 0
  bool last = false;             // @last
};
Expected<KeyframeArg> parse_keyframe_arg(const std::string& arg);
// The keyframe's pixel frame in a clip of `frames` pixel frames: @last, @FRAME, else the
// file's "pixel_frame" metadata (`meta`), else 0; invalid_argument past the last frame.
Expected<int64_t> keyframe_pixel_frame(const KeyframeArg& k, const std::optional<std::string>& meta, int64_t frames);

// A numeric flag bound as text, and whether it was given on the command line at all
// (an empty value, `--kv-tile ''`, is given: it is refused, never taken as the default).
struct FlagText {
  std::string name;  // "--kv-tile" (for messages)
  std::string text;
  CLI::Option* opt = nullptr;
  bool given() const { return opt != nullptr && opt->count() > 0; }
};

// The memory flags of a command (forward, generate): every one that was given goes into
// one api::MemoryRequest, checked by the library's one validation (api::resolve_memory,
// the same rules and messages as the C API, Python and the node). Flags a command does
// not have are nullptr / false.
struct MemoryFlags {
  const FlagText* vram_budget = nullptr;
  const FlagText* budget = nullptr;  // the activation budget
  const FlagText* mlp_chunk = nullptr;
  const FlagText* attn_chunk = nullptr;
  const FlagText* final_chunk = nullptr;
  const FlagText* kv_chunk = nullptr;
  const FlagText* resident_blocks = nullptr;
  const FlagText* slots = nullptr;
  bool kv_offload = false, residual_offload = false, no_prefetch = false, keep_prefetch = false;
};
// The request (values parsed by the flags' ranges) and the resolved MemorySpec
// (invalid_argument naming the flags: a combination that has no effect, a value out of
// range). knobs.kv_tile is left 0 (numerics: the caller's).
Expected<api::MemorySpec> memory_from_flags(const MemoryFlags& f, api::MemoryRequest* request = nullptr);

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
//   LAYERSTREAM_ATTENTION      = auto|native|cudnn|hopper|int8 -> --attention (when not given)
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
  FlagText attention;  // --attention auto|native|cudnn|hopper|int8
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
// The flags forward and generate share (their options structs derive from it; the
// numbers as text for the one strict parser).
struct RunFlags {
  LoraFlags lora;          // --lora FILE[:STRENGTH] ..., --lora-dtype
  WeightFlags wflags;      // --format, --precision
  NumericsFlags numerics;  // --attention, --gemm-f32 (+ the developer variables)
  FlagText model, preset, weights_seed;
  FlagText frames, width, height, text_tokens, seed;
  std::vector<std::string> keyframes;
  FlagText mlp_chunk, attn_chunk, final_chunk, kv_tile, budget, vram_budget;
  FlagText device, threads;
  FlagText devices;  // --devices: sequence-parallel ranks (docs/multi-gpu.md)
  FlagText output, json, memory_plot;
  bool quiet = false, allow_nonfinite = false;
};
// RunFlags' slices into knobs (chunk tokens; knobs.kv_tile = --kv-tile, 0 when not given:
// the device's) and --kv-tile's value into kv_tile (1 when not given).
Status slice_knobs_from_flags(const RunFlags& o, exec::PlanKnobs& knobs, int64_t& kv_tile);
// RunFlags' output files (-o, --json, --memory-plot) and input files (--model, --lora,
// --keyframe) as (flag, path) pairs, for check_output_paths; a command adds its own.
void run_file_paths(const RunFlags& o, std::vector<std::pair<std::string, std::string>>& outputs,
                    std::vector<std::pair<std::string, std::string>>& inputs);
// The ranks' devices: --devices' list (one backend per sequence-parallel rank,
// docs/multi-gpu.md), else --device (cpu when not given).
Expected<std::vector<std::string>> rank_devices(const RunFlags& o);
// The flags forward and generate register alike, in their --help order: the slices
// (--mlp-chunk, --attn-chunk, --final-chunk: rows per slice, 0 = none), --kv-tile (keys
// per attention tile, a numerics setting; not given = the device's), the numerics, LoRA
// and weight flags, and the activation --budget.
void add_plan_flags(CLI::App& app, RunFlags& o);
// --device, --devices (sequence-parallel ranks) and --threads.
void add_device_flags(CLI::App& app, RunFlags& o);
// --allow-nonfinite, --json FILE and --memory-plot FILE.svg (their help: the command's
// report and plot).
void add_report_flags(CLI::App& app, RunFlags& o, const std::string& json_help, const std::string& plot_help);
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

}  // namespace ls::cli
