"""INT8 attention restated in PyTorch, for the golden fidelity files (issue 26 item 3).

Two algorithms LayerStream's `attention int8` (docs/int8-attention.md) is measured against,
each restated from reading its sources (no code copied), plus the float64 reference:

* kitchen_int8_attention: Comfy Kitchen's INT8 attention (`comfy_kitchen.sage_attention.
  int8_attention`, ComfyUI's "comfy kitchen attention"), as its CUDA path computes it on
  sm_80 / sm_90 for an unmasked call. Read in Comfy-Org/comfy-kitchen:
  comfy_kitchen/sage_attention.py (padding, tile choice, scale buffer shapes),
  backends/cuda/sage_attention/quant_qk_int8.cu (rotation, anchor key, Q/K scale groups),
  quant_v_int8.cu (per-channel V), qk_int_sv_i8_cuda.cuh + attn_utils.cuh (the softmax,
  P quantisation, row sum, P.V), sage_attn_launcher.cu (tile sizes). See KITCHEN below.
* sage_int8_attention: plain SageAttention (thu-ml/SageAttention, papers 1 and 2): one
  INT8 scale per block of Q rows and of K rows, K minus its per-channel mean over all
  keys, no rotation, P.V in FP8 e4m3 as SageAttention 2 does. See SAGE below.
* exact_attention: softmax attention in float64 of the same (bf16-valued) inputs.

Layout everywhere: q [H, Mq, D], k and v [H, Mk, D], float tensors holding bf16 values;
the results are float32 tensors holding bf16 values, [H, Mq, D]. Everything runs on the
CPU in float32 / float64 (any PyTorch >= 1.13), whatever device the inputs come from.

KITCHEN, step by step (what its kernels do, and where this restatement had to choose):
 1. Head dim padded with zeros to C = 64, 128 or 256; scale = fl32(D ** -0.5) of the
    unpadded D; key tile cta_k = 128 when C >= 128 and Mk > 1024, else 64.
 2. Rotation of Q and K rows (the same for both, so q.k is kept up to rounding):
    Mk <= 256: H4 on every 4 adjacent channels, times 0.5 ("convrot4");
    else C = 128: a fixed sign flip (four 32-bit words, a channel is negated where its
    bit is 0), then the normalised fast Walsh-Hadamard transform H128 (stages of stride
    1, 2, then x 0.5, then 4 .. 64, then x fl32(0.1767766952966369));
    C = 64: H64 without signs (stages 1, 2, x 0.5, 4 .. 32, x 0.25); C = 256: H128
    without signs on each 128-channel half. Every stage is fp32 a + b / a - b.
 3. K anchor: 9 keys at rows s (Mk - 1) / 8; the candidate minimising
    sum_c (9 k_cand - sum_samples k)^2; used when it lowers the samples' energy and raises
    their abs-max by at most 12.5 %; then fl32(k - anchor) for every key. CHOICE: the
    energies are summed in float64 here (the kernel: fp32 fmaf per channel and a shuffle
    tree), which can only matter at a near tie.
 4. Q scales per group of rows: rows r, r + 8, r + 16, r + 24 of each 32-row block (C 64
    and 128), r, r + 8 of each 16-row block (C 256). K scales per group of keys: keys with
    (n mod 8) / 2 == o inside each cta_k block (16 keys at cta_k 64, 32 at 128). Scale
    fl32(fl32(amax / 127) + 1e-7) over the rotated values; x8 = sat(rint(x * fl32(1 / s))).
 5. V: per (head, channel) over all keys, s = max(fl32(amax * fl32(1/127)), 1e-12),
    v8 = sat(rint(v * fl32(1 / s))).
 6. Scores per cta_k tile: s_int = q8 . k8 (exact), the log2-domain factor
    sc = fl32(fl32(scale * log2e) * fl32(sq * sk)); tile max
    tile_m = max_j fma(s_int_j, sc_j, -7.9943534) (so that 2^(t - tile_m) is 255 at the
    tile's own maximum); m_new = max(m, tile_m); x = 2^-|m - tile_m|; the running state
    is scaled by x where the tile raised the maximum, the tile's contribution by x where
    it did not. p_j = 2^fma(s_int_j, sc_j, -tile_m) (relative to the TILE's maximum),
    p8_j = sat_u8(rint(p_j)); acc = fma(float(sum_j p8_j v8_j), x_tile, acc).
 7. Row sum: in every tile but the last, the integer sums of p8 over each thread's keys
    (4 keys per 16-key subtile), added with fma(sum, x_tile, d) per subtile in order on
    each of the 4 threads that share a row; in the LAST tile (the kernel's masked path)
    the fp32 sums of the unquantised p, ((p_a + p_b) + (p_c + p_d)) per thread and
    subtile. The 4 threads' d are added as (d0 + d1) + (d2 + d3); out = bf16(fl32(acc *
    fl32(1 / d)) * s_v). (On Blackwell with Mk <= 512 every tile takes the masked path:
    not restated.)
 CHOICES: exp2 is torch's fp32 exp2 (the kernel: ex2.approx.ftz, about 2 ulp), 1 / d is
 IEEE (the kernel: rcp.approx); fma is computed in float64 and rounded once to fp32
 (exact except for a double rounding at a probability of about 2^-29 per operation).

SAGE (plain SageAttention, restated; CHOICES named): Q quantised per block of 128 rows
after multiplying by fl32(scale * log2e) (SageAttention's per-block quantiser folds the
softmax scale into Q), K per block of 64 keys after subtracting its per-channel mean over
all keys (fp32), scale amax / 127, rounding half away from zero; no rotation; online
softmax in base 2 over 128-key tiles with the running maximum; P scaled to 448 (2^(s - m
+ log2 448)) and rounded to e4m3; V per channel to e4m3 with scale amax / 448; P.V
accumulated in fp32 per tile and added to the fp32 output (SageAttention 2's two-level
"fp32 + fp32" accumulation; Hopper's FP8 MMA accumulates with fewer bits, not modelled);
the row sum is the fp32 sum of the unquantised p; out = bf16(acc / l * s_v).
"""

import math
import struct

import torch


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


LOG2E_F = f32(1.44269504088896340736)
S_U8_OFFSET = f32(7.9943534)  # exp2(7.9943534) rounds to 255
INV_SQRT32_F = f32(0.1767766952966369)
KITCHEN_SIGN_WORDS = (0x1035997B, 0x8087F5EE, 0xEE2E4E1A, 0x71132418)


def _t(x):  # an fp32 scalar tensor
    return torch.tensor(f32(x), dtype=torch.float32)


def _fma32(a, b, c):
    """fl32(a * b + c) for fp32 a, b, c: the product is exact in float64."""
    return (a.double() * b.double() + c.double()).float()


def _bf16(x):
    return x.float().to(torch.bfloat16).float()


# ---------------------------------------------------------------------------------------
# float64 reference
# ---------------------------------------------------------------------------------------
def exact_attention(q, k, v, scale=None):
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * sc
    return torch.matmul(torch.softmax(s, dim=-1), v)


def rel_l2(a, ref):
    a, ref = a.double().cpu(), ref.double().cpu()
    return float((a - ref).norm() / ref.norm())


# ---------------------------------------------------------------------------------------
# Kitchen
# ---------------------------------------------------------------------------------------
def _butterfly(x, s):
    """One fast Walsh-Hadamard stage of stride s on the last dim: (a, b) -> (a + b, a - b)."""
    shape = x.shape
    y = x.reshape(*shape[:-1], shape[-1] // (2 * s), 2, s)
    a, b = y[..., 0, :], y[..., 1, :]
    return torch.stack((a + b, a - b), dim=-2).reshape(shape)


def kitchen_signs(C=128):
    sign = [1.0 if (KITCHEN_SIGN_WORDS[c // 32] >> (c % 32)) & 1 else -1.0 for c in range(C)]
    return torch.tensor(sign, dtype=torch.float32)


def kitchen_rotate(x, C, Mk):
    """Kitchen's rotation (step 2) of fp32 rows x [..., C]."""
    x = x.float()
    half = _t(0.5)
    if Mk <= 256:  # convrot4
        for s in (1, 2):
            x = _butterfly(x, s)
        return x * half
    if C == 64:  # convrot64
        for s in (1, 2):
            x = _butterfly(x, s)
        x = x * half
        for s in (4, 8, 16, 32):
            x = _butterfly(x, s)
        return x * _t(0.25)
    tiles = []
    for t in range(C // 128):
        y = x[..., t * 128:(t + 1) * 128]
        if C == 128:  # convrot128: signs, then the normalised H128
            y = y * kitchen_signs(128)  # exact (a sign flip)
        for s in (1, 2):
            y = _butterfly(y, s)
        y = y * half
        for s in (4, 8, 16, 32, 64):
            y = _butterfly(y, s)
        tiles.append(y * _t(INV_SQRT32_F))
    return torch.cat(tiles, dim=-1)


def _row_scale(amax):
    return amax / _t(127.0) + _t(1e-7)  # fp32 division, then fp32 add


def _quant_i8(x, s):
    inv = _t(1.0) / s
    return torch.round(x * inv).clamp(-128, 127)


def kitchen_anchor(k):
    """Step 3: per head the anchor key's row index, or -1. k fp32 [H, Mk, C]."""
    H, Mk, _ = k.shape
    rows = [s * (Mk - 1) // 8 for s in range(9)]
    S = k[:, rows, :].double()  # [H, 9, C]
    e0 = (S * S).sum((1, 2))
    m0 = S.abs().amax((1, 2)).float()
    dist = ((9.0 * S - S.sum(1, keepdim=True)) ** 2).sum(-1)  # [H, 9]
    best = torch.argmin(dist, dim=1)  # the first minimum, as the kernel's strict <
    out = []
    for h in range(H):
        r = S[h] - S[h, best[h]]
        e1, m1 = float((r * r).sum()), float(r.abs().amax())
        ok = e1 < float(e0[h]) and f32(m1) <= f32(float(m0[h]) * 1.125)
        out.append(rows[int(best[h])] if ok else -1)
    return out


def kitchen_int8_attention(q, k, v, scale=None, return_details=False, p_running_max=False):
    """Kitchen's algorithm (module docstring). p_running_max: an ablation, P quantised
    against the running maximum m_new instead of the tile's own (not Kitchen's)."""
    q, k, v = (t.detach().cpu().float() for t in (q, k, v))
    H, Mq, D0 = q.shape
    Mk = k.shape[1]
    C = 64 if D0 <= 64 else 128 if D0 <= 128 else 256
    if C != D0:
        pad = lambda t: torch.nn.functional.pad(t, (0, C - D0))  # noqa: E731
        q, k, v = pad(q), pad(k), pad(v)
    sm = f32(D0 ** -0.5) if scale is None else f32(scale)
    cta_k = 128 if (C >= 128 and Mk > 1024) else 64
    # K anchor, rotation, scales
    anchors = kitchen_anchor(k)
    kc = k.clone()
    for h, a in enumerate(anchors):
        if a >= 0:
            kc[h] = k[h] - k[h, a]
    kr = kitchen_rotate(kc, C, Mk)
    qr = kitchen_rotate(q, C, Mk)
    # Q groups (step 4)
    warpq, nr = (16, 2) if C == 256 else (32, 4)
    Mq_p = (Mq + 127) // 128 * 128
    qp = torch.nn.functional.pad(qr, (0, 0, 0, Mq_p - Mq))
    g = qp.abs().reshape(H, Mq_p // warpq, nr, 8, C).amax(dim=(2, 4))  # [H, blocks, 8]
    sq = _row_scale(g)[:, :, None, :].expand(H, Mq_p // warpq, nr, 8).reshape(H, Mq_p)[:, :Mq]
    q8 = _quant_i8(qr, sq[..., None])
    # K groups
    Mk_p = (Mk + cta_k - 1) // cta_k * cta_k
    kp = torch.nn.functional.pad(kr, (0, 0, 0, Mk_p - Mk))
    g = kp.abs().reshape(H, Mk_p // cta_k, cta_k // 8, 4, 2, C).amax(dim=(2, 4, 5))  # [H, blocks, 4]
    sk = _row_scale(g)[:, :, None, :, None].expand(H, Mk_p // cta_k, cta_k // 8, 4, 2).reshape(H, Mk_p)[:, :Mk]
    k8 = _quant_i8(kr, sk[..., None])
    # V (step 5)
    sv = torch.maximum(v.abs().amax(1) * _t(1.0 / 127.0), _t(1e-12))  # [H, C]
    v8 = _quant_i8(v, sv[:, None, :])
    # Softmax and P.V (steps 6-7)
    s_int = torch.matmul(q8.double(), k8.double().transpose(-1, -2))  # exact integers
    base = _t(sm) * _t(LOG2E_F)  # the kernel's sm_scale *= log2e (fp32)
    dq = sq[:, :, None] * sk[:, None, :]  # fp32 [H, Mq, Mk]
    sc = base * dq
    ntile = Mk_p // cta_k
    m = torch.full((H, Mq), -50000.0, dtype=torch.float32)
    d = torch.ones((H, Mq, 4), dtype=torch.float32)
    acc = torch.zeros((H, Mq, C), dtype=torch.float32)
    off = _t(S_U8_OFFSET)
    for t in range(ntile):
        j0, j1 = t * cta_k, min(Mk, (t + 1) * cta_k)
        last = t == ntile - 1
        st = s_int[:, :, j0:j1].float()  # exact
        sct = sc[:, :, j0:j1]
        tile_m = _fma32(st, sct, (-off).expand_as(st)).amax(-1)
        x = torch.exp2(-(m - tile_m).abs())
        o_scale = torch.where(m < tile_m, x, torch.ones_like(x))
        ts = torch.where(tile_m < m, x, torch.ones_like(x))
        d = d * o_scale[..., None]
        acc = acc * o_scale[..., None]
        p_ref = torch.maximum(m, tile_m) if p_running_max else tile_m
        if p_running_max:  # the tile's contribution then needs no rescaling
            ts = torch.ones_like(ts)
        p = torch.exp2(_fma32(st, sct, (-p_ref)[..., None].expand_as(st)))
        n = j1 - j0
        if n < cta_k:  # the last tile's keys past Mk: probability 0
            p = torch.nn.functional.pad(p, (0, cta_k - n))
        p8 = torch.round(p).clamp(0, 255)
        part = torch.matmul(p8[..., :n].double(), v8[:, j0:j1, :].double()).float()  # exact integers
        acc = _fma32(part, ts[..., None].expand_as(part), acc)
        # keys of thread t in subtile f: f*16 + h*8 + 2t + p (h, p in {0, 1})
        sub = (p8 if not last else p).reshape(H, Mq, cta_k // 16, 2, 4, 2)
        if not last:
            den = sub.sum(dim=(3, 5))  # exact integers [H, Mq, nsub, 4]
        else:
            den = (sub[:, :, :, 0, :, 0] + sub[:, :, :, 0, :, 1]) + (sub[:, :, :, 1, :, 0] + sub[:, :, :, 1, :, 1])
        for f in range(cta_k // 16):
            d = _fma32(den[:, :, f, :], ts[..., None].expand(H, Mq, 4), d)
        m = torch.maximum(m, tile_m)
    dsum = (d[..., 0] + d[..., 1]) + (d[..., 2] + d[..., 3])
    out = (acc * (_t(1.0) / dsum)[..., None]) * sv[:, None, :]
    out = _bf16(out)[..., :D0]
    if return_details:
        return out, {"anchors": anchors, "cta_k": cta_k, "C": C}
    return out


# ---------------------------------------------------------------------------------------
# SageAttention (plain, restated)
# ---------------------------------------------------------------------------------------
def e4m3_round(x):
    """Nearest e4m3fn value (ties to even), saturating to +-448; fp32 kept."""
    x = x.clamp(-448.0, 448.0)
    _, e = torch.frexp(x.abs())
    step = torch.pow(torch.tensor(2.0, dtype=x.dtype), (e - 4).clamp(min=-9).to(x.dtype))
    return (torch.round(x / step) * step).clamp(-448.0, 448.0)


def _quant_block_i8(x, blk):
    """Per block of blk rows of x [H, M, D]: scale amax / 127, round half away from 0."""
    H, M, D = x.shape
    Mp = (M + blk - 1) // blk * blk
    xp = torch.nn.functional.pad(x, (0, 0, 0, Mp - M))
    amax = xp.abs().reshape(H, Mp // blk, blk * D).amax(-1)
    s = torch.maximum(amax / _t(127.0), _t(1e-30))
    s_rows = s[:, :, None].expand(H, Mp // blk, blk).reshape(H, Mp)[:, :M]
    y = x / s_rows[..., None]
    return torch.trunc(y + 0.5 * torch.sign(y)).clamp(-127, 127), s_rows


def sage_int8_attention(q, k, v, scale=None, q_block=128, k_block=64, kv_tile=128):
    q, k, v = (t.detach().cpu().float() for t in (q, k, v))
    H, Mq, D = q.shape
    Mk = k.shape[1]
    sm = f32(D ** -0.5) if scale is None else f32(scale)
    qs = q * (_t(sm) * _t(LOG2E_F))
    kc = k - k.mean(dim=1, keepdim=True)
    q8, sq = _quant_block_i8(qs, q_block)
    k8, sk = _quant_block_i8(kc, k_block)
    sv = torch.maximum(v.abs().amax(1) / _t(448.0), _t(1e-30))  # [H, D]
    v8 = e4m3_round(v / sv[:, None, :])
    s = torch.matmul(q8.double(), k8.double().transpose(-1, -2)).float() * (sq[:, :, None] * sk[:, None, :])
    off = _t(math.log2(448.0))
    m = torch.full((H, Mq), -float("inf"), dtype=torch.float32)
    l = torch.zeros((H, Mq), dtype=torch.float32)
    acc = torch.zeros((H, Mq, D), dtype=torch.float32)
    for j0 in range(0, Mk, kv_tile):
        st = s[:, :, j0:j0 + kv_tile]
        m_new = torch.maximum(m, st.amax(-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(st - m_new[..., None] + off)
        l = l * alpha + p.sum(-1)
        part = torch.matmul(e4m3_round(p).double(), v8[:, j0:j0 + kv_tile, :].double()).float()
        acc = acc * alpha[..., None] + part
        m = m_new
    return _bf16(acc / l[..., None] * sv[:, None, :])


# ---------------------------------------------------------------------------------------
# Deterministic inputs shared with the C++ test (tests/test_attention_int8_fidelity.cpp):
# integer hashing only, so both sides make the same bf16 values bit for bit.
# ---------------------------------------------------------------------------------------
M32 = 0xFFFFFFFF


def _mul32(x, c):
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def hash32(x):
    """lowbias32 on int64 tensors holding uint32 values."""
    x = x & M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash32_int(x):
    return int(hash32(torch.tensor([x], dtype=torch.int64))[0])


def uniform24(seed, n):
    """n values (h >> 8) / 2^24, h = hash32(i ^ hash32(seed)) for i = 0 .. n-1 (float64, exact)."""
    i = torch.arange(n, dtype=torch.int64)
    h = hash32(i ^ hash32_int(seed))
    return (h >> 8).double() / float(1 << 24)


def fidelity_tensor(seed, M, H, D, offset, channels):
    """[M, H, D] bf16 values: fl32(sum of 12 uniform24 - 6) (Irwin-Hall, about N(0, 1)),
    plus on `channels` outlier channels per head fl32(offset * fl32(0.5 + u)), u uniform24
    of stream seed ^ 0x5bd1e995 indexed by h * D + c; rounded to bf16."""
    n = M * H * D
    u = uniform24(seed, n * 12).reshape(n, 12)
    x = (u.sum(1) - 6.0).float().reshape(M, H, D)
    if channels:
        chans = [(37 * i + 5) % D for i in range(channels)]
        su = uniform24(seed ^ 0x5BD1E995, H * D).float().reshape(H, D)
        off = _t(offset) * (_t(0.5) + su)
        mask = torch.zeros(D, dtype=torch.bool)
        mask[chans] = True
        x = torch.where(mask[None, None, :], x + off[None, :, :], x)
    return x.to(torch.bfloat16)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def bf16_fnv(t):
    """FNV-1a 64 of a bf16 tensor's little-endian bytes (as the C++ test hashes them)."""
    return "%016x" % fnv1a64(t.contiguous().view(torch.int16).numpy().tobytes())
