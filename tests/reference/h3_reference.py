#!/usr/bin/env python3
"""PyTorch reference for LayerStream's golden files (tests/data/golden).

An independent implementation, written from docs/h3-model.md (shared/docs), of
  (a) every op of src/backend/backend.h with the rounding points of h3-model.md §3, and
  (b) the full MiniMax H3 denoiser forward (text refiner, time embedding or AdaLN curve,
      packed layout + RoPE, DiT blocks, final layer, audio carry transform, masks)
for tiny configurations with seeded random weights under the real key names (§1.3).

Every computation runs twice:
  * "bf16" mode: what ComfyUI computes on a GPU (bf16 activations, cuBLAS GEMMs with fp32
    accumulation, fp32 islands with TF32 OFF, SDPA = FlashAttention-2 where available),
    following every rounding point of h3-model.md §2-§3;
  * "exact" mode: the same formulas in float64 with no rounding at all.
The exact result lets the C++ tests bound their error the FlashAttention way (DESIGN.md
§4): err(LayerStream, exact) <= 2 * err(PyTorch, exact) + a small floor.

Output (all written with the `safetensors` package; metadata on every file):
  ops_v1.safetensors                 per op case: inputs, "<case>.out" (PyTorch, bf16 mode)
                                     and "<case>.exact" (float64)
  h3_golden_tiny.safetensors         tiny unpruned model: model tensors only, bare keys,
                                     declared dtypes (a normal checkpoint)
  h3_golden_tiny_curve.safetensors   the same config in the pruned / AdaLN-curve form
  forward_v1_<case>.safetensors      inputs, named intermediates, velocities, and the
                                     same names under "exact." (float64 math, stored f32)

Regenerate (on a machine with a CUDA GPU, PyTorch and safetensors):
  python3 tests/reference/h3_reference.py --out tests/data/golden
It also runs on the CPU (--device cpu, any PyTorch >= 1.13) for a dry run; the files
then record device "cpu" and are NOT the committed golden data.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

GOLDEN_FORMAT = "1"
GENERATOR = "tests/reference/h3_reference.py"
REGENERATE = "python3 tests/reference/h3_reference.py --out tests/data/golden"
EPS = 1e-5

# Which attention kernel bf16 SDPA really used ("flash", "default", "math-fallback").
ATTN_BACKENDS = set()


# ---------------------------------------------------------------------------------------
# fp32 / bf16 scalar helpers (host-side scalars follow fp32 arithmetic exactly: an IEEE
# op on two fp32 values computed in double and rounded once to fp32 is correctly rounded)
# ---------------------------------------------------------------------------------------
def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def bf16_scalar(x):
    return float(torch.tensor([f32(x)], dtype=torch.float32).to(torch.bfloat16).float()[0])


class Prec:
    """Numerics mode. bf16: activations bf16, fp32 islands fp32. exact: float64 everywhere."""

    def __init__(self, exact):
        self.exact = exact
        self.lo = torch.float64 if exact else torch.bfloat16  # activation dtype
        self.f32 = torch.float64 if exact else torch.float32  # fp32 islands / op internals

    def fp32(self, x):  # a host fp32 scalar (exact mode: unrounded)
        return float(x) if self.exact else f32(x)


BF16 = Prec(False)
EXACT = Prec(True)


# ---------------------------------------------------------------------------------------
# Ops (backend.h), each with its rounding points.  Shapes PyTorch-order.
# ---------------------------------------------------------------------------------------
def op_gemm(x, w, b=None):
    """out = x @ w^T (+ b). bf16: cuBLAS, fp32 accumulate, one rounding (bias added in
    fp32 inside the epilogue/beta term). fp32: TF32 off (set globally)."""
    return F.linear(x, w.to(x.dtype), None if b is None else b.to(x.dtype))


def op_rms_norm(x, w, eps, P):
    """bf16 [M, D] -> bf16( x * rsqrt(mean(x^2) + eps) * w ): fp32 inside, ONE rounding
    (the fused single-rounding form of h3-model.md §3.2)."""
    xf = x.to(P.f32)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r * w.to(P.f32)).to(P.lo)


def op_modulate(h, shift, scale, rows, P):
    """h bf16 [M, D]; shift/scale tables [R, D] (bf16, or f32 cast to bf16 first);
    rows long [M]. sc = bf16(1 + bf16(scale)); out = bf16(bf16(h * sc) + bf16(shift))."""
    sc = 1 + scale.to(P.lo)  # bf16 add, rounded
    out = h * sc[rows]  # rounded
    return out + shift.to(P.lo)[rows]  # rounded


def op_modulate_f32(h, shift, scale, rows, P):
    """f32 tables (pruned final layer): out = fl32(fl32(h * (1 + scale)) + shift)."""
    sc = 1 + scale.to(P.f32)
    return h.to(P.f32) * sc[rows] + shift.to(P.f32)[rows]


def op_gated_add(x, y, gate, rows, P):
    """x + y * bf16(gate[rows]) with one rounding (torch.addcmul: fp32 opmath)."""
    return torch.addcmul(x, y, gate.to(P.lo)[rows])


def op_add(x, y):
    return x + y


def op_qk_norm_rope(x, w, rope, eps, P):
    """x bf16 [M, H, Dh]; w bf16 [Dh]; rope None or bf16 [M, P, 2] (cos, sin).
    rrms = rsqrt(sum_d x_d^2 / Dh + eps) (fp32); n = bf16(x * rrms * w) (one rounding);
    split-half partial RoPE on dims [0, 2P): pairs (j, j + P):
      out_j = bf16(c*n_j - s*n_{j+P}), out_{j+P} = bf16(s*n_j + c*n_{j+P}) (fp32 math);
    dims >= 2P keep n."""
    dh = x.shape[-1]
    xf = x.to(P.f32)
    rrms = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / dh + eps)
    n = (xf * rrms * w.to(P.f32)).to(P.lo)
    if rope is None:
        return n
    npairs = rope.shape[1]
    c = rope[:, :, 0].to(P.f32)[:, None, :]  # [M, 1, P]
    s = rope[:, :, 1].to(P.f32)[:, None, :]
    x0 = n[..., :npairs].to(P.f32)
    x1 = n[..., npairs:2 * npairs].to(P.f32)
    y0 = (c * x0 - s * x1).to(P.lo)
    y1 = (s * x0 + c * x1).to(P.lo)
    return torch.cat([y0, y1, n[..., 2 * npairs:]], dim=-1)


def op_swiglu(u, P):
    """u bf16 [M, 2F] (gate first): bf16( bf16(silu(gate)) * up )."""
    f = u.shape[-1] // 2
    return F.silu(u[:, :f]) * u[:, f:]


def op_silu(x):
    return F.silu(x)


def op_time_embedding(t, n, P):
    """t f32 [M] -> f32 [M, n]: half = n/2, freq_j = exp(-ln(10000) * j / half),
    arg = t * freq, [cos(arg), sin(arg)] (cos first)."""
    half = n // 2
    j = torch.arange(half, dtype=P.f32, device=t.device)
    freq = torch.exp(-math.log(10000.0) * j / half)
    arg = t.to(P.f32)[:, None] * freq[None, :]
    return torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1)


def _sdpa_math(q, k, v, scale):
    # [H, Mq, Dh] x [H, Mk, Dh]: plain softmax attention in the inputs' dtype.
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(s, dim=-1), v)


def op_attention(q, k, v, P, scale=None):
    """q [Mq, H, Dh], k/v [Mk, H, Dh] -> [Mq, H, Dh]; full bidirectional attention,
    scale 1/sqrt(Dh). bf16: torch SDPA (FlashAttention-2 on CUDA: fp32 online softmax,
    P rounded to bf16 before P.V, bf16 out). exact: float64 softmax."""
    dh = q.shape[-1]
    sc = 1.0 / math.sqrt(dh) if scale is None else scale
    qh, kh, vh = (t.transpose(0, 1) for t in (q, k, v))  # [H, M, Dh] views
    if P.exact:
        return _sdpa_math(qh, kh, vh, sc).transpose(0, 1)
    if not hasattr(F, "scaled_dot_product_attention"):
        # Old PyTorch (dry runs only): fp32 softmax, bf16 P, bf16 out.
        ATTN_BACKENDS.add("math-fallback")
        s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * sc
        p = torch.softmax(s, dim=-1).to(torch.bfloat16).float()
        return torch.matmul(p, vh.float()).to(torch.bfloat16).transpose(0, 1)
    # [1, H, M, Dh]. Made contiguous so every SDPA build accepts them for the flash kernel
    # (its arithmetic does not depend on strides; ComfyUI passes strided views).
    q4, k4, v4 = (t.unsqueeze(0).contiguous() for t in (qh, kh, vh))
    kw = {} if scale is None else {"scale": scale}
    out = None
    if q.is_cuda:
        try:
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                ctx = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
            except ImportError:  # PyTorch < 2.3
                ctx = torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
            with ctx:
                out = F.scaled_dot_product_attention(q4, k4, v4, **kw)
            ATTN_BACKENDS.add("flash")
        except Exception as e:  # noqa: BLE001 - record and fall back
            print(f"note: flash SDPA unavailable ({type(e).__name__}: {e}); default SDPA", file=sys.stderr)
            out = None
    if out is None:
        out = F.scaled_dot_product_attention(q4, k4, v4, **kw)
        ATTN_BACKENDS.add("default")
    return out[0].transpose(0, 1)


# ---------------------------------------------------------------------------------------
# Model configuration and weights
# ---------------------------------------------------------------------------------------
class Cfg:
    def __init__(self, **kw):
        self.hidden = 64
        self.num_layers = 2
        self.refiner_layers = 1
        self.heads = 3           # I = 96 != hidden 64, so a D/I mix-up cannot pass
        self.head_dim = 32
        self.ffn = 128
        self.latents = 24
        self.audio_latents = 32
        self.text_dim = 48
        self.timestep_input_dim = 32
        self.time_embed_hidden = 80
        self.time_embed_dim = 32
        self.rope_len = 4        # pairs 12, rot_dim 24 < head_dim 32 (partial rotation)
        self.curve_grid = 0      # > 0: pruned / curve form
        self.curve_k = 8
        self.pdd = 1             # > 1: a PDD head bank of this size on both heads (§2.12)
        self.__dict__.update(kw)

    @property
    def inner(self):
        return self.heads * self.head_dim

    @property
    def pairs(self):
        return 3 * self.rope_len

    @property
    def curve(self):
        return self.curve_grid > 0

    def to_json(self):
        return {k: v for k, v in self.__dict__.items()}


def tensor_specs(cfg):
    """(name, shape, dtype, init kind, fan_in) in h3-model.md §1.3 naming."""
    D, I, Fh, Dh = cfg.hidden, cfg.inner, cfg.ffn, cfg.head_dim
    f32_, bf = torch.float32, torch.bfloat16
    ada_dt = f32_ if cfg.curve else bf
    specs = []

    def add(name, shape, dtype, kind, fan=1):
        specs.append((name, tuple(shape), dtype, kind, fan))

    pv = 4 * cfg.latents
    add("video_patch_proj.weight", [D, pv], f32_, "lin", pv)
    add("video_patch_proj.bias", [D], f32_, "bias")
    add("audio_patch_proj.weight", [D, cfg.audio_latents], f32_, "lin", cfg.audio_latents)
    add("audio_patch_proj.bias", [D], f32_, "bias")
    add("condition_proj.weight", [D, cfg.text_dim], bf, "lin", cfg.text_dim)
    add("condition_proj.bias", [D], bf, "bias")
    if cfg.curve:
        add("adaln_t_table", [cfg.curve_grid, cfg.curve_k], f32_, "curve")
        t = cfg.curve_k
    else:
        th, tin, t = cfg.time_embed_hidden, cfg.timestep_input_dim, cfg.time_embed_dim
        add("time_embedder.proj_in.weight", [th, tin], f32_, "lin", tin)
        add("time_embedder.proj_in.bias", [th], f32_, "bias_te")
        add("time_embedder.proj_out.weight", [t, th], f32_, "lin", th)
        add("time_embedder.proj_out.bias", [t], f32_, "bias_te")
    add("rope.inv_freq", [cfg.rope_len], f32_, "inv_freq")
    for i in range(cfg.refiner_layers):
        p = f"token_refiner.blocks.{i}."
        add(p + "norm1.weight", [D], bf, "norm")
        add(p + "norm2.weight", [D], bf, "norm")
        add(p + "attn.qkv_proj.weight", [3 * I, D], bf, "lin", D)
        add(p + "attn.q_norm.weight", [Dh], bf, "norm")
        add(p + "attn.k_norm.weight", [Dh], bf, "norm")
        add(p + "attn.out_proj.weight", [D, I], bf, "lin_out", I)
        add(p + "mlp.fc1.weight", [2 * Fh, D], bf, "lin", D)
        add(p + "mlp.fc2.weight", [D, Fh], bf, "lin_out", Fh)
    add("token_refiner.final_norm.weight", [D], bf, "norm")
    add("final_layer.norm.weight", [D], bf, "norm")
    add("final_layer.adaln_proj.linear.weight", [2 * D, t], ada_dt, "ada_w", t)
    add("final_layer.adaln_proj.linear.bias", [2 * D], ada_dt, "ada_b")
    # Heads: a PDD bank of n is [n*out, D] on both heads (ComfyUI's shape); row block 0 is
    # the full head, later blocks are offsets from it (drawn at 1/4 of the head's scale).
    n = cfg.pdd
    add("final_layer.video_out.weight", [n * pv, D], f32_, "lin" if n == 1 else ("bank", n), D)
    add("final_layer.video_out.bias", [n * pv], f32_, "bias" if n == 1 else ("bank_bias", n))
    add("final_layer.audio_out.weight", [n * cfg.audio_latents, D], f32_, "lin" if n == 1 else ("bank", n), D)
    add("final_layer.audio_out.bias", [n * cfg.audio_latents], f32_, "bias" if n == 1 else ("bank_bias", n))
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        add(p + "norm1.weight", [D], bf, "norm")
        add(p + "norm2.weight", [D], bf, "norm")
        add(p + "attn.qkv_proj.weight", [3 * I, D], bf, "lin", D)
        add(p + "attn.q_norm.weight", [Dh], bf, "norm")
        add(p + "attn.k_norm.weight", [Dh], bf, "norm")
        add(p + "attn.out_proj.weight", [D, I], bf, "lin_out", I)
        add(p + "mlp.fc1.weight", [2 * Fh, D], bf, "lin", D)
        add(p + "mlp.fc2.weight", [D, Fh], bf, "lin_out", Fh)
        add(p + "adaln_proj.linear.weight", [18 * D, t], ada_dt, "ada_w", t)
        add(p + "adaln_proj.linear.bias", [18 * D], ada_dt, "ada_b")
    return specs


def make_weights(cfg, seed):
    """Seeded (CPU generator, spec order) random weights in their declared dtypes."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, dtype, kind, fan in tensor_specs(cfg):
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if isinstance(kind, tuple):  # a PDD bank: block 0 the head, blocks >= 1 offsets
            nb = kind[1]
            blk = torch.ones(nb, dtype=torch.float32)
            blk[1:] = 0.25
            scale = (1.0 / math.sqrt(fan)) if kind[0] == "bank" else 0.02
            rb = r.reshape((nb, -1) + tuple(shape[1:]))
            v = (rb * blk.reshape((nb,) + (1,) * (rb.ndim - 1)) * scale).reshape(shape)
        elif kind == "lin":
            v = r / math.sqrt(fan)
        elif kind == "lin_out":
            v = r * (0.7 / math.sqrt(fan))
        elif kind == "bias":
            v = r * 0.02
        elif kind == "bias_te":
            v = r * 0.1
        elif kind == "norm":
            v = 1.0 + 0.1 * r
        elif kind == "ada_w":
            v = r / math.sqrt(fan)
        elif kind == "ada_b":
            v = r * 0.3
        elif kind == "inv_freq":
            # fp32 10000^(-i/len), computed in double then rounded (h3-model.md §1.3)
            n = shape[0]
            v = (10000.0 ** (-torch.arange(n, dtype=torch.float64) / n)).to(torch.float32)
        elif kind == "curve":
            # A plausible post-SiLU curve table [G, k]: smooth in t, silu-shaped values.
            G, k = shape
            s = torch.linspace(0, 1, G, dtype=torch.float64)[:, None]
            coef = torch.randn((4, k), generator=g, dtype=torch.float32).double()
            pre = sum(coef[m][None, :] * torch.cos(math.pi * m * s) for m in range(4))
            v = F.silu(pre * 1.5).to(torch.float32)
        else:
            raise ValueError(kind)
        out[name] = v.to(dtype).contiguous()
    return out


# ---------------------------------------------------------------------------------------
# Packed layout (h3-model.md §2.3-§2.4): float64 positions, mod rows, final-layer rows
# ---------------------------------------------------------------------------------------
FPT = (1, 4, 4, 4, 4)


def time_shift_sigma(s, f, g):
    b = s / (f + s * (1 - f))
    return g * b / (1 + (g - 1) * b)


def time_shift_sigma_f32(s, f, g):
    """Same formula in fp32 tensor arithmetic (each op rounded to fp32)."""
    b = f32(s / f32(f + f32(s * f32(1 - f))))
    return f32(f32(g * b) / f32(1 + f32((g - 1) * b)))


def spatial_axis(d, Hl, Wl):
    r = d / math.sqrt(Hl * Wl)
    n = d // 2
    return [(i * r / n + (1 - r) / 2) * 32 for i in range(n)]


def video_grid(T, Hl, Wl, origin, single_t=None):
    """Rows t-major, then h, then w. single_t: every frame at that t (cond images)."""
    ha, wa = spatial_axis(Hl, Hl, Wl), spatial_axis(Wl, Hl, Wl)
    rows = []
    off = 0.0
    for k in range(T):
        t = single_t if single_t is not None else origin + off
        for h in ha:
            for w in wa:
                rows.append((t, h, w))
        off += 5.0 / 3.0 * FPT[k % 5]
    return rows


def audio_grid(A, origin, Hl, Wl):
    wa = spatial_axis(Wl, Hl, Wl)
    return [(origin + j, 0.0, wa[0]) for j in range(A)] + [(origin + j, 0.0, wa[-1]) for j in range(A)]


def pool_patch_amax(m, T, Hl, Wl):
    """[T, Hl, Wl] -> per 2x2 patch amax, rows t, h', w' order, quantised ceil(m*256)/256 in
    fp32 (ComfyUI's model_base: _pool_masks_to_token_grid then _token_grid_masks)."""
    mm = torch.as_tensor(m, dtype=torch.float32).reshape(T, Hl // 2, 2, Wl // 2, 2)
    p = mm.amax(dim=(2, 4)).reshape(-1)
    return torch.ceil(p * 256.0) / 256.0  # f32 [T*Hl/2*Wl/2]


def quantise_audio_mask(m):
    """[2, A] -> ceil(m*256)/256 in fp32, rows channel-major [2A] (one value per audio row)."""
    return torch.ceil(torch.as_tensor(m, dtype=torch.float32).reshape(-1) * 256.0) / 256.0


def masked_rows_t(m, sigma, pin):
    """ComfyUI's _forward: rows_t = (1.0 - m * sigma).clamp(max=pin) on the fp32 mask
    values (fp32 tensor ops, the scalars rounded to fp32); None when every value is >=
    1 - 1e-3 (mask_row_values). Returns Python floats (the fp32 values)."""
    if bool((m >= 1.0 - 1e-3).all()):
        return None
    return [float(x) for x in (1.0 - m * sigma).clamp(max=pin)]


def build_layout(cfg, case, sigma_v):
    """Returns dict: positions [(t,h,w)] f64, tags/t per row, segments, unique_t, mod rows,
    final rows. sigma_v: python double of the fp32 video sigma. Segment order (§2.4):
    text | keyframes (video, then audio) | references (audio, then video) | audio | video."""
    T, Hl, Wl, A, L = case["T"], case["Hl"], case["Wl"], case["A"], case["L"]
    sv, sa_shift = case["shift_v"], case["shift_a"]
    t_v = 1.0 - sigma_v
    sigma_a = time_shift_sigma(sigma_v, sv, sa_shift)
    t_a = 1.0 - sigma_a
    vis_aug, aud_aug = case.get("vis_aug", 0.999), case.get("aud_aug", 1.0)
    t_cond_v = max(t_v, vis_aug)
    t_cond_a = max(t_a, aud_aug)
    tags = case.get("text_tags") or [1] * L
    pos, row_t, row_tag, segs = [], [], [], []

    def seg(name, rows, ts, tg):
        start = len(pos)
        pos.extend(rows)
        row_t.extend(ts if isinstance(ts, list) else [ts] * len(rows))
        row_tag.extend(tg if isinstance(tg, list) else [tg] * len(rows))
        segs.append((name, start, len(pos)))

    seg("text", [(float(i), 0.0, 0.0) for i in range(L)], t_v, [1 if x else 0 for x in tags])
    refs = case.get("refs", [])
    c = float(L)
    for r in refs:  # the target timeline starts after the references' spans
        c += 1.0 if r["kind"] == "image" else float(r["audio_latent"].shape[-1])
    for kf in case.get("keyframes", []):
        cond_t = c + 5.0 / 3.0 * kf["pixel_frame"]
        seg("cond", video_grid(1, Hl, Wl, cond_t, single_t=cond_t), t_cond_v, 0)
        if kf.get("audio_latent") is not None:
            seg("cond_audio", audio_grid(kf["audio_latent"].shape[-1], cond_t, Hl, Wl), t_cond_a, 2)
    rc = float(L)
    for r in refs:
        if r["kind"] == "image":  # own spatial grid, every row at the cursor
            rh, rw = r["latent"].shape[-2], r["latent"].shape[-1]
            seg("ref_img", video_grid(1, rh, rw, rc, single_t=rc), t_cond_v, 0)
            rc += 1.0
        else:  # audio reference: the target's w extremes
            ra = r["audio_latent"].shape[-1]
            seg("ref_audio", audio_grid(ra, rc, Hl, Wl), t_cond_a, 2)
            rc += float(ra)
    # target audio, then target video, at the cursor. Masked rows (§2.3 step 5): pins are
    # ComfyUI's constants max(t, 0.999) video and max(t, 1.0) audio (not vis/aud_aug).
    ta, ta_v = t_a, t_v
    if case.get("audio_mask") is not None:
        rows = masked_rows_t(quantise_audio_mask(case["audio_mask"]), 1.0 - t_a, max(t_a, 1.0))
        if rows is not None:
            ta = rows
    seg("audio", audio_grid(A, c, Hl, Wl), ta, 2)
    if case.get("video_mask") is not None:
        rows = masked_rows_t(pool_patch_amax(case["video_mask"], T, Hl, Wl), sigma_v, max(t_v, 0.999))
        if rows is not None:
            ta_v = rows
    seg("video", video_grid(T, Hl, Wl, c), ta_v, 0)
    unique_t = sorted(set(row_t) | {t_v, t_a})
    t_row = {t: i for i, t in enumerate(unique_t)}
    mod_rows = [t_row[t] * 3 + tag for t, tag in zip(row_t, row_tag)]
    segd = {n: (a, b) for n, a, b in segs}
    fa, fb = segd["audio"]
    va, vb = segd["video"]
    return {
        "positions": pos, "unique_t": unique_t, "mod_rows": mod_rows,
        "final_rows_audio": [t_row[t] for t in row_t[fa:fb]],
        "final_rows_video": [t_row[t] for t in row_t[va:vb]],
        "segments": segs, "t_v": t_v, "t_a": t_a, "sigma_a": sigma_a,
    }


def pdd_window(sample_sigmas, sigma, n, shift_v):
    """ComfyUI's FinalLayer: i = argmin |sample_sigmas - sigma| (fp32 tensor), sigma_next =
    the next entry; start/stop = round(float(1 - time_shift_sigma(s, shift_v, 1)) * n) with s
    the Python float sigma (float64) and the fp32 tensor element sigma_next (fp32 ops)."""
    ss = torch.as_tensor(sample_sigmas, dtype=torch.float32)
    i = int((ss - sigma).abs().argmin())
    sigma_next = ss[min(i + 1, ss.shape[0] - 1)]
    start, stop = (round(float(1.0 - time_shift_sigma(x, shift_v, 1.0)) * n) for x in (sigma, sigma_next))
    start = min(start, n - 1)
    stop = max(stop, start + 1)
    return start, stop


def pdd_head(weight, bias, x, n, start, stop, flow_shift, P):
    """ComfyUI's _pdd_head: row block 0 is the full head, later blocks offsets from it; the
    step uses R_0 + sum_k w_k R_k over [max(start, 1), stop), w = dt / sum dt of the
    stream's flow-time grid (float64, then cast to the activation's dtype)."""
    grid = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float64)
    dt = (1.0 - flow_shift * grid / (1.0 + (flow_shift - 1.0) * grid)).diff()[start:stop]
    w = (dt / dt.sum()).to(x.dtype).to(x.device)
    rows = weight.to(x.dtype).reshape(n, -1, weight.shape[1])
    brows = bias.to(x.dtype).reshape(n, -1)
    first = max(start, 1)
    w_eff = rows[0] + torch.einsum("n,noi->oi", w[first - start:], rows[first:stop])
    b_eff = brows[0] + torch.einsum("n,no->o", w[first - start:], brows[first:stop])
    return F.linear(x, w_eff, b_eff)


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# Quantised linears (issue 14; comfyui-and-quantized-weights.md §2-3). Two numerics, as
# for every other op: "bf16" mode = ComfyUI's eager path (comfy-kitchen's eager backend,
# as the spec restates it), "exact" mode = LayerStream's LS-int8 / fp8 formulas
# (src/backend/backend.h) in float64 with no rounding but the quantisation itself.
# ---------------------------------------------------------------------------------------
H4 = [[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]]


def hadamard(G, dtype):
    """H_G = (h4 x ... x h4) / sqrt(G), symmetric and orthogonal (entries +-1/sqrt(G))."""
    h = torch.ones((1, 1), dtype=torch.float64)
    h4 = torch.tensor(H4, dtype=torch.float64) / 2
    n = 1
    while n < G:
        h = torch.kron(h, h4)
        n *= 4
    assert n == G, G
    return h.to(dtype)


def convrot_group(K):
    """The group of the synthetic files (model/h3/quant.h): 256 where it divides K, else
    the largest power of 4 below it that does."""
    for g in (256, 64, 16, 4):
        if K % g == 0:
            return g
    raise ValueError(f"no ConvRot group divides K = {K}")


def e4m3_round(x):
    """Round to the nearest e4m3fn value (ties to even), saturating to +-448; float dtype
    kept. Normal values: 3 mantissa bits (step 2^(e-3)); below 2^-6 the subnormal step 2^-9."""
    x = x.clamp(-448.0, 448.0)
    a = x.abs()
    _, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    step = torch.pow(torch.tensor(2.0, dtype=x.dtype, device=x.device), (e - 4).clamp(min=-9).to(x.dtype))
    return (torch.round(x / step) * step).clamp(-448.0, 448.0)


def e4m3_bytes(v):
    """e4m3fn encodings (uint8) of values already on the e4m3 grid."""
    v = v.double()
    sign = (v < 0).to(torch.uint8) << 7
    a = v.abs()
    _, e = torch.frexp(a)
    ex = e - 1  # a = 1.f * 2^ex for normals
    normal = a >= 2.0 ** -6
    mant_n = torch.round((a / torch.pow(2.0, ex.double()) - 1) * 8).to(torch.int64)
    byte_n = ((ex + 7).clamp(min=0) << 3) | mant_n
    byte_s = torch.round(a / 2.0 ** -9).to(torch.int64)
    b = torch.where(normal, byte_n, byte_s).to(torch.uint8)
    return b | sign


SYNTH_FP8_INPUT_SCALE = f32(8.0 / 448.0)  # the synthetic fp8 files' static input scale (quant.h)
BIG_LINEARS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")


def quantise_checkpoint(cfg, weights, fmt):
    """A checkpoint in ComfyUI's quantised layout from the bf16 weights: the 4 big linears
    of every DiT block quantised (int8 ConvRot: kitchen's quantize_int8_convrot_weight, the
    fp32 rotation then the eager fp32 row quantiser; fp8: per-tensor amax/448, the e4m3
    rounding, input_scale on qkv/out/fc1), everything declared f32 that is a Linear
    parameter held as bf16 (ComfyUI's mixed ops). Returns (file tensors, dtype overrides,
    quant info per linear)."""
    out, over, Q = {}, {}, {}
    for k, v in weights.items():
        if v.dtype == torch.float32 and k not in ("rope.inv_freq", "adaln_t_table"):
            v = v.to(torch.bfloat16).to(torch.float32)  # mixed ops: held as bf16
        out[k] = v
    for b in range(cfg.num_layers):
        for lin in BIG_LINEARS:
            m = f"blocks.{b}.{lin}"
            w = out.pop(m + ".weight")  # bf16 [N, K]
            N, K = w.shape
            if fmt == "int8":
                G = convrot_group(K)
                wr = (w.float().reshape(N, K // G, G) @ hadamard(G, torch.float32)).reshape(N, K)
                sw = (wr.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-30)  # f32 [N, 1]
                q = torch.round(wr / sw).clamp(-128, 127).to(torch.int8)
                out[m + ".weight"] = q
                out[m + ".weight_scale"] = sw
                js = json.dumps({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": G},
                                separators=(",", ":"))
                Q[m] = {"format": "int8", "group": G, "q": q, "sw": sw.reshape(N)}
            else:
                amax = float(w.float().abs().max())
                sw = f32(amax / 448.0) if amax > 0 else 1.0
                qv = e4m3_round((w.float() / sw).clamp(-448, 448))
                out[m + ".weight"] = e4m3_bytes(qv)
                over[m + ".weight"] = "F8_E4M3"
                out[m + ".weight_scale"] = torch.tensor(sw, dtype=torch.float32)
                sa = None
                if lin != "mlp.fc2":
                    sa = SYNTH_FP8_INPUT_SCALE
                    out[m + ".input_scale"] = torch.tensor(sa, dtype=torch.float32)
                js = json.dumps({"format": "float8_e4m3fn"}, separators=(",", ":"))
                Q[m] = {"format": "fp8", "w8": qv, "sw": sw, "sa": sa}
            out[m + ".comfy_quant"] = torch.tensor(list(js.encode()), dtype=torch.uint8)
    return out, over, Q


def op_linear_int8(x, q, sw, G, P):
    """x [M, K] -> [M, N] through an int8 ConvRot weight q [N, K] (rotated), sw [N].
    bf16 (ComfyUI eager): x_rot = bf16(x_g @ H_G(bf16)); sx = max(fl32(max|x_rot| / 127),
    1e-30); qx = clamp(round(bf16(x_rot / bf16(sx))), -128, 127); acc exact;
    y = bf16(fl32(acc) * fl32(sx * sw)).
    exact (LS-int8 in float64): v = x_g @ H_G; sx = max|v| / 127; qx = clamp(round(v / sx));
    y = acc * sx * sw."""
    M, K = x.shape
    N = q.shape[0]
    if P.exact:
        v = (x.double().reshape(M, K // G, G) @ hadamard(G, torch.float64).to(x.device)).reshape(M, K)
        sx = (v.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-30)
        qx = torch.round(v / sx).clamp(-128, 127)
        acc = qx @ q.double().t()  # exact in float64: |acc| < 2^53
        return acc * sx * sw.double()[None, :]
    xr = (x.reshape(M, K // G, G) @ hadamard(G, torch.bfloat16).to(x.device)).reshape(M, K)  # bf16
    sx = (xr.abs().amax(dim=-1, keepdim=True).float() / 127.0).clamp(min=1e-30)  # f32 [M, 1]
    qx = torch.round(xr / sx.to(torch.bfloat16)).clamp(-128, 127)  # the quotient rounded to bf16
    acc = qx.double() @ q.double().t()  # the int32 GEMM (exact)
    return (acc.float() * (sx * sw.float()[None, :])).to(torch.bfloat16)


def op_linear_fp8(x, w8, sw, sa, P):
    """x [M, K] -> [M, N] through an fp8 e4m3 weight (values w8 [N, K] on the e4m3 grid),
    per-tensor sw, static activation scale sa (None: 1).
    bf16 (ComfyUI eager): qx = e4m3(clamp(bf16(x * bf16(fl32(1 / sa))), +-448)); acc = fp32
    sum of the exact products; y = bf16(acc * fl32(sa * sw)).
    exact (LS fp8 in float64): qx = e4m3(clamp(x / sa, +-448)); y = (qx @ w8^T) * sa * sw."""
    s_a = 1.0 if sa is None else sa
    if P.exact:
        qx = e4m3_round((x.double() / s_a).clamp(-448, 448))
        return (qx @ w8.double().t().to(x.device)) * s_a * sw
    inv = bf16_scalar(f32(1.0 / s_a))
    xs = x * torch.tensor(inv, dtype=torch.bfloat16, device=x.device) if sa is not None else x
    qx = e4m3_round(xs.float().clamp(-448, 448))
    acc = qx @ w8.float().t().to(x.device)
    return (acc * f32(s_a * sw)).to(torch.bfloat16)


class H3Reference:
    def __init__(self, cfg, weights, P, device, quant=None):
        self.cfg, self.P, self.dev = cfg, P, device
        self.W = {k: (v.to(torch.float64) if P.exact else v).to(device) for k, v in weights.items()
                  if v.is_floating_point()}
        self.Q = quant or {}  # linear name -> quantised weight (quantise_checkpoint)
        self.trace = {}
        self.capture = None  # a dict: attention prefix -> (q, k, v) as op_attention gets them

    def lin(self, m, x):
        """Linear m ("blocks.0.mlp.fc2") on x: plain weights as op_gemm, quantised ones
        through their format's op."""
        q = self.Q.get(m)
        if q is None:
            return op_gemm(x, self.W[m + ".weight"])
        if q["format"] == "int8":
            return op_linear_int8(x, q["q"].to(self.dev), q["sw"].to(self.dev), q["group"], self.P)
        return op_linear_fp8(x, q["w8"], q["sw"], q["sa"], self.P)

    def t(self, name, x):
        self.trace[name] = x.detach()

    # ---- shared pieces ----------------------------------------------------------------
    def attention(self, pre, h, rope):
        cfg, P = self.cfg, self.P
        S, H, Dh, I = h.shape[0], cfg.heads, cfg.head_dim, cfg.inner
        qkv = self.lin(pre + "qkv_proj", h)  # bf16 [S, 3I]
        q = qkv[:, :I].reshape(S, H, Dh)  # contiguous thirds, head-major (§1.2)
        k = qkv[:, I:2 * I].reshape(S, H, Dh)
        v = qkv[:, 2 * I:].reshape(S, H, Dh)
        q = op_qk_norm_rope(q, self.W[pre + "q_norm.weight"], rope, EPS, P)
        k = op_qk_norm_rope(k, self.W[pre + "k_norm.weight"], rope, EPS, P)
        if self.capture is not None:
            self.capture[pre] = (q.detach(), k.detach(), v.detach())
        o = op_attention(q, k, v, P)  # bf16 [S, H, Dh]
        return self.lin(pre + "out_proj", o.reshape(S, I))

    def mlp(self, pre, h):
        u = self.lin(pre + "fc1", h)  # bf16 [S, 2F]
        # ComfyUI's eager int8 / fp8 fc2 quantise the eager swiglu bf16(bf16(silu(g)) * u);
        # exact mode's swiglu is unrounded (LS-int8's fused fp32 swiglu, in float64).
        return self.lin(pre + "fc2", op_swiglu(u, self.P))

    # ---- text path (§2.13) ------------------------------------------------------------
    def refine_text(self, text):
        P, W = self.P, self.W
        x = op_gemm(text.to(P.lo), W["condition_proj.weight"], W["condition_proj.bias"])
        self.t("text.embed", x)
        for i in range(self.cfg.refiner_layers):
            p = f"token_refiner.blocks.{i}."
            a = self.attention(p + "attn.", op_rms_norm(x, W[p + "norm1.weight"], EPS, P), None)
            x = op_add(a, x)
            self.t(f"text.refiner.{i}.attn", x)
            m = self.mlp(p + "mlp.", op_rms_norm(x, W[p + "norm2.weight"], EPS, P))
            x = op_add(m, x)
            self.t(f"text.refiner.{i}.mlp", x)
        x = op_rms_norm(x, W["token_refiner.final_norm.weight"], EPS, P)
        self.t("text.refined", x)
        return x

    # ---- time embedding (§2.5) and AdaLN (§2.6) -----------------------------------------
    def time_embed(self, unique_t):
        P, W, cfg = self.P, self.W, self.cfg
        tv = torch.tensor(unique_t, dtype=torch.float64, device=self.dev).to(P.f32)  # double -> fp32
        if cfg.curve:
            table = W["adaln_t_table"].to(P.f32)  # f32 [G, k]
            G = table.shape[0]
            pos = tv.clamp(0, 1) * (G - 1)
            i0 = torch.clamp(torch.floor(pos), max=G - 2).long()
            w = pos - i0.to(pos.dtype)
            return torch.lerp(table[i0], table[i0 + 1], w[:, None])  # f32 [M, k]
        emb = op_time_embedding(tv, cfg.timestep_input_dim, P)  # f32 [M, tin]
        h = F.silu(op_gemm(emb, W["time_embedder.proj_in.weight"], W["time_embedder.proj_in.bias"]))
        out = op_gemm(h, W["time_embedder.proj_out.weight"], W["time_embedder.proj_out.bias"])
        return out.to(P.lo)  # bf16 [M, t]

    def adaln(self, pre, temb, mo):
        """[M, E*D*Mo] -> [M*Mo, E*D]; row r = t_index * Mo + modality."""
        x = temb if self.cfg.curve else F.silu(temb)  # curve table stores post-SiLU values
        y = op_gemm(x, self.W[pre + "adaln_proj.linear.weight"], self.W[pre + "adaln_proj.linear.bias"])
        return y.reshape(y.shape[0] * mo, y.shape[1] // mo)

    # ---- the denoiser call (§2.2-§2.12) ---------------------------------------------------
    def forward(self, case, refined_text):
        cfg, P, W, dev = self.cfg, self.P, self.W, self.dev
        D, T, Hl, Wl, A = cfg.hidden, case["T"], case["Hl"], case["Wl"], case["A"]
        s = case["audio_scale"]
        # §10.1-2: sigma_v = fl32(fl32(sigma * 1000) / 1000), clamp 1e-6; audio carry in fp32.
        sig32 = f32(case["sigma"])
        if P.exact:
            sigma_v = sig32  # the same double value, no rounding afterwards
            sigma_a32 = time_shift_sigma(sigma_v, case["shift_v"], case["shift_a"])
            carry = sigma_a32 / sigma_v
        else:
            sigma_v = max(f32(f32(sig32 * 1000.0) / 1000.0), f32(1e-6))
            sigma_a32 = time_shift_sigma_f32(sigma_v, case["shift_v"], case["shift_a"])
            carry = bf16_scalar(f32(sigma_a32 / sigma_v))
        video = case["video"].to(dev).to(P.lo)  # sampler fp32 -> compute dtype
        audio_src = case["audio"].to(dev).to(P.lo)
        carry_t = torch.tensor(carry, dtype=P.lo, device=dev)
        if s != 1.0:
            audio = audio_src * carry_t  # bf16 multiply
        else:
            audio = audio_src
        self.t("audio.carried", audio)

        lay = build_layout(cfg, case, sigma_v)
        S = len(lay["positions"])
        pos = torch.tensor(lay["positions"], dtype=torch.float64, device=dev).to(P.f32)  # [S, 3]
        self.t("layout.positions", pos)
        inv = W["rope.inv_freq"].to(P.f32)
        ang = (pos[:, :, None] * inv[None, None, :]).reshape(S, cfg.pairs)  # [S, P] (t, h, w axes)
        rope = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1).to(P.lo)  # bf16 [S, P, 2]
        self.t("layout.rope", rope)
        mod_rows = torch.tensor(lay["mod_rows"], dtype=torch.long, device=dev)
        self.trace["layout.mod_rows"] = mod_rows.to(torch.int32)
        self.trace["layout.unique_t"] = torch.tensor(lay["unique_t"], dtype=torch.float64).to(P.f32)

        temb = self.time_embed(lay["unique_t"])
        self.t("t_emb", temb)

        # Embedding (§2.7): fp32 patch rows -> fp32 GEMM -> bf16.
        def patchify_any(v):  # [C, t, h, w] -> [t*h/2*w/2, 4C], feature 4c + 2p + q
            C, tt, hh, ww = v.shape
            r = v.reshape(C, tt, hh // 2, 2, ww // 2, 2).permute(1, 2, 4, 0, 3, 5)
            return r.reshape(tt * (hh // 2) * (ww // 2), 4 * C)

        patchify = patchify_any
        self.cond_rows = []

        vrows = patchify(video.to(P.f32))
        arows = audio.to(P.f32).permute(1, 2, 0).reshape(2 * A, cfg.audio_latents)  # channel-major
        v_emb = op_gemm(vrows, W["video_patch_proj.weight"], W["video_patch_proj.bias"]).to(P.lo)
        a_emb = op_gemm(arows, W["audio_patch_proj.weight"], W["audio_patch_proj.bias"]).to(P.lo)
        parts = [refined_text.to(P.lo)]

        def augment(rows, aug, noise):
            # §2.7: rows = aug * rows + (1 - aug) * noise, the noise drawn in the rows' own
            # shape (torch.randn(rows.shape)): fp32 tensor-scalar ops (bf16 mode), float64 (exact).
            if aug >= 1.0:
                return rows
            return aug * rows + (1.0 - aug) * noise.to(dev).to(P.f32)

        def vproj(r):
            return op_gemm(r, W["video_patch_proj.weight"], W["video_patch_proj.bias"]).to(P.lo)

        def aproj(r):
            return op_gemm(r, W["audio_patch_proj.weight"], W["audio_patch_proj.bias"]).to(P.lo)

        def pack_audio(z):  # [Ca, 2, A] -> [2A, Ca], channel-major
            return z.permute(1, 2, 0).reshape(2 * z.shape[-1], z.shape[0])

        vis_aug, aud_aug = case.get("vis_aug", 0.999), case.get("aud_aug", 1.0)
        for kf in case.get("keyframes", []):  # cond latents stay fp32
            kr = augment(patchify(kf["latent"].to(dev).to(P.f32)), vis_aug, kf.get("noise_video"))
            self.t(f"cond.keyframe.{len(self.cond_rows)}.video_rows", kr)
            self.cond_rows.append(kr)
            parts.append(vproj(kr))
            if kf.get("audio_latent") is not None:
                ar = augment(pack_audio(kf["audio_latent"].to(dev).to(P.f32)), aud_aug, kf.get("noise_audio"))
                parts.append(aproj(ar))
        for r in case.get("refs", []):
            if r["kind"] == "image":
                rr = patchify_any(r["latent"].to(dev).to(P.f32))
                parts.append(vproj(augment(rr, vis_aug, r.get("noise_video"))))
            else:
                ar = augment(pack_audio(r["audio_latent"].to(dev).to(P.f32)), aud_aug, r.get("noise_audio"))
                parts.append(aproj(ar))
        parts += [a_emb, v_emb]
        x = torch.cat(parts, dim=0)  # bf16 [S, D]
        assert x.shape[0] == S, (x.shape, S)
        self.t("x.embed", x)

        for i in range(cfg.num_layers):
            p = f"blocks.{i}."
            ada = self.adaln(p, temb, 3)  # [3M, 6D]
            self.t(f"block.{i}.adaln", ada)
            ch = [ada[:, c * D:(c + 1) * D] for c in range(6)]
            sh_msa, sc_msa, g_msa, sh_mlp, sc_mlp, g_mlp = ch
            h = op_modulate(op_rms_norm(x, W[p + "norm1.weight"], EPS, P), sh_msa, sc_msa, mod_rows, P)
            a = self.attention(p + "attn.", h, rope)
            x = op_gated_add(x, a, g_msa, mod_rows, P)
            self.t(f"block.{i}.attn", x)
            h = op_modulate(op_rms_norm(x, W[p + "norm2.weight"], EPS, P), sh_mlp, sc_mlp, mod_rows, P)
            m = self.mlp(p + "mlp.", h)
            x = op_gated_add(x, m, g_mlp, mod_rows, P)
            self.t(f"block.{i}.mlp", x)

        # Final layer (§2.12) on the target segments only.
        ada_f = self.adaln("final_layer.", temb, 1)  # [M, 2D]
        self.t("final.adaln", ada_f)
        shift, scale = ada_f[:, :D], ada_f[:, D:]
        segd = {n: (a0, b0) for n, a0, b0 in lay["segments"]}

        def head(seg_name, rows_t, wname):
            a0, b0 = segd[seg_name]
            n = op_rms_norm(x[a0:b0], W["final_layer.norm.weight"], EPS, P)
            rt = torch.tensor(rows_t, dtype=torch.long, device=dev)
            if scale.dtype == P.lo:  # unpruned: bf16 ops, then fp32
                mod = op_modulate(n, shift, scale, rt, P).to(P.f32)
            else:  # pruned: fp32 tables, bf16 norm output promoted, fp32 ops
                mod = op_modulate_f32(n, shift, scale, rt, P)
            if n_bank == 1:
                return op_gemm(mod, W[wname + ".weight"], W[wname + ".bias"])  # fp32 head
            return pdd_head(W[wname + ".weight"], W[wname + ".bias"], mod, n_bank, pdd_start, pdd_stop,
                            case["shift_v"] if seg_name == "video" else case["shift_a"], P)

        # PDD head bank (§2.12 step 4): n from video_out's rows; both heads banked, the same
        # window from the video shift, each head weighted with its own stream's shift.
        n_bank = W["final_layer.video_out.weight"].shape[0] // (4 * cfg.latents)
        if n_bank > 1:
            pdd_start, pdd_stop = pdd_window(case["sample_sigmas"], sigma_v, n_bank, case["shift_v"])
            self.pdd_window = (pdd_start, pdd_stop)
        v_rows = head("video", lay["final_rows_video"], "final_layer.video_out")  # f32 [Nv, 4C]
        a_rows = head("audio", lay["final_rows_audio"], "final_layer.audio_out")  # f32 [2A, Ca]
        self.t("final.video_rows", v_rows)
        self.t("final.audio_rows", a_rows)
        C = cfg.latents
        vout = v_rows.reshape(T, Hl // 2, Wl // 2, C, 2, 2).permute(3, 0, 1, 4, 2, 5).reshape(C, T, Hl, Wl)
        aout = a_rows.reshape(2, A, cfg.audio_latents).permute(2, 0, 1)
        vout = -(vout.to(P.lo))  # cast, then negate
        aout = -(aout.to(P.lo))
        # Masks (§2.2 step 5): velocities times the masks model_base hands the model (pooled
        # per 2x2 patch, quantised to k/256: exact in bf16; the bf16 cast of _apply_model).
        if case.get("video_mask") is not None:
            pm = pool_patch_amax(case["video_mask"], T, Hl, Wl).reshape(T, Hl // 2, Wl // 2)
            pm = pm.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)  # [T, Hl, Wl]
            vout = vout * pm.to(dev).to(P.lo)[None]
        if case.get("audio_mask") is not None:
            am = quantise_audio_mask(case["audio_mask"]).reshape(2, A)
            aout = aout * am.to(dev).to(P.lo)[None]
        self.t("out.audio_model", aout)
        # Audio carry conversion (§2.2 step 6), bf16 tensor ops.
        if s != 1.0:
            if P.exact:
                cfac = 1.0 + (s - 1.0) * sigma_a32
            else:
                cfac = bf16_scalar(f32(1.0 + f32((s - 1.0) * sigma_a32)))
            cfac_t = torch.tensor(cfac, dtype=P.lo, device=dev)
            aout = (1.0 - s) * audio + cfac_t * aout
        self.t("out.video", vout)
        self.t("out.audio", aout)
        return vout, aout, lay


# ---------------------------------------------------------------------------------------
# Writing safetensors (the `safetensors` package; a minimal writer for dry runs without it)
# ---------------------------------------------------------------------------------------
_ST_DT = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.int32: "I32", torch.int64: "I64", torch.int8: "I8", torch.uint8: "U8"}


def save(path, tensors, metadata, dtype_override=None):
    """dtype_override: name -> safetensors dtype for uint8 tensors holding other 1-byte
    types (F8_E4M3 on a PyTorch without float8); such files use the writer below."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    meta = {k: str(v) for k, v in metadata.items()}
    dtype_override = dtype_override or {}
    try:
        if dtype_override:
            raise ImportError
        from safetensors.torch import save_file
        save_file(tensors, path, metadata=meta)
        return "safetensors"
    except ImportError:
        pass
    # Fallback (dry runs): the same format, written by hand.
    header, blobs, off = {"__metadata__": meta}, [], 0
    for k in sorted(tensors):
        v = tensors[k]
        raw = v.view(torch.int16).numpy().tobytes() if v.dtype == torch.bfloat16 else v.numpy().tobytes()
        header[k] = {"dtype": dtype_override.get(k, _ST_DT[v.dtype]), "shape": list(v.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    return "fallback-writer"


def base_metadata(device):
    return {
        "golden_format": GOLDEN_FORMAT, "generator": GENERATOR, "torch": torch.__version__,
        "regenerate": REGENERATE, "device": device,
        "cuda_device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "none",
        "cuda_runtime": str(torch.version.cuda), "tf32": "off", "bf16_reduced_precision_reduction": "off",
    }


# ---------------------------------------------------------------------------------------
# Errors (for the summary): max abs and relative L2 vs the exact result
# ---------------------------------------------------------------------------------------
def err(a, ref):
    a = a.detach().double().cpu()
    ref = ref.detach().double().cpu()
    fin = torch.isfinite(ref)
    d = (a - ref)[fin]
    mx = float(d.abs().max()) if d.numel() else 0.0
    rn = float(ref[fin].norm())
    return {"max_abs": mx, "rel_l2": float(d.norm()) / rn if rn > 0 else 0.0}


# ---------------------------------------------------------------------------------------
# Op golden cases
# ---------------------------------------------------------------------------------------
def gen_ops(dev, seed):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * scale

    def bf(x):
        return x.to(torch.bfloat16)

    tensors, cases, summary = {}, [], {}

    def put(case, op, params, inputs, out, exact):
        for k, v in inputs.items():
            tensors[f"{case}.{k}"] = v
        tensors[f"{case}.out"] = out
        # float64 twin: stored f64 for fp32 outputs, f32 for bf16 outputs (6e-8 relative,
        # far below bf16's 4e-3 ulp; keeps the file small).
        tensors[f"{case}.exact"] = exact.to(torch.float64 if out.dtype == torch.float32 else torch.float32)
        cases.append({"case": case, "op": op, **params})
        summary[case] = err(out, exact)

    def both(fn, inputs):
        """Run fn(P, **inputs on device) in bf16 mode and exact mode (inputs widened)."""
        on = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in inputs.items()}
        ex = {k: (v.to(dev).to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else
                  (v.to(dev) if torch.is_tensor(v) else v)) for k, v in inputs.items()}
        return fn(BF16, **on), fn(EXACT, **ex)

    # gemm: bf16 (no bias / bf16 bias), long K, fp32 with bias (TF32 off)
    for case, M, K, N, dt, bias in [("gemm_bf16", 37, 96, 80, "bf16", None),
                                    ("gemm_bf16_bias", 37, 96, 80, "bf16", "bf16"),
                                    ("gemm_bf16_k1000", 9, 1000, 24, "bf16", None),
                                    ("gemm_f32_bias", 37, 96, 80, "f32", "f32"),
                                    ("gemm_f32_k1000", 9, 1000, 24, "f32", None)]:
        conv = bf if dt == "bf16" else (lambda t: t)
        ins = {"x": conv(rn(M, K)), "w": conv(rn(N, K, scale=1 / math.sqrt(K)))}
        if bias:
            ins["bias"] = conv(rn(N, scale=0.5))
        o, e = both(lambda P, x, w, bias=None: op_gemm(x, w, bias), ins)
        put(case, "gemm", {"M": M, "K": K, "N": N}, ins, o, e)

    # rms_norm (odd width)
    ins = {"x": bf(rn(37, 200, scale=3.0)), "w": bf(1 + 0.2 * rn(200))}
    o, e = both(lambda P, x, w: op_rms_norm(x, w, EPS, P), ins)
    put("rms_norm", "rms_norm", {"eps": EPS}, ins, o, e)

    # modulate: bf16 tables and f32 tables (bf16 out), and the f32-out form
    R, M, D = 5, 37, 64
    rows = torch.randint(0, R, (M,), generator=g, dtype=torch.int32)
    for case, tdt in [("modulate_bf16", "bf16"), ("modulate_f32tables", "f32")]:
        conv = bf if tdt == "bf16" else (lambda t: t)
        ins = {"in": bf(rn(M, D, scale=2.0)), "shift": conv(rn(R, D, scale=0.5)),
               "scale": conv(rn(R, D, scale=0.5)), "rows": rows}
        o, e = both(lambda P, shift, scale, rows, **kw: op_modulate(kw["in"], shift, scale, rows.long(), P), ins)
        put(case, "modulate", {"out_dtype": "bf16"}, ins, o, e)
    ins = {"in": bf(rn(M, D, scale=2.0)), "shift": rn(R, D, scale=0.5), "scale": rn(R, D, scale=0.5), "rows": rows}
    o, e = both(lambda P, shift, scale, rows, **kw: op_modulate_f32(kw["in"], shift, scale, rows.long(), P), ins)
    put("modulate_f32out", "modulate", {"out_dtype": "f32"}, ins, o, e)

    # gated_add: bf16 gate and f32 gate (rounded to bf16 first)
    for case, gdt in [("gated_add_bf16", "bf16"), ("gated_add_f32gate", "f32")]:
        conv = bf if gdt == "bf16" else (lambda t: t)
        ins = {"x": bf(rn(M, D, scale=2.0)), "y": bf(rn(M, D)), "gate": conv(rn(R, D, scale=0.5)), "rows": rows}
        o, e = both(lambda P, x, y, gate, rows: op_gated_add(x, y, gate, rows.long(), P), ins)
        put(case, "gated_add", {}, ins, o, e)

    ins = {"x": bf(rn(M, D, scale=2.0)), "y": bf(rn(M, D))}
    o, e = both(lambda P, x, y: op_add(x, y), ins)
    put("add", "add", {}, ins, o, e)

    # qk_norm_rope: tiny heads with partial rotation, no-rope form, real head_dim 128 / P 48
    for case, Mr, H, Dh, npairs in [("qk_norm_rope", 37, 3, 32, 12), ("qk_norm", 37, 3, 32, 0),
                                    ("qk_norm_rope_dh128", 19, 2, 128, 48)]:
        ins = {"x": bf(rn(Mr, H, Dh, scale=2.0)), "w": bf(1 + 0.2 * rn(Dh))}
        if npairs:
            ang = rn(Mr, npairs, scale=10.0)
            ins["rope"] = bf(torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1))
        o, e = both(lambda P, x, w, rope=None: op_qk_norm_rope(x, w, rope, EPS, P), ins)
        put(case, "qk_norm_rope", {"eps": EPS, "pairs": npairs}, ins, o, e)

    ins = {"u": bf(rn(37, 160, scale=2.0))}
    o, e = both(lambda P, u: op_swiglu(u, P), ins)
    put("swiglu", "swiglu", {}, ins, o, e)

    ins = {"x": rn(37, 50, scale=4.0)}
    o, e = both(lambda P, x: op_silu(x), ins)
    put("silu", "silu", {}, ins, o, e)

    tvals = torch.tensor([0.0, 0.2, 0.5, 0.6, 0.999, 1.0, 0.0123], dtype=torch.float64).to(torch.float32)
    for n in (32, 256):
        ins = {"t": tvals}
        o, e = both(lambda P, t, n=n: op_time_embedding(t, n, P), ins)
        put(f"time_embedding_{n}", "time_embedding", {"N": n}, ins, o, e)

    # convert f32 -> bf16: ties (even/odd mantissa), near-ties, extremes, subnormals, inf, NaN
    specials = []
    for m in range(8):  # exact ties: 1 + (m + 0.5) * 2^-7
        specials.append(1.0 + (m + 0.5) * 2.0 ** -7)
        specials.append(-(1.0 + (m + 0.5) * 2.0 ** -7))
    specials += [0.0, -0.0, 1e-40, -1e-40, 3e38, -3.3e38, 1e-38, 65504.0, 1.0000001, 0.99999994,
                 float("inf"), float("-inf"), float("nan")]
    xs = torch.cat([torch.tensor(specials, dtype=torch.float32), rn(97, scale=100.0)])
    put("convert_f32_bf16", "convert", {"src": "f32", "dst": "bf16"}, {"x": xs}, xs.to(dev).to(torch.bfloat16),
        xs.double())
    xb = bf(rn(41, scale=5.0))
    put("convert_bf16_f32", "convert", {"src": "bf16", "dst": "f32"}, {"x": xb}, xb.to(dev).float(), xb.double())

    # attention (bf16, FlashAttention-2 on CUDA): awkward sizes, Mq != Mk, large logits
    for case, Mq, Mk, H, Dh, qs in [("attention", 97, 97, 3, 64, 1.0), ("attention_dh128", 33, 257, 1, 128, 1.0),
                                    ("attention_sharp", 17, 130, 2, 32, 4.0), ("attention_one", 1, 1, 1, 32, 1.0)]:
        ins = {"q": bf(rn(Mq, H, Dh, scale=qs)), "k": bf(rn(Mk, H, Dh)), "v": bf(rn(Mk, H, Dh))}
        o, e = both(lambda P, q, k, v: op_attention(q, k, v, P), ins)
        put(case, "attention", {"scale": 1.0 / math.sqrt(Dh)}, ins, o, e)

    return tensors, cases, summary


# ---------------------------------------------------------------------------------------
# Forward golden cases
# ---------------------------------------------------------------------------------------
def make_case(cfg, name, seed, frames=22, width=96, height=64, L=8, sigma=0.8, audio_scale=4.0):
    g = torch.Generator().manual_seed(seed)
    T = 2 if frames <= 5 else ((frames - 5) // 17) * 5 + 2
    Hl, Wl = height // 16, width // 16
    A = int(round(frames / 24 * 40))

    def bfx(*shape, scale=1.0):  # fp32 holding bf16-exact values (the sampler state)
        return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16).float()

    case = {"name": name, "frames": frames, "width": width, "height": height, "L": L,
            "T": T, "Hl": Hl, "Wl": Wl, "A": A, "sigma": sigma, "audio_scale": audio_scale,
            "shift_v": 12.0, "shift_a": 3.0, "vis_aug": 0.999, "aud_aug": 1.0,
            "text": (torch.randn((L, cfg.text_dim), generator=g) * 3.0).to(torch.bfloat16),
            "video": bfx(cfg.latents, T, Hl, Wl), "audio": bfx(cfg.audio_latents, 2, A, scale=2.0)}
    return case, g


def cond_noise(seed, rows_shape):
    """ComfyUI's condition noise: a CPU generator reseeded for every condition latent,
    torch.randn in the shape of its rows (after patchifying / packing)."""
    gen = torch.Generator("cpu").manual_seed(seed)
    return torch.randn(rows_shape, generator=gen, dtype=torch.float32)


def schedule_8():
    """An 8-step 'simple' schedule at shift 12 (+ terminal 0) as ComfyUI builds it: the
    discrete flow table sigma(t) = 12 t / (1 + 11 t), t = (1..1000) / 1000 (fp32), every
    125th entry from the top."""
    t = torch.arange(1, 1001, dtype=torch.float32) / 1000.0
    table = 12.0 * t / (1.0 + 11.0 * t)
    sig = [float(table[-(1 + int(x * 125))]) for x in range(8)] + [0.0]
    return torch.tensor(sig, dtype=torch.float32)


def case_list(cfg):
    out = []
    if cfg.pdd > 1:  # PDD bank: two sigmas of an 8-step schedule
        ss = schedule_8()
        for k in (2, 4):
            c, _ = make_case(cfg, f"pdd_step{k}", 120 + k, sigma=float(ss[k]))
            c["sample_sigmas"] = ss
            out.append(c)
        return out
    c, _ = make_case(cfg, "t2va", 101)
    out.append(c)
    c, _ = make_case(cfg, "t2va_sigma1", 102, sigma=1.0)
    out.append(c)
    c, g = make_case(cfg, "keyframes", 103)
    c["vis_aug"] = 1.0  # no noise augmentation: keeps the case free of PyTorch's CPU RNG
    c["text_tags"] = [1, 1, 0, 0, 0, 1, 1, 1]  # vision tokens inside the text use the video row
    c["keyframes"] = [{"pixel_frame": pf, "latent": (torch.randn((cfg.latents, 1, c["Hl"], c["Wl"]), generator=g))
                       .to(torch.bfloat16).float()} for pf in (0, c["frames"] - 1)]
    out.append(c)
    c, g = make_case(cfg, "mask", 104)
    T, Hl, Wl, A = c["T"], c["Hl"], c["Wl"], c["A"]
    vals = torch.tensor([0.0, 0.5, 1.0])
    pm = vals[torch.randint(0, 3, (T, Hl // 2, Wl // 2), generator=g)]  # constant per 2x2 patch
    c["video_mask"] = pm.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).contiguous()
    c["audio_mask"] = vals[torch.randint(0, 3, (2, A), generator=g)].contiguous()
    out.append(c)
    # Partial masks as a user draws them: values not multiples of 1/256 and not constant
    # per 2x2 patch (model_base pools and quantises them), with some exact 0s and 1s.
    c, g = make_case(cfg, "mask_partial", 105)
    vm = torch.rand((T, Hl, Wl), generator=g)
    pick = torch.randint(0, 4, (T, Hl, Wl), generator=g)
    vm = torch.where(pick == 0, torch.zeros_like(vm), vm)
    c["video_mask"] = torch.where(pick == 1, torch.ones_like(vm), vm).contiguous()
    am = torch.rand((2, A), generator=g)
    pick = torch.randint(0, 4, (2, A), generator=g)
    am = torch.where(pick == 0, torch.zeros_like(am), am)
    c["audio_mask"] = torch.where(pick == 1, torch.ones_like(am), am).contiguous()
    out.append(c)
    # A keyframe (video + audio latent) at augmentation 0.5 on both streams: the noise is
    # drawn in the rows' shape ([Hl/2*Wl/2, 96] and [2A', 32]), seed / seed + 1.
    c, g = make_case(cfg, "keyframe_aug", 106)
    c["vis_aug"], c["aud_aug"], c["seed"] = 0.5, 0.5, 4242
    kv = torch.randn((cfg.latents, 1, Hl, Wl), generator=g)
    ka = torch.randn((cfg.audio_latents, 2, 3), generator=g)
    c["keyframes"] = [{"pixel_frame": 0, "latent": kv, "audio_latent": ka,
                       "noise_video": cond_noise(c["seed"], (Hl // 2 * Wl // 2, 4 * cfg.latents)),
                       "noise_audio": cond_noise(c["seed"] + 1, (2 * 3, cfg.audio_latents))}]
    out.append(c)
    # References at augmentation 0.5: an image with its own (square) grid and an audio
    # reference; the generator restarts for each.
    c, g = make_case(cfg, "reference_aug", 107)
    c["vis_aug"], c["aud_aug"], c["seed"] = 0.5, 0.5, 777
    ri = torch.randn((cfg.latents, 1, 4, 4), generator=g)
    ra = torch.randn((cfg.audio_latents, 2, 5), generator=g)
    c["refs"] = [{"kind": "image", "latent": ri, "noise_video": cond_noise(c["seed"], (4, 4 * cfg.latents))},
                 {"kind": "audio", "audio_latent": ra, "noise_audio": cond_noise(c["seed"] + 1, (10, cfg.audio_latents))}]
    out.append(c)
    return out


# Intermediates whose float64 twin ("exact.<name>") every case stores; the first case of
# each checkpoint ("full") stores the twin of every float intermediate (size budget).
EXACT_ALWAYS = ("text.refined", "t_emb", "x.embed", "final.video_rows", "final.audio_rows", "out.video",
                "out.audio", "out.audio_model", "audio.carried")


def run_forward_case(cfg, weights, case, dev, ckpt_name, full, check_determinism, quant=None):
    ref = H3Reference(cfg, weights, BF16, dev, quant)
    ex = H3Reference(cfg, weights, EXACT, dev, quant)
    text = ref.refine_text(case["text"].to(dev))
    ref.forward(case, text)
    deterministic = None
    if check_determinism:  # a second bf16 run must give the same bytes
        again = H3Reference(cfg, weights, BF16, dev, quant)
        again.forward(case, again.refine_text(case["text"].to(dev)))
        deterministic = all(torch.equal(ref.trace[k], again.trace[k]) for k in ref.trace)
    text_e = ex.refine_text(case["text"].to(dev))
    _, _, lay = ex.forward(case, text_e)
    tensors = {
        "in.text_states": case["text"], "in.video": case["video"], "in.audio": case["audio"],
        "in.sigma": torch.tensor([f32(case["sigma"])], dtype=torch.float32),
    }
    for i, kf in enumerate(case.get("keyframes", [])):
        tensors[f"in.keyframe.{i}"] = kf["latent"]
        for k in ("audio_latent", "noise_video", "noise_audio"):
            if kf.get(k) is not None:
                tensors[f"in.keyframe.{i}.{k}"] = kf[k]
    for i, r in enumerate(case.get("refs", [])):
        for k in ("latent", "audio_latent", "noise_video", "noise_audio"):
            if r.get(k) is not None:
                tensors[f"in.ref.{i}.{k}"] = r[k]
    if case.get("sample_sigmas") is not None:
        tensors["in.sample_sigmas"] = case["sample_sigmas"].to(torch.float32)
    if case.get("text_tags"):
        tensors["in.text_tags"] = torch.tensor(case["text_tags"], dtype=torch.int8)
    if case.get("video_mask") is not None:
        tensors["in.video_mask"] = case["video_mask"].to(torch.float32)
    if case.get("audio_mask") is not None:
        tensors["in.audio_mask"] = case["audio_mask"].to(torch.float32)
    summary = {}
    for k, v in ref.trace.items():
        tensors[k] = v
        if k in ex.trace and v.is_floating_point():
            summary[k] = err(v, ex.trace[k])
            if (full and not k.startswith("layout.")) or k in EXACT_ALWAYS:
                tensors["exact." + k] = ex.trace[k].to(torch.float32)
    meta_case = {k: case[k] for k in ("name", "frames", "width", "height", "L", "T", "Hl", "Wl", "A", "sigma",
                                      "audio_scale", "shift_v", "shift_a", "vis_aug", "aud_aug")}
    meta_case["keyframe_pixel_frames"] = [kf["pixel_frame"] for kf in case.get("keyframes", [])]
    meta_case["ref_kinds"] = [r["kind"] for r in case.get("refs", [])]
    meta_case["seed"] = case.get("seed", 0)
    meta_case["pdd_heads"] = cfg.pdd
    if cfg.pdd > 1:
        meta_case["pdd_window"] = list(ref.pdd_window)
    meta_case["S"] = len(lay["positions"])
    meta_case["segments"] = lay["segments"]
    meta_case["unique_t"] = lay["unique_t"]
    meta_case["checkpoint"] = ckpt_name
    meta_case["deterministic_rerun"] = deterministic
    return tensors, meta_case, summary


def probe_torch_numerics(dev):
    """Facts about this PyTorch build that h3-model.md §9 lists as uncertain: does
    F.rms_norm round once (fused) or twice (composite) for bf16? Counted over random rows."""
    out = {}
    try:
        g = torch.Generator().manual_seed(7)
        x = (torch.randn((512, 320), generator=g) * 3).to(torch.bfloat16).to(dev)
        w = (1 + 0.3 * torch.randn((320,), generator=g)).to(torch.bfloat16).to(dev)
        if hasattr(F, "rms_norm"):
            y = F.rms_norm(x, (320,), w, EPS)
            xf = x.float()
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
            one = (xf * r * w.float()).to(torch.bfloat16)
            two = ((xf * r).to(torch.bfloat16) * w).to(torch.bfloat16)
            out["rms_norm_elements"] = y.numel()
            out["rms_norm_differs_from_single_rounding"] = int((y != one).sum())
            out["rms_norm_differs_from_double_rounding"] = int((y != two).sum())
        else:
            out["rms_norm"] = "F.rms_norm absent"
    except Exception as e:  # noqa: BLE001
        out["error"] = str(e)
    return out


def gen_torch_randn(out_dir):
    """PyTorch's CPU normal generator (condition-latent noise augmentation, h3-model.md
    §2.7, and the sampler's initial noise): torch.manual_seed(seed); torch.randn(n) for
    sizes around the 16-value Box-Muller block and the scalar (n < 16) path, 64-bit seeds,
    and a keyframe latent's shape. CPU only; needs no GPU."""
    tensors, cases = {}, []
    for seed in (0, 42, 123456789, 2 ** 32 + 5, 2 ** 63 + 11):
        for n in (1, 2, 7, 15, 16, 17, 31, 100, 1000):
            torch.manual_seed(seed)
            tensors[f"randn.{len(cases)}"] = torch.randn(n, dtype=torch.float32)
            cases.append({"name": f"randn.{len(cases)}", "seed": str(seed), "n": n})
    torch.manual_seed(7)
    tensors[f"randn.{len(cases)}"] = torch.randn((24, 1, 4, 6), dtype=torch.float32).reshape(-1)
    cases.append({"name": f"randn.{len(cases)}", "seed": "7", "n": 576, "shape": [24, 1, 4, 6]})
    meta = base_metadata("cpu")
    meta["kind"] = "torch_randn"
    meta["cases"] = json.dumps(cases)
    meta["regenerate"] = REGENERATE + " --randn-only"
    save(os.path.join(out_dir, "torch_randn_v1.safetensors"), tensors, meta)
    print(f"torch_randn_v1: {len(cases)} draws with torch {torch.__version__} on the CPU")


def gen_quant(out_dir, dev, seed):
    """The quantised golden cases (issue 14): the tiny config's weights (those of
    h3_golden_tiny) quantised in ComfyUI's int8 ConvRot and fp8 layouts, and the t2va case
    on each. Errors go to reference_errors_quant.json."""
    cfg = Cfg()
    weights = make_weights(cfg, seed)
    summary = {"device": dev, "torch": torch.__version__, "forward": {}}
    case = [c for c in case_list(cfg) if c["name"] == "t2va"][0]
    for fmt in ("int8", "fp8"):
        ckpt_name = f"h3_golden_tiny_{fmt}.safetensors"
        tensors, over, Q = quantise_checkpoint(cfg, weights, fmt)
        meta = base_metadata(dev)
        meta["kind"] = "checkpoint"
        meta["golden_config"] = json.dumps(cfg.to_json())
        meta["quant_format"] = fmt
        save(os.path.join(out_dir, ckpt_name), tensors, meta, over)
        plain = {k: v for k, v in tensors.items() if v.is_floating_point()}  # the mixed-ops float weights
        ATTN_BACKENDS.clear()
        ft, meta_case, s_fw = run_forward_case(cfg, plain, case, dev, ckpt_name, True, True, Q)
        meta = base_metadata(dev)
        meta["kind"] = "forward"
        meta["case"] = json.dumps(meta_case)
        meta["golden_config"] = json.dumps(cfg.to_json())
        meta["attention_backend"] = ",".join(sorted(ATTN_BACKENDS))
        meta["quant_format"] = fmt
        meta["regenerate"] = REGENERATE + " --quant-only --device cpu"
        cname = f"t2va_{fmt}"
        save(os.path.join(out_dir, f"forward_v1_{cname}.safetensors"), ft, meta)
        summary["forward"][cname] = s_fw
        print(f"forward_v1_{cname}: S {meta_case['S']}, deterministic rerun {meta_case['deterministic_rerun']}")
        for k in ("text.refined", "x.embed", "block.0.attn", "block.0.mlp", f"block.{cfg.num_layers - 1}.mlp",
                  "final.video_rows", "out.video", "out.audio"):
            if k in s_fw:
                print(f"  {k:22s} torch vs exact: max_abs {s_fw[k]['max_abs']:.3e} rel_l2 {s_fw[k]['rel_l2']:.3e}")
    with open(os.path.join(out_dir, "reference_errors_quant.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------
# INT8 attention fidelity (issue 26 item 3): tests/reference/int8_attention_ref.py
# ---------------------------------------------------------------------------------------
# Random inputs with H3-like outliers (made from integer hashes, so the C++ test makes the
# same bf16 values: only Kitchen's outputs and the errors are stored) and the golden H3
# cases (the real attention inputs, after q/k norm and RoPE, of the bf16 reference forward:
# stored). name, Mq, Mk, heads, head dim, K offset, K outlier channels, Q offset, Q channels.
FIDELITY_RANDOM = [
    ("gauss_2048", 64, 2048, 2, 128, 0.0, 0, 0.0, 0),
    ("k4x10_2048", 64, 2048, 2, 128, 10.0, 4, 0.0, 0),
    ("k4x20_2048", 64, 2048, 2, 128, 20.0, 4, 0.0, 0),
    ("k4x15_q4x8_2048", 64, 2048, 2, 128, 15.0, 4, 8.0, 4),
    ("k16x12_2048", 64, 2048, 2, 128, 12.0, 16, 0.0, 0),
    ("k4x15_q4x8_1000", 64, 1000, 2, 128, 15.0, 4, 8.0, 4),
    ("k4x20_200", 64, 200, 2, 128, 20.0, 4, 0.0, 0),
    ("k4x15_q4x8_2048_d64", 64, 2048, 2, 64, 15.0, 4, 8.0, 4),
]
# (forward case, attention prefix): the tiny golden config (3 heads x 32).
FIDELITY_GOLDEN = [
    ("t2va", "token_refiner.blocks.0.attn."), ("t2va", "blocks.0.attn."), ("t2va", "blocks.1.attn."),
    ("keyframes", "blocks.1.attn."), ("mask_partial", "blocks.1.attn."), ("reference_aug", "blocks.1.attn."),
]


def gen_attention(out_dir, dev, seed):
    import int8_attention_ref as ia
    meta_cases, tensors, table = [], {}, []

    def measure(name, q, k, v):  # q, k, v [M, H, D] bf16
        qh, kh, vh = (t.float().transpose(0, 1).contiguous() for t in (q, k, v))
        ex = ia.exact_attention(qh, kh, vh)
        ki, det = ia.kitchen_int8_attention(qh, kh, vh, return_details=True)
        sa = ia.sage_int8_attention(qh, kh, vh)
        bf = ex.float().to(torch.bfloat16).float()  # float64 rounded once to bf16: the floor
        e = {"err_kitchen": ia.rel_l2(ki, ex), "err_sage": ia.rel_l2(sa, ex), "err_exact_bf16": ia.rel_l2(bf, ex),
             "kitchen_anchor_rows": det["anchors"], "kitchen_cta_k": det["cta_k"], "kitchen_head_dim": det["C"]}
        table.append((name, e))
        print(f"  {name:36s} Kitchen {e['err_kitchen']:.3e}  Sage {e['err_sage']:.3e}  "
              f"bf16(exact) {e['err_exact_bf16']:.3e}  anchors {det['anchors']}")
        return ex.transpose(0, 1), ki.transpose(0, 1).to(torch.bfloat16), sa.transpose(0, 1).to(torch.bfloat16), e

    for i, (name, Mq, Mk, H, D, ko, kc, qo, qc) in enumerate(FIDELITY_RANDOM):
        cs = 1000 + 16 * i  # q, k, v streams cs, cs + 1, cs + 2
        q = ia.fidelity_tensor(cs, Mq, H, D, qo, qc)
        k = ia.fidelity_tensor(cs + 1, Mk, H, D, ko, kc)
        v = ia.fidelity_tensor(cs + 2, Mk, H, D, 0.0, 0)
        _, ki, _, e = measure(name, q, k, v)
        tensors[name + ".kitchen"] = ki
        meta_cases.append(dict(e, case=name, kind="random", seed=cs, Mq=Mq, Mk=Mk, heads=H, head_dim=D,
                               k_offset=ko, k_channels=kc, q_offset=qo, q_channels=qc,
                               fnv_q=ia.bf16_fnv(q), fnv_k=ia.bf16_fnv(k), fnv_v=ia.bf16_fnv(v)))
    cfg = Cfg()
    weights = make_weights(cfg, seed)
    cases = {c["name"]: c for c in case_list(cfg)}
    captured = {}
    for cname in sorted({c for c, _ in FIDELITY_GOLDEN}):
        ref = H3Reference(cfg, weights, BF16, dev)
        ref.capture = {}
        ref.forward(cases[cname], ref.refine_text(cases[cname]["text"].to(dev)))
        captured[cname] = ref.capture
    for cname, pre in FIDELITY_GOLDEN:
        q, k, v = (t.cpu().to(torch.bfloat16) for t in captured[cname][pre])
        name = cname + "." + pre.rstrip(".").replace("token_refiner.blocks", "refiner").replace("blocks", "block")
        ex, ki, sa, e = measure(name, q, k, v)
        for key, t in (("q", q), ("k", k), ("v", v), ("exact", ex.float()), ("kitchen", ki), ("sage", sa)):
            tensors[f"{name}.{key}"] = t
        meta_cases.append(dict(e, case=name, kind="golden", forward_case=cname, attention=pre, Mq=q.shape[0],
                               Mk=k.shape[0], heads=q.shape[1], head_dim=q.shape[2]))
    meta = base_metadata(dev)
    meta["kind"] = "attention_int8"
    meta["cases"] = json.dumps(meta_cases)
    meta["golden_config"] = json.dumps(cfg.to_json())
    meta["attention_backend"] = ",".join(sorted(ATTN_BACKENDS))
    meta["regenerate"] = REGENERATE + " --attention-only --device cpu"
    meta["kitchen_restatement"] = "tests/reference/int8_attention_ref.py kitchen_int8_attention"
    meta["sage_restatement"] = "tests/reference/int8_attention_ref.py sage_int8_attention"
    save(os.path.join(out_dir, "attention_int8_v1.safetensors"), tensors, meta)
    print(f"attention_int8_v1: {len(meta_cases)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. tests/data/golden)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--randn-only", action="store_true",
                    help="only write torch_randn_v1.safetensors (PyTorch's CPU randn; no GPU needed)")
    ap.add_argument("--quant-only", action="store_true",
                    help="only write the quantised cases (h3_golden_tiny_{int8,fp8}, forward_v1_t2va_{int8,fp8}); "
                         "committed from Debian's PyTorch 1.13 on the CPU")
    ap.add_argument("--attention-only", action="store_true",
                    help="only write attention_int8_v1.safetensors (INT8 attention fidelity: Comfy Kitchen's and "
                         "SageAttention's algorithms restated, tests/reference/int8_attention_ref.py); committed "
                         "from Debian's PyTorch 1.13 on the CPU")
    args = ap.parse_args()
    if args.attention_only:
        os.makedirs(args.out, exist_ok=True)
        torch.manual_seed(args.seed)
        gen_attention(args.out, args.device or "cpu", args.seed)
        return
    if args.randn_only:
        os.makedirs(args.out, exist_ok=True)
        gen_torch_randn(args.out)
        return
    if args.quant_only:
        os.makedirs(args.out, exist_ok=True)
        torch.manual_seed(args.seed)
        gen_quant(args.out, args.device or "cpu", args.seed)
        return
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    os.makedirs(args.out, exist_ok=True)
    # fp32 GEMMs without TF32 (ComfyUI does not enable it; PyTorch's default is off).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # bf16 GEMMs accumulate in fp32 throughout: forbid cuBLAS's reduced-precision (bf16)
    # split-K reductions, which PyTorch allows by default (irrelevant at these sizes, but
    # the reference must be the plain fp32-accumulating GEMM of the op contract).
    try:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    except (AttributeError, AssertionError):  # PyTorch without the switch
        pass
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    torch.manual_seed(args.seed)
    t0 = time.time()
    summary = {"device": dev, "torch": torch.__version__, "probe": probe_torch_numerics(dev)}
    print(f"torch {torch.__version__} cuda {torch.version.cuda} device {dev}: probe {summary['probe']}")

    tensors, cases, s_ops = gen_ops(dev, args.seed)
    meta = base_metadata(dev)
    meta["kind"] = "ops"
    meta["cases"] = json.dumps(cases)
    meta["attention_backend"] = ",".join(sorted(ATTN_BACKENDS))
    writer = save(os.path.join(args.out, "ops_v1.safetensors"), tensors, meta)
    summary["ops"] = s_ops
    print(f"ops_v1: {len(cases)} cases, attention backend {meta['attention_backend']} ({writer})")
    for k, v in s_ops.items():
        print(f"  {k:24s} torch vs exact: max_abs {v['max_abs']:.3e} rel_l2 {v['rel_l2']:.3e}")

    summary["forward"] = {}
    for ckpt_name, cfg, cases_for, wseed in [
            ("h3_golden_tiny.safetensors", Cfg(), None, args.seed),
            ("h3_golden_tiny_curve.safetensors", Cfg(curve_grid=65, curve_k=8), ["t2va"], args.seed + 7),
            ("h3_golden_tiny_pdd.safetensors", Cfg(pdd=4), None, args.seed + 11)]:
        weights = make_weights(cfg, wseed)
        meta = base_metadata(dev)
        meta["kind"] = "checkpoint"
        meta["golden_config"] = json.dumps(cfg.to_json())
        save(os.path.join(args.out, ckpt_name), weights, meta)
        first = True
        for case in case_list(cfg):
            if cases_for is not None and case["name"] not in cases_for:
                continue
            cname = case["name"] + ("_curve" if cfg.curve else "")
            try:
                ATTN_BACKENDS.clear()
                tensors, meta_case, s_fw = run_forward_case(cfg, weights, case, dev, ckpt_name, first, first)
                first = False
            except Exception as e:  # noqa: BLE001 - one broken case must not lose the others
                import traceback
                traceback.print_exc()
                print(f"forward case {cname} FAILED: {e}")
                summary["forward"][cname] = {"error": str(e)}
                continue
            meta = base_metadata(dev)
            meta["kind"] = "forward"
            meta["case"] = json.dumps(meta_case)
            meta["golden_config"] = json.dumps(cfg.to_json())
            meta["attention_backend"] = ",".join(sorted(ATTN_BACKENDS))
            save(os.path.join(args.out, f"forward_v1_{cname}.safetensors"), tensors, meta)
            summary["forward"][cname] = s_fw
            print(f"forward_v1_{cname}: S {meta_case['S']}, unique_t {meta_case['unique_t']}, "
                  f"attention {meta['attention_backend']}, deterministic rerun {meta_case['deterministic_rerun']}")
            for k in ("text.refined", "x.embed", "block.0.attn", "block.0.mlp", f"block.{cfg.num_layers - 1}.mlp",
                      "final.video_rows", "final.audio_rows", "out.video", "out.audio"):
                if k in s_fw:
                    print(f"  {k:22s} torch vs exact: max_abs {s_fw[k]['max_abs']:.3e} "
                          f"rel_l2 {s_fw[k]['rel_l2']:.3e}")
    gen_torch_randn(args.out)
    with open(os.path.join(args.out, "reference_errors.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
