// H3FileSource: an H3 safetensors checkpoint, memory-mapped (see checkpoint.h).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "model/h3/checkpoint.h"

#include "io/finite_scan.h"

namespace ls::h3 {

namespace {

// The "config.transformer" override JSON of a file's metadata, if any: either a
// metadata key "config.transformer" holding the object, or a key "config" holding
// {"transformer": {...}, ...} (the layout ComfyUI reads).
Expected<std::string> transformer_override(const SafetensorsReader& f) {
  const auto& md = f.metadata();
  if (auto it = md.find("config.transformer"); it != md.end()) return it->second;
  auto it = md.find("config");
  if (it == md.end()) return std::string();
  nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error(ErrorCode::invalid_file, f.path() + ": metadata \"config\" is not a JSON object");
  auto t = j.find("transformer");
  if (t == j.end()) return std::string();
  return t->dump();
}

}  // namespace

Expected<std::unique_ptr<H3FileSource>> open_h3_checkpoint(const std::string& path, const OpenOptions& opts) {
  LS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> file, SafetensorsReader::open(path));
  std::vector<TensorInfo> infos;
  infos.reserve(file->entries().size());
  for (const SafetensorsEntry& e : file->entries()) infos.push_back({e.name, e.dtype, e.shape});
  auto prefixed = [&](const Error& e) { return make_error(e.code, path + ": " + e.message); };

  auto override_json = transformer_override(*file);
  if (!override_json.ok()) return override_json.error();
  auto cfg = detect_h3_config(infos, *override_json);
  if (!cfg.ok()) {
    // A file holding tensors of a dtype we cannot read may lack exactly those.
    Error e = cfg.error();
    if (!file->unsupported_tensors().empty())
      e.message += " (the file also holds tensors of unsupported dtypes, e.g. " + file->unsupported_tensors().front() + ")";
    return prefixed(e);
  }
  // Quantised layers (per layer, from .comfy_quant; quant.h). The JSON and the fp8
  // input scales are read here, on the host.
  auto read = [&](const std::string& full) {
    const SafetensorsEntry* e = file->find(full);
    LS_CHECK(e != nullptr);
    const uint8_t* p = static_cast<const uint8_t*>(file->data(*e));
    return std::vector<uint8_t>(p, p + (e->end - e->begin));
  };
  auto quant = detect_quant_layout(*cfg, infos, read);
  if (!quant.ok()) return prefixed(quant.error());
  cfg->quant = std::move(quant).value();
  Status valid = validate_h3_tensors(*cfg, infos, opts.allow_dtype_conversion || cfg->quant.mixed_ops);
  if (!valid.ok()) return prefixed(valid.error());
  // A quantised checkpoint's vectors and scalars (norm weights, biases, rope.inv_freq,
  // the weight and input scales) in one pass: its runs quantise the activations that
  // feed the int8 / fp8 GEMMs per row, which maps NaN to 0 and clamps inf, so a
  // non-finite value in what multiplies those activations element-wise would give a
  // finite, wrong output instead of the run's non-finite error (issue 28, item 4).
  // The time embedder and the AdaLN curve table are scanned too: they feed the AdaLN
  // linears, which int8-convrot-full files quantise. Other matrices are not: a NaN in a
  // float linear's weights reaches the residual stream through its output and the
  // engine's check names the block and phase, and an fp8 NaN weight reaches its GEMM's
  // output the same way (int8 has none). So the scan reads a few megabytes, not the
  // checkpoint. Unquantised files need none: every NaN reaches the engine's check.
  if (cfg->quant.any()) {
    const std::string& prefix = cfg->key_prefix;
    // Vector-like: at most one dimension above 1 (int8 weight scales are [N, 1]).
    const auto scanned = [&](const SafetensorsEntry& e) {
      if (e.dtype != DType::f32 && e.dtype != DType::bf16 && e.dtype != DType::f16) return false;
      if (std::count_if(e.shape.begin(), e.shape.end(), [](int64_t d) { return d > 1; }) <= 1) return true;
      return e.name.rfind(prefix + "time_embedder.", 0) == 0 || e.name == prefix + "adaln_t_table";
    };
    for (const SafetensorsEntry& e : file->entries())
      if (scanned(e)) LS_TRY(io::require_finite(*file, e, path));
  }

  auto src = std::unique_ptr<H3FileSource>(new H3FileSource());
  src->cfg_ = std::move(cfg).value();
  src->set_specs(h3_tensor_specs(src->cfg_));
  const std::string& prefix = src->cfg_.key_prefix;
  for (const SafetensorsEntry& e : file->entries()) {
    if (e.name.compare(0, prefix.size(), prefix) != 0) {
      src->unused_.push_back(e.name);
      continue;
    }
    if (!src->spec(e.name.substr(prefix.size()))) src->unused_.push_back(e.name);
  }
  for (const std::string& u : file->unsupported_tensors()) src->unused_.push_back(u);
  src->file_ = std::move(file);
  return src;
}

TensorView H3FileSource::get(const std::string& name) const {
  const TensorSpec* s = spec(name);
  LS_CHECK_MSG(s != nullptr, "H3 checkpoint has no tensor '" + name + "' for its config");
  const SafetensorsEntry* e = file_->find(cfg_.key_prefix + name);
  LS_CHECK_MSG(e != nullptr, "validated H3 checkpoint lost tensor '" + name + "'");
  const int nd = static_cast<int>(s->shape.size());
  const bool to_bf16 = held_as_bf16(cfg_.quant, *s);  // ComfyUI's mixed ops (quant.h)
  if (e->dtype == s->dtype && file_->is_aligned(*e) && !to_bf16)
    // Zero-copy: the mapped bytes. The view is typed non-const (TensorView has no const
    // flavour); the mapping is read-only, so a write through it faults.
    return TensorView::contiguous(const_cast<void*>(file_->data(*e)), s->dtype, s->shape.data(), nd);
  // Stored in another float dtype (accepted by validation only with
  // allow_dtype_conversion) or misaligned in the file: convert / copy once into host
  // memory owned by the source. fp32 -> bf16 rounds to nearest even (dtype.h);
  // bf16/f16 -> fp32 is exact.
  std::lock_guard<std::mutex> lk(mu_);
  auto it = converted_.find(name);
  if (it == converted_.end()) {
    const int64_t n = s->numel();
    std::vector<uint8_t> buf(static_cast<size_t>(n * dtype_size(s->dtype)));
    const void* src = file_->data(*e);
    if (e->dtype == s->dtype && !to_bf16) {
      std::memcpy(buf.data(), src, buf.size());
    } else if (to_bf16) {
      // Held as bf16, used as fp32: v = fl32(bf16(stored)) (f16 -> bf16 rounds once;
      // the f32 declared dtype holds the bf16 value exactly).
      std::vector<uint8_t> stored(static_cast<size_t>(n * dtype_size(e->dtype)));
      std::memcpy(stored.data(), src, stored.size());
      for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), s->dtype, i, round_bf16(load_as_f32(stored.data(), e->dtype, i)));
    } else {
      // load_as_f32 reads element-wise with memcpy-free pointer casts; stage the stored
      // bytes in an aligned buffer first in case the file is misaligned.
      std::vector<uint8_t> stored(static_cast<size_t>(n * dtype_size(e->dtype)));
      std::memcpy(stored.data(), src, stored.size());
      for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), s->dtype, i, load_as_f32(stored.data(), e->dtype, i));
    }
    it = converted_.emplace(name, std::move(buf)).first;
  }
  return TensorView::contiguous(it->second.data(), s->dtype, s->shape.data(), nd);
}

void H3FileSource::release(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  converted_.erase(name);
}

std::string H3FileSource::describe() const {
  return "checkpoint " + file_->path() + " (" + h3_config_summary(cfg_) + ")";
}

}  // namespace ls::h3
