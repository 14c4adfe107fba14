"""The MODEL's LoRA patches on the engine path (recording engine): what a LoRA loader leaves in
`patcher.patches` (the double restates comfy/lora.py load_lora and comfy/sd.py
load_lora_for_models) becomes LoRA files the engine opens, one per strength, in ComfyUI's
order; what the engine cannot merge falls back with a reason that names it; the export is
made once per patch set and removed when the engine is rebuilt or the node's MODEL goes.
The real engine's bytes are checked in test_engine_bytes.py."""

import gc
import logging
import os

import pytest
import torch

from conftest import FakeError, write_lora

C, T, HL, WL, CA, A, L = 24, 2, 4, 4, 32, 8, 6
KIND = "diffusion_model"
QKV, FC2 = "blocks.0.attn.qkv_proj", "blocks.1.mlp.fc2"  # bf16_file: qkv_proj [6, 4], fc2 [4, 8]


def node_api():
    from layerstream_h3 import node
    return node


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((1, C, T, HL, WL), generator=g).to(torch.bfloat16),
            torch.randn((1, CA, 2, A), generator=g).to(torch.bfloat16),
            torch.randn((1, L, 128), generator=g).to(torch.bfloat16))


def step(comfy, m, **kw):
    video, audio, ctx = inputs()
    return comfy.run_step(m, video, audio, 0.5, ctx, comfy.make_payload(), **kw)


def rand(*shape, seed=0, dtype=torch.bfloat16):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def lora_a(tmp_path):
    """kohya names, a bf16 alpha, and a full diff on another layer."""
    return write_lora(tmp_path / "a.safetensors", {
        "lora_unet_blocks_0_attn_qkv_proj.lora_up.weight": rand(6, 2, seed=1),
        "lora_unet_blocks_0_attn_qkv_proj.lora_down.weight": rand(2, 4, seed=2),
        "lora_unet_blocks_0_attn_qkv_proj.alpha": torch.tensor(3.0, dtype=torch.bfloat16),
        "diffusion_model." + FC2 + ".diff": rand(4, 8, seed=3, dtype=torch.float32)})


def lora_b(tmp_path):
    """PEFT names on the same qkv layer, no alpha."""
    return write_lora(tmp_path / "b.safetensors", {
        QKV + ".lora_B.weight": rand(6, 3, seed=4, dtype=torch.float16),
        QKV + ".lora_A.weight": rand(3, 4, seed=5, dtype=torch.float16)})


def loaded(comfy, patcher, *files):
    """LoraLoaderModelOnly x len(files): (path, strength) in order."""
    for path, strength in files:
        patcher, _ = comfy.load_lora_for_models(patcher, None, comfy.read_safetensors(path), strength, 0.0)
    return patcher


def engines_with_loras(fake_ls):
    return [e for e in fake_ls.engines if e.kw.get("loras")]


def test_one_lora_on_the_input_model_reaches_the_engine(comfy, fake_ls, bf16_file, tmp_path):
    a = lora_a(tmp_path)
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (a, 0.8))
    assert sorted(p.patches) == sorted(["diffusion_model." + FC2 + ".weight", "diffusion_model." + QKV + ".weight"])
    m, text = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    assert "LoRA: 1 file from the MODEL's patches (2 weight(s), 2 patch(es)), merged (f32)" in text
    out = step(comfy, m)
    assert torch.equal(out[0], torch.full_like(out[0], -0.125))  # the engine answered
    (eng,) = fake_ls.engines
    assert eng.kw["lora_dtype"] == "f32" and len(eng.kw["loras"]) == 1
    path, strength = eng.kw["loras"][0]
    assert strength == 0.8 and os.path.isfile(path)
    # the exported file holds the loader's tensors, bit for bit, under the engine's layer names
    got = comfy.read_safetensors(path)
    src = comfy.read_safetensors(a)
    assert sorted(got) == sorted(["diffusion_model." + QKV + s for s in (".lora_up.weight", ".lora_down.weight", ".alpha")]
                                 + ["diffusion_model." + FC2 + ".diff"])
    for mine, theirs in ((".lora_up.weight", ".lora_up.weight"), (".lora_down.weight", ".lora_down.weight")):
        g, t = got["diffusion_model." + QKV + mine], src["lora_unet_blocks_0_attn_qkv_proj" + theirs]
        assert g.dtype == t.dtype and torch.equal(g.view(torch.int16), t.view(torch.int16))
    assert got["diffusion_model." + QKV + ".alpha"].dtype == torch.float32
    assert float(got["diffusion_model." + QKV + ".alpha"]) == 3.0
    assert torch.equal(got["diffusion_model." + FC2 + ".diff"], src["diffusion_model." + FC2 + ".diff"])
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")]


def test_two_stacked_loras_keep_their_order_and_strengths(comfy, fake_ls, bf16_file, tmp_path):
    a, b = lora_a(tmp_path), lora_b(tmp_path)
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (a, 0.8), (b, -0.35))
    assert [x[0] for x in p.patches["diffusion_model." + QKV + ".weight"]] == [0.8, -0.35]
    m, text = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    assert "LoRA: 2 files from the MODEL's patches (2 weight(s), 3 patch(es))" in text
    step(comfy, m)
    (eng,) = fake_ls.engines
    (f1, s1), (f2, s2) = eng.kw["loras"]
    assert (s1, s2) == (0.8, -0.35)
    assert sorted(comfy.read_safetensors(f1)) == sorted(["diffusion_model." + QKV + ".lora_up.weight",
                                                        "diffusion_model." + QKV + ".lora_down.weight",
                                                        "diffusion_model." + QKV + ".alpha",
                                                        "diffusion_model." + FC2 + ".diff"])
    second = comfy.read_safetensors(f2)  # B has no alpha: none is written (the engine's alpha = rank)
    assert sorted(second) == ["diffusion_model." + QKV + ".lora_down.weight", "diffusion_model." + QKV + ".lora_up.weight"]
    assert second["diffusion_model." + QKV + ".lora_up.weight"].dtype == torch.float16


def test_grouping_keeps_each_keys_order_when_strengths_repeat():
    from layerstream_h3 import lora_export
    t = torch.zeros((2, 2))
    d = ("diff", (t,))
    patches = {"diffusion_model.x.weight": [(1.0, d, 1.0, None, None), (0.5, d, 1.0, None, None), (1.0, d, 1.0, None, None)],
               "diffusion_model.y.weight": [(1.0, d, 1.0, None, None)],
               "diffusion_model.z.weight": [(0.5, d, 1.0, None, None), (1.0, d, 1.0, None, None)]}
    plan = lora_export.plan_patches(patches)
    assert plan.reason is None and [g.strength for g in plan.groups] == [1.0, 0.5, 1.0]
    where = {k: [i for i, g in enumerate(plan.groups) if k in g.entries] for k in patches}
    assert where == {"diffusion_model.x.weight": [0, 1, 2], "diffusion_model.y.weight": [0],
                     "diffusion_model.z.weight": [1, 2]}
    # a diff at strength 0 is skipped, as ComfyUI skips it; a set keeps it (set ignores strength)
    plan = lora_export.plan_patches({"diffusion_model.x.weight": [(0.0, d, 1.0, None, None)],
                                     "diffusion_model.y.weight": [(0.0, ("set", (t,)), 1.0, None, None)]})
    assert plan.keys == 1 and list(plan.groups[0].entries) == ["diffusion_model.y.weight"]


@pytest.mark.parametrize("case, reason", [
    ("loha", "loha adapters (1 weight(s), e.g. diffusion_model.blocks.0.attn.qkv_proj.weight)"),
    ("merge", "strength_model != 1"),
    ("offset", "offset patches"),
    ("function", "patches with a function"),
    ("dora", "DoRA (dora_scale)"),
    ("reshape", "enlarging LoRAs (reshape_weight)"),
    ("f64", "stored as float64"),
    ("outside", "patches outside the diffusion model"),
])
def test_patches_the_engine_cannot_merge_fall_back_with_their_reason(comfy, fake_ls, bf16_file, tmp_path, case,
                                                                    reason, caplog):
    p = comfy.make_patcher(path=bf16_file, state_keys=case != "outside")
    key = "diffusion_model." + QKV + ".weight"
    up, down = rand(6, 2), rand(2, 4)
    if case == "loha":
        f = write_lora(tmp_path / "h.safetensors", {QKV + s: rand(2, 2) for s in
                                                    (".hada_w1_a", ".hada_w1_b", ".hada_w2_a", ".hada_w2_b")})
        p = loaded(comfy, p, (f, 1.0))
    elif case == "merge":  # ModelMergeSimple: add_patches({k: (w,)}, 1 - ratio, ratio)
        p.add_patches({key: (rand(6, 4),)}, 0.3, 0.7)
    elif case == "offset":
        p.add_patches({(key, (0, 0, 2)): ("diff", (rand(2, 4),))})
    elif case == "function":
        p.add_patches({(key, None, lambda w: w): ("diff", (rand(6, 4),))})
    elif case in ("dora", "reshape"):
        extra = {QKV + ".dora_scale": rand(6, 1)} if case == "dora" else {
            QKV + ".reshape_weight": torch.tensor([12, 4])}
        f = str(tmp_path / "x.safetensors")
        lora = {QKV + ".lora_up.weight": up, QKV + ".lora_down.weight": down}
        lora.update(extra)
        patcher, _ = comfy.load_lora_for_models(p, None, lora, 1.0, 0.0)
        p = patcher
    elif case == "f64":
        p.add_patches({key: ("diff", (torch.zeros((6, 4), dtype=torch.float64),))})
    elif case == "outside":
        p.add_patches({"model_sampling.sigmas": ("diff", (torch.zeros(3),))})
    assert p.patches
    m, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=fake_ls)
    assert "fallback: stock" in text and reason in text and "LoRA / weight patches the engine cannot apply" in text
    assert KIND not in m.wrappers  # the MODEL passes through: stock
    with pytest.raises(RuntimeError, match="cannot apply"):
        node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    # the same patches added after the node: found when sampling starts, stock runs the call
    q = comfy.make_patcher(path=bf16_file, state_keys=case != "outside")
    m2, _ = node_api().apply_node(q, device="cpu", path="engine", layerstream_module=fake_ls)
    down_stream = m2.clone()
    down_stream.patches = {k: v[:] for k, v in p.patches.items()}
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = step(comfy, down_stream)
    assert torch.equal(out[0], torch.full_like(out[0], -0.25)) and fake_ls.engines == []
    assert reason in caplog.text


def test_a_lora_loader_after_the_node_and_the_export_cache(comfy, fake_ls, bf16_file, tmp_path):
    a, b = lora_a(tmp_path), lora_b(tmp_path)
    m, text = node_api().apply_node(comfy.make_patcher(path=bf16_file, state_keys=True), device="cpu", path="engine",
                                    fallback="error", layerstream_module=fake_ls)
    assert "LoRA: none on this MODEL" in text
    wrapper = m.wrappers[KIND]["layerstream_h3"][0]
    lora_model = loaded(comfy, m, (a, 1.0))  # LoraLoader after our node: a clone with patches
    for _ in range(2):  # two sampling runs of three steps: one export, one engine
        for _ in range(3):
            step(comfy, lora_model)
    assert wrapper.exports_made == 1 and len(fake_ls.engines) == 1
    (path, strength), = fake_ls.engines[0].kw["loras"]
    assert strength == 1.0 and os.path.isfile(path)
    # another strength is another patch set: a new export, a new engine, the old files removed
    other = loaded(comfy, m, (a, 0.5))
    step(comfy, other)
    assert wrapper.exports_made == 2 and len(fake_ls.engines) == 2 and fake_ls.engines[0].closed
    assert not os.path.exists(os.path.dirname(path))
    (path2, strength2), = fake_ls.engines[1].kw["loras"]
    assert strength2 == 0.5 and os.path.isfile(path2)
    # the MODEL without patches: the plain engine again, and the LoRA export goes with the rebuild
    step(comfy, m)
    assert "loras" not in fake_ls.engines[2].kw and not os.path.exists(os.path.dirname(path2))
    # a stack of two after the node
    both = loaded(comfy, m, (a, 1.0), (b, 0.25))
    step(comfy, both)
    assert [s for _, s in fake_ls.engines[3].kw["loras"]] == [1.0, 0.25]


def test_exports_are_removed_with_the_node(comfy, fake_ls, bf16_file, tmp_path):
    from layerstream_h3 import wrapper as wrapper_mod
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (lora_a(tmp_path), 1.0))
    m, _ = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    step(comfy, m)
    d = os.path.dirname(fake_ls.engines[0].kw["loras"][0][0])
    assert os.path.isdir(d)
    p.model.current_patcher = None  # the last sampled patcher (ComfyUI keeps it there too, until the next run)
    del m
    gc.collect()
    assert os.path.isdir(d)  # the cached engine was opened from these files and still holds them
    wrapper_mod.drop_cached_engine()
    gc.collect()
    assert not os.path.exists(d)


def test_a_failed_export_leaves_nothing_and_falls_back(comfy, fake_ls, bf16_file, tmp_path, monkeypatch, caplog):
    from layerstream_h3 import lora_export
    monkeypatch.setattr(lora_export, "temp_root", lambda: str(tmp_path / "exports"))
    os.makedirs(str(tmp_path / "exports"))
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (lora_a(tmp_path), 1.0))
    m, _ = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=fake_ls)
    real = lora_export.write_safetensors
    calls = []

    def failing(path, tensors, metadata=None):
        calls.append(path)
        real(path, tensors, metadata)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lora_export, "write_safetensors", failing)
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = step(comfy, m)
    assert calls and torch.equal(out[0], torch.full_like(out[0], -0.25))
    assert "cannot write the MODEL's LoRA patches" in caplog.text and "No space left" in caplog.text
    assert os.listdir(str(tmp_path / "exports")) == []


def test_the_engine_refusing_the_loras_falls_back_with_its_message(comfy, bf16_file, tmp_path, caplog):
    import conftest
    ls = conftest.fake_layerstream()

    def refusing(**kw):
        if kw.get("loras"):
            raise FakeError("LoRA {}: key diffusion_model.blocks.0.attn.qkv_proj* matches no layer".format(kw["loras"][0][0]))
        return conftest.FakeEngine(**kw)

    ls.Engine = refusing
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (lora_a(tmp_path), 1.0))
    m, _ = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = step(comfy, m)
        step(comfy, m)
    assert torch.equal(out[0], torch.full_like(out[0], -0.25))
    assert "the engine refused the checkpoint, the device or the MODEL's LoRA patches" in caplog.text
    assert "matches no layer" in caplog.text
    assert m.wrappers[KIND]["layerstream_h3"][0].exports_made == 1  # not exported again per step


def test_side_path_status_for_a_quantised_checkpoint(comfy, fake_ls, tmp_path):
    from conftest import quant_json, write_safetensors
    t = {}
    for i in range(2):
        t["blocks.{}.attn.qkv_proj.weight".format(i)] = ("I8", [6, 4], bytes(24))
        t["blocks.{}.attn.qkv_proj.comfy_quant".format(i)] = quant_json(
            {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256})
    path = write_safetensors(tmp_path / "q.safetensors", t)
    p = comfy.make_patcher(path=path, state_keys=True)
    p.add_patches({"diffusion_model.blocks.0.attn.qkv_proj.weight": ("diff", (torch.zeros((6, 4)),))}, 1.0)
    _, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=fake_ls)
    assert "LoRA: 1 file from the MODEL's patches" in text and "side path (int8/fp8" in text


# ---- output masks: used when the engine can leave them out --------------------------------------
def test_fractional_masks_run_on_an_engine_that_leaves_masks_out(comfy, fake_ls_masks, bf16_file):
    from layerstream_h3 import wrapper
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls_masks)
    vm = torch.ones((T, HL, WL))
    vm[:, :2, :2] = 0.3
    dm, _ = comfy.token_grid_masks(vm, torch.ones((CA, 2, A)))
    assert dm is not None and 0 < float(dm.min()) < 1
    out = step(comfy, m, denoise_mask=dm)
    (call,) = fake_ls_masks.engines[0].calls
    assert call["extra"] == {"output_masks": False}
    # forward() applies the mask once, to the engine's unmasked velocity
    assert torch.equal(out[0], torch.full_like(out[0], -0.125) * dm.to(torch.bfloat16))
    assert wrapper.supports_output_masks(fake_ls_masks.engines[0])
    # binary masks go the same way (the engine leaves them out too)
    vm[:, :2, :2] = 0.0
    dm, _ = comfy.token_grid_masks(vm, torch.ones((CA, 2, A)))
    step(comfy, m, denoise_mask=dm)
    assert fake_ls_masks.engines[0].calls[1]["extra"] == {"output_masks": False}


def test_no_output_masks_capability_without_the_parameter(fake_ls):
    from layerstream_h3 import wrapper
    assert not wrapper.supports_output_masks(fake_ls.Engine())

    class Kw:
        def denoise(self, *a, **kw):
            pass

    assert not wrapper.supports_output_masks(Kw())  # **kwargs says nothing about the flag


def test_export_files_keep_every_tensor_aligned(tmp_path):
    """4-byte tensors first: an F32 alpha after an odd-length BF16 tensor would start at an odd
    offset, which the engine (it maps tensors in place) refuses."""
    import json
    import struct
    from layerstream_h3 import lora_export
    path = str(tmp_path / "x.safetensors")
    lora_export.write_safetensors(path, {"a": torch.ones(3, dtype=torch.bfloat16), "b.alpha": 2.5,
                                         "c": torch.ones(5, dtype=torch.float16), "d": torch.ones(3)})
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n).decode("utf-8"))
    assert n % 8 == 0
    sizes = {"F32": 4, "BF16": 2, "F16": 2}
    for name, e in h.items():
        assert e["data_offsets"][0] % sizes[e["dtype"]] == 0, (name, e)
    assert h["b.alpha"] == {"dtype": "F32", "shape": [], "data_offsets": h["b.alpha"]["data_offsets"]}
    assert not os.path.exists(path + ".tmp")


# ---- audio-only keyframes: always sent; the engine decides -------------------------------------
def test_an_audio_only_keyframe_reaches_the_engine(comfy, fake_ls, bf16_file):
    """MiniMaxH3AddGuide with audio and no image: a Keyframe with video None, its audio latent
    and ComfyUI's audio noise draw (seed + 1). Whether the engine takes it is its own answer
    (test_engine_bytes.py runs both branches on the real engine)."""
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    guide = torch.randn((1, CA, 2, 3), generator=torch.Generator().manual_seed(3))
    payload = comfy.make_payload(keyframes=[{"resolved_frame_index": 4, "audio_latent": guide}], seed=7, aud_aug=0.8)
    video, audio, ctx = inputs()
    out = comfy.run_step(m, video, audio, 0.5, ctx, payload)
    assert torch.equal(out[0], torch.full_like(out[0], -0.125))
    (kf,) = fake_ls.engines[0].calls[0]["clip"].kw["keyframes"]
    assert kf.a[0] == 4 and kf.a[1] is None and kf.kw["noise_video"] is None
    assert torch.equal(torch.from_numpy(kf.kw["audio"]), guide[0])
    want = torch.randn((2 * 3, CA), generator=torch.Generator("cpu").manual_seed(8), dtype=torch.float32)
    assert torch.equal(torch.from_numpy(kf.kw["noise_audio"]), want)


def test_two_nodes_on_one_patch_set_share_the_export_and_the_engine(comfy, fake_ls, bf16_file, tmp_path):
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (lora_a(tmp_path), 0.9))
    m1, _ = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    m2, _ = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    for m in (m1, m2, m1):
        step(comfy, m)
    w1, w2 = (m.wrappers[KIND]["layerstream_h3"][0] for m in (m1, m2))
    assert w1.exports_made + w2.exports_made == 1 and len(fake_ls.engines) == 1
    assert len(fake_ls.engines[0].calls) == 3


def test_loras_with_the_legacy_loader_detach(comfy, fake_ls, bf16_file, tmp_path):
    """path engine on the legacy loader detaches the blocks; the patches still reach the engine."""
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, dynamic=False, state_keys=True), (lora_a(tmp_path), 1.0))
    m, text = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    assert "detached" in text and "LoRA: 1 file" in text
    step(comfy, m)
    assert [s for _, s in fake_ls.engines[0].kw["loras"]] == [1.0]


def test_a_bypass_lora_falls_back(comfy, fake_ls, bf16_file, caplog):
    """LoraLoaderBypass-style adapters arrive as patcher injections (they replace module forwards),
    not as patches: the engine cannot see them, so the node falls back and says why."""
    p = comfy.make_patcher(path=bf16_file)
    p.injections["bypass_lora"] = [object()]
    _, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=fake_ls)
    assert "fallback: stock" in text and "injections replace module forwards (bypass_lora; e.g. a bypass LoRA)" in text
    m, _ = node_api().apply_node(comfy.make_patcher(path=bf16_file), device="cpu", path="engine",
                                 layerstream_module=fake_ls)
    later = m.clone()
    later.injections["bypass_lora"] = [object()]
    with caplog.at_level(logging.WARNING, logger="layerstream_h3"):
        out = step(comfy, later)
    assert torch.equal(out[0], torch.full_like(out[0], -0.25)) and "bypass LoRA" in caplog.text


# ---- PDD bank LoRAs (ComfyUI PR #15908: set_weight / set_bias that enlarge both heads) -------
def test_a_pdd_bank_lora_is_exported_with_its_bank(comfy, fake_ls, tmp_path):
    """A PDD LoRA (Kijai's converted layout: the bank as diffusion_model.final_layer.*.set_weight
    / .set_bias, plus a backbone pair) through the loader double: ComfyUI's patches are sets of
    the bank's shape on the heads' weights and biases; the export writes them as .set_weight of
    the layer (the bias under its own name), bit for bit, and the engine gets one file."""
    from conftest import write_safetensors
    t = {"blocks.0.attn.qkv_proj.weight": ("BF16", [6, 4], bytes(48))}
    for head, rows in (("video_out", 8), ("audio_out", 2)):
        t["final_layer.{}.weight".format(head)] = ("F32", [rows, 4], bytes(16 * rows))
        t["final_layer.{}.bias".format(head)] = ("F32", [rows], bytes(4 * rows))
    model = write_safetensors(tmp_path / "heads.safetensors", t)
    n = 3
    bank = {}
    for i, (head, rows) in enumerate((("video_out", 8), ("audio_out", 2))):
        bank["diffusion_model.final_layer.{}.set_weight".format(head)] = rand(n * rows, 4, seed=10 + i, dtype=torch.float32)
        bank["diffusion_model.final_layer.{}.set_bias".format(head)] = rand(n * rows, seed=20 + i, dtype=torch.float32)
    bank["diffusion_model." + QKV + ".lora_B.weight"] = rand(6, 2, seed=30)
    bank["diffusion_model." + QKV + ".lora_A.weight"] = rand(2, 4, seed=31)
    f = write_lora(tmp_path / "pdd.safetensors", bank)
    p = loaded(comfy, comfy.make_patcher(path=model, state_keys=True), (f, 1.0))
    assert p.patches["diffusion_model.final_layer.video_out.bias"][0][1][0] == "set"
    assert tuple(p.patches["diffusion_model.final_layer.audio_out.weight"][0][1][1][0].shape) == (n * 2, 4)
    m, text = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    assert "LoRA: 1 file from the MODEL's patches (5 weight(s), 5 patch(es))" in text
    step(comfy, m)
    (eng,) = engines_with_loras(fake_ls)
    ((path, strength),) = eng.kw["loras"]
    got = comfy.read_safetensors(path)
    for head in ("video_out", "audio_out"):
        w = got["diffusion_model.final_layer.{}.set_weight".format(head)]
        b = got["diffusion_model.final_layer.{}.bias.set_weight".format(head)]
        assert torch.equal(w, bank["diffusion_model.final_layer.{}.set_weight".format(head)])
        assert torch.equal(b, bank["diffusion_model.final_layer.{}.set_bias".format(head)])


# ---- the LoRA dtype: the path ComfyUI's patcher takes ------------------------------------------
def test_the_lora_dtype_follows_comfyuis_patch_path(comfy, bf16_file, monkeypatch):
    """ComfyUI merges at cast time (LowVramPatch, in the cast weight's dtype: bf16) for a dynamic
    patcher on a GPU and for every module under --novram; otherwise whole weights in its LoRA
    compute dtype (fp16 on a CUDA device, fp32 on the CPU). A CPU load device never gets the
    dynamic patcher (ModelPatcherDynamic reroutes it), and a model computing in another dtype
    than bf16, or an fp32 LoRA dtype, keeps the whole-weight dtype."""
    import sys
    from layerstream_h3.wrapper import lora_dtype_of
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")

    def patcher(device, dynamic):
        p = comfy.make_patcher(path=bf16_file, dynamic=dynamic)
        p.load_device = device
        return p

    assert lora_dtype_of(patcher(cuda, True)) == "bf16"
    assert lora_dtype_of(patcher(cuda, False)) == "f16"
    assert lora_dtype_of(patcher(cpu, True)) == "f32"
    assert lora_dtype_of(patcher(cpu, False)) == "f32"
    fp16_model = patcher(cuda, True)
    fp16_model.model.manual_cast_dtype = torch.float16
    assert lora_dtype_of(fp16_model) == "f16"
    mm = sys.modules["comfy.model_management"]
    monkeypatch.setattr(mm, "lora_compute_dtype", lambda d: torch.float32, raising=False)
    assert lora_dtype_of(patcher(cuda, True)) == "f32"  # --force-fp32: every cast is fp32 too
    monkeypatch.setattr(mm, "lora_compute_dtype", lambda d: torch.float16)

    class VRAMState:
        NORMAL_VRAM, LOW_VRAM, NO_VRAM = 2, 1, 0
    monkeypatch.setattr(mm, "VRAMState", VRAMState, raising=False)
    monkeypatch.setattr(mm, "vram_state", VRAMState.NO_VRAM, raising=False)
    assert lora_dtype_of(patcher(cuda, False)) == "bf16"  # --novram: every module is lowvram
    monkeypatch.setattr(mm, "vram_state", VRAMState.LOW_VRAM)
    assert lora_dtype_of(patcher(cuda, False)) == "f16"  # partial loads: not known in advance
    monkeypatch.delattr(mm, "lora_compute_dtype")
    assert lora_dtype_of(patcher(cuda, True)) == "auto"


def test_a_dynamic_cuda_model_opens_the_engine_in_the_cast_time_dtype(comfy, fake_ls, bf16_file, tmp_path):
    a = lora_a(tmp_path)
    p = loaded(comfy, comfy.make_patcher(path=bf16_file, state_keys=True), (a, 0.8))
    p.load_device = torch.device("cuda", 0)
    _, text = node_api().apply_node(p, device="cpu", path="engine", fallback="error", layerstream_module=fake_ls)
    assert "merged (bf16: ComfyUI's cast-time path under dynamic VRAM)" in text
