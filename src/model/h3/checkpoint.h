// Where the model reads its weights from: H3TensorSource, with two implementations.
//
//  - H3FileSource: a safetensors checkpoint, memory-mapped (SafetensorsReader). Opening
//    detects the config from the tensor shapes (h3-model.md §1.2) and validates every
//    expected tensor (name, shape, dtype) before anything else happens, so the model
//    code can treat a missing or misshapen tensor as a bug (LS_CHECK), not a user error.
//  - H3SyntheticSource: deterministic synthetic weights (fill_synthetic under a seed),
//    generated into host memory on first use of each tensor. It is the built-in default
//    model and what `--random-weights` gives. Its bytes equal what
//    `layerstream make-model --seed S` writes, so a run on the synthetic source and a
//    run on the made file are bit-identical.
//
// Contract for get(name): `name` is the key WITHOUT the checkpoint's prefix (e.g.
// "blocks.3.attn.qkv_proj.weight"); the view is on the host, contiguous, read-only in
// spirit (do not write through it), has exactly the shape and the DECLARED dtype of
// h3_tensor_specs(cfg()) and stays valid as long as the source lives. Asking for a
// tensor the config does not have (e.g. blocks.N with N >= num_layers, or
// attn.to_gate_compress.weight when !gate_compress) is a bug and aborts; has() asks.
//
// Memory: the file source maps the file (the kernel pages weights in on first touch;
// a 66 GB checkpoint costs no RAM until read). Tensors whose stored dtype differs from
// the declared one are only accepted with OpenOptions::allow_dtype_conversion, and are
// converted once on first get() into host memory owned by the source. The synthetic
// source owns one host buffer per tensor it has produced (release() drops one).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/h3/config.h"

namespace ls::h3 {

// "blocks.{i}.{suffix}", e.g. h3_block_key(3, "attn.qkv_proj.weight").
std::string h3_block_key(int64_t block, std::string_view suffix);
// "token_refiner.blocks.{i}.{suffix}".
std::string h3_refiner_key(int64_t block, std::string_view suffix);

class H3TensorSource {
 public:
  virtual ~H3TensorSource() = default;
  virtual const H3Config& cfg() const = 0;
  // Host view with the declared dtype and shape of the spec of that name (see above).
  // Thread-safe. Aborts (LS_CHECK) when the config has no such tensor.
  virtual TensorView get(const std::string& name) const = 0;
  // Whether the config (and so the source) has this tensor.
  virtual bool has(const std::string& name) const = 0;
  // Drop any host copy the source made for `name` (synthetic / converted tensors) so
  // a streaming caller can bound host memory; views of it become invalid. Mapped
  // tensors are unaffected. A later get() recreates it.
  virtual void release(const std::string& name) const { (void)name; }
  // One line for logs: "file /path/x.safetensors (detected ...)" / "synthetic seed 7".
  virtual std::string describe() const = 0;
  // The declared tensor table of cfg(), in h3_tensor_specs order.
  const std::vector<TensorSpec>& specs() const { return specs_; }
  const TensorSpec* spec(const std::string& name) const;

 protected:
  void set_specs(std::vector<TensorSpec> specs);

 private:
  std::vector<TensorSpec> specs_;
  std::map<std::string, size_t> spec_index_;
};

struct OpenOptions {
  // Accept float tensors stored in another float dtype than declared (e.g. fp32
  // islands stored as bf16, AdaLN stored as fp16) and convert them on first use to
  // the declared dtype. Off by default: a dtype difference is then an error that
  // names the tensor and both dtypes.
  bool allow_dtype_conversion = false;
};

class H3FileSource final : public H3TensorSource {
 public:
  const H3Config& cfg() const override { return cfg_; }
  TensorView get(const std::string& name) const override;
  bool has(const std::string& name) const override { return spec(name) != nullptr; }
  void release(const std::string& name) const override;
  std::string describe() const override;
  const SafetensorsReader& file() const { return *file_; }
  // Keys of the file the config does not use (after prefix stripping), for `info`.
  const std::vector<std::string>& unused_keys() const { return unused_; }

 private:
  friend Expected<std::unique_ptr<H3FileSource>> open_h3_checkpoint(const std::string&, const OpenOptions&);
  H3FileSource() = default;
  H3Config cfg_;
  std::unique_ptr<SafetensorsReader> file_;
  std::vector<std::string> unused_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<uint8_t>> converted_;  // name -> declared-dtype bytes
};

// Opens, detects (§1.2, metadata "config.transformer" overrides), classifies the
// quantised layers (detect_quant_layout, quant.h: cfg().quant) and validates. Errors
// (not a safetensors file, not an H3 checkpoint, missing / misshapen tensor, a malformed
// or unsupported quantised layer) name the file and what is wrong. A quantised file is
// read under ComfyUI's mixed-ops dtype policy: its declared-f32 Linear weights and biases
// are rounded to bf16 on first get() (held_as_bf16), and stored dtypes are converted as
// with allow_dtype_conversion (the policy converts them anyway).
Expected<std::unique_ptr<H3FileSource>> open_h3_checkpoint(const std::string& path, const OpenOptions& opts = {});

class H3SyntheticSource final : public H3TensorSource {
 public:
  // cfg.quant empty (bf16) or a layout from synthetic_quant_layout (quant.h).
  H3SyntheticSource(H3Config cfg, uint64_t seed);
  // The synthetic model in weight format `format` (make-model --format; quant.h): the
  // bf16 synthetic weights quantised as the published files were made. Aborts when the
  // config admits no such layout; check with synthetic_quant_layout first.
  H3SyntheticSource(H3Config cfg, uint64_t seed, SyntheticFormat format);
  const H3Config& cfg() const override { return cfg_; }
  TensorView get(const std::string& name) const override;
  bool has(const std::string& name) const override { return spec(name) != nullptr; }
  void release(const std::string& name) const override;
  std::string describe() const override;
  uint64_t seed() const { return seed_; }

 private:
  H3Config cfg_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::vector<uint8_t>> tensors_;
};

}  // namespace ls::h3
