"""Synthetic LoRA files on a `make-model` checkpoint and the LoRA loader double, shared by
test_engine_bytes.py (CPU) and test_engine_gpu.py (CUDA)."""

import torch


def header(path):
    import json
    import struct
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n).decode("utf-8"))
    h.pop("__metadata__", None)
    return h


def lora_files(tmp_path, model_path):
    """Two synthetic LoRAs on the tiny model: A in kohya names with a bf16 alpha, a PEFT pair and
    a full diff; B in PEFT names (f16, no alpha) on a layer A patches too, a set on the layer A
    diffs (order-sensitive), and a bias diff when the model has a bias. Deltas are large enough
    to move the output."""
    from conftest import write_lora
    h = header(model_path)

    def shape(name):
        return h[name]["shape"]

    def r(*s, seed, scale=0.05, dtype=torch.bfloat16):
        return (scale * torch.randn(s, generator=torch.Generator().manual_seed(seed))).to(dtype)

    qkv, fc2, fc1 = "blocks.0.attn.qkv_proj", "blocks.1.mlp.fc2", "blocks.0.mlp.fc1"
    (qo, qi), (fo, fi), (f1o, f1i) = shape(qkv + ".weight"), shape(fc2 + ".weight"), shape(fc1 + ".weight")
    a = {"lora_unet_" + qkv.replace(".", "_") + ".lora_up.weight": r(qo, 4, seed=1),
         "lora_unet_" + qkv.replace(".", "_") + ".lora_down.weight": r(4, qi, seed=2),
         "lora_unet_" + qkv.replace(".", "_") + ".alpha": torch.tensor(2.0, dtype=torch.bfloat16),
         "diffusion_model." + fc2 + ".lora_B.weight": r(fo, 8, seed=3, dtype=torch.float32),
         "diffusion_model." + fc2 + ".lora_A.weight": r(8, fi, seed=4, dtype=torch.float32),
         fc1 + ".diff": r(f1o, f1i, seed=5, scale=0.01)}
    b = {qkv + ".lora_B.weight": r(qo, 2, seed=6, dtype=torch.float16),
         qkv + ".lora_A.weight": r(2, qi, seed=7, dtype=torch.float16),
         # a set after A's diff on fc1: the order of the files decides the weight
         fc1 + ".set_weight": r(f1o, f1i, seed=9, scale=0.05)}
    biases = sorted(k for k in h if k.startswith("blocks.") and k.endswith(".bias") and k[:-5] + ".weight" in h)
    if biases:
        b[biases[0][:-5] + ".diff_b"] = r(*shape(biases[0]), seed=8, scale=0.02)
    return write_lora(tmp_path / "lora_a.safetensors", a), write_lora(tmp_path / "lora_b.safetensors", b)


def load_loras(comfy, patcher, *files):
    for path, strength in files:
        patcher, _ = comfy.load_lora_for_models(patcher, None, comfy.read_safetensors(path), strength, 0.0)
    return patcher
