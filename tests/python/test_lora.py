"""LoRAs through the Python API (Engine(loras=...)): the bytes of `layerstream forward --lora`,
another output than without, and the engine's messages for bad LoRAs."""
import subprocess

import numpy as np
import pytest

import layerstream
from conftest import FRAMES, HEIGHT, SIGMA, TOKENS, WIDTH, run_forward, tool, write_safetensors


@pytest.fixture(scope="module")
def files(tmp_path_factory, inputs):
    d = tmp_path_factory.mktemp("lora")
    model = d / "tiny.safetensors"
    subprocess.run([tool(), "make-model", "--preset", "tiny", "-q", "-o", str(model)], check=True)
    rng = np.random.default_rng(7)
    # tiny: mlp.fc2 is [hidden 128, ffn 256]
    lora = d / "lora.safetensors"
    write_safetensors(lora, {
        "diffusion_model.blocks.0.mlp.fc2.lora_up.weight": rng.standard_normal((128, 4)).astype(np.float32) * 0.1,
        "diffusion_model.blocks.0.mlp.fc2.lora_down.weight": rng.standard_normal((4, 256)).astype(np.float32) * 0.1,
        "diffusion_model.blocks.0.mlp.fc2.alpha": np.array(2.0, dtype=np.float32),
    })
    video, audio, text = inputs
    write_safetensors(d / "inputs.safetensors", {"video": video, "audio": audio, "text": text})
    return d, model, lora


def cli_args(model, inputs_file):
    return ["--model", model, "--frames", FRAMES, "--width", WIDTH, "--height", HEIGHT, "--text-tokens", TOKENS,
            "--sigma", SIGMA, "--inputs", inputs_file]


def test_lora_matches_cli_and_changes_the_output(files, clip, inputs):
    d, model, lora = files
    video, audio, text = inputs
    want, _ = run_forward(cli_args(model, d / "inputs.safetensors") + ["--lora", f"{lora}:0.5"])
    plain, _ = run_forward(cli_args(model, d / "inputs.safetensors"))
    assert want != plain
    for loras in ([f"{lora}:0.5"], [(str(lora), 0.5)]):
        e = layerstream.Engine(model=str(model), loras=loras)
        e.denoise(clip, video, audio, SIGMA, text=text)
        assert e.output_hash == want
        assert "1 LoRA" in e.report()["weights"] and "merged in f32" in e.report()["weights"]
    # Sliced engine, same bytes.
    e = layerstream.Engine(model=str(model), loras=[(str(lora), 0.5)], mlp_chunk=7, attn_chunk=5, kv_offload=True)
    e.denoise(clip, video, audio, SIGMA, text=text)
    assert e.output_hash == want


def test_bad_loras_raise_the_engines_message(files):
    d, model, lora = files
    with pytest.raises(layerstream.Error, match="absent.safetensors"):
        layerstream.Engine(model=str(model), loras=[str(d / "absent.safetensors")])
    bad = d / "bad.safetensors"
    write_safetensors(bad, {"blocks.9.mlp.fc2.lora_up.weight": np.zeros((128, 2), np.float32),
                            "blocks.9.mlp.fc2.lora_down.weight": np.zeros((2, 256), np.float32)})
    with pytest.raises(layerstream.Error, match="matches no layer"):
        layerstream.Engine(model=str(model), loras=[str(bad)])
    with pytest.raises(layerstream.Error, match="lora_dtype"):
        layerstream.Engine(model=str(model), loras=[str(lora)], lora_dtype="f64")
