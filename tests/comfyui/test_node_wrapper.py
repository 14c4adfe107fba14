"""The node and its DIFFUSION_MODEL wrapper against the ComfyUI test double (fake_comfy.py),
with a recording stand-in for the engine: what ComfyUI's arguments become, and every
fallback with its reason."""

import logging
import struct

import numpy as np
import pytest
import torch

from conftest import TINY, FakeError, quant_json, write_safetensors

C, T, HL, WL, CA, A, L = 24, 2, 4, 4, 32, 8, 6  # 5 frames, 64x64 pixels: T = 2, A = round(5 * 40 / 24) = 8
KIND = "diffusion_model"


def node_api():
    from layerstream_h3 import node
    return node


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn((1, C, T, HL, WL), generator=g).to(torch.bfloat16)
    audio = torch.randn((1, CA, 2, A), generator=g).to(torch.bfloat16)
    ctx = torch.randn((1, L, TINY["hidden"]), generator=g).to(torch.bfloat16)
    assert video.abs().sum() > 0 and audio.abs().sum() > 0 and ctx.abs().sum() > 0
    return video, audio, ctx


def apply(comfy, fake_ls, path_file, **kw):
    p = comfy.make_patcher(path=path_file)
    kw.setdefault("device", "cpu")
    kw.setdefault("path", "engine")  # fallbacks go to stock (path auto: test_auto_falls_back_to_comfy_sliced)
    m, text = node_api().apply_node(p, layerstream_module=fake_ls, **kw)
    return p, m, text


def engine_calls(fake_ls):
    return [c for e in fake_ls.engines for c in e.calls]


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


# ---- registration, t2va ----------------------------------------------------------------------
def test_node_registers_the_wrapper_on_a_clone_only(comfy, fake_ls, bf16_file):
    p, m, text = apply(comfy, fake_ls, bf16_file)
    assert m is not p
    assert KIND not in p.wrappers  # the input MODEL is untouched: bypassing the node is stock
    assert list(m.wrappers[KIND]) == ["layerstream_h3"]
    assert "checkpoint: " + bf16_file in text and "bf16" in text
    assert "A/B: bypass this node" in text
    # A second node replaces the first one's wrapper instead of stacking on it.
    m2, _ = node_api().apply_node(m, device="cpu", layerstream_module=fake_ls)
    assert len(m2.wrappers[KIND]["layerstream_h3"]) == 1


def test_t2va_maps_onto_one_engine_call(comfy, fake_ls, bf16_file):
    p, m, _ = apply(comfy, fake_ls, bf16_file, path="engine")
    video, audio, ctx = inputs()
    tags = torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.int64)
    payload = comfy.make_payload(text_token_tags=tags, seed=7, audio_scale=4.0)
    sigma = 0.7312345
    out = comfy.run_step(m, video, audio, sigma, ctx, payload, sample_sigmas=[1.0, sigma, 0.3, 0.0])
    calls = engine_calls(fake_ls)
    assert len(calls) == 1 and m.model.diffusion_model.stock_calls == []
    c = calls[0]
    clip = c["clip"]
    assert clip.a == (5, 64, 64, L)
    kw = clip.kw
    assert kw["audio_scale"] == 1.0  # the wrapper sees the stream's own audio latent (forward undid the carry)
    assert kw["seed"] == 7 and kw["vis_aug"] == 0.999 and kw["aud_aug"] == 1.0
    assert kw["shift_video"] == 12.0 and kw["shift_audio"] == 3.0
    assert list(kw["text_tags"]) == [1, 1, 0, 0, 1, 1]
    assert list(kw["sample_sigmas"]) == [f32(v) for v in (1.0, sigma, 0.3, 0.0)]
    assert kw["keyframes"] == [] and kw["references"] == []
    assert kw["video_mask"] is None and kw["audio_mask"] is None
    # timestep = fl32(sigma * 1000); the engine re-forms fl32(sigma' * 1000) from the sigma it gets.
    t = f32(f32(sigma) * 1000.0)
    assert f32(f32(c["sigma"]) * 1000.0) == t
    assert torch.equal(c["refined_text"], ctx[0]) and c["text"] is None
    assert torch.equal(c["video"], video)
    # The audio reaching _forward is audio_src * bf16(sigma_a / sigma_v), computed by forward().
    sv = torch.tensor([t], dtype=torch.float32)[0] / 1000.0
    carry = (comfy.time_shift_sigma(sv, 12.0, 3.0) / sv).to(torch.bfloat16)
    assert torch.equal(c["audio"], audio * carry)
    # What the wrapper returned is what forward() then converts: masks none, carry conversion.
    assert out[0].dtype == torch.bfloat16 and tuple(out[0].shape) == (1, C, T, HL, WL)
    assert torch.equal(out[0], torch.full_like(out[0], -0.125))
    sa = comfy.time_shift_sigma(sv, 12.0, 3.0)
    want_a = (1.0 - 4.0) * (audio * carry) + (1.0 + 3.0 * sa).to(torch.bfloat16) * torch.full_like(audio, 0.0625)
    assert torch.equal(out[1], want_a)


def test_raw_text_goes_to_the_engine_unrefined(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, _ = inputs()
    raw = torch.randn((1, L, TINY["text_dim"])).to(torch.bfloat16)
    comfy.run_step(m, video, audio, 0.5, raw, comfy.make_payload())
    c = engine_calls(fake_ls)[0]
    assert c["refined_text"] is None and torch.equal(c["text"], raw[0])


def test_sigma_for_timestep_reproduces_every_timestep():
    from layerstream_h3.mapping import sigma_for_timestep
    rng = np.random.default_rng(3)
    sig = np.concatenate([rng.random(20000).astype(np.float32), np.float32([1.0, 1e-6, 0.5, 0.999, 1e-3])])
    for s in sig:
        if s <= 0:
            continue
        t = np.float32(s) * np.float32(1000.0)
        got = sigma_for_timestep(float(t))
        assert np.float32(got) * np.float32(1000.0) == t


def test_clip_geometry_follows_comfyuis_empty_latent():
    from layerstream_h3.mapping import clip_geometry, Unsupported
    # comfy_extras/nodes_minimax_h3.py: frames 17k+5, T = 5k + 2, A = round(frames / 24 * 40)
    for k in range(0, 30):
        frames = 17 * k + 5
        assert clip_geometry(5 * k + 2, 48, 84, round(frames / 24 * 40)) == (frames, 84 * 16, 48 * 16)
    for bad in ((3, 4, 4, 8), (2, 5, 4, 8), (2, 4, 4, 9)):
        with pytest.raises(Unsupported):
            clip_geometry(*bad)


# ---- keyframes, references: noise as ComfyUI draws it ----------------------------------------
def comfy_noise_video(z, seed):
    """_cond_video_rows' draw: patchify, then randn(rows.shape) from a CPU generator."""
    b, c, t, h, w = z.shape
    rows = (t * (h // 2) * (w // 2), c * 4)
    return torch.randn(rows, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)


def comfy_noise_audio(z, seed):
    return torch.randn((2 * z.shape[-1], z.shape[1]), generator=torch.Generator("cpu").manual_seed(seed + 1),
                       dtype=torch.float32)


def test_keyframes_carry_their_latents_and_comfyuis_noise(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    first = torch.randn((1, C, 1, HL, WL))
    last = torch.randn((1, C, 1, HL, WL))
    guide_audio = torch.randn((1, CA, 2, 3))
    kfs = [{"resolved_frame_index": 0, "latent": first},
           {"resolved_frame_index": 4, "latent": last, "audio_latent": guide_audio}]
    payload = comfy.make_payload(keyframes=kfs, seed=11, aud_aug=0.9)
    comfy.run_step(m, video, audio, 0.9, ctx, payload)
    kw = engine_calls(fake_ls)[0]["clip"].kw
    k0, k1 = kw["keyframes"]
    assert k0.a[0] == 0 and k1.a[0] == 4
    assert np.array_equal(k0.a[1], first[0].numpy()) and np.array_equal(k1.a[1], last[0].numpy())
    assert np.array_equal(k1.kw["audio"], guide_audio[0].numpy())
    # every condition restarts the stream: same seed, its own shape
    assert np.array_equal(k0.kw["noise_video"], comfy_noise_video(first, 11).numpy())
    assert np.array_equal(k1.kw["noise_video"], comfy_noise_video(last, 11).numpy())
    assert np.array_equal(k1.kw["noise_audio"], comfy_noise_audio(guide_audio, 11).numpy())
    assert k0.kw["noise_audio"] is None and k0.kw["audio"] is None
    assert np.abs(k1.kw["noise_audio"]).sum() > 0


def test_no_noise_when_aug_is_one(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    kfs = [{"resolved_frame_index": 0, "latent": torch.randn((1, C, 1, HL, WL))}]
    comfy.run_step(m, video, audio, 0.9, ctx, comfy.make_payload(keyframes=kfs, vis_aug=1.0))
    k0 = engine_calls(fake_ls)[0]["clip"].kw["keyframes"][0]
    assert k0.kw["noise_video"] is None


def test_references_of_every_kind(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    img = torch.randn((1, C, 1, 6, 8))
    vid = torch.randn((1, C, 2, 4, 4))
    vid_audio = torch.randn((1, CA, 2, 5))
    snd = torch.randn((1, CA, 2, 4))
    refs = [{"kind": "image", "latent_h": 6, "latent_w": 8, "latent_t": 1, "ref_audio_t": 0, "latent": img},
            {"kind": "video_audio", "latent_h": 4, "latent_w": 4, "latent_t": 2, "ref_audio_t": 5, "latent": vid,
             "audio_latent": vid_audio},
            {"kind": "video_audio", "latent_h": 4, "latent_w": 4, "latent_t": 2, "ref_audio_t": 0, "latent": vid},
            {"kind": "audio", "ref_audio_t": 4, "audio_latent": snd},
            {"kind": "audio", "ref_audio_t": 0}]  # no rows, no time span in ComfyUI's layout
    comfy.run_step(m, video, audio, 0.6, ctx, comfy.make_payload(refs=refs, seed=5, aud_aug=0.5))
    got = engine_calls(fake_ls)[0]["clip"].kw["references"]
    assert [r.a[0] for r in got] == ["image", "video_audio", "video", "audio"]
    assert np.array_equal(got[0].kw["video"], img[0].numpy()) and got[0].kw["audio"] is None
    assert np.array_equal(got[1].kw["audio"], vid_audio[0].numpy())
    assert np.array_equal(got[0].kw["noise_video"], comfy_noise_video(img, 5).numpy())
    assert np.array_equal(got[1].kw["noise_audio"], comfy_noise_audio(vid_audio, 5).numpy())
    assert got[3].kw["video"] is None and np.array_equal(got[3].kw["noise_audio"], comfy_noise_audio(snd, 5).numpy())


def test_reference_metadata_that_disagrees_falls_back(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    refs = [{"kind": "image", "latent_h": 4, "latent_w": 4, "latent_t": 1, "ref_audio_t": 0,
             "latent": torch.randn((1, C, 1, 6, 8))}]
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = comfy.run_step(m, video, audio, 0.6, ctx, comfy.make_payload(refs=refs))
    assert engine_calls(fake_ls) == [] and len(m.model.diffusion_model.stock_calls) == 1
    assert "latent_h/latent_w 4x4 disagree" in caplog.text
    assert torch.equal(out[0], torch.full_like(out[0], -0.25))


# ---- masks -----------------------------------------------------------------------------------
def test_binary_masks_reach_the_engine(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    vm = torch.ones((T, HL, WL))
    vm[:, :2, :2] = 0.0
    am = torch.ones((CA, 2, A))
    am[:, :, :3] = 0.0
    dm, adm = comfy.token_grid_masks(vm, am)
    out = comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload(audio_scale=1.0), denoise_mask=dm,
                         audio_denoise_mask=adm)
    kw = engine_calls(fake_ls)[0]["clip"].kw
    assert np.array_equal(kw["video_mask"], dm[0, 0].numpy())
    assert np.array_equal(kw["audio_mask"], adm[0, 0].numpy()) and kw["audio_mask"].shape == (2, A)
    # forward() multiplies the wrapper's result by the masks again: 0/1 keeps it (m * m = m).
    assert torch.equal(out[0], torch.full_like(out[0], -0.125) * dm.to(torch.bfloat16))


def test_fractional_masks_fall_back_with_the_reason(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    vm = torch.ones((T, HL, WL))
    vm[:, :2, :2] = 0.3
    dm, _ = comfy.token_grid_masks(vm, torch.ones((CA, 2, A)))
    assert dm is not None and 0 < float(dm.min()) < 1
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload(), denoise_mask=dm)
    assert engine_calls(fake_ls) == [] and len(m.model.diffusion_model.stock_calls) == 1
    assert "values between 0 and 1" in caplog.text


# ---- PDD -------------------------------------------------------------------------------------
def test_pdd_without_a_schedule_raises_as_stock(comfy, fake_ls, bf16_file):
    p = comfy.make_patcher(path=bf16_file, pdd_heads=4)
    m, _ = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls)
    video, audio, ctx = inputs()
    with pytest.raises(ValueError, match="PDD heads need the sampler's sigma schedule"):
        comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload())
    comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload(), sample_sigmas=[1.0, 0.5, 0.0])
    assert list(engine_calls(fake_ls)[0]["clip"].kw["sample_sigmas"]) == [1.0, 0.5, 0.0]


# ---- fallbacks -------------------------------------------------------------------------------
def step_and_log(comfy, m, caplog, **kw):
    video, audio, ctx = inputs()
    video = kw.pop("video", video)
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = comfy.run_step(m, video, audio, 0.5, ctx, kw.pop("payload", comfy.make_payload()), **kw)
    return out


def assert_stock(m, fake_ls, out):
    assert engine_calls(fake_ls) == []
    assert len(m.model.diffusion_model.stock_calls) == 1
    assert torch.equal(out[0], torch.full_like(out[0], -0.25))


def test_batch_above_one_raises_stocks_error(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    video, audio, ctx = inputs()
    with pytest.raises(ValueError, match="MiniMax H3 supports batch size 1"):
        comfy.run_step(m, video.repeat(2, 1, 1, 1, 1), audio.repeat(2, 1, 1, 1), 0.5, ctx, comfy.make_payload())


def test_controlnet_falls_back(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    out = step_and_log(comfy, m, caplog, control={"output": []})
    assert_stock(m, fake_ls, out)
    assert "ControlNet" in caplog.text
    assert m.model.diffusion_model.stock_calls[0]["kwargs"]["control"] == {"output": []}


def test_block_replacement_patches_fall_back(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    m.model_options["transformer_options"]["patches_replace"] = {"dit": {("double_block", 3): lambda a, b: a}}
    out = step_and_log(comfy, m, caplog)
    assert_stock(m, fake_ls, out)
    assert "patches_replace['dit']" in caplog.text


def test_a_wrapper_after_ours_falls_back(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    seen = []

    def later(executor, *a, **k):
        seen.append(1)
        return executor(*a, **k)

    m.add_wrapper_with_key(KIND, "someone_else", later)
    out = step_and_log(comfy, m, caplog)
    assert_stock(m, fake_ls, out)
    assert seen == [1] and "registered after LayerStream's" in caplog.text


def test_weight_patches_the_engine_cannot_merge_fall_back_at_the_node(comfy, fake_ls, bf16_file):
    # (LoRA patches the engine merges are test_node_lora.py's; this is a kind it does not know)
    p = comfy.make_patcher(path=bf16_file)
    p.add_patches({"diffusion_model.blocks.0.attn.qkv_proj.weight": ("lora", None)})
    m, text = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="engine")
    assert "fallback: stock" in text and "LoRA / weight patches the engine cannot apply: 'lora' patches" in text
    assert KIND not in m.wrappers
    with pytest.raises(RuntimeError, match="LoRA"):
        node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="engine", fallback="error")


def test_weight_patches_added_after_the_node_fall_back_per_run(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    downstream = m.clone()  # a patch node after ours
    downstream.add_patches({"diffusion_model.blocks.1.mlp.fc1.weight": ("lora", None)})
    out = step_and_log(comfy, downstream, caplog)
    assert_stock(downstream, fake_ls, out)
    assert "LoRA / weight patches the engine cannot apply" in caplog.text
    caplog.clear()
    video, audio, ctx = inputs()
    comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload())  # the clean MODEL runs on the engine again
    assert len(engine_calls(fake_ls)) == 1


def test_not_h3_passes_through(comfy, fake_ls, bf16_file):
    p = comfy.make_patcher(path=bf16_file)
    p.model.diffusion_model = torch.nn.Linear(2, 2)
    m, text = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls)
    assert "not MiniMax H3" in text and KIND not in m.wrappers


def test_no_checkpoint_path(comfy, fake_ls):
    p = comfy.make_patcher(path=None)
    m, text = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls)
    assert "Load Diffusion Model" in text and KIND not in m.wrappers


def test_unsupported_format_falls_back(comfy, fake_ls, tmp_path):
    f = write_safetensors(tmp_path / "nvfp4.safetensors", {
        "blocks.0.attn.qkv_proj.weight": ("U8", [6, 2], bytes(12)),
        "blocks.0.attn.qkv_proj.comfy_quant": quant_json({"format": "nvfp4", "group_size": 16})})
    p = comfy.make_patcher(path=f)
    m, text = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls)
    assert "nvfp4 is not supported" in text and KIND not in m.wrappers


def test_engine_refusing_the_file_falls_back_per_call(comfy, bf16_file, caplog):
    from conftest import fake_layerstream
    ls = fake_layerstream()

    tries = []

    def refuse(**kw):
        tries.append(kw)
        raise FakeError("checkpoint is not an H3 model: missing blocks.0.adaln_proj.linear.weight")

    ls.Engine = refuse
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", layerstream_module=ls, path="engine")
    out = step_and_log(comfy, m, caplog)
    assert len(m.model.diffusion_model.stock_calls) == 1 and torch.equal(out[0], torch.full_like(out[0], -0.25))
    assert "missing blocks.0.adaln_proj" in caplog.text
    step_and_log(comfy, m, caplog)
    assert len(m.model.diffusion_model.stock_calls) == 2 and len(tries) == 1  # not reopened every step


def test_odd_latent_and_off_grid_frames_fall_back(comfy, fake_ls, bf16_file, caplog):
    _, m, _ = apply(comfy, fake_ls, bf16_file)
    odd = torch.randn((1, C, T, HL, WL + 1))
    out = step_and_log(comfy, m, caplog, video=odd)
    assert "odd" in caplog.text and len(m.model.diffusion_model.stock_calls) == 1
    off = torch.randn((1, C, 3, HL, WL))
    step_and_log(comfy, m, caplog, video=off)
    assert "17k+5" in caplog.text and len(m.model.diffusion_model.stock_calls) == 2
    assert out[0].shape[-1] == WL + 1


def test_fallback_error_raises_with_the_reason(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file, fallback="error", path="engine")
    video, audio, ctx = inputs()
    with pytest.raises(RuntimeError, match="ControlNet.*fallback = error"):
        comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload(), control=object())
    assert m.model.diffusion_model.stock_calls == []


class FakeSliced:
    """H7's interface (sliced_api.md): supported(model), SlicedRunner(...)(executor, ...), status()."""

    def __init__(self, ok=True):
        self.ok, self.runs = ok, []
        outer = self

        class SlicedRunner:
            def __init__(self, mlp_chunk_tokens=8192, attn_chunk_tokens=8192):
                self.sizes = (mlp_chunk_tokens, attn_chunk_tokens)

            def __call__(self, executor, *args, **kwargs):
                outer.runs.append(self.sizes)
                return executor(*args, **kwargs)

            def status(self):
                return ["path: comfy-sliced ({}/{} rows)".format(*self.sizes), "exact by construction (int8)"]

        self.SlicedRunner = SlicedRunner

    def supported(self, model):
        return (True, "") if self.ok else (False, "unknown attention backend")


def test_auto_falls_back_to_comfy_sliced(comfy, fake_ls, bf16_file, caplog, monkeypatch):
    from layerstream_h3 import node
    sl = FakeSliced()
    monkeypatch.setattr(node, "_import_sliced", lambda: (sl, None))
    _, m, text = apply(comfy, fake_ls, bf16_file, path="auto", mlp_chunk_tokens=512, attn_chunk_tokens=0)
    assert "comfy-sliced, else stock" in text
    step_and_log(comfy, m, caplog, control=object())
    assert sl.runs == [(512, 0)] and "fallback to comfy-sliced: a ControlNet" in caplog.text
    # path comfy-sliced registers the runner itself; no engine at all
    _, m2, text2 = apply(comfy, fake_ls, bf16_file, path="comfy-sliced")
    assert m2.wrappers[KIND]["layerstream_h3"][0].__class__.__name__ == "SlicedRunner"
    assert "exact by construction (int8)" in text2
    # and when the engine cannot take the MODEL at all (LoRA), auto runs comfy-sliced for it
    p = comfy.make_patcher(path=bf16_file)
    p.add_patches({"diffusion_model.blocks.0.mlp.fc1.weight": ("lora", None)})
    m3, text3 = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="auto")
    assert "running comfy-sliced" in text3 and "LoRA" in text3
    sl.ok = False
    m4, text4 = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="auto")
    assert "comfy-sliced cannot run it either: unknown attention backend" in text4


def test_legacy_loader_detaches_the_blocks_for_path_engine(comfy, fake_ls, bf16_file):
    p = comfy.make_patcher(path=bf16_file, dynamic=False)
    m, text = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="engine")
    assert "detached" in text
    blocks = m.object_patches["diffusion_model.blocks"]
    assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) == 0
    seen = {}

    def peek(executor, *a, **k):
        seen["blocks"] = len(executor.class_obj.blocks)
        return executor(*a, **k)

    m.add_wrapper_with_key(KIND, "peek", peek)  # a wrapper after ours: ours must fall back, and cannot
    video, audio, ctx = inputs()
    with pytest.raises(RuntimeError, match="detached"):
        comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload())
    assert seen == {}
    m.remove_wrappers_with_key(KIND, "peek")
    comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload())
    assert len(engine_calls(fake_ls)) == 1
    assert len(p.model.diffusion_model.blocks) == 2  # unpatched again after the run
    m2, text2 = node_api().apply_node(p, device="cpu", layerstream_module=fake_ls, path="auto")
    assert "diffusion_model.blocks" not in m2.object_patches and "legacy loader" in text2


def test_engine_is_made_once_and_reused(comfy, fake_ls, bf16_file):
    _, m, _ = apply(comfy, fake_ls, bf16_file, mlp_chunk=256, attn_chunk=512, kv_tile=128)
    for _ in range(3):
        video, audio, ctx = inputs()
        comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload())
    assert len(fake_ls.engines) == 1 and len(fake_ls.engines[0].calls) == 3
    kw = fake_ls.engines[0].kw
    assert kw == {"model": bf16_file, "device": "cpu", "numerics": {"kv_tile": 128}, "mlp_chunk": 256,
                  "attn_chunk": 512}


def test_bad_budget_is_refused():
    from layerstream_h3.budget import parse_budget, BudgetError, auto_budget, GIB
    assert parse_budget("auto") is None and parse_budget("12G") == 12 * GIB and parse_budget("1.5GiB") == 3 * GIB // 2
    assert parse_budget("900M") == 900 << 20 and parse_budget("4096") == 4096
    for bad in ("12 gigs", "-1G", "G"):
        with pytest.raises(BudgetError):
            parse_budget(bad)
    assert auto_budget(100 * GIB, 140 * GIB) == 100 * GIB - GIB - int(0.05 * 140 * GIB)
    assert auto_budget(GIB, 140 * GIB) is None


def test_vram_budget_reaches_the_engine(comfy, fake_ls, bf16_file, monkeypatch):
    from layerstream_h3.budget import GIB
    from layerstream_h3 import wrapper
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (100 * GIB, 140 * GIB))
    for text, want in (("auto", 100 * GIB - GIB - int(0.05 * 140 * GIB)), ("12G", 12 * GIB)):
        wrapper.drop_cached_engine()
        p = comfy.make_patcher(path=bf16_file)
        m, status = node_api().apply_node(p, device="cuda:0", vram_budget=text, layerstream_module=fake_ls,
                                          path="engine")
        m.wrappers[KIND]["layerstream_h3"][0].engine()
        assert fake_ls.engines[-1].kw == {"model": bf16_file, "device": "cuda:0", "vram_budget": want}
        assert "vram_budget" in status
    assert emptied == [1]  # only auto reads (and first empties PyTorch's cache)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (GIB, 140 * GIB))
    wrapper.drop_cached_engine()
    m, _ = node_api().apply_node(comfy.make_patcher(path=bf16_file), device="cuda:0", layerstream_module=fake_ls,
                                 path="engine")
    from layerstream_h3.mapping import Unsupported
    with pytest.raises(Unsupported, match="less than the reserve"):
        m.wrappers[KIND]["layerstream_h3"][0].engine()
