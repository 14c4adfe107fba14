#!/usr/bin/env python3
"""The PyTorch baseline for bench/bench_cuda_block.cpp: one H3 DiT block at real width
(D=5376, H=56, Dh=128, F=14336) in eager PyTorch the way ComfyUI runs it, timed twice:
with PyTorch's default attention choice and with ComfyUI's priority (FlashAttention
first, comfy_block_ms) (h3-model.md
§2.9-2.11: F.rms_norm, per-segment AdaLN modulation, F.linear, RMSNorm + split-half
RoPE on q/k, default scaled_dot_product_attention, addcmul gated residual, SwiGLU),
with synthetic weights of the same shapes. Times the block (median of --iters after
--warmup, CUDA events), SDPA alone (default and each explicit backend) and each GEMM
alone, and writes JSON.

Usage: python3 bench/pytorch_block.py --S 32768,111274 --json out.json
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

D, H, DH, I, FF, P = 5376, 56, 128, 7168, 14336, 48


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--S", default="32768")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, sd=1.0, mean=0.0):
        return (torch.randn(*shape, device=dev, generator=g) * sd + mean).to(bf)

    Wqkv, Wout = rnd(3 * I, D, sd=D ** -0.5), rnd(D, I, sd=I ** -0.5)
    Wfc1, Wfc2 = rnd(2 * FF, D, sd=D ** -0.5), rnd(D, FF, sd=FF ** -0.5)
    n1, n2, qn, kn = rnd(D, sd=0.1, mean=1), rnd(D, sd=0.1, mean=1), rnd(DH, sd=0.1, mean=1), rnd(DH, sd=0.1, mean=1)
    table = rnd(3, 6, D, sd=0.1)  # [row, (shift,scale,gate) x (msa,mlp), D]

    def modulate(h, segs, c):
        for a, b, r in segs:
            h[a:b].mul_(1 + table[r, c + 1]).add_(table[r, c])

    def gate_add(x, y, segs, c):
        for a, b, r in segs:
            x[a:b].addcmul_(y[a:b], table[r, c])

    def norm_rope(t, w, cos, sin):
        t = F.rms_norm(t, (DH,), w, 1e-5)
        x0, x1 = t[..., :P], t[..., P:2 * P]
        return torch.cat([cos * x0 - sin * x1, sin * x0 + cos * x1, t[..., 2 * P:]], dim=-1)

    def block(x, segs, cos, sin):
        S = x.shape[0]
        h = F.rms_norm(x, (D,), n1, 1e-5)
        modulate(h, segs, 0)
        qkv = F.linear(h, Wqkv)
        q, k, v = (qkv[:, i * I:(i + 1) * I].view(S, H, DH) for i in range(3))
        q, k = norm_rope(q, qn, cos, sin), norm_rope(k, kn, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
        o = o[0].transpose(0, 1).reshape(S, I)
        gate_add(x, F.linear(o, Wout), segs, 2)
        h = F.rms_norm(x, (D,), n2, 1e-5)
        modulate(h, segs, 3)
        u = F.linear(h, Wfc1)
        a = F.silu(u[:, :FF]) * u[:, FF:]
        gate_add(x, F.linear(a, Wfc2), segs, 5)
        return x

    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "iters": args.iters,
           "warmup": args.warmup, "timing": "CUDA events, median", "results": []}
    for S in [int(s) for s in args.S.split(",")]:
        x0 = rnd(S, D)
        segs = [(0, S - S // 100, 1), (S - S // 100, S, 2)]
        pos = (torch.arange(S, device=dev) % 4096).float()[:, None]
        inv = 10000.0 ** (-(torch.arange(P, device=dev) % 16).float() / 16)
        ang = pos * inv
        cos, sin = ang.cos().to(bf)[:, None, :], ang.sin().to(bf)[:, None, :]
        x = x0.clone()

        def run():
            x.copy_(x0)
            block(x, segs, cos, sin)

        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            block_ms = timed(run, args.warmup, args.iters)
        r = {"S": S, "block_ms": block_ms, "peak_bytes": torch.cuda.max_memory_allocated() - base}
        # ComfyUI's priority (h3-model.md §4): sdpa_kernel([FLASH, CUDNN, EFFICIENT, MATH],
        # set_priority=True), i.e. PyTorch's FlashAttention-2 for bf16, Dh 128, no mask.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        order = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        try:
            with torch.no_grad(), sdpa_kernel(order, set_priority=True):
                r["comfy_block_ms"] = timed(run, args.warmup, args.iters)
            r["comfy_peak_bytes"] = torch.cuda.max_memory_allocated() - base
        except Exception as e:  # set_priority missing in an older torch
            r["comfy_block_ms"] = None
            r["comfy_error"] = str(e)[:200]
        q, k, v = (rnd(S, H, DH).transpose(0, 1)[None] for _ in range(3))
        flops = 4.0 * S * S * DH * H
        r["sdpa_ms"] = timed(lambda: F.scaled_dot_product_attention(q, k, v), args.warmup, args.iters)
        r["sdpa_tflops"] = flops / r["sdpa_ms"] / 1e9
        for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            try:
                with sdpa_kernel([be]):
                    ms = timed(lambda: F.scaled_dot_product_attention(q, k, v), 1, args.iters)
                r[f"sdpa_{name}_tflops"] = flops / ms / 1e9
            except Exception as e:  # backend not available for these inputs
                r[f"sdpa_{name}_tflops"] = None
                r[f"sdpa_{name}_error"] = str(e)[:200]
        del q, k, v
        M = min(S, 16384)
        r["gemm_tflops"] = {}
        for name, Wt in [("qkv", Wqkv), ("out_proj", Wout), ("fc1", Wfc1), ("fc2", Wfc2)]:
            xin = rnd(M, Wt.shape[1])
            ms = timed(lambda: F.linear(xin, Wt), args.warmup, args.iters)
            r["gemm_tflops"][name] = 2.0 * M * Wt.shape[0] * Wt.shape[1] / ms / 1e9
        print(f"torch S={S}: block {block_ms:.1f} ms (ComfyUI priority {r['comfy_block_ms']}), sdpa {r['sdpa_ms']:.1f} ms {r['sdpa_tflops']:.0f} TFLOP/s "
              f"(flash {r['sdpa_flash_tflops']}, cudnn {r['sdpa_cudnn_tflops']}), "
              f"gemm {', '.join(f'{k} {v:.0f}' for k, v in r['gemm_tflops'].items())}, "
              f"peak {r['peak_bytes'] / 2**30:.2f} GiB", flush=True)
        out["results"].append(r)
        del x, x0
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
