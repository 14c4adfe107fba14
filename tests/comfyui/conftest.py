"""Fixtures for the ComfyUI node tests: the ComfyUI test double installed as `comfy`, a
recording stand-in for the engine, and small safetensors files."""

import json
import os
import struct
import sys
import types

import pytest

pytest.importorskip("torch")  # the node runs inside ComfyUI's torch; the tests need one too

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "comfyui"))
sys.path.insert(0, HERE)

import fake_comfy  # noqa: E402


@pytest.fixture
def comfy(monkeypatch):
    """The ComfyUI double as sys.modules['comfy...'] (removed again after the test)."""
    for name, mod in fake_comfy.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    from layerstream_h3 import wrapper
    wrapper.drop_cached_engine()
    yield fake_comfy
    wrapper.drop_cached_engine()


TINY = {"hidden": 128, "num_layers": 2, "heads": 2, "head_dim": 64, "text_dim": 96, "latents_dim": 24,
        "audio_latents_dim": 32}


class FakeError(Exception):
    pass


class FakeEngine:
    """Records every denoise call; writes recognisable velocities."""

    def __init__(self, **kw):
        self.kw = kw
        self.calls = []
        self.closed = False

    def info(self):
        return dict(TINY, device=self.kw.get("device", "cpu"), version="fake 0", model="fake")

    def denoise(self, clip, video, audio, sigma, text=None, refined_text=None, video_out=None, audio_out=None,
                stream=None, **extra):
        self.calls.append({"clip": clip, "video": video, "audio": audio, "sigma": sigma, "text": text,
                           "refined_text": refined_text, "video_out": video_out, "audio_out": audio_out,
                           "stream": stream, "extra": extra})
        video_out.fill_(-0.125)
        audio_out.fill_(0.0625)
        return video_out, audio_out

    def report(self):
        return {"plan": {"describe": "fake plan", "predicted_peak_bytes": 1 << 20, "stock_peak_bytes": 1 << 22},
                "device_peak_bytes": 3 << 20, "wall_seconds": 0.01, "output_hash": "00000000deadbeef"}

    @property
    def output_hash(self):
        return 0xDEADBEEF

    def close(self):
        self.closed = True


class FakeEngineMasks(FakeEngine):
    """An engine whose denoise takes output_masks= (the capability the node detects)."""

    def denoise(self, clip, video, audio, sigma, text=None, refined_text=None, video_out=None, audio_out=None,
                stream=None, output_masks=True):
        return FakeEngine.denoise(self, clip, video, audio, sigma, text=text, refined_text=refined_text,
                                  video_out=video_out, audio_out=audio_out, stream=stream, output_masks=output_masks)


class _Obj:
    def __init__(self, *a, **kw):
        self.a, self.kw = a, kw


def fake_layerstream(engine_class=None):
    engine_class = engine_class or FakeEngine
    ls = types.ModuleType("layerstream")
    ls.Error = FakeError
    ls.version = lambda: "layerstream fake"
    ls.engines = []

    def engine(**kw):
        e = engine_class(**kw)
        ls.engines.append(e)
        return e

    ls.Engine = engine
    ls.Clip = type("Clip", (_Obj,), {})
    ls.Keyframe = type("Keyframe", (_Obj,), {})
    ls.Reference = type("Reference", (_Obj,), {})
    return ls


@pytest.fixture
def fake_ls():
    return fake_layerstream()


@pytest.fixture
def fake_ls_masks():
    return fake_layerstream(FakeEngineMasks)


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype string, shape, raw bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode("utf-8")
    h += b" " * (-len(h) % 8)  # 8-byte aligned data, as the safetensors library writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return str(path)


def quant_json(conf):
    raw = json.dumps(conf).encode("utf-8")
    return ("U8", [len(raw)], raw)


@pytest.fixture
def bf16_file(tmp_path):
    t = {}
    for i in range(2):
        for n, shape in (("attn.qkv_proj", (6, 4)), ("mlp.fc2", (4, 8))):
            t["blocks.{}.{}.weight".format(i, n)] = ("BF16", shape, bytes(2 * shape[0] * shape[1]))
    return write_safetensors(tmp_path / "h3_bf16.safetensors", t)


def tensor_entry(t):
    """A torch tensor as write_safetensors' (dtype, shape, raw bytes)."""
    import torch
    c = t.detach().contiguous()
    name = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[c.dtype]
    if c.dtype == torch.bfloat16:
        c = c.view(torch.int16)
    return (name, list(t.shape), c.numpy().tobytes())


def write_lora(path, tensors):
    """A LoRA file from name -> torch tensor (4-byte dtypes first: every tensor aligned)."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    return write_safetensors(path, {k: tensor_entry(tensors[k]) for k in order})
