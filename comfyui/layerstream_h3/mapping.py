"""ComfyUI's `_forward` arguments -> one `layerstream.Engine.denoise` call.

The DIFFUSION_MODEL wrapper sits exactly where `MiniMaxH3Model._forward` runs
(comfy/ldm/minimax/model.py @ 01a56b76, read for this mapping; docs/comfyui.md has the
argument table). What arrives there, and what the engine is given:

  x = [video, audio]      bf16 [1, C, T, Hl, Wl], bf16 [1, Ca, 2, A]. The audio is already
                          the stream's own latent (forward() multiplied the sampler's carried
                          variable by carry = bf16(sigma_a / sigma_v) outside the wrappers),
                          so the engine runs with audio_scale = 1 (no carry in, no velocity
                          conversion out): exactly _forward's contract.
  timestep                fp32 [1] = fl32(sigma * 1000). The engine takes sigma and forms
                          fl32(sigma * 1000) itself; sigma_for_timestep finds an fp32 sigma that
                          reproduces the timestep bit for bit.
  context                 bf16 [1, L, hidden] refined by extra_conds (-> refined_text), or raw
                          [1, L, text_dim] (-> text; the engine refines it with its own kernels).
  transformer_options     sample_sigmas (PDD heads), minimax_h3_sigma_shift_video / _audio.
  minimax_payload         text_token_tags, keyframes, refs, cond_*_latents, *_cond_noise_aug,
                          seed (see build_request).
  denoise_mask            [1, 1, T, Hl, Wl], already pooled per 2x2 patch and quantised to
  audio_denoise_mask      ceil(m * 256) / 256 by model_base; [1, 1, 2, A].

Condition noise is drawn here with torch exactly as _cond_video_rows / _cond_audio_rows
draw it: for every condition, a fresh CPU generator seeded with `seed` (video) or
`seed + 1` (audio), torch.randn of the condition's *row* shape in fp32 (video rows
[t * Hl/2 * Wl/2, 4C], audio rows [2 * rt, Ca]), only when that stream's aug < 1.

Anything the engine cannot reproduce raises Unsupported(reason); the wrapper then falls
back (stock, comfy-sliced or an error, as the node says). torch is imported lazily so the
package imports without it.
"""

import struct

from .checkpoint import engine_function

VISUAL_COND_TIMESTEP = 0.999  # model.py defaults of the payload's aug strengths
AUDIO_COND_TIMESTEP = 1.0
BATCH_ERROR = "MiniMax H3 supports batch size 1"  # the ValueError stock _forward raises
PDD_ERROR = "MiniMax H3 PDD heads need the sampler's sigma schedule"


class Unsupported(Exception):
    """The engine cannot run this call as ComfyUI would; str(e) says why."""


def _f32(v):
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def _f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def _bits_f32(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def sigma_for_timestep(timestep):
    """An fp32 sigma with fl32(sigma * 1000) == timestep (fp32), the value the engine forms
    (layout.cpp: ts = sigma * 1000.0f). The sampler's own sigma is one such value, so one
    exists within an ulp or two of timestep / 1000; the search walks outwards from there.
    (Checked over every fp32 sigma in [1e-6, 1]: fl32(timestep / 1000) itself always works;
    the neighbours are a guard for other ranges.) Raises Unsupported if none is found."""
    t = _f32(timestep)
    if not (t > 0.0) or t != t or t == float("inf"):
        raise Unsupported("timestep {} is not a positive finite value".format(timestep))
    s0 = _f32_bits(_f32(t / 1000.0))
    for d in (0, 1, -1, 2, -2, 3, -3, 4, -4):
        s = _bits_f32(s0 + d)
        if _f32(_f32(s) * 1000.0) == t:
            return s
    raise Unsupported("no fp32 sigma gives timestep {!r} exactly".format(t))


def clip_geometry(T, Hl, Wl, A):
    """The engine's clip (pixel frames, width, height) for latent sizes, or Unsupported.
    The engine derives T = 5j + 2 from frames = 17j + 5, Hl = height / 16, Wl = width / 16
    and A = round(frames * 40 / 24); ComfyUI's EmptyMiniMaxH3LatentAV makes exactly these
    (comfy_extras/nodes_minimax_h3.py temporal_shape)."""
    if Hl % 2 or Wl % 2:
        raise Unsupported("the latent is {}x{} (odd); ComfyUI pads it circularly, the engine needs a canvas "
                          "of multiples of 32 pixels".format(Hl, Wl))
    if T < 2 or (T - 2) % 5:
        raise Unsupported("{} latent frames is not on the 17k+5 frame grid (T = 5k + 2)".format(T))
    frames = 17 * ((T - 2) // 5) + 5
    width, height = Wl * 16, Hl * 16
    grid = _engine_grid(frames, width, height)
    if grid is not None and (grid["T"], grid["Hl"], grid["Wl"]) != (T, Hl, Wl):
        raise Unsupported("the engine's grid for {} frames of {}x{} is T={}, {}x{}, not the latent's T={}, {}x{}".format(
            frames, width, height, grid["T"], grid["Hl"], grid["Wl"], T, Hl, Wl))
    want_a = grid["A"] if grid is not None else (10 * frames + 3) // 6
    if A != want_a:
        raise Unsupported("the audio latent has {} frames but {} video frames need {} (the engine derives the "
                          "audio length from the video's)".format(A, frames, want_a))
    return frames, width, height


def _engine_grid(frames, width, height):
    """The engine's own clip grid (layerstream.clip_geometry, the C API's ls_clip_geometry),
    or None without the engine library (the formulas above answer then). A clip the engine
    refuses (beyond its ranges) is Unsupported with its message."""
    fn = engine_function("clip_geometry")
    if fn is None:
        return None
    try:
        return fn(frames, width, height)
    except ValueError as e:  # layerstream.InvalidArgument
        raise Unsupported(str(e))


def _shape(t):
    return tuple(int(s) for s in t.shape)


def _host_f32(t):
    """A host fp32 numpy array (a copy) of a torch tensor."""
    import torch
    return t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()


def _draw_noise(shape, seed):
    import torch
    gen = torch.Generator("cpu").manual_seed(int(seed))
    return torch.randn(shape, generator=gen, dtype=torch.float32).numpy()


def _mask_is_binary(m):
    import torch
    return bool(torch.all((m == 0) | (m == 1)).item())


def _video_cond(z, C, what, Hl=None, Wl=None):
    """A condition video latent [1, C, t, h, w] -> (host fp32 [C, t, h, w], t, h, w)."""
    s = _shape(z)
    if len(s) != 5 or s[0] != 1 or s[1] != C:
        raise Unsupported("{} latent has shape {}; expected [1, {}, t, h, w]".format(what, list(s), C))
    if s[3] % 2 or s[4] % 2:
        raise Unsupported("{} latent is {}x{} (odd)".format(what, s[3], s[4]))
    if Hl is not None and (s[3], s[4]) != (Hl, Wl):
        raise Unsupported("{} latent is {}x{} but the target is {}x{}".format(what, s[3], s[4], Hl, Wl))
    return _host_f32(z[0]), s[2], s[3], s[4]


def _audio_cond(z, Ca, what):
    s = _shape(z)
    if len(s) != 4 or s[0] != 1 or s[1] != Ca or s[2] != 2:
        raise Unsupported("{} audio latent has shape {}; expected [1, {}, 2, t]".format(what, list(s), Ca))
    return _host_f32(z[0]), s[3]


def _latent_pair(x):
    """ComfyUI's [video, audio] latent list as (video, audio), batch 1: Unsupported for another
    shape, stock's ValueError for a batch > 1."""
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        raise Unsupported("the input is not the [video, audio] latent list")
    video, audio = x[0], x[1]
    if video.ndim != 5 or audio.ndim != 4:
        raise Unsupported("latents of shapes {} and {} are not [1, C, T, H, W] and [1, Ca, 2, A]".format(
            list(_shape(video)), list(_shape(audio))))
    if video.shape[0] != 1 or audio.shape[0] != 1:
        raise ValueError(BATCH_ERROR)
    return video, audio


def precheck(x, context):
    """The checks of build_request that need no engine (issue 25: the engine is opened only
    for calls it can run): the latent list, batch 1 (stock's ValueError), bf16 compute, the
    latent grid. Raises ValueError / Unsupported as build_request does; returns None."""
    import torch

    video, audio = _latent_pair(x)
    if context is None or context.ndim != 3 or context.shape[0] != 1:
        raise Unsupported("the text context is missing or not [1, L, width]")
    if context.dtype != torch.bfloat16 or video.dtype != torch.bfloat16 or audio.dtype != torch.bfloat16:
        raise Unsupported("ComfyUI computes this model in {} (latents {}); the engine computes in bf16".format(
            str(context.dtype).replace("torch.", ""), str(video.dtype).replace("torch.", "")))
    _, _, T, Hl, Wl = _shape(video)
    clip_geometry(T, Hl, Wl, _shape(audio)[3])


def build_request(model, info, x, timestep, context, transformer_options, payload, denoise_mask,
                  audio_denoise_mask, output_masks_supported=False):
    """Everything one Engine.denoise call needs, as plain values and host arrays (no layerstream
    objects yet: make_clip builds those). `model` is ComfyUI's MiniMaxH3Model (only its
    shape attributes and the PDD head width are read), `info` the engine's info() dict.

    Raises ValueError where stock _forward raises (batch > 1, PDD without a schedule) and
    Unsupported where the engine cannot give ComfyUI's answer."""
    import torch

    video, audio = _latent_pair(x)
    C, Ca, hidden = int(info["latents_dim"]), int(info["audio_latents_dim"]), int(info["hidden"])
    _, c_in, T, Hl, Wl = _shape(video)
    _, ca_in, two, A = _shape(audio)
    if c_in != C or ca_in != Ca or two != 2:
        raise Unsupported("latent channels {} / {}x{} do not match the engine's model ({} / {}x2)".format(
            c_in, ca_in, two, C, Ca))
    if context is None or context.ndim != 3 or context.shape[0] != 1:
        raise Unsupported("the text context is missing or not [1, L, width]")
    if context.dtype != torch.bfloat16 or video.dtype != torch.bfloat16 or audio.dtype != torch.bfloat16:
        raise Unsupported("ComfyUI computes this model in {} (latents {}); the engine computes in bf16".format(
            str(context.dtype).replace("torch.", ""), str(video.dtype).replace("torch.", "")))
    frames, width, height = clip_geometry(T, Hl, Wl, A)
    L, width_text = int(context.shape[1]), int(context.shape[2])
    text = refined = None
    if width_text == hidden:
        refined = context[0]
    elif width_text == int(info["text_dim"]):
        text = context[0]
    else:
        raise Unsupported("the text context is {} wide; the model takes {} (refined) or {} (raw)".format(
            width_text, hidden, info["text_dim"]))

    opts = transformer_options or {}
    payload = payload or {}
    shift_v = float(opts.get("minimax_h3_sigma_shift_video", getattr(model, "sigma_shift_video", 12.0)))
    shift_a = float(opts.get("minimax_h3_sigma_shift_audio", getattr(model, "sigma_shift_audio", 3.0)))
    sigma = sigma_for_timestep(float(timestep.flatten()[0].float().item()))

    sample_sigmas = opts.get("sample_sigmas")
    if sample_sigmas is not None:
        sample_sigmas = [float(v) for v in sample_sigmas.detach().to("cpu", torch.float32).flatten().tolist()]
    if pdd_heads(model) > 1 and sample_sigmas is None:
        raise ValueError(PDD_ERROR)

    tags = payload.get("text_token_tags")
    text_tags = None
    if tags is not None:
        flat = tags.view(-1).tolist() if hasattr(tags, "view") else list(tags)
        if len(flat) != L:
            raise Unsupported("text_token_tags has {} entries for {} text tokens".format(len(flat), L))
        if any(int(v) not in (0, 1) for v in flat):
            raise Unsupported("text_token_tags holds values other than 0 (vision) and 1 (text)")
        text_tags = [int(v) for v in flat]

    vis_aug = float(payload.get("visual_cond_noise_aug", VISUAL_COND_TIMESTEP))
    aud_aug = float(payload.get("audio_cond_noise_aug", AUDIO_COND_TIMESTEP))
    seed = int(payload.get("seed", 0))
    if seed < 0:
        raise Unsupported("seed {} is negative; the engine takes seeds from 0 to 2^64 - 1".format(seed))

    cond_video, cond_audio = [], []  # the latents in the order _forward packs them (checked below)
    keyframes = []
    for i, kf in enumerate(payload.get("keyframes") or []):
        what = "keyframe {}".format(i)
        v, a = kf.get("latent"), kf.get("audio_latent")
        entry = {"pixel_frame": int(kf["resolved_frame_index"]), "video": None, "audio": None,
                 "noise_video": None, "noise_audio": None}
        if v is not None:
            entry["video"], t, h, w = _video_cond(v, C, what, Hl, Wl)
            if vis_aug < 1.0:
                entry["noise_video"] = _draw_noise((t * (h // 2) * (w // 2), 4 * C), seed)
            cond_video.append(v)
        if a is not None:
            entry["audio"], rt = _audio_cond(a, Ca, what)
            if aud_aug < 1.0:
                entry["noise_audio"] = _draw_noise((2 * rt, Ca), seed + 1)
            cond_audio.append(a)
        if v is None and a is None:
            continue  # no rows in ComfyUI's layout either
        keyframes.append(entry)

    references = []
    for i, r in enumerate(payload.get("refs") or []):
        what = "reference {} ({})".format(i, r.get("kind"))
        kind = r.get("kind")
        if kind not in ("image", "audio", "video", "video_audio"):
            raise Unsupported("{}: unknown reference kind".format(what))
        v = r.get("latent") if "latent" in r else None
        a = r.get("audio_latent")
        rt = int(r.get("ref_audio_t", 0) or 0)
        entry = {"kind": kind, "video": None, "audio": None, "noise_video": None, "noise_audio": None}
        if kind == "audio":
            if v is not None:
                raise Unsupported("{} carries a video latent".format(what))
        else:
            if v is None:
                raise Unsupported("{} has no video latent".format(what))
            entry["video"], t, h, w = _video_cond(v, C, what)
            if (h, w) != (int(r["latent_h"]), int(r["latent_w"])):
                raise Unsupported("{}: latent_h/latent_w {}x{} disagree with its latent {}x{}".format(
                    what, r["latent_h"], r["latent_w"], h, w))
            want_t = 1 if kind == "image" else int(r["latent_t"])
            if t != want_t:
                raise Unsupported("{}: {} latent frames where the layout expects {}".format(what, t, want_t))
            if vis_aug < 1.0:
                entry["noise_video"] = _draw_noise((t * (h // 2) * (w // 2), 4 * C), seed)
            cond_video.append(v)
        if kind == "image":
            if a is not None:
                raise Unsupported("{} carries an audio latent".format(what))
        elif a is not None:
            entry["audio"], got = _audio_cond(a, Ca, what)
            if got != rt:
                raise Unsupported("{}: ref_audio_t {} disagrees with its audio latent's {} frames".format(what, rt, got))
            if aud_aug < 1.0:
                entry["noise_audio"] = _draw_noise((2 * got, Ca), seed + 1)
            cond_audio.append(a)
        elif rt > 0:
            raise Unsupported("{}: ref_audio_t {} but no audio latent".format(what, rt))
        if kind in ("video", "video_audio"):
            # ComfyUI handles both in one branch; which one a block is depends only on its audio.
            entry["kind"] = "video_audio" if entry["audio"] is not None else "video"
        if kind == "audio" and entry["audio"] is None:
            continue  # ref_audio_t == 0: no rows and no time span in ComfyUI's layout
        references.append(entry)

    # _forward takes the condition *rows* from cond_video_latents / cond_audio_latents and their
    # places from keyframes / refs; model_base builds both from the same lists. Refuse a payload
    # where they disagree instead of guessing which one the user meant.
    for name, mine in (("cond_video_latents", cond_video), ("cond_audio_latents", cond_audio)):
        theirs = list(payload.get(name) or [])
        if len(theirs) != len(mine) or any(_shape(p) != _shape(q) for p, q in zip(theirs, mine)):
            raise Unsupported("minimax_payload's {} do not match its keyframes and refs".format(name))

    video_mask = audio_mask = None
    fractional = False
    if denoise_mask is not None:
        if _shape(denoise_mask)[-3:] != (T, Hl, Wl) or denoise_mask.ndim != 5:
            raise Unsupported("denoise_mask has shape {}; expected [1, 1, {}, {}, {}]".format(
                list(_shape(denoise_mask)), T, Hl, Wl))
        m = denoise_mask[0, 0].to(torch.float32)
        fractional |= not _mask_is_binary(m)
        video_mask = _host_f32(m)
    if audio_denoise_mask is not None:
        if audio_denoise_mask.ndim != 4 or _shape(audio_denoise_mask)[-2:] != (2, A):
            raise Unsupported("audio_denoise_mask has shape {}; expected [1, 1, 2, {}]".format(
                list(_shape(audio_denoise_mask)), A))
        m = audio_denoise_mask[0, 0].to(torch.float32)
        fractional |= not _mask_is_binary(m)
        audio_mask = _host_f32(m)
    output_masks = None
    if video_mask is not None or audio_mask is not None:
        if output_masks_supported:
            output_masks = False  # the engine leaves the velocities unmasked, as _forward does
        elif fractional:
            # The engine multiplies its velocities by the masks (MiniMaxH3Model.forward's step);
            # forward() multiplies _forward's result again. For masks of 0 and 1 that is the same
            # value (m * m = m, and -0/+0 keep their sign), for fractional ones it is not.
            raise Unsupported("the denoise mask has values between 0 and 1; the engine applies masks to its "
                              "output as forward() does, so only 0/1 masks give ComfyUI's result until the "
                              "engine can leave them out")

    return {
        "frames": frames, "width": width, "height": height, "text_tokens": L, "text_tags": text_tags,
        "keyframes": keyframes, "references": references, "video_mask": video_mask, "audio_mask": audio_mask,
        "vis_aug": vis_aug, "aud_aug": aud_aug, "seed": seed, "shift_video": shift_v, "shift_audio": shift_a,
        "audio_scale": 1.0, "sample_sigmas": sample_sigmas, "sigma": sigma,
        "video": video, "audio": audio, "text": text, "refined_text": refined,
        "shapes": {"C": C, "T": T, "Hl": Hl, "Wl": Wl, "Ca": Ca, "A": A, "L": L},
        "output_masks": output_masks,
    }


def pdd_heads(model):
    """ComfyUI's PDD head count: final_layer.video_out rows / out_features (1 = one head)."""
    try:
        head = model.final_layer.video_out
        return int(head.weight.shape[0]) // int(head.out_features)
    except (AttributeError, TypeError, ZeroDivisionError):
        return 1


def make_clip(ls, req):
    """The layerstream.Clip of a request (ls = the imported layerstream module)."""
    import numpy as np
    kfs = [ls.Keyframe(k["pixel_frame"], k["video"], audio=k["audio"], noise_video=k["noise_video"],
                       noise_audio=k["noise_audio"]) for k in req["keyframes"]]
    refs = [ls.Reference(r["kind"], video=r["video"], audio=r["audio"], noise_video=r["noise_video"],
                         noise_audio=r["noise_audio"]) for r in req["references"]]
    tags = None if req["text_tags"] is None else np.asarray(req["text_tags"], dtype=np.int8)
    sigmas = None if req["sample_sigmas"] is None else np.asarray(req["sample_sigmas"], dtype=np.float32)
    return ls.Clip(req["frames"], req["width"], req["height"], req["text_tokens"], text_tags=tags,
                   keyframes=kfs, references=refs, video_mask=req["video_mask"], audio_mask=req["audio_mask"],
                   vis_aug=req["vis_aug"], aud_aug=req["aud_aug"], seed=req["seed"],
                   shift_video=req["shift_video"], shift_audio=req["shift_audio"],
                   audio_scale=req["audio_scale"], sample_sigmas=sigmas)


def describe_request(req):
    """One log line: the call's shapes and conditioning."""
    s = req["shapes"]
    parts = ["{} frames {}x{} (latent {}x{}x{}, audio {})".format(req["frames"], req["width"], req["height"],
                                                                 s["T"], s["Hl"], s["Wl"], s["A"]),
             "text {} ({})".format(s["L"], "refined" if req["refined_text"] is not None else "raw, refined by the engine")]
    if req["keyframes"]:
        parts.append("{} keyframe(s)".format(len(req["keyframes"])))
    if req["references"]:
        parts.append("references " + ",".join(r["kind"] for r in req["references"]))
    if req["video_mask"] is not None or req["audio_mask"] is not None:
        parts.append("masks " + "+".join(n for n, m in (("video", req["video_mask"]), ("audio", req["audio_mask"]))
                                         if m is not None))
    return ", ".join(parts)
