"""A test double of the ComfyUI pieces the LayerStream node touches.

Restated from ComfyUI's own files (Comfy-Org/ComfyUI, read with the search tool; no code
copied), at these revisions:
  comfy/patcher_extension.py   WrappersMP / CallbacksMP names, WrapperExecutor (calling the
                               executor runs the next wrapper, the last one runs the original;
                               class_obj is the instance), get_all_wrappers (every key's list in
                               insertion order) -- the store's copy; the current file is not in
                               the index (docs/comfyui.md).
  comfy/model_patcher.py @ 08d0e510   ModelPatcher: clone (copies patches, object_patches,
                               weight_wrapper_patches, model_options, wrappers, callbacks,
                               cached_patcher_init), add_wrapper_with_key, remove_wrappers_with_key,
                               add_callback_with_key, add_object_patch, get_model_object,
                               patch_model (object patches set BEFORE load), pre_run (ON_PRE_RUN
                               callbacks get the patcher), is_dynamic.
  comfy/model_patcher.py, comfy/patcher_extension.py, comfy_extras/nodes_model_advanced.py,
  comfy/ldm/modules/attention.py @ 0f1fa67a (kat3ri/ComfyUI)   cleanup (ON_CLEANUP callbacks get
                               the patcher; the sampler calls it after sampling),
                               set_model_optimized_attention (a closure
                               optimized_attention_override(_, *args, **kwargs) -> fn(*args,
                               **kwargs) in transformer_options, container_function copied),
                               ModelAttentionBackend (get_attention_function("comfy_kitchen_int8" |
                               "pytorch")), REGISTERED_ATTENTION_FUNCTIONS, and model.py's
                               module-level optimized_attention (imported by name; --use-ck-attention
                               makes it attention_comfy_kitchen_int8).
  comfy/ldm/minimax/model.py @ 01a56b76   MiniMaxH3Model.forward: the audio carry outside the
                               wrappers, the DIFFUSION_MODEL executor around _forward, the masks
                               multiplying the result, the carried-velocity conversion. _forward
                               itself is a stub that records the call (the stock path).
  comfy/model_base.py @ 094c74c1   _apply_model (timestep = sigma * 1000 in fp32, latents cast to
                               the compute dtype bf16, transformer_options copied per call),
                               MiniMaxH3.extra_conds (the minimax_payload dict, cond latent lists,
                               seed, audio_scale) and _denoise_mask_values (masks pooled per 2x2
                               patch by amax, quantised to ceil(m * 256) / 256, sent only when
                               some value is below 1 - 1e-3).
  comfy/sampler_helpers.py     prepare_model_patcher: the patcher's wrappers land in
                               transformer_options["wrappers"].
  comfy/model_patcher.py @ 08d0e510   add_patches (only keys of the model's state dict; each
                               patch (strength_patch, value, strength_model, offset, function);
                               a new patches_uuid per call, which clone copies).
  comfy/lora.py @ 17358c8f     load_lora (alpha via .item(), the weight adapters in order, then
                               w_norm/b_norm, diff, diff_b, set_weight, and set_bias as PR #15908
                               "MiniMax-H3: Support PDD LoRA" adds it: ("set", (t,)) on the
                               layer's bias key, a set that may change the shape) and the MiniMaxH3 part of
                               model_lora_keys_unet (lora_unet_<flat>, <layer>, diffusion_model.<layer>).
  comfy/weight_adapter/lora.py @ 6f98b150   LoRAAdapter.load (the up/down name styles in its
                               order, mid, reshape_weight) and its weights tuple
                               (up, down, alpha, mid, dora_scale, reshape).
  comfy/sd.py                  load_lora_for_models (model_lora_keys_unet, load_lora, a clone,
                               add_patches(loaded, strength_model)): the store's copy (index id
                               9863468132; the current file also runs lora_convert.convert_lora,
                               which changes no H3 key).
  comfy/model_management.py    lora_compute_dtype (fp16 where should_use_fp16, else fp32): on
                               the double's CPU device fp32, on a CUDA device fp16. vram_state /
                               VRAMState are left out (NORMAL_VRAM), unless a test sets them.
"""

import copy
import json
import struct
import types
import uuid

import torch


# ---- comfy.patcher_extension ---------------------------------------------------------------
class WrappersMP:
    OUTER_SAMPLE = "outer_sample"
    SAMPLER_SAMPLE = "sampler_sample"
    CALC_COND_BATCH = "calc_cond_batch"
    APPLY_MODEL = "apply_model"
    DIFFUSION_MODEL = "diffusion_model"


class CallbacksMP:
    ON_CLONE = "on_clone"
    ON_LOAD = "on_load_after"
    ON_CLEANUP = "on_cleanup"
    ON_PRE_RUN = "on_pre_run"


# ---- comfy.ldm.modules.attention: the attention functions (stand-ins, named as ComfyUI's) ----
def attention_pytorch(q, k, v, heads, **kwargs):
    raise NotImplementedError("stand-in")


def attention_comfy_kitchen_int8(q, k, v, heads, **kwargs):
    raise NotImplementedError("stand-in")


def attention_sage(q, k, v, heads, **kwargs):
    raise NotImplementedError("stand-in")


REGISTERED_ATTENTION_FUNCTIONS = {"comfy_kitchen_int8": attention_comfy_kitchen_int8, "sage": attention_sage,
                                  "pytorch": attention_pytorch}


def get_attention_function(name, default=...):
    if name not in REGISTERED_ATTENTION_FUNCTIONS:
        if default is ...:
            raise KeyError(name)
        return default
    return REGISTERED_ATTENTION_FUNCTIONS[name]


def model_attention_backend(model, attention):
    """comfy_extras/nodes_model_advanced.py ModelAttentionBackend.patch."""
    name = {"comfy kitchen attention": "comfy_kitchen_int8", "pytorch attention": "pytorch"}.get(attention, attention)
    fn = get_attention_function(name, None) or get_attention_function("pytorch")
    m = model.clone()
    m.set_model_optimized_attention(fn)
    return m


def get_all_wrappers(kind, transformer_options):
    out = []
    for lst in (transformer_options.get("wrappers", {}) or {}).get(kind, {}).values():
        out.extend(lst)
    return out


class WrapperExecutor:
    def __init__(self, original, class_obj, wrappers, idx):
        self.original, self.class_obj, self.wrappers, self.idx = original, class_obj, list(wrappers), idx
        self.is_last = idx == len(self.wrappers)

    def __call__(self, *args, **kwargs):
        return WrapperExecutor(self.original, self.class_obj, self.wrappers, self.idx + 1).execute(*args, **kwargs)

    def execute(self, *args, **kwargs):
        if self.is_last:
            return self.original(*args, **kwargs)
        return self.wrappers[self.idx](self, *args, **kwargs)

    @classmethod
    def new_class_executor(cls, original, class_obj, wrappers, idx=0):
        return cls(original, class_obj, wrappers, idx)


# ---- comfy.ldm.minimax.model ---------------------------------------------------------------
def time_shift_sigma(sigma, from_shift, to_shift):
    base = sigma / (from_shift + sigma * (1.0 - from_shift))
    return to_shift * base / (1.0 + (to_shift - 1.0) * base)


class _Head(torch.nn.Module):
    """final_layer.video_out of a checkpoint with n PDD heads: weight rows n * out_features."""

    def __init__(self, hidden, out_features, n):
        super().__init__()
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.zeros(out_features * n, hidden), requires_grad=False)


class PackedLayout:
    def __init__(self, signature):
        self.signature = signature


class MiniMaxH3Model(torch.nn.Module):
    def __init__(self, hidden_size=128, num_layers=2, latents_dim=24, audio_latents_dim=32, text_dim=96,
                 pdd_heads=1):
        super().__init__()
        self.hidden_size, self.latents_dim, self.audio_latents_dim = hidden_size, latents_dim, audio_latents_dim
        self.text_dim = text_dim
        self.patch_size = (1, 2, 2)
        self.sigma_shift_video, self.sigma_shift_audio = 12.0, 3.0
        self.blocks = torch.nn.ModuleList([torch.nn.Identity() for _ in range(num_layers)])
        self.final_layer = torch.nn.Module()
        self.final_layer.video_out = _Head(hidden_size, latents_dim * 4, pdd_heads)
        self.stock_calls = []

    def forward(self, x, timestep, context, transformer_options={}, minimax_payload=None, denoise_mask=None,
                audio_denoise_mask=None, **kwargs):
        scale = float((minimax_payload or {}).get("audio_scale", 1.0))
        audio_src = x[1]
        if scale != 1.0:
            shift_v = float(transformer_options.get("minimax_h3_sigma_shift_video", self.sigma_shift_video))
            shift_a = float(transformer_options.get("minimax_h3_sigma_shift_audio", self.sigma_shift_audio))
            sigma_v = (timestep.flatten()[0] / 1000.0).float().clamp(min=1e-6)
            sigma_a = time_shift_sigma(sigma_v, shift_v, shift_a)
            carry = (sigma_a / sigma_v).to(audio_src.dtype)
            x = [x[0], audio_src * carry]
        out = WrapperExecutor.new_class_executor(
            self._forward, self, get_all_wrappers(WrappersMP.DIFFUSION_MODEL, transformer_options)
        ).execute(x, timestep, context, transformer_options, minimax_payload=minimax_payload,
                  denoise_mask=denoise_mask, audio_denoise_mask=audio_denoise_mask, **kwargs)
        if denoise_mask is not None:
            out[0] = out[0] * denoise_mask
        if audio_denoise_mask is not None:
            out[1] = out[1] * audio_denoise_mask
        if scale != 1.0:
            out[1] = ((1.0 - scale) * (audio_src * carry) + (1.0 + (scale - 1.0) * sigma_a).to(out[1].dtype) * out[1])
        return out

    def _forward(self, x, timestep, context, transformer_options={}, minimax_payload=None, denoise_mask=None,
                 audio_denoise_mask=None, **kwargs):
        """The stock path (not ComfyUI's network: a recognisable stand-in)."""
        if x[0].shape[0] != 1:
            raise ValueError("MiniMax H3 supports batch size 1")
        self.stock_calls.append({"x": x, "timestep": timestep, "kwargs": dict(kwargs)})
        return [torch.full_like(x[0], -0.25), torch.full_like(x[1], -0.5)]


class BaseModel(torch.nn.Module):
    def __init__(self, diffusion_model, weight_keys=None):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.current_patcher = None
        # The state-dict keys ComfyUI's model would have ("diffusion_model." + the file's
        # names); None = any key (the older tests patch made-up keys).
        self.weight_keys = weight_keys

    def lora_state_keys(self):
        return self.weight_keys


# ---- comfy.model_patcher -------------------------------------------------------------------
def _get_attr(obj, name):
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _set_attr(obj, name, value):
    parts = name.split(".")
    owner = _get_attr(obj, ".".join(parts[:-1])) if len(parts) > 1 else obj
    old = getattr(owner, parts[-1])
    setattr(owner, parts[-1], value)
    return old


class ModelPatcher:
    def __init__(self, model, load_device=torch.device("cpu"), dynamic=True):
        self.model = model
        self.load_device = load_device
        self.patches, self.object_patches, self.object_patches_backup = {}, {}, {}
        self.weight_wrapper_patches, self.hook_patches = {}, {}
        self.injections = {}  # set_injections: name -> [PatcherInjection] (bypass LoRAs)
        self.model_options = {"transformer_options": {}}
        self.wrappers, self.callbacks = {}, {}
        self.cached_patcher_init = None
        self.dynamic = dynamic
        self.patches_uuid = uuid.uuid4()

    def is_dynamic(self):
        return self.dynamic

    def clone(self):
        n = ModelPatcher(self.model, self.load_device, self.dynamic)
        n.patches = {k: v[:] for k, v in self.patches.items()}
        n.object_patches = self.object_patches.copy()
        n.object_patches_backup = self.object_patches_backup  # shared, as ComfyUI's model_override
        n.weight_wrapper_patches = self.weight_wrapper_patches.copy()
        n.hook_patches = copy.copy(self.hook_patches)
        n.injections = {k: i.copy() for k, i in self.injections.items()}
        n.model_options = copy.deepcopy(self.model_options)
        n.wrappers = {k: {k1: w.copy() for k1, w in v.items()} for k, v in self.wrappers.items()}
        n.callbacks = {k: {k1: c.copy() for k1, c in v.items()} for k, v in self.callbacks.items()}
        n.cached_patcher_init = self.cached_patcher_init
        n.patches_uuid = self.patches_uuid
        return n

    def add_wrapper_with_key(self, kind, key, fn):
        self.wrappers.setdefault(kind, {}).setdefault(key, []).append(fn)

    def remove_wrappers_with_key(self, kind, key):
        self.wrappers.get(kind, {}).pop(key, None)

    def add_callback_with_key(self, kind, key, fn):
        self.callbacks.setdefault(kind, {}).setdefault(key, []).append(fn)

    def remove_callbacks_with_key(self, kind, key):
        self.callbacks.get(kind, {}).pop(key, None)

    def add_object_patch(self, name, obj):
        self.object_patches[name] = obj

    def get_model_object(self, name):
        if name in self.object_patches:
            return self.object_patches[name]
        if name in self.object_patches_backup:
            return self.object_patches_backup[name]
        return _get_attr(self.model, name)

    def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
        keys = self.model.lora_state_keys()
        added = []
        for k, v in patches.items():
            offset = function = None
            key = k
            if not isinstance(k, str):
                key, offset = k[0], k[1]
                function = k[2] if len(k) > 2 else None
            if keys is None or key in keys:
                added.append(k)
                self.patches.setdefault(key, []).append((strength_patch, v, strength_model, offset, function))
        self.patches_uuid = uuid.uuid4()
        return added

    def patch_model(self):
        for k, v in self.object_patches.items():
            old = _set_attr(self.model, k, v)
            self.object_patches_backup.setdefault(k, old)

    def unpatch_model(self):
        for k, v in self.object_patches_backup.items():
            _set_attr(self.model, k, v)
        self.object_patches_backup.clear()

    def pre_run(self):
        self.model.current_patcher = self
        for lst in self.callbacks.get(CallbacksMP.ON_PRE_RUN, {}).values():
            for cb in lst:
                cb(self)

    def cleanup(self):
        self.model.current_patcher = None
        for lst in self.callbacks.get(CallbacksMP.ON_CLEANUP, {}).values():
            for cb in lst:
                cb(self)

    def set_model_optimized_attention(self, optimized_attention):
        def optimized_attention_override(_, *args, **kwargs):
            return optimized_attention(*args, **kwargs)

        if getattr(optimized_attention, "container_function", None) is not None:
            optimized_attention_override.container_function = optimized_attention.container_function
        self.model_options["transformer_options"]["optimized_attention_override"] = optimized_attention_override


def load_diffusion_model(unet_path, model_options=None):
    """Stands in for comfy.sd.load_diffusion_model (only its name and the path matter)."""
    raise NotImplementedError


def read_safetensors(path):
    """comfy.utils.load_torch_file for a .safetensors file: name -> torch tensor (F32, F16,
    BF16, I64; scalars keep their empty shape)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        raw = bytearray(data[a:b])
        dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.int16, "I64": torch.int64}[e["dtype"]]
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        if e["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def make_patcher(path=None, dynamic=True, state_keys=False, **model_kw):
    """A MODEL as load_diffusion_model makes it. state_keys=True gives the base model the
    state-dict keys of the file at `path` (what a LoRA loader patches)."""
    dm = MiniMaxH3Model(**model_kw)
    keys = None
    if state_keys:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n).decode("utf-8"))
        keys = {"diffusion_model." + k for k in header if k != "__metadata__"}
    p = ModelPatcher(BaseModel(dm, weight_keys=keys), dynamic=dynamic)
    if path is not None:
        p.cached_patcher_init = (load_diffusion_model, (str(path), {}))
    return p


# ---- comfy.weight_adapter, comfy.lora, comfy.sd: a LoRA loader --------------------------------
class WeightAdapterBase:
    name = "base"

    def __init__(self, loaded_keys, weights):
        self.loaded_keys, self.weights = loaded_keys, weights


class LoRAAdapter(WeightAdapterBase):
    name = "lora"

    @classmethod
    def load(cls, x, lora, alpha, dora_scale, loaded_keys=None):
        if loaded_keys is None:
            loaded_keys = set()
        styles = ((".lora_up.weight", ".lora_down.weight", ".lora_mid.weight"), ("_lora.up.weight", "_lora.down.weight", None),
                  (".lora_B.weight", ".lora_A.weight", None), (".lora.up.weight", ".lora.down.weight", None),
                  (".lora_B", ".lora_A", None), (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight", None),
                  (".lora_B.default.weight", ".lora_A.default.weight", None))
        for up, down, mid in styles:
            if x + up in lora:
                m = None
                if mid is not None and x + mid in lora:
                    m = lora[x + mid]
                    loaded_keys.add(x + mid)
                reshape = None
                if x + ".reshape_weight" in lora:
                    reshape = lora[x + ".reshape_weight"].tolist()
                    loaded_keys.add(x + ".reshape_weight")
                loaded_keys.update((x + up, x + down))
                return cls(loaded_keys, (lora[x + up], lora[x + down], alpha, m, dora_scale, reshape))
        return None


class LoHaAdapter(WeightAdapterBase):
    """Stands in for the adapters the engine does not take (loads hada_w1_a ... as ComfyUI's LoHa)."""
    name = "loha"

    @classmethod
    def load(cls, x, lora, alpha, dora_scale, loaded_keys=None):
        names = [x + s for s in (".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b")]
        if names[0] not in lora:
            return None
        return cls(set(names), tuple(lora[n] for n in names) + (alpha, None, None, dora_scale))


ADAPTERS = [LoRAAdapter, LoHaAdapter]


def load_lora(lora, to_load):
    patch_dict = {}
    for x in to_load:
        alpha = lora[x + ".alpha"].item() if x + ".alpha" in lora else None
        dora_scale = lora.get(x + ".dora_scale")
        for cls in ADAPTERS:
            adapter = cls.load(x, lora, alpha, dora_scale, set())
            if adapter is not None:
                patch_dict[to_load[x]] = adapter
        if x + ".w_norm" in lora:
            patch_dict[to_load[x]] = ("diff", (lora[x + ".w_norm"],))
        if x + ".diff" in lora:
            patch_dict[to_load[x]] = ("diff", (lora[x + ".diff"],))
        if x + ".diff_b" in lora:
            patch_dict[to_load[x][:-len(".weight")] + ".bias"] = ("diff", (lora[x + ".diff_b"],))
        if x + ".set_weight" in lora:
            patch_dict[to_load[x]] = ("set", (lora[x + ".set_weight"],))
        if x + ".set_bias" in lora:  # PR #15908 (MiniMax-H3 PDD LoRAs); the set may resize
            patch_dict[to_load[x][:-len(".weight")] + ".bias"] = ("set", (lora[x + ".set_bias"],))
    return patch_dict


def model_lora_keys_unet(base_model):
    key_map = {}
    for k in base_model.lora_state_keys():
        if k.startswith("diffusion_model."):
            if k.endswith(".weight"):
                key_map["lora_unet_" + k[len("diffusion_model."):-len(".weight")].replace(".", "_")] = k
                key_map[k[:-len(".weight")]] = k
                key_map[k[len("diffusion_model."):-len(".weight")]] = k  # the MiniMaxH3 branch
            else:
                key_map[k] = k
    return key_map


def load_lora_for_models(model, clip, lora, strength_model, strength_clip):
    """comfy.sd.load_lora_for_models with clip None (LoraLoaderModelOnly)."""
    loaded = load_lora(lora, model_lora_keys_unet(model.model))
    n = model.clone()
    n.add_patches(loaded, strength_model)
    return n, None


def lora_compute_dtype(device):
    return torch.float16 if getattr(device, "type", None) == "cuda" else torch.float32


# ---- comfy.model_base MiniMaxH3 + the sampler side -------------------------------------------
def make_payload(text_token_tags=None, keyframes=None, refs=None, seed=0, audio_scale=4.0, vis_aug=None,
                 aud_aug=None):
    """minimax_payload as MiniMaxH3.extra_conds builds it."""
    payload = {}
    if text_token_tags is not None:
        payload["text_token_tags"] = text_token_tags
    if keyframes is not None:
        payload["keyframes"] = keyframes
        payload["cond_video_latents"] = [kf["latent"] for kf in keyframes if kf.get("latent") is not None]
        payload["cond_audio_latents"] = [kf["audio_latent"] for kf in keyframes if kf.get("audio_latent") is not None]
    if refs is not None:
        payload["refs"] = refs
        payload["cond_video_latents"] = payload.get("cond_video_latents", []) + [r["latent"] for r in refs
                                                                                 if "latent" in r]
        payload["cond_audio_latents"] = payload.get("cond_audio_latents", []) + [
            r["audio_latent"] for r in refs if r.get("audio_latent") is not None]
    if vis_aug is not None:
        payload["visual_cond_noise_aug"] = vis_aug
    if aud_aug is not None:
        payload["audio_cond_noise_aug"] = aud_aug
    payload["seed"] = seed
    payload["audio_scale"] = audio_scale
    return payload


def token_grid_masks(video_mask, audio_mask):
    """model_base's _token_grid_masks + _denoise_mask_values for one sample: video [T, H, W]
    and audio [Ca, 2, A] pixel masks -> (denoise_mask [1, 1, T, H, W] or None,
    audio_denoise_mask [1, 1, 2, A] or None)."""
    T, H, W = video_mask.shape
    v = video_mask.reshape(T, H // 2, 2, W // 2, 2).amax(dim=(2, 4))
    v = v.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)
    v = torch.ceil(v * 256.0) / 256.0
    a = audio_mask.amax(dim=0, keepdim=True)  # per latent frame and stereo channel
    a = torch.ceil(a * 256.0) / 256.0
    dm = v[None, None].clone() if torch.amin(v).item() < 1.0 - 1e-3 else None
    am = a[None].clone() if torch.amin(a).item() < 1.0 - 1e-3 else None
    return dm, am


def run_step(patcher, video, audio, sigma, context, payload, denoise_mask=None, audio_denoise_mask=None,
             control=None, sample_sigmas=None, extra_options=None, dtype=torch.bfloat16, pre_run=True):
    """One denoiser call the way ComfyUI's sampler reaches the diffusion model.
    Returns what MiniMaxH3Model.forward returns (a list of two tensors of the compute dtype,
    bf16 unless `dtype` says otherwise: an fp32 MODEL). pre_run=False: a later step of a run
    whose pre_run the caller made (ComfyUI's sampler runs pre_run once per sampling run)."""
    to = copy.deepcopy(patcher.model_options["transformer_options"])
    wrappers = to.setdefault("wrappers", {})
    for kind, table in patcher.wrappers.items():
        for key, lst in table.items():
            wrappers.setdefault(kind, {}).setdefault(key, []).extend(lst)
    if sample_sigmas is not None:
        to["sample_sigmas"] = torch.tensor(sample_sigmas, dtype=torch.float32)
    to.update(extra_options or {})
    patcher.patch_model()
    try:
        if pre_run:
            patcher.pre_run()
        t = torch.tensor([sigma], dtype=torch.float32, device=video.device) * 1000.0  # model_sampling.timestep(sigma)
        dm = patcher.model.diffusion_model
        kw = {"minimax_payload": payload}
        if denoise_mask is not None:
            kw["denoise_mask"] = denoise_mask.to(dtype)  # convert_tensor to the compute dtype
        if audio_denoise_mask is not None:
            kw["audio_denoise_mask"] = audio_denoise_mask.to(dtype)
        return dm([video.to(dtype), audio.to(dtype)], t.float(), context=context.to(dtype),
                  control=control, transformer_options=to.copy(), **kw)
    finally:
        patcher.unpatch_model()


# ---- installing the double as the `comfy` package -------------------------------------------
def modules():
    comfy = types.ModuleType("comfy")
    pe = types.ModuleType("comfy.patcher_extension")
    pe.WrappersMP, pe.CallbacksMP, pe.WrapperExecutor, pe.get_all_wrappers = (WrappersMP, CallbacksMP,
                                                                              WrapperExecutor, get_all_wrappers)
    ldm = types.ModuleType("comfy.ldm")
    minimax = types.ModuleType("comfy.ldm.minimax")
    model = types.ModuleType("comfy.ldm.minimax.model")
    model.MiniMaxH3Model, model.PackedLayout, model.time_shift_sigma = MiniMaxH3Model, PackedLayout, time_shift_sigma
    mp = types.ModuleType("comfy.model_patcher")
    mp.ModelPatcher = ModelPatcher
    mm = types.ModuleType("comfy.model_management")
    mm.lora_compute_dtype = lora_compute_dtype
    comfy.patcher_extension, comfy.ldm, comfy.model_patcher, comfy.model_management = pe, ldm, mp, mm
    ldm.minimax, minimax.model = minimax, model
    # model.py: `from comfy.ldm.modules.attention import optimized_attention` (PyTorch's by default)
    model.optimized_attention = attention_pytorch
    lmod = types.ModuleType("comfy.ldm.modules")
    attn = types.ModuleType("comfy.ldm.modules.attention")
    attn.REGISTERED_ATTENTION_FUNCTIONS, attn.get_attention_function = REGISTERED_ATTENTION_FUNCTIONS, get_attention_function
    attn.optimized_attention = attention_pytorch
    ldm.modules, lmod.attention = lmod, attn
    return {"comfy": comfy, "comfy.patcher_extension": pe, "comfy.ldm": ldm, "comfy.ldm.minimax": minimax,
            "comfy.ldm.minimax.model": model, "comfy.model_patcher": mp, "comfy.model_management": mm,
            "comfy.ldm.modules": lmod, "comfy.ldm.modules.attention": attn}


def comfy_api_modules():
    """comfy_api.latest with the io / ui names the node's v3 class uses (records the schema)."""
    latest = types.ModuleType("comfy_api.latest")
    api = types.ModuleType("comfy_api")

    class _Input:
        def __init__(self, name, **kw):
            self.name, self.kw = name, kw

    class _Type:
        Input = _Input

        class Output:
            def __init__(self, *a, **kw):
                self.a, self.kw = a, kw

    class Combo(_Type):
        pass

    io = types.SimpleNamespace(
        ComfyNode=type("ComfyNode", (), {}),
        Schema=lambda **kw: types.SimpleNamespace(**kw),
        Model=_Type, String=_Type, Int=_Type, Boolean=_Type, Combo=Combo,
        NodeOutput=lambda *a, **kw: types.SimpleNamespace(args=a, **kw))
    ui = types.SimpleNamespace(PreviewText=lambda text: types.SimpleNamespace(text=text))

    class ComfyExtension:
        pass

    latest.io, latest.ui, latest.ComfyExtension = io, ui, ComfyExtension
    api.latest = latest
    return {"comfy_api": api, "comfy_api.latest": latest}
