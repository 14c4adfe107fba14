"""LayerStream for Python: the H3 audio-video denoiser engine behind its C API.

    import layerstream
    e = layerstream.Engine(preset="tiny")                 # or model="h3.safetensors"
    clip = layerstream.Clip(frames=22, width=64, height=64, text_tokens=8)
    video_v, audio_v = e.denoise(clip, video, audio, sigma=0.7, text=text)

Arrays in and out: numpy float32 arrays (buffer protocol) or anything with ``__dlpack__``
(torch CPU/CUDA tensors, float32 or bfloat16). Strided inputs are copied, bf16 is widened
exactly; outputs are written into ``video_out`` / ``audio_out`` when given (f32 or bf16),
else returned as new numpy float32 arrays. The GIL is released during engine calls; a
failure raises ``layerstream.Error`` (a subclass per status) with the engine's message;
the argument errors (``InvalidArgument``, ``OutOfBudget``) are ``ValueError`` s as well.
Every number is checked against the library's one range table (``ranges()``; the CLI's,
the C API's and the ComfyUI node's), with the same grammar and messages.
docs/python.md has the details; shapes and meanings are the C API's (layerstream.h).
"""
from __future__ import annotations

import json as _json
import numbers as _numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _C
from ._C import (DeviceError, Error, InvalidArgument, InvalidFile, IoError, NonFinite, NotFound, OutOfBudget,
                 OutOfMemory, Unsupported)

__all__ = ["Engine", "Clip", "Keyframe", "Reference", "Error", "InvalidArgument", "InvalidFile", "IoError",
           "Unsupported", "OutOfBudget", "OutOfMemory", "DeviceError", "NotFound", "NonFinite", "version",
           "fingerprint", "parse_size", "ranges", "validate_memory", "probe_checkpoint", "clip_geometry", "PREFETCH"]


def version():
    """ls_version(): "layerstream 0.1.0 (commit ..., Release build, backends: cpu)"."""
    return _C.version()


# "layerstream 0.1.0 (...)" -> "0.1.0": one source of truth, the library's.
__version__ = _C.version().split()[1]


def fingerprint(video, audio):
    """FNV-1a 64 of the video bytes then the audio bytes (contiguous float32 host arrays):
    the "output hash" `layerstream forward` prints and Engine.output_hash."""
    return _C.fingerprint(video, audio)


def parse_size(value: Union[int, str], what: str = "size") -> int:
    """Bytes from an int or a string, by the library's one size grammar (ls_parse_size, the
    CLI's and the node's): "123456", "512M", "12G", "3.5GiB" (1024-based units, any case);
    decimal KB/MB/GB, spaces, signs and hex are refused, as is anything outside 1 B..1 EiB.
    Raises InvalidArgument (a ValueError) with the library's message."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        if isinstance(value, _numbers.Integral) and not isinstance(value, bool):
            value = int(value)  # numpy integers
        else:
            raise InvalidArgument("%s: give an int (bytes) or a string like \"12G\", got %r" % (what, value))
    return _C.parse_size(what, value if isinstance(value, str) else str(value))


def ranges() -> List[Dict[str, Any]]:
    """The library's range table (ls_range_at): one dict per quantity with name, kind
    ("integer" | "real" | "size"), lo, hi, lo_open, hi_open, text ("1..2^30", "(0, 1]"),
    unit and meaning. Every door (CLI, C API, Python, the ComfyUI node) checks against it."""
    return _C.ranges()


_RANGE_TEXT: Dict[str, str] = {}


def _range_text(name: str) -> str:
    if not _RANGE_TEXT:
        _RANGE_TEXT.update((r["name"], r["text"]) for r in _C.ranges())
    return _RANGE_TEXT[name]


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int(value: Any, what: str, range_name: Optional[str], special: Sequence[int] = ()) -> int:
    """An integer argument: an int (numpy integers too; not a bool, float or str), then
    the range table's check (ls_parse_value: the CLI's message) unless it is one of the
    door's special values (0 = the default, ...). range_name None: int64 only."""
    if isinstance(value, bool) or not isinstance(value, _numbers.Integral):
        rng = " in " + _range_text(range_name) if range_name else ""
        raise InvalidArgument("%s must be an integer%s (got %r)" % (what, rng, value))
    v = int(value)
    if v in special:
        return v
    if range_name is not None:
        _C.parse_value(range_name, what, str(v))
    elif not _INT64[0] <= v <= _INT64[1]:
        raise InvalidArgument("%s must be a 64-bit integer (got %d)" % (what, v))
    return v


def _float(value: Any, what: str, range_name: str) -> float:
    """A real argument (int, float, numpy scalars; not a bool or str), checked against the
    range table (finite, inside the range: the CLI's message)."""
    if isinstance(value, bool) or not isinstance(value, _numbers.Real):
        raise InvalidArgument("%s must be a finite number in %s (got %r)" % (what, _range_text(range_name), value))
    v = float(value)
    _C.parse_value(range_name, what, repr(v))  # repr: 'nan', 'inf', '2.0', '1e+30' as the grammar reads them
    return v


def _opt(check, value, name):
    """None (the library's default) or the value checked against the range of that name."""
    return None if value is None else check(value, name, name)


# The prefetch choice under a vram budget, by name (ls_memory_request.prefetch 0 / 1 / 2).
PREFETCH = {"off": 0, "auto": 1, "always": 2}
# The memory choice's tag (ls_memory_mode), by name.
_MEMORY_MODE = {"knobs": 0, "activation_budget": 1, "vram_budget": 2}


def _memory_request(vram_budget=None, activation_budget=None, prefetch=None, mlp_chunk=None, attn_chunk=None,
                    final_chunk=None, kv_offload=None, kv_chunk=None, residual_offload=None, resident_blocks=None,
                    slots=None) -> Dict[str, int]:
    """The given memory keywords as an ls_memory_request (only what is not None), the tag
    from them: vram_budget, else activation_budget, else the knobs."""
    m: Dict[str, int] = {}
    if vram_budget is not None:
        m["vram_budget"] = parse_size(vram_budget, "vram_budget")
    if activation_budget is not None:
        m["activation_budget"] = parse_size(activation_budget, "activation_budget")
    if prefetch is not None:
        if prefetch is True or prefetch is False:
            m["prefetch"] = 1 if prefetch else 0
        elif isinstance(prefetch, str) and prefetch in PREFETCH:
            m["prefetch"] = PREFETCH[prefetch]
        else:
            raise InvalidArgument("prefetch must be True, False or 'always' (or the names 'auto', 'off', 'always'), "
                                  "got %r" % (prefetch,))
    for key, v in (("mlp_chunk", mlp_chunk), ("attn_chunk", attn_chunk), ("final_chunk", final_chunk),
                   ("kv_chunk", kv_chunk), ("resident_blocks", resident_blocks), ("slots", slots)):
        if v is not None:
            m[key] = _int(v, key, None)
    for key, v in (("kv_offload", kv_offload), ("residual_offload", residual_offload)):
        if v is not None:
            if not isinstance(v, (bool, int)) or v not in (0, 1):
                raise InvalidArgument("%s must be True or False, got %r" % (key, v))
            m[key] = int(bool(v))
    m["mode"] = _MEMORY_MODE["vram_budget" if "vram_budget" in m else
                             "activation_budget" if "activation_budget" in m else "knobs"]
    return m


def validate_memory(*, device: Optional[str] = None, **memory: Any) -> None:
    """The library's one memory validation (ls_memory_validate) of Engine's memory
    keywords (vram_budget, activation_budget, prefetch, mlp_chunk, attn_chunk, final_chunk,
    kv_offload, kv_chunk, residual_offload, resident_blocks, slots; None = not given) and,
    with `device`, whether that device has memory for a vram budget. Returns None, or
    raises InvalidArgument with the message every door gives."""
    unknown = sorted(set(memory) - set(_memory_request.__code__.co_varnames[:11]))
    if unknown:
        raise InvalidArgument("validate_memory: unknown keyword(s) %s" % ", ".join(unknown))
    _C.memory_validate(_memory_request(**memory), device)


def clip_geometry(frames: int, width: int, height: int) -> Dict[str, int]:
    """The latent grid every H3 model gives a clip (ls_clip_geometry; no engine needed):
    frames snapped up to 17j + 5, T, Hl, Wl and the audio latent frames A."""
    return _C.clip_geometry(_int(frames, "frames", "frames"), _int(width, "width", "width"),
                            _int(height, "height", "height"))


def probe_checkpoint(path: str) -> Dict[str, Any]:
    """What the engine makes of an H3 checkpoint without loading its weights
    (ls_probe_checkpoint): runnable, reason, config (geometry), format, census, the
    quantised layers, the clip grid, the version."""
    return _json.loads(_C.probe_checkpoint(str(path)))


_ATTENTION = {"default": 0, "native": 1, "cudnn": 2, "hopper": 3, "int8": 4}
_GEMM_F32 = {"lanes16": 0, "cublaslt": 1}
_NUMERICS_KEYS = ("attention", "kv_tile", "gemm_f32", "native_variant", "cudnn_q_chunk", "cudnn_form",
                  "cudnn_skip_configs")
_REFERENCE_KINDS = {"image": 0, "audio": 1, "video": 2, "video_audio": 3}


def _numerics_params(numerics):
    if numerics is None:
        return {}
    if not isinstance(numerics, dict):
        raise InvalidArgument("numerics: give a dict (attention=, kv_tile=, gemm_f32=, ...), got %r" % (numerics,))
    unknown = sorted(set(numerics) - set(_NUMERICS_KEYS))
    if unknown:
        raise InvalidArgument("numerics: unknown key(s) %s; known: %s" % (", ".join(unknown), ", ".join(_NUMERICS_KEYS)))
    out = dict(numerics)
    if out.get("kv_tile") is not None:
        out["kv_tile"] = _int(out["kv_tile"], "numerics.kv_tile", "kv_tile", special=(0,))  # 0 = the device's
    for key in ("cudnn_q_chunk", "cudnn_skip_configs"):
        if out.get(key) is not None:
            out[key] = _int(out[key], "numerics." + key, None)
    for key, table in (("attention", _ATTENTION), ("gemm_f32", _GEMM_F32)):
        if key in out and out[key] is not None:
            if out[key] not in table:
                raise InvalidArgument("numerics.%s: %r is not one of %s" % (key, out[key], ", ".join(table)))
            out[key] = table[out[key]]
    return out


class Keyframe:
    """A keyframe (ls_keyframe): latents pinned at pixel frame `pixel_frame` (0 = first,
    frames - 1 = last). video [C, T, Hl, Wl], audio [Ca, 2, A] (optional), and the
    caller-drawn noise-augmentation rows (None = the engine draws them as torch's CPU
    generator would): noise_video [T*Hl/2*Wl/2, 4C], noise_audio [2A, Ca]. video=None
    with an audio latent is an audio-only keyframe (ComfyUI's MiniMaxH3AddGuide with
    audio and no image): only its audio rows enter the sequence."""

    def __init__(self, pixel_frame: int, video: Any = None, audio: Any = None, *, noise_video: Any = None,
                 noise_audio: Any = None) -> None:
        # The clip's frame count bounds it (checked by the engine: 0 .. frames - 1).
        self.pixel_frame = _int(pixel_frame, "keyframe pixel_frame", None)
        self.video, self.audio, self.noise_video, self.noise_audio = video, audio, noise_video, noise_audio

    def __repr__(self):
        return "Keyframe(pixel_frame=%d)" % self.pixel_frame


class Reference:
    """A reference (ls_reference): kind "image" | "audio" | "video" | "video_audio",
    its latents and optional noise rows, as Keyframe."""

    def __init__(self, kind: str, video: Any = None, audio: Any = None, *, noise_video: Any = None,
                 noise_audio: Any = None) -> None:
        if kind not in _REFERENCE_KINDS:
            raise InvalidArgument("reference kind %r is not one of %s" % (kind, ", ".join(_REFERENCE_KINDS)))
        self.kind = kind
        self.video, self.audio, self.noise_video, self.noise_audio = video, audio, noise_video, noise_audio

    def __repr__(self):
        return "Reference(%r)" % self.kind


def _tags_bytes(tags, n):
    """text tags (1 text, 0 vision) as int8 bytes: a sequence, numpy array or tensor."""
    if tags is None:
        return None
    if hasattr(tags, "detach"):  # a torch tensor (CPU or CUDA): a few bytes
        tags = tags.detach().cpu().tolist()
    elif hasattr(tags, "tolist"):
        tags = tags.tolist()
    tags = list(tags)
    while len(tags) == 1 and isinstance(tags[0], (list, tuple)):  # [1, L]
        tags = list(tags[0])
    for t in tags:
        if int(t) not in (0, 1):
            raise InvalidArgument("text_tags: %r is not 0 (vision) or 1 (text)" % (t,))
    return bytes(int(t) for t in tags)


def _floats(values, what, range_name):
    if values is None:
        return None
    if hasattr(values, "detach"):
        values = values.detach().cpu().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    return [_float(v, "%s[%d]" % (what, i), range_name) for i, v in enumerate(values)]


class Clip:
    """The clip and its conditioning (ls_clip): pixel geometry (frames snapped up to
    17j+5, width and height multiples of 32), text_tokens L, text_tags (int [L]: 1 text,
    0 vision; None = all text), keyframes and references (Keyframe / Reference), masks
    (video_mask [T, Hl, Wl], audio_mask [2, A]; 1 = denoise), aug strengths, the
    noise-augmentation seed, shifts, audio_scale and sample_sigmas (the schedule; read
    by the PDD head bank)."""

    def __init__(self, frames: int, width: int, height: int, text_tokens: int, *, text_tags: Any = None,
                 keyframes: Sequence["Keyframe"] = (), references: Sequence["Reference"] = (),
                 video_mask: Any = None, audio_mask: Any = None, vis_aug: Optional[float] = None,
                 aud_aug: Optional[float] = None, seed: Optional[int] = None, shift_video: Optional[float] = None,
                 shift_audio: Optional[float] = None, audio_scale: Optional[float] = None,
                 sample_sigmas: Any = None) -> None:
        # None = the library's default (ls_clip_init: vis_aug 0.999, aud_aug 1, seed 0, shifts
        # 12 and 3, audio_scale 4), the one place they are written.
        self.frames, self.width, self.height, self.text_tokens = frames, width, height, text_tokens
        self.text_tags = text_tags
        self.keyframes, self.references = list(keyframes), list(references)
        self.video_mask, self.audio_mask = video_mask, audio_mask
        self.vis_aug, self.aud_aug, self.seed = vis_aug, aud_aug, seed
        self.shift_video, self.shift_audio, self.audio_scale = shift_video, shift_audio, audio_scale
        self.sample_sigmas = sample_sigmas

    def __repr__(self):
        return "Clip(frames=%r, width=%r, height=%r, text_tokens=%r, keyframes=%d, references=%d)" % (
            self.frames, self.width, self.height, self.text_tokens, len(self.keyframes), len(self.references))

    def _to_c(self):
        """The dict layerstream._C reads (plain values; arrays as given)."""
        for k in self.keyframes:
            if not isinstance(k, Keyframe):
                raise InvalidArgument("keyframes: give layerstream.Keyframe objects, got %r" % (k,))
        for r in self.references:
            if not isinstance(r, Reference):
                raise InvalidArgument("references: give layerstream.Reference objects, got %r" % (r,))
        # Every number against the library's range table (the CLI's grammar and messages).
        text_tokens = _int(self.text_tokens, "text_tokens", "text_tokens")
        return {
            "frames": _int(self.frames, "frames", "frames"), "width": _int(self.width, "width", "width"),
            "height": _int(self.height, "height", "height"), "text_tokens": text_tokens,
            "text_tags": _tags_bytes(self.text_tags, text_tokens),
            "keyframes": [(k.pixel_frame, k.video, k.audio, k.noise_video, k.noise_audio) for k in self.keyframes],
            "references": [(_REFERENCE_KINDS[r.kind], r.video, r.audio, r.noise_video, r.noise_audio)
                           for r in self.references],
            "video_mask": self.video_mask, "audio_mask": self.audio_mask,
            "vis_aug": _opt(_float, self.vis_aug, "vis_aug"), "aud_aug": _opt(_float, self.aud_aug, "aud_aug"),
            "seed": _opt(_int, self.seed, "seed"),
            "shift_video": _opt(_float, self.shift_video, "shift_video"),
            "shift_audio": _opt(_float, self.shift_audio, "shift_audio"),
            "audio_scale": _opt(_float, self.audio_scale, "audio_scale"),
            "sample_sigmas": _floats(self.sample_sigmas, "sample_sigmas", "sample_sigma"),
        }


def _is_cuda(x):
    if x is None or not hasattr(x, "__dlpack_device__"):
        return False
    try:
        return x.__dlpack_device__()[0] == 2  # kDLCUDA
    except Exception:
        return False


def _stream_handle(stream, arrays):
    """The caller's CUDA stream as an int: an int, an object with .cuda_stream (torch),
    or None = torch's current stream when a tensor is on CUDA and torch is loaded, else
    the legacy default stream (0)."""
    if stream is None:
        cuda = [a for a in arrays if _is_cuda(a)]
        if not cuda:
            return 0
        import sys
        torch = sys.modules.get("torch")
        device = getattr(cuda[0], "device", None)
        if torch is None or not isinstance(device, torch.device):
            return 0
        return int(torch.cuda.current_stream(device).cuda_stream)
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    if isinstance(stream, int) and not isinstance(stream, bool) and 0 <= stream < (1 << 64):
        return stream
    raise InvalidArgument("stream: give a CUDA stream handle (int) or an object with .cuda_stream, got %r" % (stream,))


class Engine:
    """An H3 denoiser's weights on one device (ls_engine). Memory: ONE choice, the
    library's tagged request (ls_memory_request, validated as at every door): vram_budget
    (one device budget, int bytes or "12G"; prefetch 'auto' | 'off' | 'always'), or
    activation_budget (activations only; resident_blocks / slots), or the explicit knobs
    (mlp_chunk, attn_chunk, final_chunk, kv_offload, kv_chunk, residual_offload,
    resident_blocks, slots). None = not given (the library's default); a keyword that has
    no effect under the choice is refused. None of them changes an output bit. numerics
    (dict: attention="default"|"native"|"cudnn"|"hopper"|"int8", kv_tile=, gemm_f32=
    "lanes16"|"cublaslt", and the CUDA developer knobs) may. Every parameter after
    `model` is keyword-only."""

    def __init__(self, model: Optional[str] = None, *, preset: Optional[str] = None, weights_seed: int = 0,
                 blocks: int = 0, device: str = "cpu", vram_budget: Union[int, str, None] = None,
                 activation_budget: Union[int, str, None] = None, mlp_chunk: Optional[int] = None,
                 attn_chunk: Optional[int] = None, final_chunk: Optional[int] = None,
                 kv_offload: Optional[bool] = None, kv_chunk: Optional[int] = None,
                 residual_offload: Optional[bool] = None, resident_blocks: Optional[int] = None,
                 slots: Optional[int] = None, prefetch: Union[bool, str, None] = None,
                 numerics: Optional[Dict[str, Any]] = None, threads: Optional[int] = 0, check_finite: bool = True,
                 loras: Sequence[Union[str, Tuple[str, float]]] = (), lora_dtype: str = "auto",
                 devices: Union[str, Sequence[str], None] = None) -> None:
        if model is not None and preset is not None:
            raise InvalidArgument("Engine: give model (a checkpoint path) or preset, not both")
        if vram_budget is not None and activation_budget is not None:
            raise InvalidArgument("Engine: vram_budget and activation_budget are exclusive (one memory choice)")
        params: Dict[str, Any] = {
            "model_path": None if model is None else str(model), "preset": preset,
            "weights_seed": _int(weights_seed, "weights_seed", "seed"),
            "blocks": _int(blocks, "blocks", "blocks", special=(0,)),  # 0 = the preset's
            "device": str(device),
            # threads: 0 = all cores, None = leave the process-wide pool as it is
            "threads": -1 if threads is None else _int(threads, "threads", "threads"),
            "check_finite": bool(check_finite),
        }
        # The memory choice: the given keywords as ONE request (the library validates it).
        params["memory"] = _memory_request(
            vram_budget=vram_budget, activation_budget=activation_budget, prefetch=prefetch, mlp_chunk=mlp_chunk,
            attn_chunk=attn_chunk, final_chunk=final_chunk, kv_offload=kv_offload, kv_chunk=kv_chunk,
            residual_offload=residual_offload, resident_blocks=resident_blocks, slots=slots)
        # LoRAs: "FILE", "FILE:STRENGTH" or (FILE, STRENGTH), merged by ComfyUI's formula in this order.
        params["loras"] = [f"{l[0]}:{_float(l[1], 'lora strength', 'lora_strength')!r}"
                           if isinstance(l, (tuple, list)) else str(l) for l in loras]
        dtypes = {"auto": 0, "f32": 1, "f16": 2, "bf16": 3}
        if lora_dtype not in dtypes:
            raise InvalidArgument(f"Engine: lora_dtype must be auto, f32, f16 or bf16, got {lora_dtype!r}")
        params["lora_dtype"] = dtypes[lora_dtype]
        # devices: sequence parallel (docs/multi-gpu.md), "cuda:0,cuda:1" / ["cuda:0", "cuda:1"] / "cpu*4";
        # the output bytes equal one device's.
        if devices is not None:
            if not isinstance(devices, str):
                devices = [str(d) for d in devices]
                # ["cpu"] * N: N in-process CPU ranks ("cpu*N"; the CPU cannot be listed twice)
                devices = "cpu*%d" % len(devices) if devices and all(d == "cpu" for d in devices) else ",".join(devices)
            params["devices"] = devices
        params.update(_numerics_params(numerics))
        self._model = str(model) if model is not None else "preset:%s" % preset
        self._device = str(device)
        self._numerics = dict(numerics or {})
        self._e = _C.Engine(params)

    def close(self):
        """Frees the engine now (else when the object is collected)."""
        self._e.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        """The model's widths (ls_model_info) plus device, version, model and numerics
        (as requested; the resolved settings are in plan() and report())."""
        d = self._e.info()
        d.update(device=self._device, version=version(), model=self._model, numerics=dict(self._numerics))
        return d

    def clip_shape(self, clip):
        """The clip's latent sizes on this model: T, Hl, Wl, A, S (packed rows) and the
        element counts of video [C, T, Hl, Wl], audio [Ca, 2, A] and text [L, text_dim]."""
        return self._e.clip_shape(_clip(clip)._to_c())

    def plan(self, clip: "Clip", sigma: float = 1.0) -> Dict[str, Any]:
        """The dry run (ls_engine_plan's JSON, parsed): the activation plan, the budget
        plan, minimum_budget_bytes, the resolved numerics, the version."""
        return _json.loads(self._e.plan(_clip(clip)._to_c(), _float(sigma, "sigma", "sigma")))

    def denoise(self, clip: "Clip", video: Any, audio: Any, sigma: float, *, text: Any = None,
                refined_text: Any = None, video_out: Any = None, audio_out: Any = None, stream: Any = None,
                output_masks: bool = True) -> Tuple[Any, Any]:
        """One denoiser call (MiniMaxH3Model._forward's work): the velocities (ComfyUI's
        sign) of video [C, T, Hl, Wl] and audio [Ca, 2, A] (a leading 1 allowed) at the
        video sigma `sigma`, from raw text states [L, text_dim] or refined ones bf16
        [L, hidden]. output_masks=False leaves the velocities unmasked, as _forward
        returns them (the clip's masks still set the per-row timesteps); True multiplies
        them by the masks, as MiniMaxH3Model.forward does. CUDA tensors (on the engine's
        device) are read and written in place on the device. Returns (video_out, audio_out)."""
        clip = _clip(clip)
        if video_out is None or audio_out is None:
            # New numpy float32 arrays of the inputs' shapes (a leading 1 kept), or of the
            # clip's when an input has no .shape.
            import numpy as np
            shape = None
            if not (hasattr(video, "shape") and hasattr(audio, "shape")):
                shape, info = self.clip_shape(clip), self._e.info()
            if video_out is None:
                video_out = np.empty(tuple(video.shape) if shape is None else
                                     (info["latents_dim"], shape["T"], shape["Hl"], shape["Wl"]), dtype=np.float32)
            if audio_out is None:
                audio_out = np.empty(tuple(audio.shape) if shape is None else
                                     (info["audio_latents_dim"], 2, shape["A"]), dtype=np.float32)
        arrays = [video, audio, text, refined_text, video_out, audio_out, clip.video_mask, clip.audio_mask]
        for k in clip.keyframes + clip.references:
            arrays += [k.video, k.audio, k.noise_video, k.noise_audio]
        handle = _stream_handle(stream, arrays)
        self._e.denoise(clip._to_c(), video, audio, _float(sigma, "sigma", "sigma"), text, refined_text, video_out,
                        audio_out, handle, bool(output_masks))
        return video_out, audio_out

    def refine_text(self, text):
        """ls_engine_refine_text: raw text states float32 [L, text_dim] (a contiguous host
        array) -> the refined states as bf16 bits, numpy uint16 [L, hidden]. As values:
        ``(bits.astype(np.uint32) << 16).view(np.float32)``, or torch's
        ``torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)``; either can be
        passed as denoise(refined_text=...). (Beyond the contract: for tests and tools.)"""
        import numpy as np
        hidden = self._e.info()["hidden"]
        bits = np.frombuffer(self._e.refine_text(text, hidden), dtype="<u2")
        return bits.reshape(-1, hidden).copy()

    def report(self, output_hash=True):
        """The last call's report (ls_engine_report_json, parsed). output_hash=False leaves
        the fingerprint out (ls_engine_call_report_json): it reads every output byte, about
        50 ms at S = 111k, which a caller reporting every step need not pay."""
        return _json.loads(self._e.report() if output_hash else self._e.call_report())

    @property
    def output_hash(self):
        """The last output's fingerprint (ls_engine_output_hash); 0 before any call."""
        return self._e.output_hash()

    def __repr__(self):
        return "layerstream.Engine(%s on %s)" % (self._model, self._device)


def _clip(clip):
    if not isinstance(clip, Clip):
        raise InvalidArgument("clip: give a layerstream.Clip, got %r" % (clip,))
    return clip
