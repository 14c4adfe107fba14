"""CUDA: torch CUDA tensors in and out, ordered on a non-default stream, give the bytes
of host inputs and of `layerstream forward --device cuda`, with the target latents read
and the velocities written on the device (issue 13: no host staging; the report says
so); mixed host/device audio with the carry is staged and still exact; output_masks and
an audio-only keyframe with device tensors; one call's time
through Python against the CLI (printed; run with -s). Skips without CUDA (a torch with
CUDA and a layerstream build with the CUDA backend). The lead runs it on the GPU machine:
  PYTHONPATH=build/python LS_TOOL=build/layerstream python3 -m pytest -s tests/python/test_cuda.py
"""
import time

import numpy as np
import pytest

import layerstream
from conftest import FRAMES, HEIGHT, SIGMA, TOKENS, WIDTH, clip_args, run_forward, write_safetensors

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)
if "cuda" not in layerstream.version():
    pytest.skip("layerstream built without the CUDA backend: %s" % layerstream.version(), allow_module_level=True)


@pytest.fixture(scope="module")
def cuda_engine():
    return layerstream.Engine(preset="tiny", device="cuda:0")


@pytest.fixture(scope="module")
def host_result(cuda_engine, clip, inputs):
    """The CUDA engine on host (numpy) inputs: the reference."""
    video, audio, text = inputs
    v, a = cuda_engine.denoise(clip, video, audio, SIGMA, text=text)
    assert cuda_engine.report()["staged_through_host"] is False
    return v.copy(), a.copy(), cuda_engine.output_hash


def test_matches_cli_on_cuda(cuda_engine, clip, inputs, host_result, tmp_path):
    video, audio, text = inputs
    write_safetensors(tmp_path / "in.safetensors", {"video": video, "audio": audio, "text": text})
    h, out = run_forward(clip_args() + ["--device", "cuda:0", "--inputs", tmp_path / "in.safetensors"],
                         output=tmp_path / "out.safetensors")
    assert h == host_result[2]
    assert out["video"].tobytes() == host_result[0].tobytes() and out["audio"].tobytes() == host_result[1].tobytes()


def delayed_copy(src, stream):
    """A CUDA tensor written on `stream` only after a long kernel: a reader that does not
    wait for the stream sees the uninitialised (NaN-filled) buffer instead."""
    with torch.cuda.stream(stream):
        t = torch.full(src.shape, float("nan"), dtype=src.dtype, device="cuda")
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on this stream
        t.copy_(src.to("cuda", non_blocking=False))
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_tensors_on_a_side_stream(cuda_engine, clip, inputs, host_result, dtype):
    video, audio, text = inputs
    s = torch.cuda.Stream()
    srcs = [torch.from_numpy(x.copy()).to(dtype) for x in (video, audio, text)]  # exact in bf16
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        tv, ta, tt = (delayed_copy(x, s) for x in srcs)
        vo = torch.full(video.shape, float("nan"), dtype=dtype, device="cuda")
        ao = torch.full((1,) + audio.shape, float("nan"), dtype=dtype, device="cuda")
        rv, ra = cuda_engine.denoise(clip, tv, ta, SIGMA, text=tt[None], video_out=vo, audio_out=ao, stream=s)
        assert rv is vo and ra is ao
        # read on the same stream: ordered after the engine's writes (no synchronize here)
        got_v = vo.float().cpu() if dtype == torch.float32 else vo.cpu()
        got_a = ao.cpu()
    ref_v = torch.from_numpy(host_result[0])
    ref_a = torch.from_numpy(host_result[1])
    if dtype == torch.float32:
        assert got_v.numpy().tobytes() == host_result[0].tobytes()
        assert got_a[0].numpy().tobytes() == host_result[1].tobytes()
    else:
        assert torch.equal(got_v, ref_v.to(torch.bfloat16)) and torch.equal(got_a[0], ref_a.to(torch.bfloat16))
    assert cuda_engine.output_hash == host_result[2]
    rep = cuda_engine.report()
    # The latents stayed on the device; only the (small) text went through the host, and
    # the outputs were read back once for the fingerprint.
    assert rep["staged_through_host"] is False and rep["staged_bytes"]["latents"] == 0
    assert rep["staged_bytes"]["conditioning"] == tt.numel() * tt.element_size()
    assert rep["output_readback_bytes"] == (vo.numel() + ao.numel()) * vo.element_size()


def test_audio_carry_across_sides_is_staged_and_exact(cuda_engine, clip, inputs, host_result):
    """With the carry (audio_scale 4) a device audio input and a host audio output (or the
    reverse) stage the audio through the host; the bytes do not change."""
    video, audio, text = inputs
    dv, da = torch.from_numpy(video.copy()).cuda(), torch.from_numpy(audio.copy()).cuda()
    v, a = cuda_engine.denoise(clip, dv, da, SIGMA, text=text, video_out=torch.empty_like(dv),
                               audio_out=np.empty(audio.shape, np.float32))
    rep = cuda_engine.report()
    assert rep["staged_through_host"] is True and rep["staged_bytes"]["latents"] == audio.nbytes
    assert v.cpu().numpy().tobytes() == host_result[0].tobytes() and a.tobytes() == host_result[1].tobytes()
    v, a = cuda_engine.denoise(clip, dv, audio, SIGMA, text=text, video_out=torch.empty_like(dv),
                               audio_out=torch.empty_like(da))
    assert cuda_engine.report()["staged_through_host"] is True
    assert v.cpu().numpy().tobytes() == host_result[0].tobytes() and a.cpu().numpy().tobytes() == host_result[1].tobytes()


def test_output_masks_and_audio_keyframe_on_device(cuda_engine, inputs):
    """Fractional masks with output_masks=False and an audio-only keyframe, all as CUDA
    tensors (audio_scale 1: the node's setting, the audio stays on the device): the bytes
    of the same call with numpy arrays."""
    video, audio, text = inputs
    T, Hl, Wl = video.shape[1:]
    rng = np.random.default_rng(3)
    vm = rng.uniform(0, 1, size=(T, Hl, Wl)).astype(np.float32)
    am = np.full((2, audio.shape[2]), 0.5, np.float32)
    ka = rng.standard_normal((audio.shape[0], 2, 3)).astype(np.float32)

    def clip(arr):
        return layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, keyframes=[layerstream.Keyframe(2, audio=arr(ka))],
                                video_mask=arr(vm), audio_mask=arr(am), audio_scale=1.0)
    for masks in (True, False):
        hv, ha = cuda_engine.denoise(clip(lambda x: x), video, audio, SIGMA, text=text, output_masks=masks)
        hv, ha = hv.copy(), ha.copy()
        dv, da = torch.from_numpy(video.copy()).cuda(), torch.from_numpy(audio.copy()).cuda()
        vo, ao = torch.empty_like(dv, dtype=torch.bfloat16), torch.empty_like(da)
        cuda_engine.denoise(clip(lambda x: torch.from_numpy(x).cuda()), dv, da, SIGMA, text=torch.from_numpy(text).cuda(),
                            video_out=vo, audio_out=ao, output_masks=masks)
        assert cuda_engine.report()["staged_through_host"] is False
        assert torch.equal(vo.cpu(), torch.from_numpy(hv).to(torch.bfloat16))
        assert ao.cpu().numpy().tobytes() == ha.tobytes()


def test_stream_none_is_torch_current_stream(cuda_engine, clip, inputs, host_result):
    video, audio, text = inputs
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        tv = delayed_copy(torch.from_numpy(video.copy()), s)
        vo = torch.empty(video.shape, device="cuda")
        cuda_engine.denoise(clip, tv, audio, SIGMA, text=text, video_out=vo,
                            audio_out=np.empty(audio.shape, np.float32))  # stream=None: s, torch's current
        got = vo.cpu()
    assert got.numpy().tobytes() == host_result[0].tobytes()


def test_keyframe_on_device_equals_host(cuda_engine, inputs):
    video, audio, text = inputs
    kv = (np.arange(video[:, :1].size) % 97 / 32 - 1.5).astype(np.float32).reshape(video[:, :1].shape)
    host = cuda_engine.denoise(layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS, keyframes=[layerstream.Keyframe(0, kv)]),
                               video, audio, SIGMA, text=text)[0].copy()
    dev = cuda_engine.denoise(layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS,
                                               keyframes=[layerstream.Keyframe(0, torch.from_numpy(kv).cuda())]),
                              video, audio, SIGMA, text=text)[0]
    assert host.tobytes() == dev.tobytes()


def test_wrong_device_index_refused(cuda_engine, clip, inputs):
    video, audio, text = inputs
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    with pytest.raises(layerstream.InvalidArgument, match="engine runs on cuda:0"):
        cuda_engine.denoise(clip, torch.from_numpy(video).to("cuda:1"), audio, SIGMA, text=text)


def test_strided_device_output_refused(cuda_engine, clip, inputs):
    video, audio, text = inputs
    big = torch.empty(video.shape[::-1], device="cuda").permute(3, 2, 1, 0)
    with pytest.raises(layerstream.Unsupported, match="device outputs must be contiguous"):
        cuda_engine.denoise(clip, video, audio, SIGMA, text=text, video_out=big,
                            audio_out=np.empty(audio.shape, np.float32))


def test_time_python_vs_cli(tmp_path):
    """One call of the `small` preset (2 blocks) on cuda: Python (CUDA tensors) vs the CLI."""
    e = layerstream.Engine(preset="small", blocks=2, device="cuda:0")
    clip = layerstream.Clip(FRAMES, 256, 256, 64)
    info, shape = e.info(), e.clip_shape(clip)
    g = torch.Generator().manual_seed(0)
    video = (torch.randn(info["latents_dim"], shape["T"], shape["Hl"], shape["Wl"], generator=g))
    audio = torch.randn(info["audio_latents_dim"], 2, shape["A"], generator=g)
    text = torch.randn(64, info["text_dim"], generator=g)
    dv, da, dt = video.cuda(), audio.cuda(), text.cuda()
    vo, ao = torch.empty_like(dv), torch.empty_like(da)
    e.denoise(clip, dv, da, SIGMA, text=dt, video_out=vo, audio_out=ao)  # warm (engine made)
    torch.cuda.synchronize()
    n = 3
    t0 = time.perf_counter()
    for _ in range(n):
        e.denoise(clip, dv, da, SIGMA, text=dt, video_out=vo, audio_out=ao)
    torch.cuda.synchronize()
    py = (time.perf_counter() - t0) / n
    rep = e.report()
    write_safetensors(tmp_path / "in.safetensors", {"video": video.numpy(), "audio": audio.numpy(),
                                                    "text": text.numpy()})
    t0 = time.perf_counter()
    h, _ = run_forward(["--preset", "small", "--blocks", 2, "--frames", FRAMES, "--width", 256, "--height", 256,
                        "--text-tokens", 64, "--sigma", SIGMA, "--device", "cuda:0", "--inputs",
                        tmp_path / "in.safetensors"])
    cli = time.perf_counter() - t0
    assert h == e.output_hash
    print("\n[overhead] small preset (2 blocks), cuda:0: Python call %.1f ms (CUDA tensors in place); "
          "CLI process %.1f ms (incl. start-up and weights); report: %s"
          % (py * 1e3, cli * 1e3, {k: v for k, v in rep.items() if "second" in k or "time" in k}))
