"""examples/denoise.c in Python: an engine on the tiny preset (synthetic weights), ONE
denoiser call on the same inputs, and the output fingerprint, which equals the C
example's and `layerstream forward --inputs`'s (tests/python/test_denoise.py runs it).

    PYTHONPATH=build/python python3 examples/denoise.py     prints "output hash %016x"

Needs numpy, in the same python3 the package was built for (CMake's Python3_EXECUTABLE,
printed by the configure step; Debian: python3-numpy). Run it with that interpreter.
"""
import sys

try:
    import numpy as np
except ImportError:
    raise SystemExit("examples/denoise.py needs numpy, which %s (python %d.%d) does not have: install it "
                     "(Debian: apt-get install python3-numpy; or pip install numpy) or run the example with the "
                     "python3 that has it and that the layerstream package was built for"
                     % (sys.executable, sys.version_info[0], sys.version_info[1]))
try:
    import layerstream
except ImportError as e:
    raise SystemExit("examples/denoise.py: cannot import layerstream with %s (%s): build the target "
                     "layerstream_py for this python3 (cmake -DPython3_EXECUTABLE=%s) and set "
                     "PYTHONPATH=build/python" % (sys.executable, e, sys.executable))


def fill(n, salt):
    """denoise.c's fill(): values in [-2, 2) in steps of 1/64, from a multiplicative hash."""
    i = np.arange(n, dtype=np.uint64)
    h = ((i + np.uint64((salt * 0x9E3779B9) & 0xFFFFFFFF)) & np.uint64(0xFFFFFFFF)) * np.uint64(2654435761)
    h &= np.uint64(0xFFFFFFFF)
    return ((h >> np.uint64(16)) & np.uint64(0xFF)).astype(np.float32) / np.float32(64) - np.float32(2)


def main():
    engine = layerstream.Engine(preset="tiny")
    clip = layerstream.Clip(frames=22, width=64, height=64, text_tokens=8)
    info, shape = engine.info(), engine.clip_shape(clip)
    video = fill(shape["video_count"], 1).reshape(info["latents_dim"], shape["T"], shape["Hl"], shape["Wl"])
    audio = fill(shape["audio_count"], 2).reshape(info["audio_latents_dim"], 2, shape["A"])
    text = fill(shape["text_count"], 3).reshape(clip.text_tokens, info["text_dim"])
    try:
        video_v, audio_v = engine.denoise(clip, video, audio, sigma=0.7, text=text)
    except layerstream.Error as e:  # e.status: "invalid_argument", ...; str(e): the engine's message
        raise SystemExit("denoise: %s (%s)" % (e, e.status))
    assert layerstream.fingerprint(video_v, audio_v) == engine.output_hash
    print("output hash %016x" % engine.output_hash)


if __name__ == "__main__":
    main()
