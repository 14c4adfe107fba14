#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/), small files only.

  python3 fuzz/make_corpus.py

fuzz_safetensors: whole safetensors files: minimal valid ones (empty header, one tensor,
metadata, every dtype, zero-size and scalar tensors, an unsupported dtype, a misaligned
tensor, five dims) and edge cases the reader refuses (gap, trailing bytes, overlap,
header length into the padding, duplicate name, deep nesting).
fuzz_h3_detect: safetensors headers (JSON text; the target builds the data section):
the committed tiny checkpoints' headers and variants (key prefix, config override in
the metadata, a missing block, curve form).
fuzz_cli_inputs: whole safetensors files as the CLI reads them (--inputs, --mask,
--keyframe, --text, --ref) for the tiny preset, and one with five-dimensional tensors.
Deterministic: running it again gives the same bytes.
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")
SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I8": 1, "I32": 4, "U8": 1, "I64": 8, "BOOL": 1}


def pad(h):
    return h + b" " * ((8 - len(h) % 8) % 8)


def st_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] back to back; data bytes 1, 2, 3, ..."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = SIZES[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = pad(json.dumps(header, separators=(",", ":")).encode())
    return struct.pack("<Q", len(h)) + h + bytes((i % 251) + 1 for i in range(off))


def raw(header_text, data):
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors_seeds():
    t = "fuzz_safetensors"
    write(t, "empty", st_file([]))
    write(t, "metadata_only", st_file([], {"k": "v", "format": "pt"}))
    write(t, "one_f32", st_file([("x", "F32", [2, 3])]))
    write(t, "every_dtype", st_file([(f"t_{dt.lower()}", dt, [3]) for dt in
                                    ["F64", "F32", "I32", "BF16", "F16", "F8_E4M3", "I8", "U8"]], {"k": "v"}))
    write(t, "zero_size_and_scalar", st_file([("s", "F64", []), ("z", "F32", [0, 5]), ("a", "BF16", [2, 2]),
                                             ("e", "U8", [0])]))
    write(t, "unsupported_dtype", st_file([("ids", "I64", [2]), ("flag", "BOOL", [3]), ("w", "F32", [1])]))
    write(t, "five_dims", st_file([("five", "U8", [1, 2, 1, 2, 1])]))
    write(t, "misaligned", raw('{"p":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                               '"x":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}   ', b"\x07\x00\x00\x80\x3f"))
    # Refused by the reader (each a different check).
    good = st_file([("a", "U8", [4])])
    n = struct.unpack("<Q", good[:8])[0]
    write(t, "header_length_into_padding", struct.pack("<Q", n - 1) + good[8:])
    write(t, "trailing_bytes", good + b"xyz")
    write(t, "gap", raw('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                        '"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}', b"d" * 12))
    write(t, "overlap", raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                            '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"d" * 12))
    write(t, "duplicate_name", raw('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                   '"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"ab"))
    write(t, "deep_nesting", raw('{"__metadata__":' + "[" * 80 + "]" * 80 + "}", b""))
    write(t, "huge_shape", raw('{"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}}', b"d" * 8))
    write(t, "short", b"\x05\x00\x00")


def h3_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    for e in header.values():
        e.pop("data_offsets", None)  # the target recomputes them
    return header


def h3_seeds():
    t = "fuzz_h3_detect"
    golden = os.path.join(ROOT, "tests", "data", "golden")
    tiny = h3_header(os.path.join(golden, "h3_golden_tiny.safetensors"))
    curve = h3_header(os.path.join(golden, "h3_golden_tiny_curve.safetensors"))
    dump = lambda h: json.dumps(h, separators=(",", ":"), sort_keys=True).encode()
    write(t, "tiny", dump(tiny))
    write(t, "tiny_curve", dump(curve))
    write(t, "tiny_prefixed", dump({"model.diffusion_model." + k: v for k, v in tiny.items()}))
    write(t, "tiny_missing_block", dump({k: v for k, v in tiny.items() if not k.startswith("blocks.1.")}))
    with_override = dict(tiny)
    with_override["__metadata__"] = {"config": json.dumps({"transformer": {"num_attention_heads": 3,
                                                                           "attention_head_dim": 32}})}
    write(t, "tiny_config_override", dump(with_override))
    with_override2 = dict(tiny)
    with_override2["__metadata__"] = {"config.transformer": "{\"num_layers\": 2}"}
    write(t, "tiny_config_transformer", dump(with_override2))
    write(t, "empty", b"{}")


def cli_inputs_seeds():
    """The CLI's input files for the tiny preset (latents 24 / 32, text_dim 96) and the
    target's 5-frame 64x64 clip (T 2, Hl = Wl = 4, A 8, L 4)."""
    t = "fuzz_cli_inputs"
    write(t, "inputs", st_file([("video", "F32", [24, 2, 4, 4]), ("audio", "F32", [32, 2, 8]),
                                ("text", "F32", [4, 96])]))
    write(t, "mask", st_file([("video_mask", "F32", [2, 4, 4]), ("audio_mask", "F32", [2, 8])]))
    write(t, "keyframe", st_file([("video", "F32", [24, 1, 4, 4]), ("audio", "F32", [32, 2, 3])],
                                 {"pixel_frame": "2"}))
    write(t, "keyframe_bf16", st_file([("video", "BF16", [24, 1, 4, 4])]))
    write(t, "text", st_file([("text", "BF16", [1, 4, 96]), ("negative", "F32", [4, 96])]))
    write(t, "five_dims", st_file([("video", "F32", [1, 1, 1, 1, 1]), ("text", "F32", [1, 1, 1, 1, 1]),
                                   ("negative", "F32", [1, 1, 1, 1, 1])]))


if __name__ == "__main__":
    safetensors_seeds()
    h3_seeds()
    cli_inputs_seeds()
