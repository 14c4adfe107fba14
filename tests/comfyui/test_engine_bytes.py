"""The wrapper on the real engine (the built `layerstream` package; skipped when it is not
importable): what it returns to ComfyUI is byte for byte what a direct Engine.denoise call
with the same inputs gives (torch.equal), for t2va, keyframes, references, masks, PDD,
sliced plans, and a checkpoint file written by `layerstream make-model` (LS_TOOL)."""

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

ls = pytest.importorskip("layerstream")

from layerstream_h3 import node, wrapper  # noqa: E402

C, T, HL, WL, CA, A, L = 24, 2, 4, 4, 32, 8, 6  # tiny preset; 5 frames of 64x64
KIND = "diffusion_model"


def tiny_factory(settings, budget, **lora_kw):
    return ls.Engine(preset="tiny", device="cpu", mlp_chunk=settings.mlp_chunk, attn_chunk=settings.attn_chunk,
                     **lora_kw)


def inputs(seed=1, hidden=128):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn((1, C, T, HL, WL), generator=g).to(torch.bfloat16)
    audio = torch.randn((1, CA, 2, A), generator=g).to(torch.bfloat16)
    ctx = (0.5 * torch.randn((1, L, hidden), generator=g)).to(torch.bfloat16)
    return video, audio, ctx


def _probe(p):
    """A probe wrapper registered BEFORE the node's (it sees what ours returns): each call's
    input x and output clones."""
    seen = []

    def probe(executor, *a, **k):
        out = executor(*a, **k)
        seen.append({"x": a[0], "out": [o.clone() for o in out]})
        return out

    p.add_wrapper_with_key(KIND, "probe", probe)
    return seen


def probed(comfy, path, pdd_heads=1, **kw):
    """A MODEL with a probe wrapper (_probe) and the node."""
    p = comfy.make_patcher(path=path, pdd_heads=pdd_heads)
    seen = _probe(p)
    kw.setdefault("engine_factory", tiny_factory)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls, **kw)
    return m, seen, text


def carried(comfy, audio, sigma):
    """The audio _forward receives: forward() multiplies by bf16(sigma_a / sigma_v)."""
    t = torch.tensor([sigma], dtype=torch.float32) * 1000.0
    sv = (t[0] / 1000.0).float().clamp(min=1e-6)
    return audio * (comfy.time_shift_sigma(sv, 12.0, 3.0) / sv).to(torch.bfloat16)


def direct(clip, video, audio, sigma, ctx, **kw):
    eng = ls.Engine(preset="tiny", device="cpu")
    v, a = eng.denoise(clip, video[0].float().numpy(), audio[0].float().numpy(), np.float32(sigma),
                       refined_text=ctx[0], **kw)
    return torch.from_numpy(np.ascontiguousarray(v)), torch.from_numpy(np.ascontiguousarray(a))


def check_equal(seen, v, a):
    assert len(seen) == 1
    out = seen[0]["out"]
    assert out[0].dtype == torch.bfloat16 and out[0].shape == (1,) + tuple(v.shape)
    assert v.abs().sum() > 0 and a.abs().sum() > 0  # a non-trivial answer
    assert torch.equal(out[0][0].float(), v) and torch.equal(out[1][0].float(), a)


def test_t2va_gives_the_bytes_of_a_direct_call(comfy, bf16_file, caplog):
    import logging
    import re
    m, seen, _ = probed(comfy, bf16_file)
    video, audio, ctx = inputs()
    tags = torch.tensor([1, 1, 0, 0, 1, 1])
    sigma = 0.8123
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(text_token_tags=tags, seed=3))
    # the log: the plan at the first call, then the device peak, time and hash read from the engine's report
    assert "[LayerStream] plan: " in caplog.text and "[LayerStream] numerics: " in caplog.text
    assert re.search(r"device peak [0-9.]+ [KMG]?i?B .*activation peak [0-9.]+ [KMG]?i?B, output hash [0-9a-f]{16}",
                     caplog.text), caplog.text
    clip = ls.Clip(5, 64, 64, L, text_tags=[1, 1, 0, 0, 1, 1], seed=3, audio_scale=1.0)
    v, a = direct(clip, video, carried(comfy, audio, sigma), sigma, ctx)
    check_equal(seen, v, a)


def test_forward_level_equals_the_engines_own_carry(comfy, bf16_file):
    """ComfyUI's forward() around the wrapper (carry in, velocity conversion out, masks)
    gives what the engine computes itself for the whole forward (audio_scale 4)."""
    m, _, _ = probed(comfy, bf16_file)
    video, audio, ctx = inputs(seed=2)
    vm = torch.ones((T, HL, WL))
    vm[0] = 0.0
    am = torch.ones((CA, 2, A))
    am[:, :, :2] = 0.0
    dm, adm = comfy.token_grid_masks(vm, am)
    sigma = 0.55
    out = comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(seed=1, audio_scale=4.0),
                         denoise_mask=dm, audio_denoise_mask=adm)
    clip = ls.Clip(5, 64, 64, L, seed=1, audio_scale=4.0, video_mask=dm[0, 0].numpy(), audio_mask=adm[0, 0].numpy())
    v, a = direct(clip, video, audio, sigma, ctx)
    assert torch.equal(out[0][0].float(), v) and torch.equal(out[1][0].float(), a)


def test_keyframes_references_and_masks(comfy, bf16_file):
    m, seen, _ = probed(comfy, bf16_file)
    video, audio, ctx = inputs(seed=4)
    g = torch.Generator().manual_seed(9)
    first = torch.randn((1, C, 1, HL, WL), generator=g)
    guide_audio = torch.randn((1, CA, 2, 2), generator=g)
    img = torch.randn((1, C, 1, 2, 4), generator=g)
    kfs = [{"resolved_frame_index": 0, "latent": first}, {"resolved_frame_index": 4, "audio_latent": guide_audio,
                                                           "latent": first.flip(-1).contiguous()}]
    refs = [{"kind": "image", "latent_h": 2, "latent_w": 4, "latent_t": 1, "ref_audio_t": 0, "latent": img}]
    vm = torch.ones((T, HL, WL))
    vm[1, 2:, :] = 0.0
    dm, _ = comfy.token_grid_masks(vm, torch.ones((CA, 2, A)))
    sigma, seed = 0.4, 21
    payload = comfy.make_payload(keyframes=kfs, refs=refs, seed=seed, aud_aug=0.75)
    comfy.run_step(m, video, audio, sigma, ctx, payload, denoise_mask=dm)

    def nv(z):  # ComfyUI's draws, restated: patchify then randn(rows.shape), seed / seed + 1
        rows = (z.shape[2] * (z.shape[3] // 2) * (z.shape[4] // 2), 4 * z.shape[1])
        return torch.randn(rows, generator=torch.Generator("cpu").manual_seed(seed)).numpy()

    na = torch.randn((2 * 2, CA), generator=torch.Generator("cpu").manual_seed(seed + 1)).numpy()
    clip = ls.Clip(5, 64, 64, L, seed=seed, audio_scale=1.0, aud_aug=0.75, video_mask=dm[0, 0].numpy(),
                   keyframes=[ls.Keyframe(0, first[0].numpy(), noise_video=nv(first)),
                              ls.Keyframe(4, first.flip(-1)[0].contiguous().numpy(), audio=guide_audio[0].numpy(),
                                          noise_video=nv(first), noise_audio=na)],
                   references=[ls.Reference("image", video=img[0].numpy(), noise_video=nv(img))])
    # The node hands the engine output_masks=False where the engine takes it (its result
    # stands for _forward's, which forward() then masks): compare with the same call.
    unmasked = {"output_masks": False} if wrapper.supports_output_masks(ls.Engine(preset="tiny", device="cpu")) else {}
    v, a = direct(clip, video, carried(comfy, audio, sigma), sigma, ctx, **unmasked)
    check_equal(seen, v, a)
    # and the condition rows mattered: without them the answer differs
    v0, _ = direct(ls.Clip(5, 64, 64, L, seed=seed, audio_scale=1.0, video_mask=dm[0, 0].numpy()),
                   video, carried(comfy, audio, sigma), sigma, ctx)
    assert not torch.equal(v0, v)


def test_an_audio_only_keyframe(comfy, bf16_file, caplog):
    """MiniMaxH3AddGuide with audio and no image: a keyframe without `latent`. Either the
    engine runs it (and gives a direct call's bytes) or it says why and stock runs."""
    import logging
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node.apply_node(p, device="cpu", path="engine", fallback="stock", layerstream_module=ls,
                           engine_factory=tiny_factory)
    video, audio, ctx = inputs(seed=8)
    guide = torch.randn((1, CA, 2, 2))
    payload = comfy.make_payload(keyframes=[{"resolved_frame_index": 4, "audio_latent": guide}], audio_scale=1.0)
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = comfy.run_step(m, video, audio, 0.5, ctx, payload)
    print("audio-only keyframe:", "fallback (this engine refuses it)" if m.model.diffusion_model.stock_calls
          else "engine path")
    if m.model.diffusion_model.stock_calls:
        assert "fallback to stock: the engine failed: keyframe 0 has no video latent" in caplog.text
        assert torch.equal(out[0], torch.full_like(out[0], -0.25))
    else:
        clip = ls.Clip(5, 64, 64, L, audio_scale=1.0, keyframes=[ls.Keyframe(4, None, audio=guide[0].numpy())])
        v, a = direct(clip, video, audio, 0.5, ctx)
        assert torch.equal(out[0][0].float(), v) and torch.equal(out[1][0].float(), a)


def test_slices_do_not_change_a_byte(comfy, bf16_file):
    video, audio, ctx = inputs(seed=5)
    outs = []
    for mlp, attn in ((0, 0), (64, 32), (16, 48)):
        wrapper.drop_cached_engine()
        m, seen, _ = probed(comfy, bf16_file, mlp_chunk=mlp, attn_chunk=attn)
        comfy.run_step(m, video, audio, 0.7, ctx, comfy.make_payload())
        outs.append(seen[0]["out"])
    for o in outs[1:]:
        assert torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1])


def make_model_file(tmp_path, *extra):
    tool = os.environ.get("LS_TOOL") or shutil.which("layerstream")
    if not tool or not os.path.exists(tool):
        pytest.skip("the layerstream CLI is not known (LS_TOOL)")
    path = str(tmp_path / "tiny.safetensors")
    r = subprocess.run([tool, "make-model", "--preset", "tiny", "-q", "-o", path] + list(extra),
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("make-model {} failed: {}".format(" ".join(extra), r.stderr.strip()))
    # An engine that cannot run this format yet may abort (an internal check) and take pytest
    # with it: probe it in a child process first and skip with its message.
    r = subprocess.run([tool, "forward", "--model", path, "--frames", "5", "--width", "64", "--height", "64",
                        "--text-tokens", str(L), "--sigma", "0.5"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("this engine build cannot run a {} file yet: {}".format(
            " ".join(extra), (r.stderr.strip().splitlines() or ["rc %d" % r.returncode])[-1]))
    return path


@pytest.mark.parametrize("fmt", ["bf16", "int8-convrot", "fp8"])
def test_the_models_own_file(comfy, tmp_path, fmt):
    """The real route: the engine opens the file the MODEL was loaded from."""
    path = make_model_file(tmp_path, "--format", fmt)
    p = comfy.make_patcher(path=path)
    seen = _probe(p)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls)
    assert "checkpoint: " + path in text
    video, audio, ctx = inputs(seed=6)
    sigma = 0.66
    comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(seed=2))
    eng = ls.Engine(model=path, device="cpu")
    v, a = eng.denoise(ls.Clip(5, 64, 64, L, seed=2, audio_scale=1.0), video[0].float().numpy(),
                       carried(comfy, audio, sigma)[0].float().numpy(), np.float32(sigma), refined_text=ctx[0])
    check_equal(seen, torch.from_numpy(v), torch.from_numpy(a))


def test_pdd_heads_read_the_schedule(comfy, tmp_path):
    path = make_model_file(tmp_path, "--pdd-heads", "16")
    p = comfy.make_patcher(path=path, pdd_heads=16)
    m, _ = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls)
    video, audio, ctx = inputs(seed=7)
    # 16 heads at sigma 0.8: the step to 0.45 spans heads [12, 15), the step to 0 spans [12, 16)
    schedules = ([1.0, 0.8, 0.45, 0.0], [1.0, 0.8, 0.0])
    outs = [comfy.run_step(m, video, audio, 0.8, ctx, comfy.make_payload(audio_scale=1.0), sample_sigmas=s)
            for s in schedules]
    eng = ls.Engine(model=path, device="cpu")
    for out, s in zip(outs, schedules):
        v, a = eng.denoise(ls.Clip(5, 64, 64, L, audio_scale=1.0, sample_sigmas=s), video[0].float().numpy(),
                           audio[0].float().numpy(), np.float32(0.8), refined_text=ctx[0])
        assert torch.equal(out[0][0].float(), torch.from_numpy(v)) and torch.equal(out[1][0].float(), torch.from_numpy(a))
    assert not torch.equal(outs[0][0], outs[1][0])  # the schedule picks other heads


# ---- the MODEL's LoRAs --------------------------------------------------------------------------
from lora_helpers import lora_files as _lora_files, load_loras as _load  # noqa: E402

def _direct_lora(path, loras, video, audio, sigma, ctx, seed=0):
    eng = ls.Engine(model=path, device="cpu", loras=loras, lora_dtype="f32")
    v, a = eng.denoise(ls.Clip(5, 64, 64, L, seed=seed, audio_scale=1.0), video[0].float().numpy(),
                       audio[0].float().numpy(), np.float32(sigma), refined_text=ctx[0])
    return torch.from_numpy(v), torch.from_numpy(a)


@pytest.mark.parametrize("stack", [[0.8], [0.8, -0.5]])
def test_the_models_loras_give_a_direct_lora_call_s_bytes(comfy, tmp_path, stack):
    """A LoRA loader (the double restates comfy/lora.py) before the node: the node's output is
    byte for byte Engine(model, loras=[(file, strength), ...]) on the same inputs."""
    path = make_model_file(tmp_path)
    fa, fb = _lora_files(tmp_path, path)
    files = list(zip([fa, fb], stack))
    p = _load(comfy, comfy.make_patcher(path=path, state_keys=True), *files)
    assert p.patches
    seen = _probe(p)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls)
    assert "LoRA: {} file".format(len(stack)) in text and "merged (f32)" in text
    video, audio, ctx = inputs(seed=11)
    sigma = 0.7
    comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(seed=2))
    car = carried(comfy, audio, sigma)
    v, a = _direct_lora(path, files, video, car, sigma, ctx, seed=2)
    check_equal(seen, v, a)
    # the LoRAs mattered: without them (or with one strength changed) the answer differs
    v0, _ = _direct_lora(path, [], video, car, sigma, ctx, seed=2)
    assert not torch.equal(v0, v)
    if len(stack) == 2:
        v1, _ = _direct_lora(path, files[:1], video, car, sigma, ctx, seed=2)
        assert not torch.equal(v1, v)


def test_a_pdd_bank_lora_gives_a_direct_lora_call_s_bytes(comfy, tmp_path):
    """A PDD LoRA (ComfyUI PR #15908's layout: the 4-head bank as .set_weight / .set_bias of both
    heads, plus a backbone pair) through the loader double and the node: the export holds the
    sets in the bank's shapes, the engine enlarges its heads from them, and the node's output is
    Engine(model, loras=[the file]) with the same schedule, byte for byte."""
    from conftest import write_lora
    from lora_helpers import header
    path = make_model_file(tmp_path)
    h = header(path)
    n, D = 4, h["final_layer.video_out.weight"]["shape"][1]
    g = torch.Generator().manual_seed(3)
    bank = {}
    for head in ("video_out", "audio_out"):
        rows = h["final_layer.{}.weight".format(head)]["shape"][0]
        bank["diffusion_model.final_layer.{}.set_weight".format(head)] = 0.02 * torch.randn((n * rows, D), generator=g)
        bank["diffusion_model.final_layer.{}.set_bias".format(head)] = 0.02 * torch.randn((n * rows,), generator=g)
    qo, qi = h["blocks.0.attn.qkv_proj.weight"]["shape"]
    bank["diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight"] = (0.05 * torch.randn((qo, 4), generator=g)).to(torch.bfloat16)
    bank["diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight"] = (0.05 * torch.randn((4, qi), generator=g)).to(torch.bfloat16)
    f = write_lora(tmp_path / "pdd.safetensors", bank)
    p = _load(comfy, comfy.make_patcher(path=path, state_keys=True), (f, 1.0))
    assert p.patches["diffusion_model.final_layer.audio_out.bias"][0][1][0] == "set"
    seen = _probe(p)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls)
    assert "LoRA: 1 file" in text
    video, audio, ctx = inputs(seed=14)
    sigma, sched = 0.8, [1.0, 0.8, 0.45, 0.0]
    comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(seed=2), sample_sigmas=sched)
    car = carried(comfy, audio, sigma)
    eng = ls.Engine(model=path, device="cpu", loras=[(f, 1.0)], lora_dtype="f32")
    v, a = eng.denoise(ls.Clip(5, 64, 64, L, seed=2, audio_scale=1.0, sample_sigmas=sched), video[0].float().numpy(),
                       car[0].float().numpy(), np.float32(sigma), refined_text=ctx[0])
    check_equal(seen, torch.from_numpy(v), torch.from_numpy(a))
    v0, _ = _direct_lora(path, [], video, car, sigma, ctx, seed=2)
    assert not torch.equal(v0, torch.from_numpy(v))  # the bank mattered


def test_a_lora_loader_after_the_node_on_the_engine(comfy, tmp_path):
    path = make_model_file(tmp_path)
    fa, fb = _lora_files(tmp_path, path)
    p = comfy.make_patcher(path=path, state_keys=True)
    seen = _probe(p)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=ls)
    assert "LoRA: none on this MODEL" in text
    downstream = _load(comfy, m, (fa, 0.6), (fb, 1.25))
    video, audio, ctx = inputs(seed=12)
    for sigma in (0.9, 0.4):  # one sampling run of two steps: one export
        comfy.run_step(downstream, video, audio, sigma, ctx, comfy.make_payload())
    assert m.wrappers[KIND]["layerstream_h3"][0].exports_made == 1
    v, a = _direct_lora(path, [(fa, 0.6), (fb, 1.25)], video, carried(comfy, audio, 0.4), 0.4, ctx)
    seen[:] = seen[1:]
    check_equal(seen, v, a)


# ---- masks the engine leaves out (Engine.denoise(output_masks=False)), when it can ----------------
def test_fractional_masks_run_on_the_engine_when_it_can_leave_them_out(comfy, bf16_file, caplog):
    import logging
    from layerstream_h3 import wrapper
    m, seen, _ = probed(comfy, bf16_file)
    m.wrappers[KIND]["layerstream_h3"][0].settings.fallback = "stock"
    video, audio, ctx = inputs(seed=13)
    vm = torch.ones((T, HL, WL))
    vm[:, :2, :] = 0.25
    am = torch.ones((CA, 2, A))
    am[:, :, :3] = 0.5
    dm, adm = comfy.token_grid_masks(vm, am)
    assert 0 < float(dm.min()) < 1 and 0 < float(adm.min()) < 1
    sigma = 0.6
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(seed=4), denoise_mask=dm,
                             audio_denoise_mask=adm)
    supported = wrapper.supports_output_masks(ls.Engine(preset="tiny", device="cpu"))
    print("engine supports output_masks:", supported)
    if not supported:  # this build: stock, and the reason
        assert "values between 0 and 1" in caplog.text and m.model.diffusion_model.stock_calls
        return
    assert not m.model.diffusion_model.stock_calls and "fallback" not in caplog.text
    eng = ls.Engine(preset="tiny", device="cpu")
    clip = ls.Clip(5, 64, 64, L, seed=4, audio_scale=1.0, video_mask=dm[0, 0].numpy(), audio_mask=adm[0, 0].numpy())
    v, a = eng.denoise(clip, video[0].float().numpy(), carried(comfy, audio, sigma)[0].float().numpy(),
                       np.float32(sigma), refined_text=ctx[0], output_masks=False)
    check_equal(seen, torch.from_numpy(v), torch.from_numpy(a))
    # forward() then applies each mask once
    assert torch.equal(out[0], seen[0]["out"][0] * dm.to(torch.bfloat16))


@pytest.mark.parametrize("fmt", ["int8-convrot", "fp8"])
def test_the_models_loras_on_a_quantised_file(comfy, tmp_path, fmt, caplog):
    """int8 / fp8 checkpoints: the engine applies LoRAs there as a side path (an engine build
    without it refuses the files). Whichever this engine does, the node does the same: the
    direct call's bytes, or the fallback with the engine's own message."""
    import logging
    path = make_model_file(tmp_path, "--format", fmt)
    fa, fb = _lora_files(tmp_path, path)
    files = [(fa, 0.7), (fb, 0.3)]
    p = _load(comfy, comfy.make_patcher(path=path, state_keys=True), *files)
    seen = _probe(p)
    m, text = node.apply_node(p, device="cpu", path="engine", fallback="stock", layerstream_module=ls)
    assert "LoRA: 2 files" in text and "side path (int8/fp8" in text
    video, audio, ctx = inputs(seed=14)
    sigma = 0.5
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload())
    try:
        v, a = _direct_lora(path, files, video, carried(comfy, audio, sigma), sigma, ctx)
    except ls.Error as e:
        print("{} + LoRA: fallback (this engine refuses: {})".format(fmt, e))
        assert m.model.diffusion_model.stock_calls
        assert "the engine refused the checkpoint, the device or the MODEL's LoRA patches" in caplog.text
        assert str(e).split(": ")[-1] in caplog.text
        return
    print("{} + LoRA: engine path".format(fmt))
    assert not m.model.diffusion_model.stock_calls
    check_equal(seen, v, a)
