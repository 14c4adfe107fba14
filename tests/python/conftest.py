"""Shared helpers of the layerstream Python tests (run by ctest: python_test_*).

ctest sets PYTHONPATH to the build tree's python/ (the package), LS_TOOL to the
`layerstream` CLI and LS_EXAMPLE to examples/denoise.c's binary. Run by hand:
  PYTHONPATH=build/python LS_TOOL=build/layerstream LS_EXAMPLE=build/examples/ls_example_denoise \
      python3 -m pytest tests/python
"""
import json
import os
import re
import struct
import subprocess

import numpy as np
import pytest

import layerstream

# The clip of examples/denoise.c (tiny preset) and tests/api/example_vs_cli.cmake.
FRAMES, WIDTH, HEIGHT, TOKENS, SIGMA = 22, 64, 64, 8, 0.7


def tool():
    path = os.environ.get("LS_TOOL")
    if not path or not os.path.exists(path):
        pytest.fail("LS_TOOL (the layerstream CLI) is not set or missing: %r" % path)
    return path


def example():
    path = os.environ.get("LS_EXAMPLE")
    if not path or not os.path.exists(path):
        pytest.fail("LS_EXAMPLE (examples/denoise.c's binary) is not set or missing: %r" % path)
    return path


def fill(n, salt):
    """examples/denoise.c's fill(): values in [-2, 2) in steps of 1/64 (exact in bf16)."""
    i = np.arange(n, dtype=np.uint64)
    h = ((i + np.uint64((salt * 0x9E3779B9) & 0xFFFFFFFF)) & np.uint64(0xFFFFFFFF)) * np.uint64(2654435761)
    h &= np.uint64(0xFFFFFFFF)
    return (((h >> np.uint64(16)) & np.uint64(0xFF)).astype(np.float32) / np.float32(64.0) - np.float32(2.0))


def write_safetensors(path, tensors, metadata=None):
    """f32 tensors {name: array} as safetensors (little-endian)."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + end], dtype="<f4").reshape(e["shape"])
    return out


def run_forward(args, output=None):
    """`layerstream forward -q ARGS [-o output]`: (hash int, outputs dict or None)."""
    cmd = [tool(), "forward", "-q"] + [str(a) for a in args]
    if output:
        cmd += ["-o", str(output)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, "forward failed (%d): %s %s" % (r.returncode, r.stdout, r.stderr)
    m = re.search(r"output hash ([0-9a-f]{16})", r.stdout)
    assert m, r.stdout
    return int(m.group(1), 16), (read_safetensors(output) if output else None)


def clip_args(frames=FRAMES, width=WIDTH, height=HEIGHT, tokens=TOKENS, sigma=SIGMA):
    return ["--preset", "tiny", "--frames", frames, "--width", width, "--height", height, "--text-tokens", tokens,
            "--sigma", sigma]


@pytest.fixture(scope="session")
def engine():
    return layerstream.Engine(preset="tiny")


@pytest.fixture(scope="session")
def clip():
    return layerstream.Clip(FRAMES, WIDTH, HEIGHT, TOKENS)


@pytest.fixture(scope="session")
def inputs(engine, clip):
    """examples/denoise.c's inputs as numpy float32 arrays of the clip's shapes."""
    info, shape = engine.info(), engine.clip_shape(clip)
    video = fill(shape["video_count"], 1).reshape(info["latents_dim"], shape["T"], shape["Hl"], shape["Wl"])
    audio = fill(shape["audio_count"], 2).reshape(info["audio_latents_dim"], 2, shape["A"])
    text = fill(shape["text_count"], 3).reshape(TOKENS, info["text_dim"])
    return video, audio, text


@pytest.fixture(scope="session")
def reference(engine, clip, inputs, tmp_path_factory):
    """The CLI's velocities and hash on these inputs (`forward --inputs FILE -o OUT`)."""
    d = tmp_path_factory.mktemp("cli")
    video, audio, text = inputs
    write_safetensors(d / "inputs.safetensors", {"video": video, "audio": audio, "text": text})
    h, out = run_forward(clip_args() + ["--inputs", d / "inputs.safetensors"], output=d / "out.safetensors")
    return h, out["video"], out["audio"]
