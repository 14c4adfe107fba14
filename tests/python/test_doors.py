"""One memory request and one range table at every door (issues 27 item 1, 28 item 6).

tests/data/memory_doors.json is fed to Python (layerstream.Engine, validate_memory) and to
the ComfyUI node (layerstream_h3.budget: parse_budget, check_memory, and the pure-Python
size grammar it falls back to without the engine library): the same acceptance and the
same message as the CLI and the C API (tests/test_api_doors.cpp feeds them the table).
Then the values issue 28 found accepted at the Python door but refused by the CLI, and the
Python package's shape (keyword-only parameters, ValueError, type information).
"""
import inspect
import json
import math
import os
import sys

import numpy as np
import pytest

import layerstream

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "comfyui"))
from layerstream_h3 import budget  # noqa: E402  (the node's module: no torch, no ComfyUI)

with open(os.path.join(ROOT, "tests", "data", "memory_doors.json")) as f:
    TABLE = json.load(f)["cases"]

NAMES = {"vram_budget": "vram_budget", "activation_budget": "activation_budget", "prefetch": "prefetch",
         "prefetch_off": "prefetch=0", "prefetch_always": "prefetch=2", "mlp_chunk": "mlp_chunk",
         "attn_chunk": "attn_chunk", "final_chunk": "final_chunk", "kv_offload": "kv_offload",
         "kv_chunk": "kv_chunk", "residual_offload": "residual_offload", "resident_blocks": "resident_blocks",
         "slots": "slots", "a_device": 'a "cuda" device'}


def spell(text):
    return text.format(**NAMES)


def python_kwargs(memory):
    kw = {}
    for key, v in memory.items():
        if key == "prefetch":
            kw[key] = {0: "off", 1: "auto", 2: "always"}[v]
        elif key in ("kv_offload", "residual_offload"):
            kw[key] = bool(v)
        else:
            kw[key] = v
    return kw


@pytest.mark.parametrize("case", TABLE, ids=[c["name"] for c in TABLE])
def test_python_door(case):
    kw = python_kwargs(case["memory"])
    if case["expect"] == "ok":
        layerstream.validate_memory(device=case["device"], **kw)
        layerstream.Engine(preset="tiny", device=case["device"], **kw).close()
        return
    want = spell(case["expect"])
    with pytest.raises(layerstream.InvalidArgument) as ei:
        layerstream.validate_memory(device=case["device"], **kw)
    assert str(ei.value) == want
    with pytest.raises(layerstream.InvalidArgument) as ei:
        layerstream.Engine(preset="tiny", device=case["device"], **kw)
    assert str(ei.value) == want
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, layerstream.Error)


NODE_KEYS = {"vram_budget", "mlp_chunk", "attn_chunk"}


@pytest.mark.parametrize("case", [c for c in TABLE if set(c["memory"]) <= NODE_KEYS],
                         ids=[c["name"] for c in TABLE if set(c["memory"]) <= NODE_KEYS])
def test_node_door(case):
    """The node's inputs: vram_budget (a string), mlp_chunk, attn_chunk, and the device."""
    m = case["memory"]
    ok = case["expect"] == "ok"

    def run():
        vram = budget.parse_budget(m["vram_budget"]) if "vram_budget" in m else None
        budget.check_memory(vram_budget=vram, mlp_chunk=m.get("mlp_chunk"), attn_chunk=m.get("attn_chunk"),
                            device=case["device"])

    if ok:
        run()
        return
    with pytest.raises(budget.BudgetError) as ei:
        run()
    assert str(ei.value) == spell(case["expect"])


@pytest.mark.parametrize("case", [c for c in TABLE if set(c["memory"]) <= NODE_KEYS],
                         ids=[c["name"] for c in TABLE if set(c["memory"]) <= NODE_KEYS])
def test_node_settings_door(case):
    """The node as a user meets it: wrapper.Settings (built when the node is applied) runs the
    same validation, so a size with explicit slices, or a size on the CPU, is refused there
    with the message every door gives (it used to let the slices win or ignore the size)."""
    pytest.importorskip("torch")  # mapping (imported by wrapper) needs torch
    from layerstream_h3 import wrapper
    m = case["memory"]

    def run():
        wrapper.Settings(device=case["device"], vram_budget=m.get("vram_budget", "auto"),
                         mlp_chunk=m.get("mlp_chunk", 0), attn_chunk=m.get("attn_chunk", 0))

    if case["expect"] == "ok":
        run()
        return
    with pytest.raises(budget.BudgetError) as ei:
        run()
    assert str(ei.value) == spell(case["expect"])


def test_node_settings_auto_with_slices_or_cpu_is_no_budget():
    """'auto' is no budget given: explicit slices, or the CPU engine, run without one."""
    pytest.importorskip("torch")
    from layerstream_h3 import wrapper
    assert wrapper.Settings(device="cuda:0", vram_budget="auto", mlp_chunk=4096).vram_budget is None
    assert wrapper.Settings(device="cpu", vram_budget="auto").vram_budget is None


SIZE_TEXTS = ["12G", "12g", "1.5GiB", "900M", "4096", "4096B", ".5K", "5.G", "1T", "1048576T", "1048577T", "12GB",
              "12 G", " 12G", "12G ", "0", "0x10", "+5G", "-1G", "G", "", ".", "1.5B", "1e3", "nan", "12 gigs",
              "99999999999999999999999", "0.0000000000000000001K", "3.999999999999999999999G", "1KiB", "2mib"]


@pytest.mark.parametrize("text", SIZE_TEXTS)
def test_size_grammar_is_one(text):
    """layerstream.parse_size (the library's ls_parse_size), the node's parse_size over it
    and the node's pure-Python fallback give the same bytes or the same message."""
    def answer(fn):
        try:
            return ("ok", fn(text))
        except ValueError as e:
            return ("error", str(e))
    lib = answer(lambda t: layerstream.parse_size(t, "vram_budget"))
    node = answer(budget.parse_size)
    fallback = answer(budget.parse_size_fallback)
    assert lib == node == fallback, (lib, node, fallback)


# ---- the range table (issue 28 item 6): what the CLI refuses, refused here too ----------
def test_range_table_is_the_librarys():
    table = {r["name"]: r for r in layerstream.ranges()}
    assert table["kv_tile"]["text"] == "1..2^30"
    assert table["sigma"]["text"] == "(0, 1]" and table["sigma"]["lo_open"]
    assert table["vram_budget"]["kind"] == "size" and table["vram_budget"]["hi"] == float(1 << 60)


def refused(fragment, fn, *args, **kw):
    with pytest.raises(layerstream.InvalidArgument) as ei:
        fn(*args, **kw)
    assert fragment in str(ei.value), str(ei.value)
    assert isinstance(ei.value, ValueError)
    return str(ei.value)


@pytest.fixture(scope="module")
def tiny():
    e = layerstream.Engine(preset="tiny")
    yield e
    e.close()


def clip(**kw):
    return layerstream.Clip(22, 64, 64, 8, **kw)


def test_refused_like_the_cli(tiny):
    assert refused("", tiny.plan, clip(), 2.0) == "sigma must be a finite number in (0, 1] (got '2.0')"
    refused("sigma must be a finite number in (0, 1] (got '1e+30')", tiny.plan, clip(), 1e30)
    refused("sigma must be a finite number in (0, 1] (got 'nan')", tiny.plan, clip(), math.nan)
    refused("sample_sigmas[0] must be a finite number in [0, 1] (got 'nan')", tiny.plan,
            clip(sample_sigmas=[math.nan]), 0.5)
    refused("sample_sigmas[0] must be a finite number in [0, 1] (got 'nan')", tiny.plan,
            clip(sample_sigmas=np.array([math.nan], np.float32)), 0.5)
    info = tiny.info()
    kv = np.zeros((info["latents_dim"], 1, 4, 4), np.float32)
    refused("keyframe 0 pixel_frame must be an integer in 0..21 (got '1000000')", tiny.plan,
            clip(keyframes=[layerstream.Keyframe(10 ** 6, kv)]), 0.5)
    refused("frames must be an integer in 1..100000 (got '0')", tiny.plan, layerstream.Clip(0, 64, 64, 8), 0.5)
    refused("blocks must be an integer in 1..1000 (got '-3')", layerstream.Engine, preset="tiny", blocks=-3)
    refused("threads must be an integer in 0..4096 (got '-1')", layerstream.Engine, preset="tiny", threads=-1)
    refused("numerics.kv_tile must be an integer in 1..2^30 (got '1099511627776')", layerstream.Engine,
            preset="tiny", numerics={"kv_tile": 2 ** 40})
    # Values no C type holds: a layerstream.InvalidArgument, never a bare "Unable to cast".
    refused("weights_seed must be an integer in 0..2^63-1 (got '%d')" % (2 ** 70), layerstream.Engine,
            preset="tiny", weights_seed=2 ** 70)
    refused("mlp_chunk must be a 64-bit integer", layerstream.Engine, preset="tiny", mlp_chunk=2 ** 70)
    refused("frames must be an integer in 1..100000 (got '%d')" % (2 ** 70), tiny.plan,
            layerstream.Clip(2 ** 70, 64, 64, 8), 0.5)
    refused("frames must be an integer in 1..100000 (got 22.5)", tiny.plan, layerstream.Clip(22.5, 64, 64, 8), 0.5)
    refused("seed must be an integer in 0..2^63-1 (got '-1')", tiny.plan, clip(seed=-1), 0.5)
    refused("keyframe pixel_frame must be a 64-bit integer", layerstream.Keyframe, 2 ** 70)
    v = np.zeros((1,), np.float32)
    refused("stream: give a CUDA stream handle", tiny.denoise, clip(), v, v, 0.5, text=v, stream=2 ** 70)
    refused("lora strength must be a finite number in [-100, 100] (got 'inf')", layerstream.Engine,
            preset="tiny", loras=[("x.safetensors", math.inf)])
    refused("the strength must be a finite number in [-100, 100] (got '0x10')", layerstream.Engine,
            preset="tiny", loras=["x.safetensors:0x10"])


def test_accepted_values_still_run(tiny):
    tiny.plan(clip(sample_sigmas=[1.0, 0.5, 0.0]), np.float32(0.5))
    layerstream.Engine(preset="tiny", threads=None, blocks=np.int64(1), numerics={"kv_tile": 0}).close()


# ---- Python as its ecosystem expects (issue 27 item 5) -----------------------------------
def test_keyword_only_and_value_errors():
    params = inspect.signature(layerstream.Engine.__init__).parameters
    positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == ["self", "model"], positional
    with pytest.raises(TypeError):
        layerstream.Engine(None, "tiny")  # preset is keyword-only
    den = inspect.signature(layerstream.Engine.denoise).parameters
    assert den["text"].kind == den["text"].KEYWORD_ONLY and den["sigma"].kind == den["sigma"].POSITIONAL_OR_KEYWORD
    assert inspect.signature(layerstream.Clip.__init__).parameters["seed"].kind == inspect.Parameter.KEYWORD_ONLY
    for cls in (layerstream.InvalidArgument, layerstream.OutOfBudget):
        assert issubclass(cls, ValueError) and issubclass(cls, layerstream.Error)
    assert not issubclass(layerstream.InvalidFile, ValueError)
    assert issubclass(layerstream.Error, RuntimeError)


def test_prefetch_by_name():
    refused("prefetch must be True, False or 'always'", layerstream.Engine, preset="tiny", prefetch=2)
    refused("prefetch=0 goes with vram_budget", layerstream.Engine, preset="tiny", prefetch="off")
    layerstream.validate_memory(vram_budget="1G", prefetch="always")
    layerstream.validate_memory(vram_budget="1G", prefetch=False)
    assert layerstream.PREFETCH == {"off": 0, "auto": 1, "always": 2}


def test_type_information_is_shipped():
    pkg = os.path.dirname(layerstream.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    stub = os.path.join(pkg, "_C.pyi")
    assert os.path.exists(stub)
    import ast
    names = {n.name for n in ast.parse(open(stub).read()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    extension = {n for n in dir(layerstream._C) if not n.startswith("_")}
    missing = extension - names - {"API_VERSION"}
    assert not missing, "layerstream._C names without a stub: %s" % sorted(missing)


# ---- the checkpoint probe (issue 27 item 3): the engine answers what the node re-derived --
def make_model(tmp_path, fmt):
    import subprocess
    tool = os.environ.get("LS_TOOL")
    if not tool or not os.path.exists(tool):
        pytest.fail("LS_TOOL (the layerstream CLI) is not set or missing: %r" % tool)
    out = str(tmp_path / ("tiny_%s.safetensors" % fmt))
    subprocess.run([tool, "make-model", "--preset", "tiny", "--format", fmt, "-q", "-o", out], check=True)
    return out


def test_probe_checkpoint(tmp_path):
    from layerstream_h3 import checkpoint
    bf16 = make_model(tmp_path, "bf16")
    p = layerstream.probe_checkpoint(bf16)
    assert p["runnable"] and p["reason"] == "" and p["format"] == "bf16" and p["layers"] == {}
    with layerstream.Engine(bf16) as e:
        info = e.info()
    for key in ("hidden", "num_layers", "heads", "head_dim", "text_dim", "latents_dim", "audio_latents_dim"):
        assert p["model_info"][key] == info[key], key
    assert p["config"]["hidden_size"] == info["hidden"]
    assert p["clip_grid"]["frame_step"] == 17 and p["clip_grid"]["latent_downscale"] == 16
    int8 = make_model(tmp_path, "int8-convrot")
    q = layerstream.probe_checkpoint(int8)
    assert q["runnable"] and q["format"].startswith("int8_convrot g")
    assert q["layers"] and all(v["format"] == "int8_convrot" for v in q["layers"].values())
    # The node's status line takes the engine's answer for a file the engine runs.
    text, info = checkpoint.describe_format(int8)
    assert text == q["format"] and info["engine"] and info["quantised"] == len(q["layers"])
    assert checkpoint.unsupported_reason(int8) is None
    # A file the engine cannot run: runnable false, the engine's reason; no exception.
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    r = layerstream.probe_checkpoint(str(bad))
    assert not r["runnable"] and r["reason"] and r["status"] == "invalid_file", r
    # Without the engine the node's pure-Python reading answers (its own label).
    assert checkpoint.describe_format(bf16)[0] == "bf16"


def test_clip_geometry_is_the_engines():
    """The node's inversion (mapping.clip_geometry: latent sizes -> the clip) agrees with the
    engine's grid (ls_clip_geometry) over ComfyUI's sizes, and asks the engine when it can."""
    from layerstream_h3 import mapping
    for frames in (1, 5, 6, 22, 23, 97, 121, 241):
        for width, height in ((32, 32), (64, 96), (1280, 704)):
            g = layerstream.clip_geometry(frames, width, height)
            assert (g["frames"] - 5) % 17 == 0 and g["frames"] >= frames and g["T"] == 5 * ((g["frames"] - 5) // 17) + 2
            assert mapping.clip_geometry(g["T"], g["Hl"], g["Wl"], g["A"]) == (g["frames"], width, height)
    refused("width must be an integer in 32..65536 (got '16')", layerstream.clip_geometry, 22, 16, 64)
    with pytest.raises(mapping.Unsupported) as ei:
        mapping.clip_geometry(7, 8192, 8, 37)  # 131072 pixels high: beyond the engine's range
    assert "height must be an integer in 32..65536" in str(ei.value)
