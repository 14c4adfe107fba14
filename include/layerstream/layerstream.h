/* LayerStream: the public C API (C11; the only header a front-end includes).
 *
 * One engine holds an H3 denoiser's weights on one device and runs denoiser calls and
 * whole sampling runs under a memory choice (a total device budget, an activation
 * budget, or explicit slice / offload / residency knobs). None of the memory choices
 * changes an output bit (docs/exactness.md); the numerics (ls_numerics) may.
 *
 *   ls_engine_params p;  ls_engine_params_init(&p);
 *   p.preset = "tiny";                             (or p.model_path = "h3.safetensors")
 *   ls_engine* e = NULL;
 *   if (ls_engine_create(&p, &e) != LS_OK) fprintf(stderr, "%s\n", ls_last_error());
 *   ls_denoise_params d;  ls_denoise_params_init(&d);
 *   ... d.clip, d.video, d.audio, d.text, d.sigma, d.video_out, d.audio_out ...
 *   if (ls_engine_denoise(e, &d) != LS_OK) fprintf(stderr, "%s\n", ls_engine_last_error(e));
 *   printf("%016llx\n", (unsigned long long)ls_engine_output_hash(e));
 *   ls_engine_free(e);
 *
 * Ownership and lifetime (docs/api.md):
 *  - Every pointer a caller passes in is borrowed for the duration of the call only;
 *    the library copies what it keeps. Outputs go to caller-owned buffers.
 *  - Strings the library returns (last error, JSON) are owned by the library: the
 *    engine's until the next call on that engine or ls_engine_free; ls_last_error's
 *    until the next failing create on the same thread.
 * Threading: an engine is used by one thread at a time (calls on one engine must not
 *   overlap); different engines may be used from different threads.
 * Errors: every function returning ls_status sets a message a user can act on:
 *   ls_engine_last_error(engine), or ls_last_error() (thread-local) when there is no
 *   engine yet (ls_engine_create) or the engine argument is NULL.
 * Versioning: every params struct starts with `size`, set by its _init function to
 *   sizeof(the struct); structs only ever grow at the end (append-only), so a program
 *   built against an older header keeps working (fields it does not know take their
 *   defaults). A size larger than the library knows is refused (LS_INVALID_ARGUMENT).
 *   LS_API_VERSION counts compatible additions; ls_version() names the build.
 * Shapes are PyTorch-ordered, outermost first: fp32 [C, T, Hl, Wl] is C*T*Hl*Wl
 *   contiguous floats with Wl fastest.
 */
#ifndef LAYERSTREAM_LAYERSTREAM_H
#define LAYERSTREAM_LAYERSTREAM_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(LS_BUILDING_LIBRARY)
#    define LS_API __declspec(dllexport)
#  else
#    define LS_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define LS_API __attribute__((visibility("default")))
#else
#  define LS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LS_API_VERSION 5 /* 2: ls_tensor (host or CUDA memory, f32|bf16, strided) and a caller's stream;
                           * 3: LoRAs; 4: ls_denoise_params.output_masks, audio-only keyframes,
                           * ls_engine_params.devices, LS_ATTENTION_HOPPER;
                           * 5: ls_memory_request (one tagged memory choice, ls_memory_validate,
                           *    ls_engine_params.memory), the range table (ls_range_at,
                           *    ls_parse_value), ls_parse_size, ls_clip_geometry, ls_probe_checkpoint */

/* ---- status ------------------------------------------------------------------- */
/* Mirrors ls::ErrorCode (src/core/status.h) plus LS_OK. */
typedef enum ls_status {
  LS_OK = 0,
  LS_INVALID_ARGUMENT = 1, /* the caller asked for something malformed (shape, value) */
  LS_INVALID_FILE = 2,     /* a file is malformed or inconsistent */
  LS_IO = 3,               /* the operating system refused a read or write */
  LS_UNSUPPORTED = 4,      /* well-formed but not implemented (or not in this build) */
  LS_OUT_OF_BUDGET = 5,    /* a plan does not fit the memory budget (the message names the minimum) */
  LS_OUT_OF_MEMORY = 6,    /* an allocation failed */
  LS_DEVICE = 7,           /* a device (CUDA, cuBLAS, cuDNN) call failed */
  LS_NOT_FOUND = 8,        /* a named thing is absent */
  LS_NONFINITE = 9         /* a computed value is NaN or infinite */
} ls_status;

/* "ok", "invalid_argument", ... (static strings). */
LS_API const char* ls_status_string(ls_status status);
/* "layerstream 0.1.0 (commit ..., Release build, backends: cpu)" (static string). */
LS_API const char* ls_version(void);
/* The message of the last failure on this thread with no engine to hold it
 * (ls_engine_create, or a NULL engine); "" if none. */
LS_API const char* ls_last_error(void);

/* FNV-1a 64 of the video bytes then the audio bytes: the output fingerprint the CLI
 * prints ("output hash"), equal across plans and budgets. */
LS_API uint64_t ls_fingerprint(const float* video, size_t video_count, const float* audio, size_t audio_count);

/* ---- tensors (API version 2): caller memory on the host or a CUDA device ---------
 * An ls_tensor describes memory the caller owns (borrowed for the call, as every
 * pointer). Inputs may be f32 or bf16 (bf16 is widened to fp32 exactly) and strided
 * (gathered into the library's contiguous fp32 copy); leading dimensions of size 1 are
 * accepted (a batch of one: [1, C, T, Hl, Wl] for [C, T, Hl, Wl]). Outputs are written
 * as f32, or as bf16 (each fp32 value rounded to nearest-even, as torch's .to(bfloat16));
 * host outputs may be strided, device outputs must be contiguous.
 * Device memory: a CUDA tensor must be on the engine's device. The engine packs its
 * inputs on the host today, so the library stages device inputs through host memory
 * (and device outputs back), ordered on the caller's stream with events
 * (ls_denoise_params.stream; no device-wide synchronisation). */
typedef enum ls_dtype { LS_DTYPE_F32 = 0, LS_DTYPE_BF16 = 1 } ls_dtype;
typedef enum ls_device_type { LS_DEVICE_CPU = 0, LS_DEVICE_CUDA = 1 } ls_device_type;
#define LS_TENSOR_MAX_DIMS 8

typedef struct ls_tensor {
  uint32_t size;               /* sizeof(ls_tensor), set by ls_tensor_init */
  void* data;                  /* the element at index (0, ..., 0) */
  ls_dtype dtype;              /* default LS_DTYPE_F32 */
  ls_device_type device_type;  /* default LS_DEVICE_CPU (host memory) */
  int32_t device_index;        /* CUDA: the device ordinal */
  int32_t ndim;                /* 1 .. LS_TENSOR_MAX_DIMS */
  int64_t shape[LS_TENSOR_MAX_DIMS];
  int64_t strides[LS_TENSOR_MAX_DIMS]; /* elements (not bytes), >= 0; always set (row-major for contiguous) */
} ls_tensor;

/* Zeroes t and sets size. */
LS_API void ls_tensor_init(ls_tensor* t);
/* ls_tensor_init, then a contiguous (row-major) host tensor of the given shape. */
LS_API void ls_tensor_host(ls_tensor* t, void* data, ls_dtype dtype, int32_t ndim, const int64_t* shape);

/* ---- numerics: every setting that may change output bits ----------------------- */
typedef enum ls_attention {
  LS_ATTENTION_DEFAULT = 0, /* the backend's for the model: CUDA hopper at head dim 128 on sm_90,
                               else cuDNN where built, else native (CPU: native) */
  LS_ATTENTION_NATIVE = 1,  /* the built-in kernel (CUDA) / the reference (CPU) */
  LS_ATTENTION_CUDNN = 2,   /* cuDNN's fused SDPA per key tile (CUDA + cuDNN) */
  LS_ATTENTION_HOPPER = 3,  /* the sm_90a kernel, head dim 128 (CUDA on Hopper; DEFAULT's choice there) */
  LS_ATTENTION_INT8 = 4     /* INT8 Q/K/V, u8 P (docs/int8-attention.md): CPU reference, CUDA sm_80+ */
} ls_attention;

typedef enum ls_gemm_f32_order {
  LS_GEMM_F32_LANES16 = 0, /* the CPU reference's order (CUDA gives the CPU's bytes) */
  LS_GEMM_F32_CUBLASLT = 1 /* pinned cuBLASLt path (CUDA only; other bits) */
} ls_gemm_f32_order;

typedef struct ls_numerics {
  uint32_t size;              /* sizeof(ls_numerics), set by ls_numerics_init */
  ls_attention attention;     /* default LS_ATTENTION_DEFAULT */
  int64_t kv_tile;            /* keys per attention tile; 0 (default) = the device's (CPU 1024) */
  ls_gemm_f32_order gemm_f32; /* default LS_GEMM_F32_LANES16 */
  /* Developer knobs of the CUDA kernels (each may change bits). */
  const char* native_variant; /* native kernel warp layout: NULL/"" (= "4x2"), "4x1", "8x1" */
  int64_t cudnn_q_chunk;      /* cuDNN: queries per staged chunk (default 2048) */
  const char* cudnn_form;     /* cuDNN graph form: NULL/"" (auto), "unified", "composite", "composite-f32p" */
  int64_t cudnn_skip_configs; /* cuDNN: skip the first N heuristic engine configs (default 0) */
} ls_numerics;

LS_API void ls_numerics_init(ls_numerics* n);

/* ---- engine --------------------------------------------------------------------- */
typedef enum ls_memory_mode {
  LS_MEMORY_KNOBS = 0,             /* the explicit knobs below (default: stock plan, all resident) */
  LS_MEMORY_ACTIVATION_BUDGET = 1, /* the largest slices whose activations fit activation_budget */
  LS_MEMORY_VRAM_BUDGET = 2        /* ONE device budget: weights, tables, activations, workspace */
} ls_memory_mode;

/* ---- the memory request (API version 5): ONE tagged memory choice ----------------
 * The same request, validation and messages at every door (the CLI's flags, this API,
 * Python's Engine keywords, the ComfyUI node): src/api/memory_request.h. The tag `mode`
 * says which choice; each field is LS_UNSET (ls_memory_request_init) or given, and a
 * given field that has no effect under the mode is refused (LS_INVALID_ARGUMENT naming
 * it), never ignored:
 *   LS_MEMORY_VRAM_BUDGET:       vram_budget (required), prefetch; nothing else.
 *   LS_MEMORY_ACTIVATION_BUDGET: activation_budget (required), resident_blocks, slots;
 *                                no slices, no kv_offload / residual_offload.
 *   LS_MEMORY_KNOBS:             the slices, offloads and residency below.
 * Unset fields take the library's defaults (the stock plan, every block resident, two
 * slots; under a vram budget prefetch 1). Ranges: ls_range_at / docs/api.md. */
#define LS_UNSET INT64_MIN
typedef struct ls_memory_request {
  uint32_t size;             /* sizeof(ls_memory_request), set by ls_memory_request_init */
  ls_memory_mode mode;       /* the tag; default LS_MEMORY_KNOBS */
  int64_t vram_budget;       /* bytes, 1 .. 2^60 */
  int64_t activation_budget; /* bytes, 1 .. 2^60 */
  int64_t prefetch;          /* 0 one block slot, 1 two (one where offloading exposes less), 2 always two */
  int64_t mlp_chunk;         /* rows per MLP / patch-embedding slice; 0 = all */
  int64_t attn_chunk;        /* rows per attention slice (two-pass); 0 = stock */
  int64_t final_chunk;       /* rows per final-layer slice; 0 = all */
  int64_t kv_offload;        /* 0 | 1: K/V in pinned host memory (needs attn_chunk) */
  int64_t kv_chunk;          /* keys per streamed K/V chunk (with kv_offload; 0 = about 4096, int8 16384; a multiple of kv_tile, with attention int8 also of 128) */
  int64_t residual_offload;  /* 0 | 1: the residual in pinned host memory (needs attn_chunk) */
  int64_t resident_blocks;   /* blocks kept on the device, 0 .. 1000 (unset = all) */
  int64_t slots;             /* 1 | 2 slots for streamed blocks (with resident_blocks) */
} ls_memory_request;

/* Every field LS_UNSET, mode LS_MEMORY_KNOBS. */
LS_API void ls_memory_request_init(ls_memory_request* r);
/* The one validation (ranges, the tag against the fields, every combination); with
 * `device` ("cpu", "cuda", "cuda:N", "cpu*N", "cuda:0,cuda:1"; NULL = not checked) also
 * whether the device has memory for a vram budget. LS_OK, or LS_INVALID_ARGUMENT with
 * the message in ls_last_error(). ls_engine_create calls the same. */
LS_API ls_status ls_memory_validate(const ls_memory_request* r, const char* device);

/* ---- sizes and ranges (API version 5): the one grammar and table of every door -----
 * Sizes: bytes ("123456", "123456B") or a number with a 1024-based unit K, M, G, T /
 * KiB, MiB, GiB, TiB, any case ("512M", "3.5GiB"); decimal units (KB, MB, ...), spaces,
 * signs and hex are refused. `what` names the quantity in the message (NULL = "size").
 * LS_OK, or LS_INVALID_ARGUMENT with the message in ls_last_error(). */
LS_API ls_status ls_parse_size(const char* what, const char* text, uint64_t* bytes);

typedef enum ls_range_kind { LS_RANGE_INTEGER = 0, LS_RANGE_REAL = 1, LS_RANGE_SIZE = 2 } ls_range_kind;
typedef struct ls_range {
  uint32_t size;        /* sizeof(ls_range), set by the caller (or ls_range_at's init) */
  const char* name;     /* "kv_tile", "sigma", "vram_budget", ... (static strings) */
  ls_range_kind kind;
  double lo, hi;        /* the bounds (sizes and integers up to 2^53 exactly) */
  int32_t lo_open, hi_open;
  const char* text;     /* the range as the messages print it: "1..2^30", "(0, 1]", "1 B..1 EiB" */
  const char* unit;     /* "keys", "bytes", "" */
  const char* meaning;  /* one line */
} ls_range;
/* The number of quantities in the table, and entry i (0-based); LS_NOT_FOUND past the end. */
LS_API size_t ls_range_count(void);
LS_API ls_status ls_range_at(size_t i, ls_range* out);
/* `text` parsed by the grammar (integers: decimal digits; reals: [-]D[.D][e[+-]D], no
 * '+', spaces, hex, inf, nan) and checked against the named quantity's range; `what`
 * names it in the message (NULL = the name). LS_INVALID_ARGUMENT with the message in
 * ls_last_error(); LS_NOT_FOUND for an unknown name. */
LS_API ls_status ls_parse_value(const char* name, const char* what, const char* text, double* value);

/* ---- the clip grid (API version 5) ---------------------------------------------------
 * The latent geometry every H3 model gives a clip (no engine needed): frames snapped up to
 * 17j + 5, T = 5j + 2 latent frames, Hl = height / 16, Wl = width / 16, A = round(5 *
 * frames / 3) audio latent frames. frames, width and height are checked against the range
 * table (width and height multiples of 32); LS_INVALID_ARGUMENT with ls_last_error(). */
typedef struct ls_clip_grid {
  uint32_t size;              /* sizeof(ls_clip_grid), set by the caller */
  int64_t frames;             /* snapped */
  int64_t width, height;
  int64_t T, Hl, Wl, A;
} ls_clip_grid;
LS_API ls_status ls_clip_geometry(int64_t frames, int64_t width, int64_t height, ls_clip_grid* out);

/* ---- the checkpoint probe (API version 5) --------------------------------------------
 * What the engine makes of an H3 checkpoint without loading its weights: JSON
 * {"path", "runnable" (bool), "reason" (why not; "" when runnable), "status" ("ok" or the
 * ls_status_string the engine would fail with), "model_info" (ls_model_info's fields:
 * hidden, num_layers, heads, head_dim, text_dim, latents_dim, audio_latents_dim, and
 * pdd_heads), "config" (the checkpoint's config under ComfyUI's names, as `layerstream
 * info` prints it), "format" (one line: "bf16", "int8_convrot g256",
 * "fp8_scaled (float8_e4m3fn)", ...), "census" (formats by layer class), "layers" (per
 * quantised linear: format, group), "clip_grid" (frames 17j+5, width/height multiples
 * of 32, latent factors), "version"}. The string is thread-local, valid until the next
 * probe on the thread. A file the engine cannot run is LS_OK with runnable false; a
 * NULL argument is LS_INVALID_ARGUMENT. */
LS_API ls_status ls_probe_checkpoint(const char* path, const char** json);

typedef struct ls_engine_params {
  uint32_t size; /* sizeof(ls_engine_params), set by ls_engine_params_init */
  /* Weights: a checkpoint, or a preset's synthetic weights (what make-model writes). */
  const char* model_path; /* an H3 checkpoint (.safetensors); NULL = use preset */
  const char* preset;     /* "tiny" | "small" | "h3" (with model_path NULL) */
  uint64_t weights_seed;  /* preset only; default 0 */
  int64_t blocks;         /* preset only; > 0 = this many DiT blocks at full width; 0 = the preset's */
  /* Device: "cpu" (default), "cuda", "cuda:N". */
  const char* device;
  int32_t threads; /* CPU threads of the process-wide pool; 0 (default) = all cores, < 0 = leave as is */
  /* Memory (never changes an output bit). */
  ls_memory_mode memory_mode;
  uint64_t vram_budget;       /* LS_MEMORY_VRAM_BUDGET: bytes (a device backend only) */
  int32_t prefetch;           /* LS_MEMORY_VRAM_BUDGET: 1 (default) two block slots, but one where offloading
                                 needs it and one exposes less transfer (docs/budget.md); 0 one; 2 always two */
  uint64_t activation_budget; /* LS_MEMORY_ACTIVATION_BUDGET: bytes */
  int64_t mlp_chunk;          /* KNOBS: rows per MLP / patch-embedding slice; 0 = all */
  int64_t attn_chunk;         /* KNOBS: rows per attention slice (two-pass); 0 = stock */
  int64_t final_chunk;        /* KNOBS: rows per final-layer slice; 0 = all */
  int32_t kv_offload;         /* KNOBS: K/V in pinned host memory (needs attn_chunk) */
  int64_t kv_chunk;           /* KNOBS: keys per streamed K/V chunk (0 = about 4096, int8 16384; int8: a multiple of 128) */
  int32_t residual_offload;   /* KNOBS: the residual in pinned host memory (needs attn_chunk) */
  int64_t resident_blocks;    /* KNOBS: blocks kept on the device; -1 (default) = all */
  int32_t slots;              /* KNOBS: slots for streamed blocks, 2 (default, prefetch) or 1 */
  /* Numerics: NULL = every default (ls_numerics_init). Copied at create. */
  const ls_numerics* numerics;
  /* Checks: 1 (default) fail with LS_NONFINITE naming the first block and phase where a
   * NaN/inf appears; 0 no check. Never changes a bit. */
  int32_t check_finite;
  /* ---- LS_API_VERSION 3 ---- */
  /* LoRAs merged into the weights by ComfyUI's formula (docs/lora.md), in this order:
   * lora_count strings "FILE" or "FILE:STRENGTH" (copied at create). NULL / 0 = none. */
  const char* const* loras;
  size_t lora_count;
  /* The merge's compute dtype (numerics: changes bits): LS_LORA_DTYPE_AUTO (default) =
   * ComfyUI's for the device (f16 on CUDA, f32 on the CPU). */
  int32_t lora_dtype;
  /* ---- LS_API_VERSION 4 ---- */
  /* Sequence parallel over several devices (docs/multi-gpu.md): NULL (default) = `device`
   * alone; else "cuda:0,cuda:1,..." or "cpu*N" (N in-process CPU ranks), one rank per
   * device, rank 0 first (`device` is then not read). The output bytes equal one
   * device's; budgets are per device; the count must divide the model's heads. */
  const char* devices;
  /* ---- LS_API_VERSION 5 ---- */
  /* The memory choice as ONE tagged request (ls_memory_request; copied at create). NULL
   * (default) = the legacy fields above (memory_mode .. slots), which keep their meaning;
   * given, the legacy memory fields must keep their defaults (else LS_INVALID_ARGUMENT).
   * Either way the same validation runs (ls_memory_validate): under LS_MEMORY_VRAM_BUDGET
   * a legacy slice, offload or residency field that is not its default is refused (it
   * used to be ignored), as is a prefetch other than 1 outside it. */
  const ls_memory_request* memory;
} ls_engine_params;

#define LS_LORA_DTYPE_AUTO 0
#define LS_LORA_DTYPE_F32 1
#define LS_LORA_DTYPE_F16 2
#define LS_LORA_DTYPE_BF16 3 /* API 4: ComfyUI's cast-time merge (dynamic VRAM / lowvram), docs/lora.md */

LS_API void ls_engine_params_init(ls_engine_params* p);

typedef struct ls_engine ls_engine; /* opaque */

/* Opens the device and the weights (a file is checked now; synthetic weights are made
 * lazily). The device engine itself is made at the first call that knows the clip (its
 * residency may depend on the clip under a vram budget) and kept while the clip's plan
 * keeps the same residency. On failure *out is NULL and ls_last_error() says why. */
LS_API ls_status ls_engine_create(const ls_engine_params* params, ls_engine** out);
LS_API void ls_engine_free(ls_engine* engine); /* NULL is fine */
/* The message of the engine's last failure ("" if none); owned by the engine. */
LS_API const char* ls_engine_last_error(const ls_engine* engine);

/* The model's dimensions (for sizing buffers). */
typedef struct ls_model_info {
  uint32_t size;
  int64_t hidden, num_layers, heads, head_dim, text_dim;
  int64_t latents_dim;       /* C of video latents */
  int64_t audio_latents_dim; /* Ca of audio latents */
} ls_model_info;
LS_API void ls_model_info_init(ls_model_info* info);
LS_API ls_status ls_engine_model_info(ls_engine* engine, ls_model_info* info);

/* ---- the clip and its conditioning ---------------------------------------------- */
typedef struct ls_video_latent {
  const float* data; /* fp32 [C, T, Hl, Wl], C = latents_dim; NULL = none */
  int64_t T, Hl, Wl;
} ls_video_latent;

typedef struct ls_audio_latent {
  const float* data; /* fp32 [Ca, 2, A], Ca = audio_latents_dim; NULL = none */
  int64_t A;
} ls_audio_latent;

/* Caller-drawn noise augmentation rows (h3::ConditionNoise): NULL = the engine's
 * restatement of torch's CPU generator. Read only when the stream's aug < 1. */
typedef struct ls_condition_noise {
  const float* video; /* fp32 [T*Hl/2*Wl/2, 4C] row-major, or NULL */
  size_t video_count;
  const float* audio; /* fp32 [2A, Ca] row-major, or NULL */
  size_t audio_count;
} ls_condition_noise;

typedef struct ls_keyframe {
  int64_t pixel_frame; /* 0 = first frame, frames - 1 = last */
  ls_video_latent video; /* may be empty (data NULL) for an audio-only keyframe */
  ls_audio_latent audio; /* optional; required without video */
  ls_condition_noise noise;
} ls_keyframe;

typedef enum ls_reference_kind {
  LS_REFERENCE_IMAGE = 0,
  LS_REFERENCE_AUDIO = 1,
  LS_REFERENCE_VIDEO = 2,
  LS_REFERENCE_VIDEO_AUDIO = 3
} ls_reference_kind;

typedef struct ls_reference {
  ls_reference_kind kind;
  ls_video_latent video;
  ls_audio_latent audio;
  ls_condition_noise noise;
} ls_reference;

/* API version 2: a keyframe or reference in ls_tensor form (any dtype, strides, host
 * or device memory), through ls_clip.keyframe_tensors / reference_tensors. Arrays of
 * POINTERS, so that each struct's `size` versions it on its own. */
typedef struct ls_keyframe_tensors {
  uint32_t size;                /* sizeof(ls_keyframe_tensors), set by ls_keyframe_tensors_init */
  int64_t pixel_frame;          /* as ls_keyframe */
  const ls_tensor* video;       /* [C, T, Hl, Wl], or NULL for an audio-only keyframe
                                 * (ComfyUI's MiniMaxH3AddGuide with audio and no image) */
  const ls_tensor* audio;       /* [Ca, 2, A] or NULL (required without video) */
  const ls_tensor* noise_video; /* ls_condition_noise.video's values (any shape; read in row-major order) or NULL */
  const ls_tensor* noise_audio; /* ls_condition_noise.audio's values or NULL */
} ls_keyframe_tensors;
LS_API void ls_keyframe_tensors_init(ls_keyframe_tensors* k);

typedef struct ls_reference_tensors {
  uint32_t size; /* sizeof(ls_reference_tensors), set by ls_reference_tensors_init */
  ls_reference_kind kind;
  const ls_tensor* video;       /* [C, T, Hl, Wl] or NULL */
  const ls_tensor* audio;       /* [Ca, 2, A] or NULL */
  const ls_tensor* noise_video; /* or NULL */
  const ls_tensor* noise_audio; /* or NULL */
} ls_reference_tensors;
LS_API void ls_reference_tensors_init(ls_reference_tensors* r);

typedef struct ls_clip {
  uint32_t size; /* sizeof(ls_clip), set by ls_clip_init */
  /* Pixel geometry: frames (snapped up to 17j+5), width and height (multiples of 32). */
  int64_t frames, width, height;
  int64_t text_tokens;       /* L: rows of the text states */
  const int8_t* text_tags;   /* int8 [L]: 1 text, 0 vision token; NULL = all text */
  const ls_keyframe* keyframes;
  size_t keyframe_count;
  const ls_reference* references;
  size_t reference_count;
  const float* video_mask;   /* fp32 [T, Hl, Wl], 1 = denoise; NULL = none */
  const float* audio_mask;   /* fp32 [2, A]; NULL = none */
  double vis_aug;            /* default 0.999 */
  double aud_aug;            /* default 1.0 */
  uint64_t seed;             /* noise-augmentation seed (the sampler seed); default 0 */
  double shift_video;        /* default 12.0 */
  double shift_audio;        /* default 3.0 */
  double audio_scale;        /* default 4.0 (1.0: no audio carry) */
  /* The sampling schedule (descending, terminal 0 allowed). ls_engine_denoise: read by
   * the PDD head bank only (NULL: a PDD model uses {1, sigma, 0}, as `layerstream
   * forward`). ls_engine_generate: the schedule (NULL: a simple one of `steps`). */
  const float* sample_sigmas;
  size_t sample_sigma_count;
  /* API version 2: tensor forms, used in place of the pointer forms above (give one
   * form of each: both is LS_INVALID_ARGUMENT). */
  const ls_tensor* video_mask_tensor; /* [T, Hl, Wl] (leading 1s allowed) or NULL */
  const ls_tensor* audio_mask_tensor; /* [2, A] or NULL */
  const ls_keyframe_tensors* const* keyframe_tensors; /* keyframe_tensor_count pointers */
  size_t keyframe_tensor_count;
  const ls_reference_tensors* const* reference_tensors;
  size_t reference_tensor_count;
} ls_clip;

LS_API void ls_clip_init(ls_clip* clip);

/* Device tensors in a clip (ls_clip's tensor forms) given to ls_engine_clip_shape or
 * ls_engine_plan are read after the work on the legacy default stream (ls_engine_denoise
 * orders them on its `stream`). */
/* The latent sizes of a clip on this engine's model (for sizing buffers). */
typedef struct ls_clip_shape {
  uint32_t size;           /* sizeof(ls_clip_shape), set by ls_clip_shape_init */
  int64_t T, Hl, Wl;       /* video latent frames, height, width */
  int64_t A;               /* audio latent frames */
  int64_t S;               /* packed rows of one denoiser call */
  size_t video_count;      /* floats of fp32 [C, T, Hl, Wl] */
  size_t audio_count;      /* floats of fp32 [Ca, 2, A] */
  size_t text_count;       /* floats of raw text states fp32 [L, text_dim] */
} ls_clip_shape;
LS_API void ls_clip_shape_init(ls_clip_shape* shape);
LS_API ls_status ls_engine_clip_shape(ls_engine* engine, const ls_clip* clip, ls_clip_shape* shape);

/* ---- plan without work (the dry run) -------------------------------------------- */
/* JSON owned by the engine (valid until the next call on it): {"plan": the activation
 * plan (slices, buffers, predicted peak), "vram_budget": the budget plan or null
 * (residency, offloads, predicted peak by component, PCIe bytes), "minimum_budget_bytes"
 * (the smallest budget of the mode, 0 for knobs), "numerics", "version"}. `sigma` is
 * the call's sigma (ignored when clip->sample_sigmas is given). */
LS_API ls_status ls_engine_plan(ls_engine* engine, const ls_clip* clip, float sigma, const char** json);

/* ---- one denoiser call ---------------------------------------------------------- */
typedef struct ls_denoise_params {
  uint32_t size; /* sizeof(ls_denoise_params), set by ls_denoise_params_init */
  const ls_clip* clip;
  const float* video; /* fp32 [C, T, Hl, Wl] (the sampler's state) */
  const float* audio; /* fp32 [Ca, 2, A] */
  /* Text: raw text-encoder states fp32 [L, text_dim] (refined here), or refined ones
   * bf16 bits [L, hidden] (from ls_engine_refine_text; then `text` is ignored). */
  const float* text;
  const uint16_t* refined_text;
  float sigma;  /* the call's video sigma (timestep fl32(sigma * 1000)) */
  float* video_out; /* fp32 [C, T, Hl, Wl]: the velocity (ComfyUI sign) */
  size_t video_out_count;
  float* audio_out; /* fp32 [Ca, 2, A] */
  size_t audio_out_count;
  /* API version 2: tensor forms (ls_tensor), used in place of the pointer of the same
   * role (give one form of each). video_out_tensor / audio_out_tensor are written (f32
   * or bf16); the fingerprint (ls_engine_output_hash) is always of the fp32 velocities. */
  const ls_tensor* video_tensor;        /* [C, T, Hl, Wl] */
  const ls_tensor* audio_tensor;        /* [Ca, 2, A] */
  const ls_tensor* text_tensor;         /* raw states [L, text_dim] */
  const ls_tensor* refined_text_tensor; /* bf16 [L, hidden] (or f32 holding bf16 values exactly) */
  const ls_tensor* video_out_tensor;
  const ls_tensor* audio_out_tensor;
  /* The caller's CUDA stream (a cudaStream_t; NULL = the legacy default stream): the
   * engine's reads of device inputs wait for the work queued on it so far, and later
   * work on it waits for the engine's writes of device outputs (events, no device-wide
   * synchronisation). Ignored when no tensor is on a device. */
  void* stream;
  /* API version 4: 1 (the default, set by ls_denoise_params_init) multiplies the
   * velocities by the clip's masks, as ComfyUI's MiniMaxH3Model.forward does; 0 returns
   * them unmasked, as its _forward does (the masked rows' timesteps still come from the
   * masks). */
  int32_t output_masks;
} ls_denoise_params;

LS_API void ls_denoise_params_init(ls_denoise_params* p);
LS_API ls_status ls_engine_denoise(ls_engine* engine, const ls_denoise_params* p);

/* Refines raw text states fp32 [tokens, text_dim] into bf16 bits [tokens, hidden]
 * (out_count = tokens * hidden). */
LS_API ls_status ls_engine_refine_text(ls_engine* engine, const float* text, int64_t tokens, uint16_t* out,
                                       size_t out_count);

/* ---- a whole sampling run (simple schedule, flow Euler, CFG) --------------------- */
typedef struct ls_generate_params {
  uint32_t size; /* sizeof(ls_generate_params) */
  const ls_clip* clip; /* clip->sample_sigmas, if given, is the schedule; else a simple one of `steps` */
  int64_t steps;         /* default 4 */
  double cfg;            /* default 1 (one forward per step) */
  uint64_t seed;         /* sampler seed: noise; default 0 */
  const float* text;     /* raw text states fp32 [L, text_dim], L = clip->text_tokens */
  const float* negative; /* fp32 [negative_tokens, text_dim]; required when cfg != 1 */
  int64_t negative_tokens;
  const float* initial_latent; /* packed fp32 video then audio, NULL = t2va (zeros) */
  float* video_out;            /* fp32 [C, T, Hl, Wl]: the final latents */
  size_t video_out_count;
  float* audio_out; /* fp32 [Ca, 2, A] */
  size_t audio_out_count;
} ls_generate_params;

LS_API void ls_generate_params_init(ls_generate_params* p);
LS_API ls_status ls_engine_generate(ls_engine* engine, const ls_generate_params* p);

/* ---- after a call ---------------------------------------------------------------- */
/* The last denoise / generate: the run report (RunReport fields; every forward for
 * generate), the plan, the budget plan, the numerics and the version, as JSON owned by
 * the engine (valid until the next call on it). LS_NOT_FOUND before any call. */
LS_API ls_status ls_engine_report_json(ls_engine* engine, const char** json);
/* The last output's fingerprint (ls_fingerprint of video then audio); 0 before any.
 * Computed at the first request after a call (here or by ls_engine_report_json): it reads
 * every output byte, about 50 ms at S = 111k on a server CPU. */
LS_API uint64_t ls_engine_output_hash(const ls_engine* engine);
/* The last call's report as ls_engine_report_json gives it, without "output_hash": no cost
 * beyond the call (a caller that reports every step, such as the ComfyUI node, uses this). */
LS_API ls_status ls_engine_call_report_json(ls_engine* engine, const char** json);

#ifdef __cplusplus
}
#endif

#endif /* LAYERSTREAM_LAYERSTREAM_H */
