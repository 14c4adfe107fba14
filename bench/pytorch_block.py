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

With --from DIR the weights and inputs are exactly LayerStream's: DIR is what
`bench_cuda_block --dump DIR --S <S>` wrote (tensor names, shapes and the block's math
are listed in that file's header): weights.safetensors, and io_S<S>.safetensors for
every --S (x0, rows -> AdaLN segments, rope (cos, sin) pairs, and y, LayerStream's
stock block output). After the timings, the error of the block output against a float64
reference (DESIGN.md §4: at most 2x a plain same-precision implementation's):
  rows   --sample-rows R query rows (default 2048): R - R/16 spread evenly over [0, S-1]
         (both ends included) plus R/16 spread over the audio rows (table row 2).
  fp64   the block from the same bf16 weights and inputs with no rounding anywhere
         (fp64 norms, modulation, GEMMs, RoPE, exact softmax, SwiGLU, residual): K and V
         of all S tokens in fp64 (2*S*I*8 bytes, 12.8 GB at S = 111k), the sampled
         queries in chunks of 128 (fp64 scores [H, 128, S], 6.4 GB at S = 111k); the
         fp64 weights add 3.1 GB. The PyTorch block's buffers are freed first.
  metric for y in (LayerStream's y, PyTorch default, ComfyUI priority) at those rows:
         delta rel L2 = |y - ref| / |ref - x0| (the block's update, what the block
         computes; the residual's bf16 rounding alone is reported as the floor),
         out rel L2 = |y - ref| / |ref|, max abs = max |y - ref|; and LayerStream
         against PyTorch directly (|y_ours - y_pt| / |y_pt - x0|). With the bench's
         weights the update is ~6 % of |x|, so the floor is most of every error:
         sqrt(err^2 - floor^2), what each adds above it, is reported too.
  rule   delta rel L2 of ours / PyTorch default <= 2; exit status 1 when it fails.
Numbers go to results[i]["error"].

Usage: python3 bench/pytorch_block.py --S 32768,111274 --json out.json
       python3 bench/pytorch_block.py --from DIR --S 111274 [--sample-rows 2048] --json out.json
       (--device cpu: checks the script at small S on a machine without a GPU; host
       times, no memory peaks)
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

D, H, DH, I, FF, P = 5376, 56, 128, 7168, 14336, 48

ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
             "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}


def read_safetensors(path):
    """({name: CPU tensor}, metadata) of a safetensors file: u64 little-endian header
    length N, N bytes of JSON {name: {dtype, shape, data_offsets: [a, b]}}, then the data
    (offsets relative to its start). Plain file reads, no `safetensors` package."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", {})
        out = {}
        for name, e in header.items():
            a, b = e["data_offsets"]
            buf = bytearray(b - a)
            f.seek(8 + n + a)
            view, got = memoryview(buf), 0
            while got < len(buf):
                k = f.readinto(view[got:])
                if not k:
                    raise ValueError(f"{path}: tensor {name} is cut short")
                got += k
            dt = ST_DTYPES[e["dtype"]]
            t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
            out[name] = t.reshape(e["shape"])
    return out, meta


def segments(rows):
    """AdaLN segments (a, b, table row) of consecutive equal rows[i] (i32 [S])."""
    r = rows.tolist()
    segs, a = [], 0
    for i in range(1, len(r) + 1):
        if i == len(r) or r[i] != r[a]:
            segs.append((a, i, r[a]))
            a = i
    return segs


def sample_rows(rows, R):
    """Sorted query rows for the error check: R - R/16 spread evenly over [0, S-1] (ends
    included) plus R/16 spread over the audio rows (rows == 2); all rows when R >= S."""
    S = rows.numel()
    if R >= S:
        return torch.arange(S)
    main = torch.linspace(0, S - 1, R - R // 16, dtype=torch.float64).round().long()
    audio = (rows == 2).nonzero().flatten()
    if audio.numel():
        pick = torch.linspace(0, audio.numel() - 1, min(R // 16, audio.numel()), dtype=torch.float64).round().long()
        audio = audio[pick]
    return torch.unique(torch.cat([main, audio]))


def reference_fp64(W, x0, rows, rope, idx, kv_rows=4096, q_rows=128):
    """The block in float64 at rows idx, from the bf16 weights W, x0 [S, D], rows [S]
    (long) and rope [S, P, 2] (all on one device), with no rounding anywhere."""
    d, dev, S = torch.float64, x0.device, x0.shape[0]
    W = {k: v.to(d) for k, v in W.items()}
    tab = W["table"].view(3, 6, D)
    cos, sin = rope[..., 0].to(d)[:, None, :], rope[..., 1].to(d)[:, None, :]  # [S, 1, P]

    def norm_mod(x, w, r, c):  # shift = chunk c, scale = chunk c + 1 of table row r
        h = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w
        return h * (1 + tab[r, c + 1]) + tab[r, c]

    def norm_rope(t, w, c, s):  # t [n, H, DH]; split-half over dims [0, 2P)
        t = t * torch.rsqrt(t.square().mean(-1, keepdim=True) + 1e-5) * w
        t0, t1 = t[..., :P], t[..., P:2 * P]
        return torch.cat([c * t0 - s * t1, s * t0 + c * t1, t[..., 2 * P:]], dim=-1)

    K = torch.empty(H, S, DH, dtype=d, device=dev)
    V = torch.empty(H, S, DH, dtype=d, device=dev)
    for a in range(0, S, kv_rows):
        e = min(S, a + kv_rows)
        kv = F.linear(norm_mod(x0[a:e].to(d), W["norm1"], rows[a:e], 0), W["qkv"][I:])  # [n, 2I]
        K[:, a:e] = norm_rope(kv[:, :I].view(-1, H, DH), W["k_norm"], cos[a:e], sin[a:e]).transpose(0, 1)
        V[:, a:e] = kv[:, I:].view(-1, H, DH).transpose(0, 1)
        del kv
    out = []
    for a in range(0, idx.numel(), q_rows):
        ii = idx[a:a + q_rows]
        x, r = x0[ii].to(d), rows[ii]
        q = F.linear(norm_mod(x, W["norm1"], r, 0), W["qkv"][:I]).view(-1, H, DH)
        q = norm_rope(q, W["q_norm"], cos[ii], sin[ii]).transpose(0, 1)  # [H, n, DH]
        s = torch.matmul(q, K.transpose(1, 2)).mul_(DH ** -0.5)  # [H, n, S]
        s.sub_(s.amax(-1, keepdim=True)).exp_()
        o = torch.matmul(s, V).div_(s.sum(-1, keepdim=True))  # [H, n, DH]
        del s
        x = x + F.linear(o.transpose(0, 1).reshape(-1, I), W["out"]) * tab[r, 2]
        u = F.linear(norm_mod(x, W["norm2"], r, 3), W["fc1"])
        x = x + F.linear(F.silu(u[:, :FF]) * u[:, FF:], W["fc2"]) * tab[r, 5]
        out.append(x)
    return torch.cat(out)


def errors(y, ref, x0):
    """Distances of a result y [R, D] from the fp64 reference ref at the same rows."""
    diff = y.to(torch.float64) - ref
    return {"delta_rel_l2": (diff.norm() / (ref - x0).norm()).item(),
            "out_rel_l2": (diff.norm() / ref.norm()).item(),
            "max_abs": diff.abs().max().item()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--S", default="32768")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--from", dest="from_dir", default="",
                    help="weights and inputs from bench_cuda_block --dump DIR; then the error vs fp64")
    ap.add_argument("--sample-rows", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev, bf = args.device, torch.bfloat16
    cuda = dev.startswith("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def timed(fn, warmup, iters):
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(iters):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        return ts[len(ts) // 2]

    def mark():  # start of a peak measurement: bytes allocated now
        if not cuda:
            return 0
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak(base):
        return torch.cuda.max_memory_allocated() - base if cuda else None

    def free():
        if cuda:
            torch.cuda.empty_cache()

    def rnd(*shape, sd=1.0, mean=0.0):
        return (torch.randn(*shape, device=dev, generator=g) * sd + mean).to(bf)

    if args.from_dir:
        wf, wmeta = read_safetensors(os.path.join(args.from_dir, "weights.safetensors"))
        want = {"norm1": (D,), "norm2": (D,), "q_norm": (DH,), "k_norm": (DH,), "qkv": (3 * I, D), "out": (D, I),
                "fc1": (2 * FF, D), "fc2": (D, FF), "table": (3, 6 * D)}
        for k, shape in want.items():
            if k not in wf or tuple(wf[k].shape) != shape or wf[k].dtype != bf:
                sys.exit(f"pytorch_block: weights.safetensors: {k} must be bf16 {list(shape)}")
        Wb = {k: wf[k].to(dev) for k in want}  # bf16, as dumped
        del wf
        Wqkv, Wout, Wfc1, Wfc2 = Wb["qkv"], Wb["out"], Wb["fc1"], Wb["fc2"]
        n1, n2, qn, kn = Wb["norm1"], Wb["norm2"], Wb["q_norm"], Wb["k_norm"]
        table = Wb["table"].view(3, 6, D)  # [row, (shift,scale,gate) x (msa,mlp), D]
    else:
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

    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else dev, "iters": args.iters,
           "warmup": args.warmup, "timing": "CUDA events, median" if cuda else "host clock, median", "results": []}
    if args.from_dir:
        out["from"] = {"dir": args.from_dir, "weights_metadata": wmeta}
    failed = False
    for S in [int(s) for s in args.S.split(",")]:
        if args.from_dir:
            io, iometa = read_safetensors(os.path.join(args.from_dir, f"io_S{S}.safetensors"))
            want = {"rows": ((S,), torch.int32), "x0": ((S, D), bf), "rope": ((S, P, 2), bf), "y": ((S, D), bf)}
            for k, (shape, dt) in want.items():
                if k not in io or tuple(io[k].shape) != shape or io[k].dtype != dt:
                    sys.exit(f"pytorch_block: io_S{S}.safetensors: {k} must be {dt} {list(shape)}")
            rows = io["rows"]
            segs = segments(rows)
            idx = sample_rows(rows, args.sample_rows)
            y_ours = io["y"][idx]  # bf16 [R, D], host
            x0, rope = io["x0"].to(dev), io["rope"].to(dev)
            del io
            cos, sin = rope[..., 0].contiguous()[:, None, :], rope[..., 1].contiguous()[:, None, :]  # bf16 [S, 1, P]
        else:
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

        base = mark()
        with torch.no_grad():
            block_ms = timed(run, args.warmup, args.iters)
        r = {"S": S, "block_ms": block_ms, "peak_bytes": peak(base)}
        y_pt = x[idx.to(dev)].cpu() if args.from_dir else None  # x holds the last run's output
        y_comfy = None
        # ComfyUI's priority (h3-model.md §4): sdpa_kernel([FLASH, CUDNN, EFFICIENT, MATH],
        # set_priority=True), i.e. PyTorch's FlashAttention-2 for bf16, Dh 128, no mask.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        order = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        base = mark()
        try:
            with torch.no_grad(), sdpa_kernel(order, set_priority=True):
                r["comfy_block_ms"] = timed(run, args.warmup, args.iters)
            r["comfy_peak_bytes"] = peak(base)
            y_comfy = x[idx.to(dev)].cpu() if args.from_dir else None
        except Exception as e:  # set_priority missing in an older torch
            r["comfy_block_ms"] = None
            r["comfy_error"] = str(e)[:200]
        del x
        free()
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
        del xin
        free()
        peak_text = f"{r['peak_bytes'] / 2**30:.2f} GiB" if cuda else "n/a"
        print(f"torch S={S}: block {block_ms:.1f} ms (ComfyUI priority {r['comfy_block_ms']}), sdpa {r['sdpa_ms']:.1f} ms {r['sdpa_tflops']:.0f} TFLOP/s "
              f"(flash {r['sdpa_flash_tflops']}, cudnn {r['sdpa_cudnn_tflops']}), "
              f"gemm {', '.join(f'{k} {v:.0f}' for k, v in r['gemm_tflops'].items())}, "
              f"peak {peak_text}", flush=True)
        if args.from_dir:
            t0 = time.perf_counter()
            base = mark()
            with torch.no_grad():
                ref = reference_fp64(Wb, x0, rows.long().to(dev), rope, idx.to(dev)).cpu()
            ref_s = time.perf_counter() - t0
            x0s = x0[idx.to(dev)].cpu().to(torch.float64)
            e = {"sample_rows": idx.numel(), "audio_rows_sampled": int((rows[idx] == 2).sum()),
                 "reference": "float64 block from the same bf16 weights and inputs, no intermediate rounding",
                 "reference_seconds": ref_s, "reference_peak_bytes": peak(base),
                 "ours": errors(y_ours, ref, x0s), "pytorch": errors(y_pt, ref, x0s),
                 "comfy": errors(y_comfy, ref, x0s) if y_comfy is not None else None,
                 "bf16_rounding_floor": errors(ref.to(bf), ref, x0s),
                 "ours_vs_pytorch_delta_rel_l2":
                     ((y_ours.double() - y_pt.double()).norm() / (y_pt.double() - x0s).norm()).item()}
            if y_comfy is not None:
                e["ours_vs_comfy_delta_rel_l2"] = \
                    ((y_ours.double() - y_comfy.double()).norm() / (y_comfy.double() - x0s).norm()).item()
            e["ratio_ours_over_pytorch"] = e["ours"]["delta_rel_l2"] / e["pytorch"]["delta_rel_l2"]
            # The floor is part of every bf16 result's error; what each adds on top of it,
            # sqrt(err^2 - floor^2) (independent errors), shows a difference the floor dilutes.
            fl = e["bf16_rounding_floor"]["delta_rel_l2"]
            e["delta_rel_l2_above_floor"] = {k: math.sqrt(max(0.0, e[k]["delta_rel_l2"] ** 2 - fl ** 2))
                                             for k in ("ours", "pytorch", "comfy") if e[k] is not None}
            if y_comfy is not None:
                e["ratio_ours_over_comfy"] = e["ours"]["delta_rel_l2"] / e["comfy"]["delta_rel_l2"]
            e["rule"] = "delta rel L2: ours <= 2 x PyTorch default (DESIGN.md §4)"
            e["pass"] = e["ratio_ours_over_pytorch"] <= 2.0
            failed |= not e["pass"]
            r["error"] = e
            del ref
            free()
            c = f", ComfyUI {e['comfy']['delta_rel_l2']:.2e}" if y_comfy is not None else ""
            print(f"error vs fp64 (delta rel L2, {idx.numel()} rows): ours {e['ours']['delta_rel_l2']:.2e}, "
                  f"PyTorch default {e['pytorch']['delta_rel_l2']:.2e}{c} (bf16 rounding of the exact output "
                  f"alone {e['bf16_rounding_floor']['delta_rel_l2']:.2e}); ratio ours/PyTorch "
                  f"{e['ratio_ours_over_pytorch']:.2f} (rule: <= 2): {'PASS' if e['pass'] else 'FAIL'}", flush=True)
            print(f"  out rel L2: ours {e['ours']['out_rel_l2']:.2e}, PyTorch {e['pytorch']['out_rel_l2']:.2e}; "
                  f"max abs: ours {e['ours']['max_abs']:.3g}, PyTorch {e['pytorch']['max_abs']:.3g}; "
                  f"ours vs PyTorch (delta rel L2) {e['ours_vs_pytorch_delta_rel_l2']:.2e}; above the floor: "
                  f"ours {e['delta_rel_l2_above_floor']['ours']:.2e}, PyTorch {e['delta_rel_l2_above_floor']['pytorch']:.2e}; "
                  f"fp64 reference {ref_s:.1f} s", flush=True)
        out["results"].append(r)
        del x0
        free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
