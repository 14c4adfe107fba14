"""Which file a ComfyUI MODEL was loaded from, and what its DiT weights are stored as.

The engine answers first: layerstream.probe_checkpoint (the C API's ls_probe_checkpoint)
opens the file as the engine would (header, tensor table, every quantised layer; the
weights are mapped, not read) and says whether it can run it, its format per layer and
its geometry. Where the engine library is absent, or the file is not one the engine
recognises as an H3 checkpoint, the pure-Python reading below (json + struct: the
safetensors header plus the few small `.comfy_quant` tensors, never the weights) gives
the status line its text.
"""

import json
import os
import struct

# ComfyUI's core UNET loader (comfy/sd.py load_diffusion_model) records how to reload the
# model: patcher.cached_patcher_init = (load_diffusion_model, (unet_path, model_options)).
# Other loaders (GGUF, custom ones) set their own tuple or none.
_LOADERS_WITH_PATH = ("load_diffusion_model", "load_diffusion_model_readonly")


def checkpoint_path(patcher):
    """(path, None) or (None, reason a user can act on)."""
    init = getattr(patcher, "cached_patcher_init", None)
    if not init or len(init) < 2 or not isinstance(init[1], (tuple, list)) or not init[1]:
        return None, ("the MODEL carries no checkpoint path (it was not loaded by ComfyUI's "
                      "'Load Diffusion Model' node); load the H3 file with that node")
    loader = getattr(init[0], "__name__", "")
    path = init[1][0]
    if loader not in _LOADERS_WITH_PATH or not isinstance(path, str):
        return None, ("the MODEL was loaded by {!r}, not by 'Load Diffusion Model', so its file "
                      "is unknown; load the H3 file with that node".format(loader or init[0]))
    if not os.path.isfile(path):
        return None, "the MODEL's checkpoint {} is not a readable file".format(path)
    return path, None


class HeaderError(ValueError):
    pass


def read_header(path):
    """The safetensors header: (dict name -> {dtype, shape, data_offsets}, data_start)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise HeaderError("{} is too short to be a safetensors file".format(path))
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > 512 * 1024 * 1024:
            raise HeaderError("{} has an implausible safetensors header length {}".format(path, n))
        raw = f.read(n)
        if len(raw) != n:
            raise HeaderError("{} ends inside its safetensors header".format(path))
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HeaderError("{}: the safetensors header is not JSON ({})".format(path, e))
    header.pop("__metadata__", None)
    return header, 8 + n


def _read_tensor_bytes(path, data_start, entry, limit=4096):
    a, b = entry["data_offsets"]
    if b - a > limit:
        return None
    with open(path, "rb") as f:
        f.seek(data_start + a)
        return f.read(b - a)


def engine_function(name):
    """The layerstream package's function `name`, or None when the package is not importable
    (not installed, or its library does not load) or is a build without that function."""
    try:
        import layerstream
    except Exception:
        return None
    return getattr(layerstream, name, None)


def probe(path):
    """The engine's probe of the checkpoint (a dict: runnable, reason, status, config,
    format, census, layers, clip_grid), or None when the layerstream package (with
    probe_checkpoint) is not importable."""
    fn = engine_function("probe_checkpoint")
    if fn is None:
        return None
    try:
        return fn(path)
    except Exception:  # an argument the probe refuses (not a path): the fallback answers
        return None


def _engine_format(p):
    """describe_format's answer from a runnable probe: the engine's label and counts."""
    census = p.get("census") or {}
    formats, groups, quantised = {}, {}, 0
    for q in census.get("quantised", []):
        formats[q["format"]] = formats.get(q["format"], 0) + q["linears"]
        if q.get("group"):
            groups[q["group"]] = groups.get(q["group"], 0) + q["linears"]
        quantised += q["linears"]
    info = {"quantised": quantised, "formats": formats, "groups": groups, "plain_linears": census.get("plain_linears"),
            "engine": True}
    if not quantised:
        info["dtypes"] = {d["dtype"]: d["tensors"] for d in census.get("bytes_by_dtype", [])}
    return p.get("format") or "?", info


def describe_format(path):
    """A short description of the DiT's block linears, as the status shows it:
    'bf16', 'int8_convrot g256', 'int8_convrot g256+g64', 'fp8_scaled (float8_e4m3fn)', or a
    mixed one such as 'int8_convrot g256 (+ 4 blocks bf16)'. Also returns the raw counts.
    Raises HeaderError when the file is not a readable safetensors file.
    A file the engine runs is described by the engine (probe(): its label, e.g. 'bf16',
    'int8_convrot g256+g64', 'fp8_e4m3'; info["engine"] True)."""
    p = probe(path)
    if p is not None and p.get("runnable"):
        return _engine_format(p)
    header, data_start = read_header(path)
    groups = {}
    formats = {}
    block_linears = 0
    quantised = 0
    float_dtypes = {}
    for name, entry in header.items():
        if name.endswith(".comfy_quant"):
            quantised += 1
            raw = _read_tensor_bytes(path, data_start, entry)
            conf = {}
            if raw is not None:
                try:
                    conf = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    conf = {}
            params = conf.get("params", {}) if isinstance(conf.get("params"), dict) else {}
            fmt = conf.get("format", "?")
            if conf.get("convrot", params.get("convrot", False)):
                fmt += "_convrot"
                g = conf.get("convrot_groupsize", params.get("convrot_groupsize", 256))
                groups[g] = groups.get(g, 0) + 1
            formats[fmt] = formats.get(fmt, 0) + 1
        elif name.startswith("blocks.") and name.endswith(".weight") and len(entry.get("shape", ())) == 2:
            block_linears += 1
            dt = entry.get("dtype", "?")
            float_dtypes[dt] = float_dtypes.get(dt, 0) + 1
    if not formats:
        if "F8_E4M3" in float_dtypes:
            text = "fp8_scaled (float8_e4m3fn)"
        elif float_dtypes:
            text = "/".join(sorted(k.lower() for k in float_dtypes))
        else:
            text = "no DiT block linears found"
        return text, {"quantised": 0, "block_linears": block_linears, "dtypes": float_dtypes}
    main = max(formats, key=formats.get)
    text = main.replace("int8_tensorwise_convrot", "int8_convrot")
    if groups:
        text += " " + "+".join("g{}".format(g) for g in sorted(groups, reverse=True))
    others = {k: v for k, v in formats.items() if k != main}
    if others:
        text += " (+ " + ", ".join("{} {}".format(v, k) for k, v in sorted(others.items())) + ")"
    return text, {"quantised": quantised, "block_linears": block_linears, "formats": formats, "groups": groups}


# Formats the engine may be able to load; anything else is refused here with its name so
# the status says why (the engine's own check is the final word: it opens the file).
UNSUPPORTED_QUANT = ("nvfp4", "mxfp8", "convrot_w4a4", "asym_w4a8_int8", "awq_w4a16", "float8_e5m2")


def unsupported_reason(path):
    """None when the file looks loadable by the engine, else why not (or a header error).
    A file the engine's probe says it runs is None. Otherwise the header reading below
    answers (no engine library, or a file the probe refuses: the engine's own open refuses
    it again, with its message, when the node makes the engine, and the node falls back;
    the node's tests route partial files this way)."""
    if path.lower().endswith(".gguf"):
        return "GGUF checkpoints are not supported by the engine"
    p = probe(path)
    if p is not None and p.get("runnable"):
        return None
    try:
        text, info = describe_format(path)
    except (HeaderError, OSError) as e:
        return "cannot read the checkpoint header: {}".format(e)
    bad = [f for f in info.get("formats", {}) if any(f.startswith(u) for u in UNSUPPORTED_QUANT)]
    if bad:
        return "checkpoint format {} is not supported by the engine".format(", ".join(sorted(bad)))
    return None
