"""LayerStream for Python: the H3 audio-video denoiser engine behind its C API.

    import layerstream
    e = layerstream.Engine(preset="tiny")                 # or model="h3.safetensors"
    clip = layerstream.Clip(frames=22, width=64, height=64, text_tokens=8)
    video_v, audio_v = e.denoise(clip, video, audio, sigma=0.7, text=text)

Arrays in and out: numpy float32 arrays (buffer protocol) or anything with ``__dlpack__``
(torch CPU/CUDA tensors, float32 or bfloat16). Strided inputs are copied, bf16 is widened
exactly; outputs are written into ``video_out`` / ``audio_out`` when given (f32 or bf16),
else returned as new numpy float32 arrays. The GIL is released during engine calls; a
failure raises ``layerstream.Error`` (a subclass per status) with the engine's message.
docs/python.md has the details; shapes and meanings are the C API's (layerstream.h).
"""
import json as _json
import re as _re

from . import _C
from ._C import (DeviceError, Error, InvalidArgument, InvalidFile, IoError, NonFinite, NotFound, OutOfBudget,
                 OutOfMemory, Unsupported)

__all__ = ["Engine", "Clip", "Keyframe", "Reference", "Error", "InvalidArgument", "InvalidFile", "IoError",
           "Unsupported", "OutOfBudget", "OutOfMemory", "DeviceError", "NotFound", "NonFinite", "version",
           "fingerprint", "parse_size"]


def version():
    """ls_version(): "layerstream 0.1.0 (commit ..., Release build, backends: cpu)"."""
    return _C.version()


# "layerstream 0.1.0 (...)" -> "0.1.0": one source of truth, the library's.
__version__ = _C.version().split()[1]


def fingerprint(video, audio):
    """FNV-1a 64 of the video bytes then the audio bytes (contiguous float32 host arrays):
    the "output hash" `layerstream forward` prints and Engine.output_hash."""
    return _C.fingerprint(video, audio)


_SIZE = _re.compile(r"^(\d+(?:\.\d+)?|\.\d+)(b|k|m|g|t|kib|mib|gib|tib)?$", _re.IGNORECASE)
_UNIT = {None: 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value, what="size"):
    """Bytes from an int or a string as the CLI reads sizes: "123456", "512M", "12G",
    "3.5GiB" (1024-based units, any case; decimal KB/MB/GB are refused as ambiguous)."""
    if isinstance(value, bool):
        raise InvalidArgument("%s: %r is not a size" % (what, value))
    if isinstance(value, int):
        if value <= 0:
            raise InvalidArgument("%s must be > 0 bytes, got %d" % (what, value))
        return value
    if not isinstance(value, str):
        raise InvalidArgument("%s: give an int (bytes) or a string like \"12G\", got %r" % (what, value))
    m = _SIZE.match(value.strip())
    if not m:
        raise InvalidArgument("%s: %r is not a size (bytes, or a number with K, M, G, T / KiB, MiB, GiB, TiB; "
                              "1024-based)" % (what, value))
    unit = m.group(2).lower()[0] if m.group(2) and m.group(2).lower() != "b" else None
    n = int(float(m.group(1)) * _UNIT[unit]) if unit else int(m.group(1).split(".")[0])
    if n <= 0:
        raise InvalidArgument("%s must be > 0 bytes, got %r" % (what, value))
    return n


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

    def __init__(self, pixel_frame, video=None, audio=None, noise_video=None, noise_audio=None):
        self.pixel_frame = int(pixel_frame)
        self.video, self.audio, self.noise_video, self.noise_audio = video, audio, noise_video, noise_audio

    def __repr__(self):
        return "Keyframe(pixel_frame=%d)" % self.pixel_frame


class Reference:
    """A reference (ls_reference): kind "image" | "audio" | "video" | "video_audio",
    its latents and optional noise rows, as Keyframe."""

    def __init__(self, kind, video=None, audio=None, noise_video=None, noise_audio=None):
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


def _floats(values):
    if values is None:
        return None
    if hasattr(values, "detach"):
        values = values.detach().cpu().tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    return [float(v) for v in values]


class Clip:
    """The clip and its conditioning (ls_clip): pixel geometry (frames snapped up to
    17j+5, width and height multiples of 32), text_tokens L, text_tags (int [L]: 1 text,
    0 vision; None = all text), keyframes and references (Keyframe / Reference), masks
    (video_mask [T, Hl, Wl], audio_mask [2, A]; 1 = denoise), aug strengths, the
    noise-augmentation seed, shifts, audio_scale and sample_sigmas (the schedule; read
    by the PDD head bank)."""

    def __init__(self, frames, width, height, text_tokens, text_tags=None, keyframes=(), references=(),
                 video_mask=None, audio_mask=None, vis_aug=0.999, aud_aug=1.0, seed=0, shift_video=12.0,
                 shift_audio=3.0, audio_scale=4.0, sample_sigmas=None):
        self.frames, self.width, self.height, self.text_tokens = frames, width, height, text_tokens
        self.text_tags = text_tags
        self.keyframes, self.references = list(keyframes), list(references)
        self.video_mask, self.audio_mask = video_mask, audio_mask
        self.vis_aug, self.aud_aug, self.seed = vis_aug, aud_aug, seed
        self.shift_video, self.shift_audio, self.audio_scale = shift_video, shift_audio, audio_scale
        self.sample_sigmas = sample_sigmas

    def __repr__(self):
        return "Clip(frames=%d, width=%d, height=%d, text_tokens=%d, keyframes=%d, references=%d)" % (
            self.frames, self.width, self.height, self.text_tokens, len(self.keyframes), len(self.references))

    def _to_c(self):
        """The dict layerstream._C reads (plain values; arrays as given)."""
        for k in self.keyframes:
            if not isinstance(k, Keyframe):
                raise InvalidArgument("keyframes: give layerstream.Keyframe objects, got %r" % (k,))
        for r in self.references:
            if not isinstance(r, Reference):
                raise InvalidArgument("references: give layerstream.Reference objects, got %r" % (r,))
        return {
            "frames": int(self.frames), "width": int(self.width), "height": int(self.height),
            "text_tokens": int(self.text_tokens),
            "text_tags": _tags_bytes(self.text_tags, self.text_tokens),
            "keyframes": [(k.pixel_frame, k.video, k.audio, k.noise_video, k.noise_audio) for k in self.keyframes],
            "references": [(_REFERENCE_KINDS[r.kind], r.video, r.audio, r.noise_video, r.noise_audio)
                           for r in self.references],
            "video_mask": self.video_mask, "audio_mask": self.audio_mask,
            "vis_aug": float(self.vis_aug), "aud_aug": float(self.aud_aug), "seed": int(self.seed),
            "shift_video": float(self.shift_video), "shift_audio": float(self.shift_audio),
            "audio_scale": float(self.audio_scale), "sample_sigmas": _floats(self.sample_sigmas),
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
    if isinstance(stream, int) and stream >= 0:
        return stream
    raise InvalidArgument("stream: give a CUDA stream handle (int) or an object with .cuda_stream, got %r" % (stream,))


class Engine:
    """An H3 denoiser's weights on one device (ls_engine). Memory choice: vram_budget
    (one device budget, int bytes or "12G"), or activation_budget (activations only), or
    the explicit knobs; none of them changes an output bit. numerics (dict: attention=
    "default"|"native"|"cudnn"|"hopper"|"int8", kv_tile=, gemm_f32="lanes16"|"cublaslt", and the CUDA
    developer knobs) may."""

    def __init__(self, model=None, preset=None, weights_seed=0, blocks=0, device="cpu", vram_budget=None,
                 activation_budget=None, mlp_chunk=0, attn_chunk=0, final_chunk=0, kv_offload=False, kv_chunk=0,
                 residual_offload=False, resident_blocks=-1, slots=2, prefetch=True, numerics=None, threads=0,
                 check_finite=True, loras=(), lora_dtype="auto", devices=None):
        if model is not None and preset is not None:
            raise InvalidArgument("Engine: give model (a checkpoint path) or preset, not both")
        if vram_budget is not None and activation_budget is not None:
            raise InvalidArgument("Engine: vram_budget and activation_budget are exclusive (one memory choice)")
        params = {
            "model_path": None if model is None else str(model), "preset": preset,
            "weights_seed": int(weights_seed), "blocks": int(blocks), "device": str(device), "threads": int(threads),
            "memory_mode": 0, "mlp_chunk": int(mlp_chunk), "attn_chunk": int(attn_chunk),
            "final_chunk": int(final_chunk), "kv_offload": bool(kv_offload), "kv_chunk": int(kv_chunk),
            "residual_offload": bool(residual_offload), "resident_blocks": int(resident_blocks), "slots": int(slots),
            "check_finite": bool(check_finite),
        }
        # prefetch (vram_budget): True two block slots (one where offloading needs it and one
        # exposes less transfer), False one, "always" two whatever the budget (docs/budget.md).
        if prefetch == "always":
            params["prefetch"] = 2
        elif not isinstance(prefetch, str) and prefetch in (0, 1):  # True / False (or 1 / 0)
            params["prefetch"] = 1 if prefetch else 0
        else:
            raise InvalidArgument(f"Engine: prefetch must be True, False or 'always', got {prefetch!r}")
        # LoRAs: "FILE", "FILE:STRENGTH" or (FILE, STRENGTH), merged by ComfyUI's formula in this order.
        params["loras"] = [f"{l[0]}:{float(l[1])!r}" if isinstance(l, (tuple, list)) else str(l) for l in loras]
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
        if vram_budget is not None:
            params["memory_mode"] = 2
            params["vram_budget"] = parse_size(vram_budget, "vram_budget")
        elif activation_budget is not None:
            params["memory_mode"] = 1
            params["activation_budget"] = parse_size(activation_budget, "activation_budget")
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

    def plan(self, clip, sigma=1.0):
        """The dry run (ls_engine_plan's JSON, parsed): the activation plan, the budget
        plan, minimum_budget_bytes, the resolved numerics, the version."""
        return _json.loads(self._e.plan(_clip(clip)._to_c(), float(sigma)))

    def denoise(self, clip, video, audio, sigma, text=None, refined_text=None, video_out=None, audio_out=None,
                stream=None, output_masks=True):
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
        self._e.denoise(clip._to_c(), video, audio, float(sigma), text, refined_text, video_out, audio_out, handle,
                        bool(output_masks))
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

    def report(self):
        """The last call's report (ls_engine_report_json, parsed)."""
        return _json.loads(self._e.report())

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
