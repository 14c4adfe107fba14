"""The GIL is released during engine calls (another Python thread keeps running), and
calls on one engine from two threads are serialised (both give the reference bytes)."""
import threading
import time

import numpy as np

import layerstream
from conftest import SIGMA


def test_gil_released_during_denoise():
    e = layerstream.Engine(preset="small", blocks=2)
    clip = layerstream.Clip(22, 128, 128, 32)
    info, s = e.info(), e.clip_shape(clip)
    video = (np.arange(s["video_count"]) % 7 / 8).astype(np.float32).reshape(
        info["latents_dim"], s["T"], s["Hl"], s["Wl"])
    audio = np.zeros((info["audio_latents_dim"], 2, s["A"]), np.float32)
    text = (np.arange(s["text_count"]) % 5 / 8).astype(np.float32).reshape(32, info["text_dim"])
    e.denoise(clip, video, audio, SIGMA, text=text)  # warm: weights and engine made
    t0 = time.perf_counter()
    e.denoise(clip, video, audio, SIGMA, text=text)
    call = time.perf_counter() - t0
    done = threading.Event()

    def work():
        for _ in range(3):
            e.denoise(clip, video, audio, SIGMA, text=text)
        done.set()

    th = threading.Thread(target=work)
    last, max_gap = time.perf_counter(), 0.0
    th.start()
    while not done.is_set():
        now = time.perf_counter()
        max_gap, last = max(max_gap, now - last), now
    th.join()
    # Holding the GIL through a call would stall this loop for the whole call.
    assert max_gap < 0.5 * call, "main thread stalled %.0f ms during %.0f ms calls" % (max_gap * 1e3, call * 1e3)


def test_one_engine_two_threads(engine, clip, inputs, reference):
    video, audio, text = inputs
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                v, a = engine.denoise(clip, video, audio, SIGMA, text=text)
                results.append(v.tobytes() + a.tobytes())
        except Exception as x:  # pragma: no cover - reported below
            errors.append(x)

    ths = [threading.Thread(target=work) for _ in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors, errors
    assert len(results) == 10 and set(results) == {reference[1].tobytes() + reference[2].tobytes()}
