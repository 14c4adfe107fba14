// layerstream._C: the CPython extension over the public C API (layerstream.h) only.
//
// What it adds to the C API is the Python side of tensor exchange and errors:
//  - arrays in and out: the buffer protocol (numpy; float32) and DLPack (`__dlpack__`,
//    torch CPU and CUDA tensors; float32 and bfloat16; legacy DLManagedTensor capsules,
//    <dlpack/dlpack.h> from Debian's libdlpack-dev, no torch at build time) become
//    ls_tensor descriptors of the caller's memory: no copy here, strides kept (the
//    library gathers strided inputs and widens bf16 exactly);
//  - the GIL is released during every engine call (a mutex keeps calls on one engine
//    from overlapping, as the C API requires);
//  - a failing status raises layerstream.Error (or a subclass per status) carrying the
//    engine's message (ls_engine_last_error / ls_last_error) and `.status`.
// Everything else (argument parsing, sizes like "12G", numpy output allocation, JSON)
// is in python/layerstream/__init__.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>
#include <layerstream/layerstream.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// ---- errors ------------------------------------------------------------------------
// layerstream.Error (a RuntimeError) and one subclass per ls_status.
PyObject* g_error = nullptr;
std::map<int, PyObject*> g_status_class;

[[noreturn]] void raise(ls_status st, const std::string& message) {
  auto it = g_status_class.find(static_cast<int>(st));
  PyObject* cls = it != g_status_class.end() ? it->second : g_error;
  py::object inst = py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", message.c_str()));
  if (!inst) throw py::error_already_set();
  inst.attr("status") = py::str(ls_status_string(st));
  PyErr_SetObject(cls, inst.ptr());
  throw py::error_already_set();
}
[[noreturn]] void invalid(const std::string& message) { raise(LS_INVALID_ARGUMENT, message); }

// ---- tensors -------------------------------------------------------------------------
// One caller array seen as an ls_tensor, and what keeps its memory alive until the call
// returns: a Py_buffer (buffer protocol) or a consumed DLPack capsule's DLManagedTensor
// (its deleter runs in the destructor, with the GIL held). Held objects are kept in
// unique_ptrs so the ls_tensor addresses handed to the C API stay put.
struct Held {
  ls_tensor t{};
  Py_buffer view{};
  bool has_view = false;
  DLManagedTensor* managed = nullptr;

  Held() { ls_tensor_init(&t); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() {
    if (managed && managed->deleter) managed->deleter(managed);
    if (has_view) PyBuffer_Release(&view);
  }
};

// The caller's CUDA stream as DLPack's `stream` argument: the producer (torch) makes
// that stream wait for its own work on the tensor. 0 (the legacy default stream) is
// spelled 1 in the DLPack protocol.
py::object dlpack_stream_arg(uintptr_t stream) { return py::int_(stream == 0 ? uintptr_t{1} : stream); }

std::unique_ptr<Held> from_buffer(py::handle obj, bool writable, const std::string& what) {
  auto h = std::make_unique<Held>();
  int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &h->view, flags) != 0) {
    py::error_already_set e;  // takes the Python error
    invalid(what + ": " + std::string(py::str(e.value())) + (writable ? " (an output must be writable)" : ""));
  }
  h->has_view = true;
  const Py_buffer& v = h->view;
  std::string fmt = v.format ? v.format : "B";
  if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt = fmt.substr(1);
  if (fmt != "f" || v.itemsize != 4)
    invalid(what + ": buffer format '" + std::string(v.format ? v.format : "B") + "' (itemsize " +
            std::to_string(v.itemsize) + "): give float32 (numpy), or bfloat16 / float32 through __dlpack__ (torch)");
  if (v.ndim < 1 || v.ndim > LS_TENSOR_MAX_DIMS)
    invalid(what + ": " + std::to_string(v.ndim) + " dimensions (1 to " + std::to_string(LS_TENSOR_MAX_DIMS) + ")");
  h->t.data = v.buf;
  h->t.dtype = LS_DTYPE_F32;
  h->t.device_type = LS_DEVICE_CPU;
  h->t.ndim = v.ndim;
  for (int i = 0; i < v.ndim; ++i) {
    h->t.shape[i] = v.shape[i];
    if (v.strides[i] % v.itemsize != 0) invalid(what + ": a stride is not a whole number of elements");
    h->t.strides[i] = v.strides[i] / v.itemsize;  // negative strides are refused by the library
  }
  return h;
}

std::unique_ptr<Held> from_dlpack(py::handle obj, uintptr_t stream, const std::string& what) {
  int dev_type = kDLCPU;
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple d = obj.attr("__dlpack_device__")();
    dev_type = d[0].cast<int>();
  }
  py::object capsule;
  if (dev_type == kDLCUDA) {
    capsule = obj.attr("__dlpack__")(py::arg("stream") = dlpack_stream_arg(stream));
  } else if (dev_type == kDLCPU || dev_type == kDLCUDAHost) {
    capsule = obj.attr("__dlpack__")();
  } else {
    invalid(what + ": DLPack device type " + std::to_string(dev_type) + ": give a CPU or CUDA tensor");
  }
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    invalid(what + ": __dlpack__ did not return a \"dltensor\" capsule (an unused DLPack 0.6 capsule)");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!m) throw py::error_already_set();
  // Consumed: the capsule's destructor must no longer free it; Held calls the deleter.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
  auto h = std::make_unique<Held>();
  h->managed = m;
  const DLTensor& dl = m->dl_tensor;
  if (dl.dtype.lanes != 1) invalid(what + ": vector dtypes (lanes > 1) are not supported");
  if (dl.dtype.code == kDLFloat && dl.dtype.bits == 32) {
    h->t.dtype = LS_DTYPE_F32;
  } else if (dl.dtype.code == kDLBfloat && dl.dtype.bits == 16) {
    h->t.dtype = LS_DTYPE_BF16;
  } else {
    const char* code = dl.dtype.code == kDLFloat ? "float" : dl.dtype.code == kDLInt ? "int"
                       : dl.dtype.code == kDLUInt ? "uint" : dl.dtype.code == kDLBfloat ? "bfloat" : "code ";
    invalid(what + ": dtype " + code + std::to_string(dl.dtype.bits) + ": give float32 or bfloat16");
  }
  if (dl.ndim < 1 || dl.ndim > LS_TENSOR_MAX_DIMS)
    invalid(what + ": " + std::to_string(dl.ndim) + " dimensions (1 to " + std::to_string(LS_TENSOR_MAX_DIMS) + ")");
  h->t.data = static_cast<char*>(dl.data) + dl.byte_offset;
  h->t.ndim = dl.ndim;
  int64_t stride = 1;
  for (int i = dl.ndim - 1; i >= 0; --i) {
    h->t.shape[i] = dl.shape[i];
    h->t.strides[i] = dl.strides ? dl.strides[i] : stride;  // NULL strides: row-major
    stride *= dl.shape[i];
  }
  if (dl.device.device_type == kDLCUDA) {
    h->t.device_type = LS_DEVICE_CUDA;
    h->t.device_index = dl.device.device_id;
  } else {
    h->t.device_type = LS_DEVICE_CPU;  // kDLCPU, kDLCUDAHost (pinned host memory)
  }
  return h;
}

// Buffer protocol first (numpy; torch tensors do not offer it), then DLPack.
std::unique_ptr<Held> as_tensor(py::handle obj, bool writable, uintptr_t stream, const std::string& what) {
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, writable, what);
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, stream, what);
  invalid(what + ": expected an array with the buffer protocol (numpy float32) or a tensor with __dlpack__ (torch), got " +
          std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

// A dict entry, or `fallback` (the library's default) when absent or None.
template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

// ---- the clip --------------------------------------------------------------------------
// The clip as python/layerstream/__init__.py hands it over (Clip._to_c): a dict of plain
// values; keyframes as (pixel_frame, video, audio, noise_video, noise_audio) tuples,
// references as (kind, video, audio, noise_video, noise_audio).
struct ClipHolder {
  ls_clip clip{};
  std::string tags;
  std::vector<float> sigmas;
  std::vector<std::unique_ptr<Held>> tensors;
  std::vector<ls_keyframe_tensors> keyframes;
  std::vector<const ls_keyframe_tensors*> keyframe_ptrs;
  std::vector<ls_reference_tensors> references;
  std::vector<const ls_reference_tensors*> reference_ptrs;

  const ls_tensor* tensor(py::handle obj, uintptr_t stream, const std::string& what) {
    if (obj.is_none()) return nullptr;
    tensors.push_back(as_tensor(obj, false, stream, what));
    return &tensors.back()->t;
  }
  // A keyframe's or a reference's latents from its tuple's items 1..4 (video, audio,
  // noise_video, noise_audio); `what` names it in errors ("keyframe 0").
  template <typename T>
  void latents(T& t, const py::tuple& x, uintptr_t stream, const std::string& what) {
    t.video = tensor(x[1], stream, what + " video");
    t.audio = tensor(x[2], stream, what + " audio");
    t.noise_video = tensor(x[3], stream, what + " noise_video");
    t.noise_audio = tensor(x[4], stream, what + " noise_audio");
  }
};

std::unique_ptr<ClipHolder> make_clip_values(const py::dict& d, uintptr_t stream) {
  auto h = std::make_unique<ClipHolder>();
  ls_clip& c = h->clip;
  ls_clip_init(&c);
  c.frames = d["frames"].cast<int64_t>();
  c.width = d["width"].cast<int64_t>();
  c.height = d["height"].cast<int64_t>();
  c.text_tokens = d["text_tokens"].cast<int64_t>();
  if (!d["text_tags"].is_none()) {
    h->tags = d["text_tags"].cast<std::string>();  // bytes of int8 tags
    if (static_cast<int64_t>(h->tags.size()) != c.text_tokens)
      invalid("text_tags has " + std::to_string(h->tags.size()) + " entries; text_tokens is " +
              std::to_string(c.text_tokens));
    c.text_tags = reinterpret_cast<const int8_t*>(h->tags.data());
  }
  // Not given (None): ls_clip_init's defaults, the library's (h3::Conditioning's).
  c.vis_aug = get<double>(d, "vis_aug", c.vis_aug);
  c.aud_aug = get<double>(d, "aud_aug", c.aud_aug);
  c.seed = get<uint64_t>(d, "seed", c.seed);
  c.shift_video = get<double>(d, "shift_video", c.shift_video);
  c.shift_audio = get<double>(d, "shift_audio", c.shift_audio);
  c.audio_scale = get<double>(d, "audio_scale", c.audio_scale);
  if (!d["sample_sigmas"].is_none()) {
    h->sigmas = d["sample_sigmas"].cast<std::vector<float>>();
    c.sample_sigmas = h->sigmas.data();
    c.sample_sigma_count = h->sigmas.size();
  }
  c.video_mask_tensor = h->tensor(d["video_mask"], stream, "video_mask");
  c.audio_mask_tensor = h->tensor(d["audio_mask"], stream, "audio_mask");
  py::list kfs = d["keyframes"];
  h->keyframes.resize(kfs.size());  // sized once: the pointers below stay valid
  for (size_t i = 0; i < kfs.size(); ++i) {
    py::tuple k = kfs[i];
    const std::string w = "keyframe " + std::to_string(i);
    ls_keyframe_tensors& kt = h->keyframes[i];
    ls_keyframe_tensors_init(&kt);
    kt.pixel_frame = k[0].cast<int64_t>();
    h->latents(kt, k, stream, w);
    h->keyframe_ptrs.push_back(&kt);
  }
  c.keyframe_tensors = h->keyframe_ptrs.data();
  c.keyframe_tensor_count = h->keyframe_ptrs.size();
  py::list refs = d["references"];
  h->references.resize(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    py::tuple r = refs[i];
    const std::string w = "reference " + std::to_string(i);
    ls_reference_tensors& rt = h->references[i];
    ls_reference_tensors_init(&rt);
    rt.kind = static_cast<ls_reference_kind>(r[0].cast<int>());
    h->latents(rt, r, stream, w);
    h->reference_ptrs.push_back(&rt);
  }
  c.reference_tensors = h->reference_ptrs.data();
  c.reference_tensor_count = h->reference_ptrs.size();
  return h;
}

// The clip, with a value of the wrong type a layerstream.InvalidArgument (Clip._to_c
// converts and checks first; this is the net under it).
std::unique_ptr<ClipHolder> make_clip(const py::dict& d, uintptr_t stream) {
  try {
    return make_clip_values(d, stream);
  } catch (const py::cast_error& x) {
    invalid(std::string("clip: a value is not of the type its field takes (") + x.what() + ")");
  }
}

// ---- the engine ------------------------------------------------------------------------

class Engine {
 public:
  // `p`: the ls_engine_params fields by name (python/layerstream/__init__.py builds it);
  // numerics as ls_numerics fields (enums as ints).
  explicit Engine(const py::dict& p) {
    try {
      create(p);
    } catch (const py::cast_error& x) {
      // python/layerstream/__init__.py converts and checks every value first; this is the net
      // under it, so that a bad value is a layerstream.InvalidArgument, never a bare cast error.
      invalid(std::string("Engine: a value is not of the type its parameter takes (") + x.what() + ")");
    }
  }
  ~Engine() { close(); }

 private:
  void create(const py::dict& p) {
    // The defaults are the library's (ls_engine_params_init, ls_memory_request_init,
    // ls_numerics_init): only what the caller gave is set here.
    ls_engine_params ep;
    ls_engine_params_init(&ep);
    const std::string model = get<std::string>(p, "model_path", "");
    const std::string preset = get<std::string>(p, "preset", "");
    const std::string device = get<std::string>(p, "device", ep.device);
    ep.model_path = model.empty() ? nullptr : model.c_str();
    ep.preset = preset.empty() ? nullptr : preset.c_str();
    ep.weights_seed = get<uint64_t>(p, "weights_seed", ep.weights_seed);
    ep.blocks = get<int64_t>(p, "blocks", ep.blocks);
    ep.device = device.c_str();
    ep.threads = get<int32_t>(p, "threads", ep.threads);
    // The memory choice: ONE tagged request (ls_memory_request), the fields given only.
    ls_memory_request mr;
    ls_memory_request_init(&mr);
    if (p.contains("memory") && !p["memory"].is_none()) {
      py::dict m = p["memory"];
      mr.mode = static_cast<ls_memory_mode>(get<int>(m, "mode", LS_MEMORY_KNOBS));
      mr.vram_budget = get<int64_t>(m, "vram_budget", LS_UNSET);
      mr.activation_budget = get<int64_t>(m, "activation_budget", LS_UNSET);
      mr.prefetch = get<int64_t>(m, "prefetch", LS_UNSET);
      mr.mlp_chunk = get<int64_t>(m, "mlp_chunk", LS_UNSET);
      mr.attn_chunk = get<int64_t>(m, "attn_chunk", LS_UNSET);
      mr.final_chunk = get<int64_t>(m, "final_chunk", LS_UNSET);
      mr.kv_offload = get<int64_t>(m, "kv_offload", LS_UNSET);
      mr.kv_chunk = get<int64_t>(m, "kv_chunk", LS_UNSET);
      mr.residual_offload = get<int64_t>(m, "residual_offload", LS_UNSET);
      mr.resident_blocks = get<int64_t>(m, "resident_blocks", LS_UNSET);
      mr.slots = get<int64_t>(m, "slots", LS_UNSET);
      ep.memory = &mr;
    }
    ep.check_finite = get<bool>(p, "check_finite", ep.check_finite != 0) ? 1 : 0;
    std::vector<std::string> loras;
    if (p.contains("loras"))
      for (const auto& l : p["loras"]) loras.push_back(py::cast<std::string>(l));
    std::vector<const char*> lora_ptrs;
    for (const auto& l : loras) lora_ptrs.push_back(l.c_str());
    ep.loras = lora_ptrs.empty() ? nullptr : lora_ptrs.data();
    ep.lora_count = lora_ptrs.size();
    ep.lora_dtype = get<int32_t>(p, "lora_dtype", ep.lora_dtype);
    // devices: sequence parallel over several devices (docs/multi-gpu.md), "" = device alone.
    const std::string devices = get<std::string>(p, "devices", "");
    ep.devices = devices.empty() ? nullptr : devices.c_str();
    ls_numerics n;
    ls_numerics_init(&n);
    const std::string native_variant = get<std::string>(p, "native_variant", "");
    const std::string cudnn_form = get<std::string>(p, "cudnn_form", "");
    n.attention = static_cast<ls_attention>(get<int>(p, "attention", n.attention));
    n.kv_tile = get<int64_t>(p, "kv_tile", n.kv_tile);
    n.gemm_f32 = static_cast<ls_gemm_f32_order>(get<int>(p, "gemm_f32", n.gemm_f32));
    n.native_variant = native_variant.empty() ? nullptr : native_variant.c_str();
    n.cudnn_q_chunk = get<int64_t>(p, "cudnn_q_chunk", n.cudnn_q_chunk);
    n.cudnn_form = cudnn_form.empty() ? nullptr : cudnn_form.c_str();
    n.cudnn_skip_configs = get<int64_t>(p, "cudnn_skip_configs", n.cudnn_skip_configs);
    ep.numerics = &n;
    ls_status st;
    std::string message;
    {
      py::gil_scoped_release nogil;
      st = ls_engine_create(&ep, &e_);
      if (st != LS_OK) message = ls_last_error();
    }
    if (st != LS_OK) raise(st, message);
  }

 public:
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    ls_engine_free(e_);
    e_ = nullptr;
  }

  py::dict info() {
    ls_model_info m;
    ls_model_info_init(&m);
    call([&] { return ls_engine_model_info(e_, &m); });
    py::dict d;
    d["hidden"] = m.hidden, d["num_layers"] = m.num_layers, d["heads"] = m.heads, d["head_dim"] = m.head_dim;
    d["text_dim"] = m.text_dim, d["latents_dim"] = m.latents_dim, d["audio_latents_dim"] = m.audio_latents_dim;
    return d;
  }

  py::dict clip_shape(const py::dict& clip) {
    auto c = make_clip(clip, 0);
    ls_clip_shape s;
    ls_clip_shape_init(&s);
    call([&] { return ls_engine_clip_shape(e_, &c->clip, &s); });
    py::dict d;
    d["T"] = s.T, d["Hl"] = s.Hl, d["Wl"] = s.Wl, d["A"] = s.A, d["S"] = s.S;
    d["video_count"] = s.video_count, d["audio_count"] = s.audio_count, d["text_count"] = s.text_count;
    return d;
  }

  std::string plan(const py::dict& clip, float sigma) {
    auto c = make_clip(clip, 0);
    const char* json = nullptr;
    std::string out;
    call([&] {
      ls_status st = ls_engine_plan(e_, &c->clip, sigma, &json);
      if (st == LS_OK && json) out = json;  // copied before the lock is released
      return st;
    });
    return out;
  }

  // One denoiser call; the outputs are written into video_out / audio_out.
  void denoise(const py::dict& clip, py::handle video, py::handle audio, float sigma, py::handle text,
               py::handle refined_text, py::handle video_out, py::handle audio_out, uintptr_t stream, bool output_masks) {
    auto c = make_clip(clip, stream);
    ls_denoise_params d;
    ls_denoise_params_init(&d);
    d.output_masks = output_masks ? 1 : 0;
    d.clip = &c->clip;
    d.sigma = sigma;
    d.stream = reinterpret_cast<void*>(stream);
    std::vector<std::unique_ptr<Held>> held;
    auto in = [&](py::handle obj, const char* what) -> const ls_tensor* {
      if (obj.is_none()) return nullptr;
      held.push_back(as_tensor(obj, false, stream, what));
      return &held.back()->t;
    };
    auto out = [&](py::handle obj, const char* what) -> const ls_tensor* {
      if (obj.is_none()) invalid(std::string(what) + " is required");
      held.push_back(as_tensor(obj, true, stream, what));
      return &held.back()->t;
    };
    d.video_tensor = in(video, "video");
    d.audio_tensor = in(audio, "audio");
    d.text_tensor = in(text, "text");
    d.refined_text_tensor = in(refined_text, "refined_text");
    d.video_out_tensor = out(video_out, "video_out");
    d.audio_out_tensor = out(audio_out, "audio_out");
    call([&] { return ls_engine_denoise(e_, &d); });
  }

  // ls_engine_refine_text: raw states f32 [L, text_dim] (contiguous host) -> the bf16
  // bits [L, hidden] as bytes (little-endian uint16).
  py::bytes refine_text(py::handle text, int64_t hidden) {
    auto t = as_tensor(text, false, 0, "text");
    const ls_tensor& d = t->t;
    int64_t want = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      if (d.shape[i] != 1 && d.strides[i] != want) invalid("refine_text: text must be contiguous");
      want *= d.shape[i];
    }
    if (d.dtype != LS_DTYPE_F32 || d.device_type != LS_DEVICE_CPU || d.ndim < 1)
      invalid("refine_text: text must be float32 host memory [L, text_dim]");
    const int64_t tokens = d.ndim >= 2 ? d.shape[d.ndim - 2] : 0;
    std::string out(static_cast<size_t>(tokens * hidden) * sizeof(uint16_t), '\0');
    call([&] {
      return ls_engine_refine_text(e_, static_cast<const float*>(d.data), tokens, reinterpret_cast<uint16_t*>(out.data()),
                                   static_cast<size_t>(tokens * hidden));
    });
    return py::bytes(out);
  }

  std::string report() { return json_of(ls_engine_report_json); }
  std::string call_report() { return json_of(ls_engine_call_report_json); }

  // A JSON text the engine keeps (ls_engine_report_json, ls_engine_call_report_json), copied.
  std::string json_of(ls_status (*get)(ls_engine*, const char**)) {
    const char* json = nullptr;
    std::string out;
    call([&] {
      ls_status st = get(e_, &json);
      if (st == LS_OK && json) out = json;
      return st;
    });
    return out;
  }

  uint64_t output_hash() {
    std::lock_guard<std::mutex> lock(mu_);
    return ls_engine_output_hash(e_);
  }

 private:
  // Runs f (an ls_ call on e_) without the GIL, one call at a time; raises on failure
  // with the engine's message.
  template <typename F>
  void call(F&& f) {
    ls_status st = LS_OK;
    std::string message;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (!e_) {
        st = LS_INVALID_ARGUMENT;
        message = "the engine is closed";
      } else {
        st = f();
        if (st != LS_OK) message = ls_engine_last_error(e_);
      }
    }
    if (st != LS_OK) raise(st, message);
  }

  ls_engine* e_ = nullptr;
  std::mutex mu_;
};

// ls_fingerprint of two contiguous float32 host arrays (numpy): the CLI's "output hash".
uint64_t fingerprint(py::handle video, py::handle audio) {
  auto v = as_tensor(video, false, 0, "video");
  auto a = as_tensor(audio, false, 0, "audio");
  auto count = [](const ls_tensor& t, const char* what) {
    size_t n = 1;
    int64_t want = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != want) invalid(std::string(what) + ": fingerprint needs a contiguous array");
      want *= t.shape[i];
      n *= static_cast<size_t>(t.shape[i]);
    }
    if (t.dtype != LS_DTYPE_F32 || t.device_type != LS_DEVICE_CPU)
      invalid(std::string(what) + ": fingerprint needs float32 host memory");
    return n;
  };
  return ls_fingerprint(static_cast<const float*>(v->t.data), count(v->t, "video"),
                        static_cast<const float*>(a->t.data), count(a->t, "audio"));
}

// layerstream.Error and its classes, one per ls_status.
void add_errors(py::module_& m) {
  // Errors a caller's argument causes (InvalidArgument, OutOfBudget) are also ValueErrors,
  // as Python's own argument errors are; every class is a layerstream.Error.
  g_error = PyErr_NewExceptionWithDoc("layerstream.Error",
                                      "An engine call failed; .status names the ls_status, str(e) is the engine's message.",
                                      PyExc_RuntimeError, nullptr);
  PyObject_SetAttrString(g_error, "status", py::str("error").ptr());
  m.attr("Error") = py::handle(g_error);
  const std::pair<ls_status, const char*> classes[] = {
      {LS_INVALID_ARGUMENT, "InvalidArgument"}, {LS_INVALID_FILE, "InvalidFile"}, {LS_IO, "IoError"},
      {LS_UNSUPPORTED, "Unsupported"},          {LS_OUT_OF_BUDGET, "OutOfBudget"}, {LS_OUT_OF_MEMORY, "OutOfMemory"},
      {LS_DEVICE, "DeviceError"},               {LS_NOT_FOUND, "NotFound"},       {LS_NONFINITE, "NonFinite"}};
  for (const auto& [st, name] : classes) {
    const bool argument = st == LS_INVALID_ARGUMENT || st == LS_OUT_OF_BUDGET;
    py::object bases = argument ? py::object(py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)))
                                : py::object(py::reinterpret_borrow<py::object>(g_error));
    PyObject* cls = PyErr_NewException((std::string("layerstream.") + name).c_str(), bases.ptr(), nullptr);
    PyObject_SetAttrString(cls, "status", py::str(ls_status_string(st)).ptr());
    g_status_class[static_cast<int>(st)] = cls;
    m.attr(name) = py::handle(cls);
  }
}

// The one size parser, range table and memory validation of every door (API 5), and the
// clip geometry.
void add_doors(py::module_& m) {
  m.def(
      "parse_size",
      [](const std::string& what, const std::string& text) {
        uint64_t v = 0;
        if (ls_status st = ls_parse_size(what.c_str(), text.c_str(), &v); st != LS_OK) raise(st, ls_last_error());
        return v;
      },
      py::arg("what"), py::arg("text"), "ls_parse_size: bytes from a size text (1024-based units)");
  m.def(
      "parse_value",
      [](const std::string& name, const std::string& what, const std::string& text) {
        double v = 0;
        if (ls_status st = ls_parse_value(name.c_str(), what.c_str(), text.c_str(), &v); st != LS_OK)
          raise(st, ls_last_error());
        return v;
      },
      py::arg("name"), py::arg("what"), py::arg("text"), "ls_parse_value: a number checked against the range table");
  m.def("ranges", [] {
    py::list out;
    static const char* kinds[] = {"integer", "real", "size"};
    for (size_t i = 0; i < ls_range_count(); ++i) {
      ls_range r;
      std::memset(&r, 0, sizeof r);
      r.size = sizeof r;
      if (ls_status st = ls_range_at(i, &r); st != LS_OK) raise(st, ls_last_error());
      py::dict d;
      d["name"] = r.name, d["kind"] = kinds[r.kind], d["lo"] = r.lo, d["hi"] = r.hi;
      d["lo_open"] = r.lo_open != 0, d["hi_open"] = r.hi_open != 0;
      d["text"] = r.text, d["unit"] = r.unit, d["meaning"] = r.meaning;
      out.append(d);
    }
    return out;
  });
  m.def(
      "memory_validate",
      [](const py::dict& mem, py::object device) {
        ls_memory_request mr;
        ls_memory_request_init(&mr);
        try {
          mr.mode = static_cast<ls_memory_mode>(get<int>(mem, "mode", LS_MEMORY_KNOBS));
          const std::pair<const char*, int64_t*> fields[] = {
              {"vram_budget", &mr.vram_budget}, {"activation_budget", &mr.activation_budget},
              {"prefetch", &mr.prefetch},       {"mlp_chunk", &mr.mlp_chunk},
              {"attn_chunk", &mr.attn_chunk},   {"final_chunk", &mr.final_chunk},
              {"kv_offload", &mr.kv_offload},   {"kv_chunk", &mr.kv_chunk},
              {"residual_offload", &mr.residual_offload}, {"resident_blocks", &mr.resident_blocks},
              {"slots", &mr.slots}};
          for (const auto& [key, field] : fields) *field = get<int64_t>(mem, key, LS_UNSET);
        } catch (const py::cast_error& x) {
          invalid(std::string("memory: a value is not an integer (") + x.what() + ")");
        }
        const std::string dev = device.is_none() ? std::string() : py::cast<std::string>(device);
        if (ls_status st = ls_memory_validate(&mr, device.is_none() ? nullptr : dev.c_str()); st != LS_OK)
          raise(st, ls_last_error());
      },
      py::arg("memory"), py::arg("device") = py::none(), "ls_memory_validate: the one memory validation");
  m.def(
      "clip_geometry",
      [](int64_t frames, int64_t width, int64_t height) {
        ls_clip_grid g;
        std::memset(&g, 0, sizeof g);
        g.size = sizeof g;
        if (ls_status st = ls_clip_geometry(frames, width, height, &g); st != LS_OK) raise(st, ls_last_error());
        py::dict d;
        d["frames"] = g.frames, d["width"] = g.width, d["height"] = g.height;
        d["T"] = g.T, d["Hl"] = g.Hl, d["Wl"] = g.Wl, d["A"] = g.A;
        return d;
      },
      py::arg("frames"), py::arg("width"), py::arg("height"), "ls_clip_geometry: the latent grid of a clip");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "LayerStream's C API (layerstream.h) for Python; use the `layerstream` package";
  add_errors(m);
  m.def("version", [] { return std::string(ls_version()); }, "ls_version(): the build's version line");
  m.attr("API_VERSION") = LS_API_VERSION;
  m.def("status_string", [](int s) { return std::string(ls_status_string(static_cast<ls_status>(s))); });
  m.def("fingerprint", &fingerprint, py::arg("video"), py::arg("audio"),
        "ls_fingerprint (FNV-1a 64 of the video bytes, then the audio bytes) of contiguous float32 arrays");
  add_doors(m);
  m.def(
      "probe_checkpoint",
      [](const std::string& path) {
        const char* json = nullptr;
        ls_status st;
        std::string out;
        {
          py::gil_scoped_release nogil;
          st = ls_probe_checkpoint(path.c_str(), &json);
          if (st == LS_OK && json) out = json;
        }
        if (st != LS_OK) raise(st, ls_last_error());
        return out;
      },
      py::arg("path"), "ls_probe_checkpoint: JSON of what the engine makes of a checkpoint");
  py::class_<Engine>(m, "Engine")
      .def(py::init<const py::dict&>(), py::arg("params"))
      .def("close", &Engine::close)
      .def("info", &Engine::info)
      .def("clip_shape", &Engine::clip_shape, py::arg("clip"))
      .def("plan", &Engine::plan, py::arg("clip"), py::arg("sigma"))
      .def("denoise", &Engine::denoise, py::arg("clip"), py::arg("video"), py::arg("audio"), py::arg("sigma"),
           py::arg("text"), py::arg("refined_text"), py::arg("video_out"), py::arg("audio_out"), py::arg("stream"),
           py::arg("output_masks") = true)
      .def("refine_text", &Engine::refine_text, py::arg("text"), py::arg("hidden"))
      .def("report", &Engine::report)
      .def("call_report", &Engine::call_report)
      .def("output_hash", &Engine::output_hash);
}
