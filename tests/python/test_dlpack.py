"""torch CPU tensors through DLPack (Debian's torch 1.13 has __dlpack__): float32 and
bfloat16 inputs, strided tensors, outputs written into caller tensors (f32 and bf16),
the capsule consumed and released."""
import gc
import sys

import numpy as np
import pytest

import layerstream
from conftest import SIGMA

torch = pytest.importorskip("torch")


def test_torch_f32_and_bf16_inputs(engine, clip, inputs, reference):
    video, audio, text = inputs
    tv, ta, tt = (torch.from_numpy(x.copy()) for x in inputs)
    v, a = engine.denoise(clip, tv, ta, SIGMA, text=tt)  # outputs: new numpy arrays
    assert isinstance(v, np.ndarray) and v.tobytes() == reference[1].tobytes() and a.tobytes() == reference[2].tobytes()
    # bf16: the inputs are multiples of 1/64 in [-2, 2), exact in bf16, so widened exactly
    bv, ba, bt = tv.to(torch.bfloat16), ta.to(torch.bfloat16), tt.to(torch.bfloat16)
    assert torch.equal(bv.float(), tv)
    vo, ao = torch.empty_like(tv), torch.empty_like(ta)
    rv, ra = engine.denoise(clip, bv, ba, SIGMA, text=bt, video_out=vo, audio_out=ao)
    assert rv is vo and ra is ao
    assert vo.numpy().tobytes() == reference[1].tobytes() and ao.numpy().tobytes() == reference[2].tobytes()
    assert engine.output_hash == reference[0]


def test_bf16_input_is_widened_not_reinterpreted(engine, clip, inputs, reference):
    """A bf16 tensor whose values are NOT the f32 inputs gives another output (the dtype
    is honoured: reading bf16 bits as f32 would not give the bf16-rounded run either)."""
    video, audio, text = inputs
    tv = torch.from_numpy(video.copy()) + 1.0 / 512  # not exact in bf16 at |x| >= 0.5
    rounded = tv.to(torch.bfloat16)
    v1, _ = engine.denoise(clip, rounded, torch.from_numpy(audio), SIGMA, text=torch.from_numpy(text))
    v2, _ = engine.denoise(clip, rounded.float().numpy(), audio, SIGMA, text=text)
    assert v1.tobytes() == v2.tobytes() and v1.tobytes() != reference[1].tobytes()


def test_strided_torch(engine, clip, inputs, reference):
    video, audio, text = inputs
    tv = torch.from_numpy(np.ascontiguousarray(video.transpose(3, 2, 1, 0))).permute(3, 2, 1, 0)
    assert not tv.is_contiguous() and torch.equal(tv, torch.from_numpy(video))
    tt = torch.from_numpy(np.ascontiguousarray(text.T)).t()
    bt = torch.from_numpy(np.ascontiguousarray(text.T)).t().to(torch.bfloat16)  # bf16 and strided
    assert not bt.is_contiguous()
    v, a = engine.denoise(clip, tv, torch.from_numpy(audio)[None], SIGMA, text=tt)
    assert v.tobytes() == reference[1].tobytes()
    v, a = engine.denoise(clip, tv, torch.from_numpy(audio), SIGMA, text=bt)
    assert v.tobytes() == reference[1].tobytes()


def test_outputs_bf16_and_strided(engine, clip, inputs, reference):
    video, audio, text = inputs
    vo = torch.empty(video.shape, dtype=torch.bfloat16)
    ao = torch.full((1,) + audio.shape, float("nan"), dtype=torch.bfloat16)
    engine.denoise(clip, video, audio, SIGMA, text=text, video_out=vo, audio_out=ao)
    ref_v = torch.from_numpy(reference[1].copy())
    assert torch.equal(vo, ref_v.to(torch.bfloat16))  # round to nearest even, as torch's .to()
    assert torch.equal(ao[0], torch.from_numpy(reference[2].copy()).to(torch.bfloat16))
    # a strided torch output: a transposed view
    big = torch.zeros(video.shape[::-1], dtype=torch.float32)
    view = big.permute(3, 2, 1, 0)
    engine.denoise(clip, video, audio, SIGMA, text=text, video_out=view, audio_out=torch.empty(audio.shape))
    assert view.contiguous().numpy().tobytes() == reference[1].tobytes()


def test_keyframe_tensors_any_form(engine, inputs):
    """A keyframe given as numpy f32, torch bf16 and a strided torch view: one output."""
    video, audio, text = inputs
    kv = (np.arange(video[:, :1].size) % 97 / 32 - 1.5).astype(np.float32).reshape(video[:, :1].shape)
    outs = []
    for k in (kv, torch.from_numpy(kv).to(torch.bfloat16),
              torch.from_numpy(np.ascontiguousarray(kv.transpose(3, 2, 1, 0))).permute(3, 2, 1, 0)):
        clip = layerstream.Clip(22, 64, 64, 8, keyframes=[layerstream.Keyframe(0, k)],
                                text_tags=torch.tensor([1] * 6 + [0] * 2))
        outs.append(engine.denoise(clip, video, audio, SIGMA, text=text)[0].tobytes())
    assert outs[0] == outs[1] == outs[2]
    plain = engine.denoise(layerstream.Clip(22, 64, 64, 8), video, audio, SIGMA, text=text)[0].tobytes()
    assert outs[0] != plain


class Producer:
    """Only DLPack (no buffer protocol), exporting a numpy array: numpy's DLManagedTensor
    holds a reference to the array until its deleter runs, so the array's refcount shows
    whether the binding consumed the capsule (renamed it) and called the deleter once."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_capsules_consumed_and_released(engine, clip, inputs, reference):
    video, audio, text = inputs
    arrays = [x.copy() for x in inputs]
    before = [sys.getrefcount(a) for a in arrays]
    for _ in range(3):
        v, a = engine.denoise(clip, *[Producer(x) for x in arrays[:2]], SIGMA, text=Producer(arrays[2]))
    gc.collect()
    assert v.tobytes() == reference[1].tobytes()
    assert [sys.getrefcount(a) for a in arrays] == before  # each deleter ran exactly once
    # a tensor whose export failed mid-way (bad dtype) is released too
    bad = arrays[0].astype(np.float16)
    n = sys.getrefcount(bad)
    with pytest.raises(layerstream.InvalidArgument, match="dtype float16"):
        engine.denoise(clip, Producer(bad), arrays[1], SIGMA, text=arrays[2])
    gc.collect()
    assert sys.getrefcount(bad) == n


def test_cuda_tensor_on_cpu_engine_refused(engine, clip, inputs):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    video, audio, text = inputs
    with pytest.raises(layerstream.InvalidArgument, match="engine runs on cpu"):
        engine.denoise(clip, torch.from_numpy(video).cuda(), audio, SIGMA, text=text)


def test_references_and_condition_noise(engine, inputs):
    """References (image, audio, video_audio) with caller-drawn noise rows: numpy f32 and
    torch bf16 / strided forms give one output; the noise rows are really used (other
    rows, another output); a wrong number of noise values is refused by the engine."""
    video, audio, text = inputs
    C, T, Hl, Wl = video.shape
    Ca = audio.shape[0]
    g = torch.Generator().manual_seed(3)
    rv = (torch.randint(-96, 96, (C, 1, Hl, Wl), generator=g) / 64.0).numpy().astype(np.float32)
    ra = (torch.randint(-96, 96, (Ca, 2, 4), generator=g) / 64.0).numpy().astype(np.float32)
    nv = (torch.randint(-64, 64, (1 * (Hl // 2) * (Wl // 2), 4 * C), generator=g) / 32.0).numpy().astype(np.float32)
    na = (torch.randint(-64, 64, (2 * 4, Ca), generator=g) / 32.0).numpy().astype(np.float32)

    def run(refs):
        clip = layerstream.Clip(22, 64, 64, 8, references=refs, vis_aug=0.9, aud_aug=0.8, seed=11)
        return engine.denoise(clip, video, audio, SIGMA, text=text)[0].tobytes()

    plain = run([])
    a = run([layerstream.Reference("image", video=rv, noise_video=nv),
             layerstream.Reference("audio", audio=ra, noise_audio=na)])
    b = run([layerstream.Reference("image", video=torch.from_numpy(rv).to(torch.bfloat16),
                                   noise_video=torch.from_numpy(np.ascontiguousarray(nv.T)).t()),
             layerstream.Reference("audio", audio=torch.from_numpy(ra)[None], noise_audio=torch.from_numpy(na))])
    assert a == b and a != plain
    c = run([layerstream.Reference("image", video=rv, noise_video=nv * 0.5),
             layerstream.Reference("audio", audio=ra, noise_audio=na)])
    assert c != a  # the given rows are used, not redrawn
    d = run([layerstream.Reference("image", video=rv), layerstream.Reference("audio", audio=ra)])
    assert d != a  # the engine's own draw differs from the given rows
    with pytest.raises(layerstream.InvalidArgument) as ei:
        run([layerstream.Reference("image", video=rv, noise_video=nv[:-1])])
    assert "noise" in str(ei.value)
