// libFuzzer target: the CLI's input-file loaders (cli/inputs.h), as `forward --inputs /
// --keyframe / --mask` and `generate --text / --keyframe / --ref` run them on a file.
//
// The input is a whole safetensors file (read from memory, SafetensorsReader::from_bytes);
// every loader is tried on it against the tiny preset and a 5-frame 64x64 clip (and a
// geometry taken from the file's own "video" tensor, so shapes that match get through to
// the copies). Every input must give a value or an error, never an abort or a sanitizer
// report: issue 28 found `--inputs` with a 5-D tensor aborting in the error path.
// Seeds: fuzz/corpus/fuzz_cli_inputs/ (fuzz/make_corpus.py).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "io/safetensors.h"
#include "model/h3/config.h"
#include "cli/inputs.h"

namespace {

const ls::h3::H3Config& tiny() {
  static const ls::h3::H3Config c = *ls::h3::h3_preset("tiny");
  return c;
}

void check_view(const ls::TensorView& v) {
  if (v.empty()) return;
  if (v.ndim != 2 || v.size(0) < 0 || v.size(1) < 0) {
    std::fprintf(stderr, "load_text_states returned a view of rank %d\n", v.ndim);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = ls::SafetensorsReader::from_bytes(data, size, "<fuzz>");
  if (!file.ok()) return 0;
  const ls::SafetensorsReader& f = **file;
  const ls::h3::H3Config& cfg = tiny();
  auto g = ls::h3::clip_geometry(5, 64, 64, 4);
  if (!g.ok()) std::abort();
  std::vector<ls::h3::ClipGeometry> geoms{*g};
  // The file's own geometry: a "video" [C, T, Hl, Wl] whose sizes make a clip.
  if (const ls::SafetensorsEntry* v = f.find("video"); v && v->shape.size() == 4 && v->shape[2] > 0 &&
                                                      v->shape[3] > 0 && v->shape[2] <= 64 && v->shape[3] <= 64) {
    const int64_t T = v->shape[1];
    const int64_t frames = T <= 2 ? 5 : (T - 2) / 5 * 17 + 5;
    auto own = ls::h3::clip_geometry(frames, v->shape[3] * 16, v->shape[2] * 16, 4);
    if (own.ok() && own->tokens() < 100000) geoms.push_back(*own);
  }
  for (const ls::h3::ClipGeometry& geom : geoms) {
    (void)ls::cli::load_forward_inputs(f, cfg, geom);
    std::optional<std::string> frame;
    (void)ls::cli::load_forward_keyframe(f, cfg, geom, frame);
    ls::h3::Conditioning c;
    c.geometry = geom;
    (void)ls::cli::load_mask(f, geom, c);
    ls::h3::Keyframe kf;
    (void)ls::cli::load_generate_keyframe(f, cfg, geom, kf);
  }
  ls::h3::Reference ref;
  (void)ls::cli::load_reference(f, cfg, ref);
  auto t = ls::cli::load_text_states(f);
  if (t.ok()) {
    check_view(t->text);
    check_view(t->negative);
  }
  return 0;
}
