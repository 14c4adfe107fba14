"""`layerstream merge-lora` against ComfyUI's own merge formula, restated in torch (CPU).

ComfyUI (model_patcher.patch_weight_to_device + lora.calculate_weight + float.stochastic_rounding,
revision 08d0e510): temp = weight.to(T); for each patch temp += ((strength * alpha/rank) *
mm(up.f32, down.f32)).type(T); out = temp.to(bf16). T = fp32 on the CPU, fp16 on NVIDIA GPUs
that run fp16. The engine restates it with a k-ascending fp32 rank product; torch.mm sums in its
BLAS's order, so at larger ranks the fp32 product may differ in its last bit, which the bf16
rounding hides almost always: the test prints the count and bounds it.

Run by ctest with LS_TOOL=<path to layerstream>.
"""
import json
import os
import struct
import subprocess
import tempfile

import numpy as np
import pytest
import torch

TOOL = os.environ.get("LS_TOOL", "layerstream")


def read_tensor(path, name):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    e = hdr[name]
    raw = bytearray(data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}[e["dtype"]]
    return torch.frombuffer(raw, dtype=dt).reshape(e["shape"]).clone(), hdr.get("__metadata__", {})


def write_safetensors(path, tensors):
    meta, blobs, off = {}, [], 0
    for k, t in tensors.items():
        t = t.contiguous()
        b = t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()
        name = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[t.dtype]
        meta[k] = {"dtype": name, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    j = json.dumps(meta).encode()
    j += b" " * ((8 - len(j) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(blobs))


def comfy_merge(w, patches, T):
    temp = w.to(T, copy=True)
    for up, down, alpha, strength in patches:
        a = alpha / down.shape[0] if alpha is not None else 1.0
        diff = torch.mm(up.float(), down.float())
        temp += ((strength * a) * diff).type(temp.dtype)
    return temp.to(w.dtype)


def comfy_merge_cast_time(w, patches):
    """ComfyUI's cast-time merge (model_patcher.LowVramPatch: dynamic VRAM, lowvram modules):
    calculate_weight with intermediate_dtype = the cast weight's dtype (bf16), the factors
    cast to it before torch.mm, whose bf16 result cuBLAS rounds once from an fp32 sum
    (restated here as an fp32 mm then one rounding, since the CPU's bf16 mm need not)."""
    temp = w.to(torch.bfloat16, copy=True)
    for up, down, alpha, strength in patches:
        a = alpha / down.shape[0] if alpha is not None else 1.0
        diff = torch.mm(up.to(torch.bfloat16).float(), down.to(torch.bfloat16).float()).to(torch.bfloat16)
        # bf16 tensor * Python scalar and bf16 += bf16 as CUDA torch runs them (opmath fp32,
        # the scalar as fl32, one rounding each), spelled out in fp32: torch 1.13's CPU
        # kernels round the scalar to bf16 first.
        v = (torch.tensor(strength * a, dtype=torch.float32) * diff.float()).to(torch.bfloat16)
        temp = (temp.float() + v.float()).to(torch.bfloat16)
    return temp


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    p = str(d / "base.safetensors")
    subprocess.run([TOOL, "make-model", "--preset", "tiny", "-q", "-o", p], check=True, capture_output=True)
    return d, p


LAYERS = ["blocks.0.attn.qkv_proj", "blocks.1.mlp.fc2", "blocks.1.attn.out_proj"]


@pytest.mark.parametrize("rank", [4, 32])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_merge_equals_comfyui_formula(base, rank, dtype):
    d, base_path = base
    g = torch.Generator().manual_seed(rank)
    files, patches = [], {}
    for i, (style, strength, alpha) in enumerate([(("lora_up.weight", "lora_down.weight"), 0.8, 16.0),
                                                  (("lora_B.weight", "lora_A.weight"), -0.35, None)]):
        tensors = {}
        for layer in LAYERS:
            w, _ = read_tensor(base_path, layer + ".weight")
            up = (torch.randn(w.shape[0], rank, generator=g) * 0.05).to(torch.bfloat16)
            down = (torch.randn(rank, w.shape[1], generator=g) * 0.05).to(torch.bfloat16)
            prefix = "diffusion_model." + layer if i == 0 else "lora_unet_" + layer.replace(".", "_")
            tensors[prefix + "." + style[0]] = up
            tensors[prefix + "." + style[1]] = down
            if alpha is not None:
                tensors[prefix + ".alpha"] = torch.tensor(alpha)
            patches.setdefault(layer, []).append((up, down, alpha, strength))
        path = str(d / f"l{i}_{rank}_{dtype}.safetensors")
        write_safetensors(path, tensors)
        files.append(f"{path}:{strength}")
    out = str(d / f"merged_{rank}_{dtype}.safetensors")
    cmd = [TOOL, "merge-lora", "--model", base_path, "-o", out, "--lora-dtype", dtype, "-q"]
    for f in files:
        cmd += ["--lora", f]
    subprocess.run(cmd, check=True, capture_output=True)
    T = torch.float32 if dtype == "f32" else torch.float16
    total = differ = 0
    for layer in LAYERS:
        w, _ = read_tensor(base_path, layer + ".weight")
        got, meta = read_tensor(out, layer + ".weight")
        want = comfy_merge_cast_time(w, patches[layer]) if dtype == "bf16" else comfy_merge(w, patches[layer], T)
        if dtype == "bf16":  # the cast-time path is a different merge: most values move
            f32 = comfy_merge(w, patches[layer], torch.float32)
            assert (want.view(torch.int16) != f32.view(torch.int16)).float().mean() > 0.01
        assert (got.view(torch.int16) != w.view(torch.int16)).float().mean() > 0.5, "the LoRA changed nothing"
        differ += int((got.view(torch.int16) != want.view(torch.int16)).sum())
        total += w.numel()
    assert "layerstream.lora" in meta
    print(f"rank {rank} {dtype}: {differ} of {total} merged bf16 values differ from torch's formula")
    # Rank 4: torch's mm sums 4 products in order, so the bytes agree exactly. Larger ranks:
    # at most a last-bit difference of the fp32 product, visible after bf16 rounding rarely.
    if rank <= 4:
        assert differ == 0
    else:
        assert differ <= total * 1e-3


def test_unpatched_tensors_keep_their_bytes(base):
    d, base_path = base
    w, _ = read_tensor(base_path, "blocks.1.mlp.fc2.weight")
    up = torch.ones(w.shape[0], 2, dtype=torch.bfloat16) * 0.01
    down = torch.ones(2, w.shape[1], dtype=torch.bfloat16) * 0.01
    lp = str(d / "one.safetensors")
    write_safetensors(lp, {"blocks.1.mlp.fc2.lora_up.weight": up, "blocks.1.mlp.fc2.lora_down.weight": down})
    out = str(d / "one_merged.safetensors")
    subprocess.run([TOOL, "merge-lora", "--model", base_path, "--lora", lp, "-o", out, "-q"], check=True,
                   capture_output=True)
    for name in ["blocks.0.mlp.fc2.weight", "final_layer.video_out.weight", "blocks.1.norm1.weight"]:
        a, _ = read_tensor(base_path, name)
        b, _ = read_tensor(out, name)
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a, b.view(torch.uint8) if b.dtype != torch.float32 else b)


def test_refusals_name_the_problem(base):
    d, base_path = base
    lp = str(d / "bad.safetensors")
    write_safetensors(lp, {"blocks.7.mlp.fc2.lora_up.weight": torch.zeros(4, 2),
                           "blocks.7.mlp.fc2.lora_down.weight": torch.zeros(2, 4)})
    r = subprocess.run([TOOL, "merge-lora", "--model", base_path, "--lora", lp, "-o", str(d / "x.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "matches no layer" in r.stderr
    assert not os.path.exists(str(d / "x.safetensors"))
    r = subprocess.run([TOOL, "merge-lora", "--model", base_path, "--lora", lp, "--lora-dtype", "f64",
                        "-o", str(d / "x.safetensors")], capture_output=True, text=True)
    assert r.returncode == 2 and "f32, f16 or bf16" in r.stderr
