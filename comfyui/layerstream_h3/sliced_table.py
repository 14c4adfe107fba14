"""Row-count thresholds of the kernels the comfy-sliced path runs (issue 18).

Slicing a token-wise op is exact when the kernel computes a row from that row alone, with a
reduction order that does not depend on how many rows it is given. Integer GEMMs are exact
by construction (int32 accumulation is associative; the activation scale is per row). Float
kernels are not: a library may pick another algorithm (split-K, split-KV, a GEMV) for a small
row count, which sums in another order. This table holds, per kernel, the smallest slice
(rows) at which the kernel was measured equal to the full-sequence product, and where that
number comes from. The planner (sliced.plan_slices) keeps every slice of an op at or above
the largest floor of the kernels the op runs; a short last slice is merged into the one
before it.

One table; every entry carries its measurement. Kinds of entry:
  "construction"  exact for every row count by how the kernel is built
  "measured"      measured equal to the full product for every slice >= min_rows
  "conservative"  not measured by itself; given the floor of the nearest measured kernel
  "unmeasured"    nothing known: slicing runs, but the run is "not guaranteed"
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Threshold:
    min_rows: int   # smallest slice (rows) the kernel may see; 1 = any slice
    kind: str       # construction | measured | conservative | unmeasured
    source: str     # where the number comes from


# The GPU numbers below were measured on one NVIDIA H200 with PyTorch 2.11 at the real H3
# widths (D 5376, 56 heads x 128, SwiGLU 14336), each slice of m rows compared with the same
# rows of the full product at S of about 38k (the measurement issue 18 quotes):
#   bf16 cuBLAS, qkv   [m, 5376] x [5376, 21504]: differs for m <= 8
#   bf16 cuBLAS, fc2   [m, 14336] x [14336, 5376]: differs for m <= 320
#   SDPA FlashAttention-2, m queries x S keys:    differs for m <= 192 (split-KV below that)
#   SDPA cuDNN attention:                          differs only at m = 1
#   int8 GEMMs (ConvRot int8, per-row activation scales): equal at every m
#     (comfy_kitchen's TensorWiseINT8Layout quantises activations with dynamic per-row
#     scales, or one static input_scale: a row's int8 values never depend on other rows)
# fc1 and out_proj were not listed separately; they get fc2's floor (the largest measured
# GEMM floor), which costs nothing at the default 8192-row slices.
# tests/comfyui/test_sliced_gpu.py re-measures every entry on the machine it runs on and
# prints the table; update the numbers here from its output when kernels or devices change.
GPU_DEVICE = "H200"
GPU_TORCH = "2.11"
GEMM_FLOOR_MEASURED = 321  # fc2: differs at m <= 320
# The fp32 output heads at full width, F.linear [m, 5376] x [5376, n] + bias, n = 96 (video,
# 4 x 24 channels) and 32 (audio), at S = 38,000 and S = 111,274 (issue 25;
# tools/device/comfyui_node.sh, bench/results/issue25): the video head differs from the full
# product for slices of up to 1024 rows, the audio head up to 4096; both equal at 8192, the next
# size tried (1, 2, 4, ... 4096, 8192 rows at offsets 0, 1000 and S - m). Head slices stay at or
# above 8192 rows.
HEAD_FLOOR_MEASURED = 8192

CUDA = {
    "gemm.bf16.qkv": Threshold(9, "measured", "H200 torch 2.11: cuBLAS differs at m <= 8"),
    "gemm.bf16.fc2": Threshold(GEMM_FLOOR_MEASURED, "measured", "H200 torch 2.11: cuBLAS differs at m <= 320"),
    "gemm.bf16.fc1": Threshold(GEMM_FLOOR_MEASURED, "conservative", "not measured alone; fc2's floor"),
    "gemm.bf16.out_proj": Threshold(GEMM_FLOOR_MEASURED, "conservative", "not measured alone; fc2's floor"),
    "gemm.int8": Threshold(1, "construction", "int32 accumulation, per-row activation scale (H200: equal at every m)"),
    "gemm.f32.head": Threshold(HEAD_FLOOR_MEASURED, "measured",
                               "H200 torch 2.11, fp32 heads at full width: cuBLAS differs at m <= 4096"),
    "gemm.other": Threshold(GEMM_FLOOR_MEASURED, "unmeasured", "weight format not measured"),
    "attention.sdpa.flash": Threshold(193, "measured", "H200 torch 2.11: FlashAttention-2 differs at m <= 192"),
    "attention.sdpa.cudnn": Threshold(2, "measured", "H200 torch 2.11: cuDNN attention differs only at m = 1"),
    "attention.other": Threshold(GEMM_FLOOR_MEASURED, "unmeasured", "attention backend not measured"),
    # Per-row kernels: a norm reduces inside one row, modulation / SwiGLU / gated add are
    # elementwise, the fused q/k RMSNorm + RoPE works per (token, head).
    "rowwise": Threshold(1, "construction", "reduces within one row or is elementwise (test_sliced_gpu.py checks)"),
}

# Measured on this project's CI machine: Debian 12 python3-torch 1.13.1 (x86-64, AVX2,
# BLAS_INFO=generic, MKL-DNN 2.6.3; the CI machine's thread count), by tests/comfyui/test_sliced.py's
# probe (TestCpuKernels): every slice of m = 1, 2, 3, 5, ... 513 rows at row offsets 0, 1 and
# S - m compared with the full product:
#   F.linear bf16 and fp32 (with and without bias), N x K from 64 x 64 to 1024 x 2048: equal
#   at every m; matmul/softmax attention (fp32 or bf16 scores): equal at every m;
#   silu * mul, addcmul (bf16): equal at every m;
#   an RMSNorm computed in fp32 (upcast, mean, rsqrt, one rounding): equal at every m;
#   BUT a bf16 x.pow(2).mean(-1) differs for many m (the CPU reduction vectorises across
#   rows), so only an fp32-internal norm is row-exact on the CPU.
CPU_TORCH = "1.13"
CPU = {
    "gemm.bf16.qkv": Threshold(1, "measured", "torch 1.13 CPU: equal at every m"),
    "gemm.bf16.fc2": Threshold(1, "measured", "torch 1.13 CPU: equal at every m"),
    "gemm.bf16.fc1": Threshold(1, "measured", "torch 1.13 CPU: equal at every m"),
    "gemm.bf16.out_proj": Threshold(1, "measured", "torch 1.13 CPU: equal at every m"),
    "gemm.int8": Threshold(1, "construction", "integer accumulation, per-row activation scale"),
    "gemm.f32.head": Threshold(1, "measured", "torch 1.13 CPU: fp32 F.linear equal at every m"),
    "gemm.other": Threshold(1, "unmeasured", "weight format not measured"),
    "attention.cpu.math": Threshold(1, "measured", "torch 1.13 CPU: matmul + softmax equal at every m"),
    "attention.other": Threshold(1, "unmeasured", "attention backend not measured on the CPU"),
    "rowwise": Threshold(1, "measured", "torch 1.13 CPU: fp32-internal norm, elementwise ops equal at every m"),
}


def table_for(device_type, torch_version, device_name=""):
    """(table, note): the entries for this device and whether they were measured on it.
    note is "" when the table's measurement applies, else why it may not."""
    if device_type == "cuda":
        notes = []
        if GPU_DEVICE not in device_name:
            notes.append(f"table measured on an {GPU_DEVICE}, this is {device_name or 'another GPU'}")
        if not torch_version.startswith(GPU_TORCH):
            notes.append(f"table measured with torch {GPU_TORCH}, this is {torch_version}")
        return CUDA, "; ".join(notes)
    if device_type == "cpu":
        note = "" if torch_version.startswith(CPU_TORCH) else \
            f"CPU table measured with torch {CPU_TORCH}, this is {torch_version}"
        return CPU, note
    return {}, f"no table for device type {device_type}"


def lookup(table, key):
    """The entry for key; an unknown key reads as unmeasured with the conservative floor."""
    if key in table:
        return table[key]
    family = key.split(".")[0]
    other = table.get(f"{family}.other")
    if other is not None:
        return other
    return Threshold(GEMM_FLOOR_MEASURED, "unmeasured", f"{key}: no entry")
