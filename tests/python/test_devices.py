"""devices= (sequence parallel, docs/multi-gpu.md): 2 and 4 in-process CPU ranks give one
device's output bytes; a rank count that does not divide the heads is refused."""
import numpy as np
import pytest

import layerstream
from conftest import SIGMA


def _denoise(**kw):
    e = layerstream.Engine(preset="small", blocks=2, **kw)
    clip = layerstream.Clip(9, 64, 64, 16)
    info, s = e.info(), e.clip_shape(clip)
    video = (np.arange(s["video_count"]) % 7 / 8).astype(np.float32).reshape(
        info["latents_dim"], s["T"], s["Hl"], s["Wl"])
    audio = (np.arange(2 * s["A"] * info["audio_latents_dim"]) % 3 / 4).astype(np.float32).reshape(
        info["audio_latents_dim"], 2, s["A"])
    text = (np.arange(s["text_count"]) % 5 / 8).astype(np.float32).reshape(16, info["text_dim"])
    return e.denoise(clip, video, audio, SIGMA, text=text)


def test_cpu_ranks_give_one_devices_bytes():
    ref = _denoise()
    for devices in ("cpu*2", ["cpu"] * 4):
        out = _denoise(devices=devices)
        for a, b in zip(ref[:2], out[:2]):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_ranks_must_divide_heads():
    with pytest.raises(layerstream.Error, match="do not divide"):
        _denoise(devices="cpu*3")
