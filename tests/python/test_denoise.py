"""numpy inputs through Engine.denoise give the bytes of `layerstream forward --inputs`
and of examples/denoise.c (the C API); bf16, strided and batched inputs; outputs into
caller arrays; the memory knobs change no bit; keyframes and masks match the CLI."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import layerstream
from conftest import SIGMA, clip_args, example, run_forward, write_safetensors


def test_numpy_matches_cli_and_c_example(engine, clip, inputs, reference, tmp_path):
    video, audio, text = inputs
    assert np.count_nonzero(video) > video.size // 2 and video.std() > 0.5  # non-trivial inputs
    v, a = engine.denoise(clip, video, audio, SIGMA, text=text)
    cli_hash, cli_v, cli_a = reference
    assert v.dtype == np.float32 and v.shape == video.shape and a.shape == audio.shape
    assert np.count_nonzero(v) > v.size // 2  # a real output, not zeros
    assert v.tobytes() == cli_v.tobytes() and a.tobytes() == cli_a.tobytes()  # memcmp
    assert engine.output_hash == cli_hash == layerstream.fingerprint(v, a)
    # examples/denoise.c (the C API through pointers) on the same inputs
    r = subprocess.run([example(), str(tmp_path / "in.safetensors")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(re.search(r"output hash ([0-9a-f]{16})", r.stdout).group(1), 16) == cli_hash
    # examples/denoise.py (this package) prints the same hash
    ex = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "denoise.py")
    r = subprocess.run([sys.executable, ex], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "output hash %016x" % cli_hash
    # and the report says so
    rep = engine.report()
    assert rep["call"] == "denoise" and int(rep["output_hash"], 16) == cli_hash
    assert rep["staged_through_host"] is False


def test_inputs_are_read(engine, clip, inputs, reference):
    """Another input gives another output (the arrays really reach the engine)."""
    video, audio, text = inputs
    v, _ = engine.denoise(clip, video, audio, SIGMA, text=text[::-1].copy())
    assert v.tobytes() != reference[1].tobytes()
    v, _ = engine.denoise(clip, video * np.float32(0.5), audio, SIGMA, text=text)
    assert v.tobytes() != reference[1].tobytes()


def test_strided_and_batched_inputs(engine, clip, inputs, reference):
    video, audio, text = inputs
    # every other element of a larger array: a strided view (copied by the library)
    big = np.zeros((video.shape[0], video.shape[1], video.shape[2], 2 * video.shape[3]), np.float32)
    big[..., ::2] = video
    sv = big[..., ::2]
    assert not sv.flags["C_CONTIGUOUS"]
    tt = np.asfortranarray(text)  # column-major
    assert not tt.flags["C_CONTIGUOUS"]
    v, a = engine.denoise(clip, sv, audio[None], SIGMA, text=tt[None])  # leading 1s: a batch of one
    assert v.tobytes() == reference[1].tobytes() and a.reshape(reference[2].shape).tobytes() == reference[2].tobytes()
    assert a.shape == (1,) + audio.shape


def test_outputs_into_caller_arrays(engine, clip, inputs, reference):
    video, audio, text = inputs
    vo = np.full(video.shape, np.nan, np.float32)
    ao = np.full(audio.shape, np.nan, np.float32)
    rv, ra = engine.denoise(clip, video, audio, SIGMA, text=text, video_out=vo, audio_out=ao)
    assert rv is vo and ra is ao
    assert vo.tobytes() == reference[1].tobytes() and ao.tobytes() == reference[2].tobytes()
    # a strided host output (every other element of a larger array)
    big = np.full(video.shape[:3] + (2 * video.shape[3],), 7.0, np.float32)
    engine.denoise(clip, video, audio, SIGMA, text=text, video_out=big[..., 1::2], audio_out=ao)
    assert big[..., 1::2].tobytes() == reference[1].tobytes()
    assert np.all(big[..., 0::2] == 7.0)  # the gaps are untouched


def test_memory_knobs_change_no_bit(clip, inputs, reference):
    video, audio, text = inputs
    for kw in ({"mlp_chunk": 64, "attn_chunk": 32, "final_chunk": 16}, {"activation_budget": "1M"}):
        e = layerstream.Engine(preset="tiny", **kw)
        v, a = e.denoise(clip, video, audio, SIGMA, text=text)
        assert v.tobytes() == reference[1].tobytes() and a.tobytes() == reference[2].tobytes(), kw


def test_info_shape_plan(engine, clip):
    info = engine.info()
    for k in ("hidden", "num_layers", "heads", "head_dim", "text_dim", "latents_dim", "audio_latents_dim"):
        assert isinstance(info[k], int) and info[k] > 0, k
    assert info["device"] == "cpu" and info["model"] == "preset:tiny" and info["version"] == layerstream.version()
    s = engine.clip_shape(clip)
    assert s["video_count"] == info["latents_dim"] * s["T"] * s["Hl"] * s["Wl"]
    assert s["audio_count"] == info["audio_latents_dim"] * 2 * s["A"] and s["S"] > 0
    p = engine.plan(clip, SIGMA)
    assert "plan" in p and p["minimum_budget_bytes"] == 0 and p["numerics"]["attention"]
    assert layerstream.__version__ == "0.1.0" and layerstream.version().startswith("layerstream 0.1.0")


def test_keyframes_and_masks_match_cli(engine, inputs, tmp_path):
    """A keyframe (video + audio, noise drawn by the engine) and both masks, through
    Python arrays (one of them strided, one bf16-exact scaled), against the CLI's files."""
    video, audio, text = inputs
    C, T, Hl, Wl = video.shape
    rng = np.random.default_rng(5)
    kv = (rng.integers(-128, 128, size=(C, 1, Hl, Wl)) / 64).astype(np.float32)
    ka = (rng.integers(-128, 128, size=(audio.shape[0], 2, 4)) / 64).astype(np.float32)
    vm = (rng.integers(0, 2, size=(T, Hl, Wl))).astype(np.float32)
    am = np.ones((2, audio.shape[2]), np.float32)
    am[:, :3] = 0.25
    write_safetensors(tmp_path / "in.safetensors", {"video": video, "audio": audio, "text": text})
    write_safetensors(tmp_path / "kf.safetensors", {"video": kv, "audio": ka})
    write_safetensors(tmp_path / "mask.safetensors", {"video_mask": vm, "audio_mask": am})
    h, out = run_forward(clip_args() + ["--inputs", tmp_path / "in.safetensors", "--keyframe",
                                        "%s@last" % (tmp_path / "kf.safetensors"), "--mask",
                                        tmp_path / "mask.safetensors"], output=tmp_path / "out.safetensors")
    h_plain, _ = run_forward(clip_args() + ["--inputs", tmp_path / "in.safetensors"])
    assert h != h_plain  # the keyframe and masks matter
    big = np.zeros((T, Hl, 2 * Wl), np.float32)
    big[..., ::2] = vm
    clip = layerstream.Clip(22, 64, 64, 8, keyframes=[layerstream.Keyframe(21, kv, ka)], video_mask=big[..., ::2],
                            audio_mask=am[None])
    v, a = engine.denoise(clip, video, audio, SIGMA, text=text)
    assert engine.output_hash == h
    assert v.tobytes() == out["video"].tobytes() and a.tobytes() == out["audio"].tobytes()


def test_overhead_against_cli(engine, clip, inputs, tmp_path):
    """One call's time through Python against the CLI's forward (printed; run with -s)."""
    video, audio, text = inputs
    write_safetensors(tmp_path / "in.safetensors", {"video": video, "audio": audio, "text": text})
    engine.denoise(clip, video, audio, SIGMA, text=text)  # warm
    n = 5
    t0 = time.perf_counter()
    for _ in range(n):
        engine.denoise(clip, video, audio, SIGMA, text=text)
    py = (time.perf_counter() - t0) / n
    rep = engine.report()
    t0 = time.perf_counter()
    run_forward(clip_args() + ["--inputs", tmp_path / "in.safetensors"])
    cli = time.perf_counter() - t0
    print("\n[overhead] tiny preset, CPU: Python denoise %.2f ms per call; engine-reported %s; CLI process %.1f ms"
          % (py * 1e3, {k: rep[k] for k in rep if "second" in k or k.endswith("_s")}, cli * 1e3))


def test_refined_text_gives_the_raw_text_bytes(engine, clip, inputs, reference):
    """Refined states (ls_engine_refine_text) as f32 holding bf16 values, and as torch
    bf16, give the bytes of the raw-text call."""
    video, audio, text = inputs
    bits = engine.refine_text(text)
    assert bits.dtype == np.uint16 and bits.shape == (8, engine.info()["hidden"]) and np.count_nonzero(bits) > 0
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    v, a = engine.denoise(clip, video, audio, SIGMA, refined_text=as_f32)
    assert v.tobytes() == reference[1].tobytes() and a.tobytes() == reference[2].tobytes()
    torch = pytest.importorskip("torch")
    as_bf16 = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    assert torch.equal(as_bf16.float(), torch.from_numpy(as_f32))
    v, _ = engine.denoise(clip, video, audio, SIGMA, refined_text=as_bf16[None])
    assert v.tobytes() == reference[1].tobytes()
    # other refined states give another output (the argument is really used)
    v, _ = engine.denoise(clip, video, audio, SIGMA, refined_text=as_f32[::-1].copy())
    assert v.tobytes() != reference[1].tobytes()


def test_output_masks_off_gives_the_unmasked_velocities(engine, inputs):
    """output_masks=False returns _forward's unmasked velocities: with fractional masks,
    the masked call's values are bf16(unmasked * m), m the pooled mask of the row; the
    masks still set the rows' timesteps (unmasked differs from the mask-free call)."""
    video, audio, text = inputs
    C, T, Hl, Wl = video.shape
    A = audio.shape[2]
    rng = np.random.default_rng(9)
    vm = np.ceil(rng.uniform(0, 1, size=(T, Hl, Wl)) * 256).astype(np.float32) / 256  # pooled = the 2x2 amax
    vm[0] = 0.0
    am = np.full((2, A), 0.375, np.float32)
    am[:, ::3] = 1.0
    kw = dict(audio_scale=1.0)  # no carry between the head and the masks (the node's setting)
    masked_clip = layerstream.Clip(22, 64, 64, 8, video_mask=vm, audio_mask=am, **kw)
    vmk, amk = engine.denoise(masked_clip, video, audio, SIGMA, text=text)
    vun, aun = engine.denoise(masked_clip, video, audio, SIGMA, text=text, output_masks=False)
    assert engine.report()["call"] == "denoise"
    pooled = vm.reshape(T, Hl // 2, 2, Wl // 2, 2).max(axis=(2, 4))
    pm = np.repeat(np.repeat(pooled, 2, axis=1), 2, axis=2)[None]
    assert 0 < np.count_nonzero((pm > 0) & (pm < 1))
    def bf16(x):  # round to nearest even (finite values)
        u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
        return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    assert bf16(vun * pm).tobytes() == vmk.tobytes()
    assert bf16(aun * am[None]).tobytes() == amk.tobytes()
    assert vun.tobytes() != vmk.tobytes()
    vplain, _ = engine.denoise(layerstream.Clip(22, 64, 64, 8, **kw), video, audio, SIGMA, text=text)
    assert vplain.tobytes() != vun.tobytes()  # the per-row timesteps stay


def test_audio_only_keyframe_matches_cli(engine, inputs, tmp_path):
    """A keyframe with an audio latent and no video (ComfyUI's AddGuide with audio only)
    gives the CLI's bytes for the same file, and differs from no keyframe."""
    video, audio, text = inputs
    rng = np.random.default_rng(7)
    ka = (rng.integers(-128, 128, size=(audio.shape[0], 2, 5)) / 64).astype(np.float32)
    write_safetensors(tmp_path / "in.safetensors", {"video": video, "audio": audio, "text": text})
    write_safetensors(tmp_path / "kfa.safetensors", {"audio": ka})
    h, out = run_forward(clip_args() + ["--inputs", tmp_path / "in.safetensors", "--keyframe",
                                        "%s@4" % (tmp_path / "kfa.safetensors")], output=tmp_path / "out.safetensors")
    h_plain, _ = run_forward(clip_args() + ["--inputs", tmp_path / "in.safetensors"])
    assert h != h_plain
    clip = layerstream.Clip(22, 64, 64, 8, keyframes=[layerstream.Keyframe(4, audio=ka)])
    v, a = engine.denoise(clip, video, audio, SIGMA, text=text)
    assert engine.output_hash == h
    assert v.tobytes() == out["video"].tobytes() and a.tobytes() == out["audio"].tobytes()
    shape = engine.clip_shape(layerstream.Clip(22, 64, 64, 8))
    assert engine.clip_shape(clip)["S"] == shape["S"] + 2 * 5  # only its audio rows
    with pytest.raises(layerstream.InvalidArgument, match="neither a video nor an audio latent"):
        engine.denoise(layerstream.Clip(22, 64, 64, 8, keyframes=[layerstream.Keyframe(4)]), video, audio, SIGMA,
                       text=text)
