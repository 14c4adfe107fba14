"""The package outside ComfyUI (imports, one warning, registers nothing), the v3 node class
inside a comfy_api double, and the checkpoint header reader."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, quant_json, write_safetensors

COMFYUI_DIR = os.path.join(ROOT, "comfyui")


def run_python(code, block=()):
    """A fresh interpreter with comfyui/ on the path; `block` names modules made unimportable."""
    pre = "import sys\n" + "".join("sys.modules[{!r}] = None\n".format(m) for m in block)
    env = dict(os.environ, PYTHONPATH=COMFYUI_DIR)
    return subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("block", [("comfy_api", "comfy"), ("torch", "comfy_api", "comfy")],
                         ids=["without-comfyui", "without-torch"])
def test_imports_cleanly_outside_comfyui(block):
    r = run_python("import layerstream_h3 as p\n"
                   "assert p.NODE_CLASS_MAPPINGS == {} and p.NODE_DISPLAY_NAME_MAPPINGS == {}\n"
                   "assert not hasattr(p, 'comfy_entrypoint')\n"
                   "from layerstream_h3 import budget, checkpoint, mapping, wrapper, node\n"
                   "print('ok')\n", block=block)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    warnings = [l for l in r.stderr.splitlines() if "[LayerStream]" in l]
    assert len(warnings) == 1 and "not registered" in warnings[0], r.stderr
    if "torch" in block:
        assert "torch" in warnings[0] or "comfy_api" in warnings[0]


def test_inside_comfyui_only_the_v3_entry_point_exists(monkeypatch):
    """ComfyUI's loader takes the v1 branch whenever NODE_CLASS_MAPPINGS is not None and then
    never calls comfy_entrypoint (nodes.py load_custom_node), so it must be absent."""
    import asyncio
    import importlib
    import fake_comfy
    for name, mod in list(fake_comfy.comfy_api_modules().items()) + list(fake_comfy.modules().items()):
        monkeypatch.setitem(sys.modules, name, mod)
    for name in [n for n in sys.modules if n == "layerstream_h3" or n.startswith("layerstream_h3.")]:
        monkeypatch.delitem(sys.modules, name)
    pkg = importlib.import_module("layerstream_h3")
    assert not hasattr(pkg, "NODE_CLASS_MAPPINGS")
    ext = asyncio.run(pkg.comfy_entrypoint())
    (cls,) = asyncio.run(ext.get_node_list())
    schema = cls.define_schema()
    assert schema.node_id == "LayerStreamH3Engine" and schema.display_name == "LayerStream: H3 Engine"
    names = [i.name for i in schema.inputs]
    assert names == ["model", "vram_budget", "mlp_chunk", "attn_chunk", "kv_tile", "device", "fallback", "path",
                     "mlp_chunk_tokens", "attn_chunk_tokens", "sliced_keep_q"]
    assert by_name(schema, "sliced_keep_q")["default"] is True and by_name(schema, "sliced_keep_q")["optional"] is True
    by = {i.name: i.kw for i in schema.inputs}
    assert by["mlp_chunk_tokens"]["default"] == 8192 and by["mlp_chunk_tokens"]["step"] == 256
    assert by["attn_chunk_tokens"]["default"] == 8192 and by["attn_chunk_tokens"]["min"] == 0
    assert by["path"]["options"] == ["auto", "engine", "comfy-sliced"] and by["path"]["default"] == "auto"
    assert by["fallback"]["options"] == ["stock", "error"] and by["kv_tile"]["advanced"] is True
    assert by["vram_budget"]["default"] == "auto"
    # execute: MODEL out, the status as the node's preview text
    p = fake_comfy.make_patcher(path=None)
    out = cls.execute(p, "auto", 0, 0, 0, "cpu", "stock", "engine", 8192, 8192)
    assert out.args[0] is not p and "Load Diffusion Model" in out.ui.text


def by_name(schema, name):
    return {i.name: i.kw for i in schema.inputs}[name]


def test_format_of_bf16_int8_and_fp8_files(tmp_path, bf16_file):
    from layerstream_h3.checkpoint import describe_format, unsupported_reason
    assert describe_format(bf16_file)[0] == "bf16" and unsupported_reason(bf16_file) is None
    t = {}
    for i in range(3):
        t["blocks.{}.attn.qkv_proj.weight".format(i)] = ("I8", [6, 4], bytes(24))
        t["blocks.{}.attn.qkv_proj.weight_scale".format(i)] = ("F32", [6, 1], bytes(24))
        t["blocks.{}.attn.qkv_proj.comfy_quant".format(i)] = quant_json(
            {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256})
    # the full files' adaln at group 64, with the settings nested under params
    t["blocks.0.adaln_proj.linear.comfy_quant"] = quant_json(
        {"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 64}})
    t["blocks.0.adaln_proj.linear.weight"] = ("I8", [6, 4], bytes(24))
    int8 = write_safetensors(tmp_path / "int8.safetensors", t)
    text, info = describe_format(int8)
    assert text == "int8_convrot g256+g64" and info["quantised"] == 4 and unsupported_reason(int8) is None
    fp8 = write_safetensors(tmp_path / "fp8.safetensors", {
        "blocks.0.mlp.fc1.weight": ("F8_E4M3", [4, 4], bytes(16)), "blocks.0.mlp.fc1.weight_scale": ("F32", [], bytes(4))})
    assert describe_format(fp8)[0] == "fp8_scaled (float8_e4m3fn)"
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    assert "cannot read the checkpoint header" in unsupported_reason(str(bad))
    assert "GGUF" in unsupported_reason(str(tmp_path / "x.gguf"))


def test_checkpoint_path_from_the_model(tmp_path, bf16_file):
    import fake_comfy
    from layerstream_h3.checkpoint import checkpoint_path
    p = fake_comfy.make_patcher(path=bf16_file)
    assert checkpoint_path(p) == (bf16_file, None)

    def load_gguf_unet(path):
        pass

    p.cached_patcher_init = (load_gguf_unet, (bf16_file,))
    path, why = checkpoint_path(p)
    assert path is None and "load_gguf_unet" in why
    p.cached_patcher_init = (fake_comfy.load_diffusion_model, (str(tmp_path / "gone.safetensors"), {}))
    assert "not a readable file" in checkpoint_path(p)[1]


def test_loads_the_way_comfyuis_custom_node_loader_loads_it(monkeypatch):
    """nodes.py load_custom_node: spec_from_file_location(<module path as a name>, <dir>/__init__.py,
    submodule_search_locations=[<dir>]); the relative imports must resolve under that name."""
    import asyncio
    import importlib.util
    import fake_comfy
    for name, mod in list(fake_comfy.comfy_api_modules().items()) + list(fake_comfy.modules().items()):
        monkeypatch.setitem(sys.modules, name, mod)
    pkg_dir = os.path.join(COMFYUI_DIR, "layerstream_h3")
    name = pkg_dir.replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg_dir, "__init__.py"),
                                                  submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    assert getattr(module, "NODE_CLASS_MAPPINGS", None) is None  # so ComfyUI takes the v3 branch
    (cls,) = asyncio.run(asyncio.run(module.comfy_entrypoint()).get_node_list())
    assert cls.define_schema().node_id == "LayerStreamH3Engine"
    for k in [k for k in sys.modules if k.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, k)
