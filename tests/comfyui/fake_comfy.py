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
"""

import copy
import math
import sys
import types

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
    ON_PRE_RUN = "on_pre_run"


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
    def __init__(self, diffusion_model):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.current_patcher = None


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
        self.model_options = {"transformer_options": {}}
        self.wrappers, self.callbacks = {}, {}
        self.cached_patcher_init = None
        self.dynamic = dynamic

    def is_dynamic(self):
        return self.dynamic

    def clone(self):
        n = ModelPatcher(self.model, self.load_device, self.dynamic)
        n.patches = {k: v[:] for k, v in self.patches.items()}
        n.object_patches = self.object_patches.copy()
        n.object_patches_backup = self.object_patches_backup  # shared, as ComfyUI's model_override
        n.weight_wrapper_patches = self.weight_wrapper_patches.copy()
        n.hook_patches = copy.copy(self.hook_patches)
        n.model_options = copy.deepcopy(self.model_options)
        n.wrappers = {k: {k1: w.copy() for k1, w in v.items()} for k, v in self.wrappers.items()}
        n.callbacks = {k: {k1: c.copy() for k1, c in v.items()} for k, v in self.callbacks.items()}
        n.cached_patcher_init = self.cached_patcher_init
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

    def add_patches(self, patches):
        for k, v in patches.items():
            self.patches.setdefault(k, []).append((1.0, v, 1.0, None, None))

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


def load_diffusion_model(unet_path, model_options=None):
    """Stands in for comfy.sd.load_diffusion_model (only its name and the path matter)."""
    raise NotImplementedError


def make_patcher(path=None, dynamic=True, **model_kw):
    dm = MiniMaxH3Model(**model_kw)
    p = ModelPatcher(BaseModel(dm), dynamic=dynamic)
    if path is not None:
        p.cached_patcher_init = (load_diffusion_model, (str(path), {}))
    return p


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
             control=None, sample_sigmas=None, extra_options=None):
    """One denoiser call the way ComfyUI's sampler reaches the diffusion model.
    Returns what MiniMaxH3Model.forward returns (a list of two bf16 tensors)."""
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
        patcher.pre_run()
        t = torch.tensor([sigma], dtype=torch.float32, device=video.device) * 1000.0  # model_sampling.timestep(sigma)
        dm = patcher.model.diffusion_model
        kw = {"minimax_payload": payload}
        if denoise_mask is not None:
            kw["denoise_mask"] = denoise_mask.to(torch.bfloat16)  # convert_tensor to the compute dtype
        if audio_denoise_mask is not None:
            kw["audio_denoise_mask"] = audio_denoise_mask.to(torch.bfloat16)
        return dm([video.to(torch.bfloat16), audio.to(torch.bfloat16)], t.float(), context=context.to(torch.bfloat16),
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
    comfy.patcher_extension, comfy.ldm, comfy.model_patcher = pe, ldm, mp
    ldm.minimax, minimax.model = minimax, model
    return {"comfy": comfy, "comfy.patcher_extension": pe, "comfy.ldm": ldm, "comfy.ldm.minimax": minimax,
            "comfy.ldm.minimax.model": model, "comfy.model_patcher": mp}


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
        Model=_Type, String=_Type, Int=_Type, Combo=Combo,
        NodeOutput=lambda *a, **kw: types.SimpleNamespace(args=a, **kw))
    ui = types.SimpleNamespace(PreviewText=lambda text: types.SimpleNamespace(text=text))

    class ComfyExtension:
        pass

    latest.io, latest.ui, latest.ComfyExtension = io, ui, ComfyExtension
    api.latest = latest
    return {"comfy_api": api, "comfy_api.latest": latest}
