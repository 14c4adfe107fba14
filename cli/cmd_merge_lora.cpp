// `layerstream merge-lora`: writes a checkpoint with LoRAs merged in, by ComfyUI's formula
// (model/lora.h), so a run on the written file reads exactly the weights a run with
// `--lora` reads (the issue-17 property: merged-run equals pre-merged-checkpoint run).
//
// Every tensor of the input file is written under its own name; the tensors a LoRA
// patches get the merged values (in the dtype the engine reads them in), every other
// tensor its stored bytes. The file's metadata is kept, plus "layerstream.lora" naming
// the LoRAs, strengths and the merge dtype. Atomic like make-model (temporary file, then
// rename); ^C leaves the output untouched.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"  // format_bytes
#include "io/mapping_guard.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/lora.h"
#include "model/lora_source.h"
#include "cli/cli_util.h"
#include "cli/interrupt.h"
#include "cli/command.h"

#include <layerstream_version.h>

namespace ls::cli {
namespace {


struct MergeLoraOptions {
  FlagText model, output, dtype;
  std::vector<std::string> loras;
  bool quiet = false;
};

int usage(const std::string& msg) {
  std::fprintf(stderr, "layerstream merge-lora: error: %s\n", msg.c_str());
  return kExitUsage;
}

int run_merge_lora(const MergeLoraOptions& o) {
  if (o.loras.empty()) return usage("give at least one --lora FILE[:STRENGTH]");
  lora::MergeDtype dtype = lora::MergeDtype::f32;
  if (o.dtype.given()) {
    if (!lora::parse_merge_dtype(o.dtype.text, &dtype))
      return usage("--lora-dtype must be f32, f16 or bf16, got \"" + o.dtype.text + "\"");
  }
  std::vector<lora::LoraFile> files;
  for (const std::string& a : o.loras) {
    auto f = lora::parse_lora_arg(a);
    if (!f.ok()) return usage(f.error().message);
    files.push_back(*f);
  }
  {
    // The output may be neither the model nor a LoRA (writing it would replace the input).
    std::vector<std::pair<std::string, std::string>> inputs{{"--model", o.model.text}};
    for (const std::string& a : o.loras) inputs.emplace_back("--lora", a);
    if (Status s = check_output_paths({{"-o", o.output.text}}, inputs); !s.ok())
      return report_error("layerstream merge-lora", s.error());
  }
  auto src = h3::open_h3_checkpoint(o.model.text);
  if (!src.ok()) return report_error("layerstream merge-lora", src.error());
  const SafetensorsReader& file = (*src)->file();
  const std::string prefix = (*src)->cfg().key_prefix;
  auto set = lora::LoraSet::open(files, (*src)->specs());
  if (!set.ok()) return report_error("layerstream merge-lora", set.error());
  const std::string lora_desc = set->describe();
  const size_t patched = set->targets().size();
  std::unique_ptr<h3::H3TensorSource> inner = std::move(src).value();
  auto merged = lora::LoraSource::wrap(std::move(inner), std::move(set).value(), dtype, /*side_path=*/false);
  if (!merged.ok()) return report_error("layerstream merge-lora", merged.error());
  const lora::LoraSource& ls = **merged;

  SafetensorsWriter w(o.output.text);
  for (const auto& [k, v] : file.metadata()) w.set_metadata(k, v);
  w.set_metadata("layerstream.lora", lora_desc + ", merged in " + lora::merge_dtype_name(dtype) + " by layerstream " +
                                         LS_VERSION);
  // A patched tensor is written in the dtype the engine reads (its declared dtype).
  auto patched_spec = [&](const SafetensorsEntry& e) -> const h3::TensorSpec* {
    if (e.name.compare(0, prefix.size(), prefix) != 0) return nullptr;
    const std::string n = e.name.substr(prefix.size());
    return ls.loras().touches(n) ? ls.spec(n) : nullptr;
  };
  for (const SafetensorsEntry& e : file.entries()) {
    const h3::TensorSpec* s = patched_spec(e);
    Status st = s != nullptr ? w.declare(e.name, s->dtype, s->shape) : w.declare(e.name, e.dtype, e.shape);
    if (!st.ok()) return usage(st.message());
  }
  // ^C / SIGTERM from before the temporary file exists: stop cleanly, the output untouched.
  const InterruptScope interrupt;
  if (Status st = w.begin(); !st.ok()) return report_error("layerstream merge-lora", st.error());
  uint64_t bytes = 0;
  size_t done = 0;
  for (const SafetensorsEntry& e : file.entries()) {
    if (interrupt.interrupted()) {
      std::fprintf(stderr, "layerstream merge-lora: interrupted; nothing was written to %s\n", o.output.text.c_str());
      return kExitRuntime;
    }
    Status st;
    if (const h3::TensorSpec* s = patched_spec(e); s != nullptr) {
      const std::string n = e.name.substr(prefix.size());
      const TensorView v = ls.get(n);
      st = w.write(v.data, static_cast<size_t>(v.nbytes()));
      ls.release(n);
      bytes += static_cast<uint64_t>(v.nbytes());
      if (!o.quiet && ++done % 50 == 0)
        std::fprintf(stderr, "merge-lora: %zu / %zu tensors merged\n", done, patched);
    } else {
      st = w.write(file.data(e), static_cast<size_t>(e.end - e.begin));
      bytes += e.end - e.begin;
    }
    if (!st.ok()) return report_error("layerstream merge-lora", st.error());
  }
  // The model or a LoRA truncated while it was read (io/mapping_guard.h): the zeros read
  // in its place are not published.
  if (Status st = io::check_mapped_files(); !st.ok()) return report_error("layerstream merge-lora", st.error());
  if (Status st = w.commit(); !st.ok()) return report_error("layerstream merge-lora", st.error());
  std::printf("wrote %s: %s, %zu tensors merged in %s, %s\n", o.output.text.c_str(), lora_desc.c_str(), patched,
              lora::merge_dtype_name(dtype), format_bytes(bytes).c_str());
  return 0;
}

CommandRun setup_merge_lora(CLI::App& sub) {
  auto o = std::make_shared<MergeLoraOptions>();
  add_text_flag(sub, "--model", o->model, "FILE", "The H3 checkpoint (.safetensors) to merge into", "", true);
  sub.add_option("--lora", o->loras,
                 "A LoRA file, optionally with a strength: FILE or FILE:STRENGTH (repeatable; applied in the order "
                 "given, as ComfyUI chains LoRA loaders)")
      ->type_name("FILE[:STRENGTH]")
      ->required();
  add_text_flag(sub, "--lora-dtype", o->dtype, "f32|f16|bf16",
                "LoRA compute dtype (changes bits): f32 = ComfyUI on the CPU, f16 = ComfyUI on NVIDIA GPUs that run "
                "fp16 (its lora_compute_dtype), bf16 = ComfyUI's cast-time merge (dynamic VRAM / lowvram)",
                "f32", false);
  sub.add_flag("-q,--quiet", o->quiet, "No progress on stderr");
  add_text_flag(sub, "-o,--output", o->output, "FILE", "Output .safetensors file (written atomically)", "", true);
  return [o]() { return run_merge_lora(*o); };
}

LS_REGISTER_COMMAND(register_merge_lora, "merge-lora",
                    "Write a checkpoint with LoRAs merged in by ComfyUI's formula (what --lora reads)", setup_merge_lora);

}  // namespace
}  // namespace ls::cli
