/* A program using only the public C API (include/layerstream/layerstream.h): an engine
 * on the built-in tiny preset (synthetic weights), ONE denoiser call on inputs made
 * here, and the output fingerprint. With a path argument it also writes its inputs as
 * safetensors ("video" f32 [C, T, Hl, Wl], "audio" f32 [Ca, 2, A], "text" f32 [L,
 * text_dim]), so that
 *
 *   layerstream forward --preset tiny --frames 22 --width 64 --height 64 \
 *       --text-tokens 8 --sigma 0.7 --inputs PATH
 *
 * prints the same "output hash" (tests/api/example_vs_cli.cmake checks it).
 *
 *   denoise [INPUTS.safetensors]     prints "output hash %016llx"; exit 0 ok, 1 failure
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <layerstream/layerstream.h>

/* Deterministic inputs in [-2, 2): a multiplicative hash of the index, in steps of
 * 1/64 (exact in bf16, never all zero). `salt` separates video, audio and text. */
static void fill(float* x, size_t n, uint32_t salt) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = ((uint32_t)i + salt * 0x9e3779b9u) * 2654435761u;
    x[i] = (float)((h >> 16) & 0xffu) / 64.0f - 2.0f;
  }
}

/* One f32 tensor's header entry. */
static int entry(char* buf, size_t cap, const char* name, const int64_t* shape, int ndim, size_t begin, size_t end,
                 int first) {
  int n = snprintf(buf, cap, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", first ? "" : ",", name);
  for (int d = 0; d < ndim; ++d) n += snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? "," : "", (long long)shape[d]);
  n += snprintf(buf + n, cap - (size_t)n, "],\"data_offsets\":[%zu,%zu]}", begin, end);
  return n;
}

/* safetensors: u64 little-endian header length, JSON header (space-padded to 8 bytes),
 * then the tensors' bytes (little-endian f32, as this host holds them). */
static int write_inputs(const char* path, const float* const data[3], const size_t count[3], const int64_t shapes[3][4],
                        const int ndims[3]) {
  static const char* names[3] = {"video", "audio", "text"};
  char header[1024];
  int n = snprintf(header, sizeof header, "{");
  size_t offset = 0;
  for (int t = 0; t < 3; ++t) {
    n += entry(header + n, sizeof header - (size_t)n, names[t], shapes[t], ndims[t], offset,
               offset + count[t] * sizeof(float), t == 0);
    offset += count[t] * sizeof(float);
  }
  n += snprintf(header + n, sizeof header - (size_t)n, "}");
  while (n % 8 != 0) header[n++] = ' ';
  FILE* f = fopen(path, "wb");
  if (!f) return 0;
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = (unsigned char)(((uint64_t)n >> (8 * b)) & 0xffu);
  int ok = fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, (size_t)n, f) == (size_t)n;
  for (int t = 0; t < 3 && ok; ++t) ok = fwrite(data[t], sizeof(float), count[t], f) == count[t];
  return fclose(f) == 0 && ok;
}

int main(int argc, char** argv) {
  ls_engine_params params;
  ls_engine_params_init(&params);
  params.preset = "tiny";
  ls_engine* engine = NULL;
  if (ls_engine_create(&params, &engine) != LS_OK) {
    fprintf(stderr, "denoise: %s\n", ls_last_error());
    return 1;
  }
  ls_model_info info;
  ls_model_info_init(&info);
  ls_clip clip;
  ls_clip_init(&clip);
  clip.frames = 22, clip.width = 64, clip.height = 64, clip.text_tokens = 8;
  ls_clip_shape shape;
  ls_clip_shape_init(&shape);
  if (ls_engine_model_info(engine, &info) != LS_OK || ls_engine_clip_shape(engine, &clip, &shape) != LS_OK) {
    fprintf(stderr, "denoise: %s\n", ls_engine_last_error(engine));
    ls_engine_free(engine);
    return 1;
  }
  float* video = malloc(shape.video_count * sizeof(float));
  float* audio = malloc(shape.audio_count * sizeof(float));
  float* text = malloc(shape.text_count * sizeof(float));
  float* video_out = malloc(shape.video_count * sizeof(float));
  float* audio_out = malloc(shape.audio_count * sizeof(float));
  int rc = 1;
  if (!video || !audio || !text || !video_out || !audio_out) {
    fprintf(stderr, "denoise: out of memory\n");
    goto done;
  }
  fill(video, shape.video_count, 1);
  fill(audio, shape.audio_count, 2);
  fill(text, shape.text_count, 3);
  if (argc > 1) {
    const float* const data[3] = {video, audio, text};
    const size_t count[3] = {shape.video_count, shape.audio_count, shape.text_count};
    const int64_t shapes[3][4] = {{info.latents_dim, shape.T, shape.Hl, shape.Wl},
                                  {info.audio_latents_dim, 2, shape.A, 0},
                                  {clip.text_tokens, info.text_dim, 0, 0}};
    const int ndims[3] = {4, 3, 2};
    if (!write_inputs(argv[1], data, count, shapes, ndims)) {
      fprintf(stderr, "denoise: cannot write %s\n", argv[1]);
      goto done;
    }
  }

  ls_denoise_params call;
  ls_denoise_params_init(&call);
  call.clip = &clip;
  call.video = video;
  call.audio = audio;
  call.text = text;
  call.sigma = 0.7f;
  call.video_out = video_out;
  call.video_out_count = shape.video_count;
  call.audio_out = audio_out;
  call.audio_out_count = shape.audio_count;
  if (ls_engine_denoise(engine, &call) != LS_OK) {
    fprintf(stderr, "denoise: %s\n", ls_engine_last_error(engine));
    goto done;
  }
  /* The fingerprint of the caller's buffers equals the engine's own record. */
  if (ls_fingerprint(video_out, shape.video_count, audio_out, shape.audio_count) != ls_engine_output_hash(engine)) {
    fprintf(stderr, "denoise: fingerprint mismatch\n");
    goto done;
  }
  printf("output hash %016llx\n", (unsigned long long)ls_engine_output_hash(engine));
  rc = 0;
done:
  free(video), free(audio), free(text), free(video_out), free(audio_out);
  ls_engine_free(engine);
  return rc;
}
