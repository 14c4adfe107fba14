"""A small torch.nn.Module mirror of ComfyUI's MiniMaxH3Model (comfy/ldm/minimax/model.py,
read at revision 01a56b76bba3) for the comfy-sliced path's tests (issue 18).

It keeps what comfyui/layerstream_h3/sliced.py touches, under ComfyUI's names and calling
conventions: model.blocks[i] (norm1, norm2, attn.{qkv_proj, q_norm, k_norm, out_proj, heads,
head_dim, comfy_attention}, mlp.{fc1, fc2}, adaln_proj) with
forward(x, t_emb, mod_segments, rope_freqs, transformer_options, attention); model.final_layer
with forward(x, t_emb, video_seg, audio_seg, sigma, sample_sigmas, shifts) and PDD head banks;
module-level _mod_scale_shift / _mod_gate / _mod_row / optimized_attention /
AttentionTensorContainer and comfy.quant_ops.ck.rms_rope_split_half_; the DIFFUSION_MODEL
wrapper chain (executor(*args), executor.class_obj) and "double_block" replace patches.
Written for these tests, not copied: the packed layout (text | keyframe cond rows | audio |
video), per-row mask timesteps, text tags and the time embedding are simplified, but they
produce the same kinds of inputs the blocks and the head see (int mod rows and per-token
LongTensor rows, a [1, S, 1, P, 2, 2] rotation table).

Numerics follow ComfyUI on a GPU where it matters for slicing: bf16 activations, RMSNorm in
fp32 with one rounding (what F.rms_norm does for bf16; on the CPU a bf16 mean is not row-exact,
see sliced_table.py), in-place modulation and gated adds per segment, fp32 output heads.
"""

import math
import types

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the stand-ins for the comfy package the model module reaches through `comfy.` ------
def _rms_rope_split_half(q, k, table, qw, kw, epsilon, rot_dim):
    """Per (token, head) RMSNorm (fp32, one rounding) then split-half RoPE on the first rot_dim
    dims: pair (j, j + rot_dim/2) rotated by table [1, S, 1, rot_dim/2, 2, 2]."""
    def one(x, w):
        xf = x.float()
        n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon) * w.float()).to(x.dtype)
        p = rot_dim // 2
        m = table.float()  # [1, S, 1, p, 2, 2]
        x0, x1 = n[..., :p].float(), n[..., p:rot_dim].float()
        y0 = m[..., 0, 0] * x0 + m[..., 0, 1] * x1
        y1 = m[..., 1, 0] * x0 + m[..., 1, 1] * x1
        return torch.cat([y0.to(x.dtype), y1.to(x.dtype), n[..., rot_dim:]], dim=-1)
    return one(q, qw), one(k, kw)


def _rms_rope_split_half_(q, k, table, qw, kw, epsilon, rot_dim):
    qo, ko = _rms_rope_split_half(q, k, table, qw, kw, epsilon, rot_dim)
    q.copy_(qo)
    k.copy_(ko)


def _cast_to(t, dtype=None, device=None, **_):
    return t.to(device=device if device is not None else t.device, dtype=dtype if dtype is not None else t.dtype)


def _linear_input_act(linear, x, input_act):
    assert input_act == "swiglu"
    gate, up = x.chunk(2, dim=-1)
    return linear(F.silu(gate).mul_(up))


class _WrapperExecutor:
    """ComfyUI's WrapperExecutor, reduced: executor(*args) runs the next wrapper or the
    wrapped function; executor.class_obj is the model."""

    def __init__(self, fn, class_obj, wrappers, idx=0):
        self.fn, self.class_obj, self.wrappers, self.idx = fn, class_obj, wrappers, idx

    def __call__(self, *args, **kwargs):
        if self.idx < len(self.wrappers):
            nxt = _WrapperExecutor(self.fn, self.class_obj, self.wrappers, self.idx + 1)
            return self.wrappers[self.idx](nxt, *args, **kwargs)
        return self.fn(*args, **kwargs)


comfy = types.SimpleNamespace(
    quant_ops=types.SimpleNamespace(ck=types.SimpleNamespace(
        rms_rope_split_half=_rms_rope_split_half, rms_rope_split_half_=_rms_rope_split_half_)),
    model_management=types.SimpleNamespace(cast_to=_cast_to, in_training=False),
    ops=types.SimpleNamespace(linear_input_act=_linear_input_act),
)

# How many attention calls saw how many queries (tests check slicing really happened).
ATTENTION_CALLS = []


class AttentionTensorContainer:
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def take(self):
        t = self.tensor
        if t is None:
            raise RuntimeError("attention tensor container has already been consumed")
        self.tensor = None
        return t


class ComfyAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.function = None


def _sdpa_comfy_priority(q, k, v):
    """SDPA as comfy/ops.py calls it on CUDA: for inputs of 128k elements or more, under the
    backend priority flash, cuDNN, efficient, math (where PyTorch can set a priority)."""
    try:
        import inspect
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if q.nelement() >= 1024 * 128 and "set_priority" in inspect.signature(sdpa_kernel).parameters:
            order = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                     SDPBackend.MATH]
            with sdpa_kernel(order, set_priority=True):
                return F.scaled_dot_product_attention(q, k, v)
    except ImportError:
        pass
    return F.scaled_dot_product_attention(q, k, v)


def _attention_math(q, k, v, heads, **kw):
    """q [1, H, M, Dh], k/v [1, H, S, Dh] -> [1, M, H*Dh]. CUDA / PyTorch >= 2: SDPA (as
    ComfyUI's attention_pytorch); otherwise fp32 scores and softmax, P rounded to the input
    dtype, P.V accumulated in fp32 (row-exact on the CPU, sliced_table.py)."""
    ATTENTION_CALLS.append(q.shape[2])
    if hasattr(F, "scaled_dot_product_attention") and q.is_cuda:
        out = _sdpa_comfy_priority(q, k, v)
    else:
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        p = torch.softmax(s, dim=-1).to(q.dtype).float()
        out = torch.matmul(p, v.float()).to(q.dtype)
    return out.transpose(1, 2).reshape(1, -1, heads * q.shape[-1])


def attention_pytorch(q, k, v, heads, mask=None, skip_reshape=True, preferred_attention=None,
                      transformer_options=None, **kw):
    """The optimized_attention entry point (attention.py wrap_attn, reduced): containers in,
    an installed override or the checkpoint's preferred function first."""
    q, k, v = q.take(), k.take(), v.take()
    to = transformer_options or {}
    if "optimized_attention_override" in to:
        return to["optimized_attention_override"](_attention_math, q, k, v, heads, **kw)
    if preferred_attention is not None and preferred_attention.function is not None:
        return preferred_attention.function(q, k, v, heads, **kw)
    return _attention_math(q, k, v, heads, **kw)


optimized_attention = attention_pytorch


# ---- operations ---------------------------------------------------------------------------
class Linear(nn.Linear):
    """comfy.ops Linear (disable_weight_init): weights used as stored (bf16 with bf16 input,
    fp32 heads with fp32 input); weight_function / bias_function patch lists like ComfyUI."""
    weight_function = []
    bias_function = []

    def forward(self, x):
        w, b = self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype)
        for f in self.weight_function:
            w = f(w)
        return F.linear(x, w, b)


class _Int8Weight:
    """Duck type of ComfyUI's QuantizedTensor with TensorWiseINT8Layout: int8 rows, fp32
    per-row scales (what classify_linear reads: _layout_cls)."""
    _layout_cls = "TensorWiseINT8Layout"

    def __init__(self, w):
        wf = w.float()
        self.scale = (wf.abs().amax(dim=1).clamp(min=1e-8) / 127.0)  # f32 [N]
        self.qdata = torch.round(wf / self.scale[:, None]).clamp(-127, 127).to(torch.int8)  # int8 [N, K]
        self.shape = w.shape
        self.dtype = torch.int8


class Int8Linear(nn.Module):
    """An int8 linear with per-row dynamic activation scales: y = (xq . wq) * sx * sw with
    the integer dot products summed exactly (in float64: |sum| < 2^53), so a row's result
    never depends on the other rows or their count (exact by construction)."""
    weight_function = []
    bias_function = []

    def __init__(self, lin):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.weight = _Int8Weight(lin.weight.detach())  # on lin's device
        self.bias = None

    def forward(self, x):
        xf = x.float()
        sx = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0  # f32 [M, 1]
        xq = torch.round(xf / sx).clamp(-127, 127)
        w = self.weight
        m = xq.shape[0]
        if x.is_cuda and hasattr(torch, "_int_mm"):
            # cuBLAS int8 x int8 -> int32 (|sum| <= K * 127^2 < 2^31): exact for every row
            # count; _int_mm wants more than 16 rows and a multiple of 8, so pad with zero rows.
            a = xq.to(torch.int8)
            rows = max(32, (m + 7) // 8 * 8)
            if rows != m:
                a = torch.cat([a, a.new_zeros((rows - m, a.shape[1]))])
            acc = torch._int_mm(a, w.qdata.t())[:m]
        else:
            acc = torch.matmul(xq.double(), w.qdata.double().t())  # exact integers in float64
        return (acc.float() * sx * w.scale[None, :]).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


# ---- model.py's module-level helpers (same semantics) ---------------------------------------
def _mod_row(vecs, row, dtype):
    return vecs[row].to(dtype)


def _mod_scale_shift(h, shift, scale, segments):
    for a, b, row in segments:
        h[a:b].mul_(1.0 + _mod_row(scale, row, h.dtype)).add_(_mod_row(shift, row, h.dtype))
    return h


def _mod_gate(x, gate, other, segments):
    for a, b, row in segments:
        x[a:b].addcmul_(other[a:b], _mod_row(gate, row, x.dtype))
    return x


# ---- modules ----------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, hidden, heads, head_dim, eps, dtype):
        super().__init__()
        self.comfy_attention = ComfyAttention()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.qkv_proj = Linear(hidden, 3 * inner, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(head_dim, eps, dtype)
        self.k_norm = RMSNorm(head_dim, eps, dtype)
        self.out_proj = Linear(inner, hidden, bias=False, dtype=dtype)

    def forward(self, x, rope_freqs=None, transformer_options={}):  # noqa: B006
        s = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.heads * self.head_dim, dim=-1)
        v = v.view(s, self.heads, self.head_dim)
        if rope_freqs is not None:
            q = q.view(1, s, self.heads, self.head_dim)
            k = k.view(1, s, self.heads, self.head_dim)
            comfy.quant_ops.ck.rms_rope_split_half_(q, k, rope_freqs, self.q_norm.weight, self.k_norm.weight,
                                                    epsilon=self.q_norm.eps, rot_dim=rope_freqs.shape[-3] * 2)
            q, k = q[0], k[0]
        else:
            q = self.q_norm(q.view(s, self.heads, self.head_dim))
            k = self.k_norm(k.view(s, self.heads, self.head_dim))
        q, k, v = (AttentionTensorContainer(t.transpose(0, 1).unsqueeze(0)) for t in (q, k, v))
        out = optimized_attention(q, k, v, self.heads, preferred_attention=self.comfy_attention, mask=None,
                                  skip_reshape=True, transformer_options=transformer_options)
        return self.out_proj(out.squeeze(0))


class MLP(nn.Module):
    def __init__(self, hidden, ffn, dtype):
        super().__init__()
        self.fc1 = Linear(hidden, 2 * ffn, bias=False, dtype=dtype)
        self.fc2 = Linear(ffn, hidden, bias=False, dtype=dtype)

    def forward(self, x):
        return comfy.ops.linear_input_act(self.fc2, self.fc1(x), "swiglu")


class AdalnProj(nn.Module):
    def __init__(self, t_dim, hidden, expand, modalities, dtype):
        super().__init__()
        self.expand, self.modalities, self.hidden = expand, modalities, hidden
        self.linear = Linear(t_dim, expand * hidden * modalities, bias=True, dtype=dtype)

    def forward(self, t_emb):
        x = self.linear(F.silu(t_emb))
        x = x.view(x.shape[0] * self.modalities, self.expand * self.hidden)
        return x.chunk(self.expand, dim=-1)


class DiTBlock(nn.Module):
    def __init__(self, hidden, heads, head_dim, ffn, t_dim, eps, dtype):
        super().__init__()
        self.norm1 = RMSNorm(hidden, eps, dtype)
        self.norm2 = RMSNorm(hidden, eps, dtype)
        self.attn = Attention(hidden, heads, head_dim, eps, dtype)
        self.mlp = MLP(hidden, ffn, dtype)
        self.adaln_proj = AdalnProj(t_dim, hidden, 6, 3, dtype)

    def forward(self, x, t_emb, mod_segments, rope_freqs, transformer_options={}, attention=None):  # noqa: B006
        attention = self.attn if attention is None else attention
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(t_emb)
        h = _mod_scale_shift(self.norm1(x), shift_msa, scale_msa, mod_segments)
        x = _mod_gate(x, gate_msa, attention(h, rope_freqs=rope_freqs, transformer_options=transformer_options),
                      mod_segments)
        h = _mod_scale_shift(self.norm2(x), shift_mlp, scale_mlp, mod_segments)
        return _mod_gate(x, gate_mlp, self.mlp(h), mod_segments)


def _pdd_head(head, h, n, start, stop):
    """A PDD bank of n heads ([n*out, D]): row block 0 plus the dt-weighted offsets of the
    banks the step spans (fixed weights here; the blending is per call, so every slice gets
    the same blended weight)."""
    w = torch.linspace(1.0, 2.0, stop - start, dtype=torch.float64)
    w = (w / w.sum()).to(h)
    rows = head.weight.reshape(n, -1, head.weight.shape[1])
    brows = head.bias.reshape(n, -1)
    first = max(start, 1)
    return F.linear(h, rows[0] + torch.einsum("n,noi->oi", w[first - start:], rows[first:stop]),
                    brows[0] + torch.einsum("n,no->o", w[first - start:], brows[first:stop]))


class FinalLayer(nn.Module):
    def __init__(self, hidden, t_dim, video_dim, audio_dim, eps, dtype, pdd=1):
        super().__init__()
        self.norm = RMSNorm(hidden, eps, dtype)
        self.adaln_proj = AdalnProj(t_dim, hidden, 2, 1, dtype)
        self.video_out = Linear(hidden, video_dim * pdd, bias=True, dtype=torch.float32)
        self.audio_out = Linear(hidden, audio_dim * pdd, bias=True, dtype=torch.float32)
        self.video_out.out_features = video_dim
        self.audio_out.out_features = audio_dim

    def forward(self, x, t_emb, video_seg, audio_seg, sigma, sample_sigmas, shifts):
        shift, scale = self.adaln_proj(t_emb)

        def mod(seg):
            a, b, row = seg
            return (self.norm(x[a:b]) * (1.0 + _mod_row(scale, row, scale.dtype))
                    + _mod_row(shift, row, shift.dtype)).to(torch.float32)

        n = self.video_out.weight.shape[0] // self.video_out.out_features
        if n == 1:
            return self.video_out(mod(video_seg)), self.audio_out(mod(audio_seg))
        if sample_sigmas is None:
            raise ValueError("PDD heads need the sampler's sigma schedule")
        i = int((sample_sigmas - sigma).abs().argmin())
        start = min(i * n // max(1, sample_sigmas.shape[0] - 1), n - 1)
        stop = max(start + 1, min(n, start + 2))
        return _pdd_head(self.video_out, mod(video_seg), n, start, stop), \
            _pdd_head(self.audio_out, mod(audio_seg), n, start, stop)


def _patchify(latent):
    # [1, C, T, H, W] -> [T * H/2 * W/2, 4C] (patch 1x2x2)
    _, c, t, h, w = latent.shape
    x = latent.reshape(c, t, h // 2, 2, w // 2, 2).permute(1, 2, 4, 0, 3, 5)
    return x.reshape(t * (h // 2) * (w // 2), c * 4)


def _unpatchify(rows, c, t, h, w):
    x = rows.reshape(t, h // 2, w // 2, c, 2, 2).permute(3, 0, 1, 4, 2, 5)
    return x.reshape(1, c, t, h, w)


class MiniMaxH3Model(nn.Module):
    def __init__(self, hidden=64, num_layers=2, heads=3, head_dim=32, ffn=128, latents=6, audio_latents=8,
                 t_dim=32, rope_len=4, eps=1e-5, pdd=1, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.hidden_size, self.latents_dim, self.audio_latents_dim = hidden, latents, audio_latents
        self.dtype = dtype
        self.video_patch_proj = Linear(4 * latents, hidden, bias=True, dtype=torch.float32)
        self.audio_patch_proj = Linear(audio_latents, hidden, bias=True, dtype=torch.float32)
        self.time_proj = Linear(t_dim, t_dim, bias=True, dtype=torch.float32)
        self.rope_len = rope_len
        self.blocks = nn.ModuleList([DiTBlock(hidden, heads, head_dim, ffn, t_dim, eps, dtype)
                                     for _ in range(num_layers)])
        self.final_layer = FinalLayer(hidden, t_dim, 4 * latents, audio_latents, eps, dtype, pdd)
        self.t_dim = t_dim
        if device is not None:
            self.to(device)

    def randomize(self, seed):
        """Seeded weights with the spread of a trained model's (norms near 1, linears 1/sqrt(fan_in))."""
        dev = next(self.parameters()).device
        g = torch.Generator(device=dev).manual_seed(seed)  # drawn where the weights live
        with torch.no_grad():
            for name, p in self.named_parameters():
                r = torch.randn(p.shape, generator=g, device=dev)
                if "norm" in name.split(".")[-2]:
                    v = 1.0 + 0.1 * r
                elif p.dim() == 2:
                    v = r / math.sqrt(p.shape[1])
                else:
                    v = 0.3 * r
                p.copy_(v.to(p.dtype))
        return self

    def forward(self, x, timestep, context, transformer_options={}, **kwargs):  # noqa: B006
        wrappers = list(transformer_options.get("wrappers", {}).get("diffusion_model", []))
        return _WrapperExecutor(self._forward, self, wrappers)(x, timestep, context, transformer_options, **kwargs)

    def _forward(self, x, timestep, context, transformer_options={}, minimax_payload=None,  # noqa: B006
                 denoise_mask=None, audio_denoise_mask=None, **kwargs):
        video, audio = x[0], x[1]
        payload = minimax_payload or {}
        dev, dtype = video.device, context.dtype
        _, C, T, Hh, Ww = video.shape
        A = audio.shape[-1]
        L = context.shape[1]
        sigma = float(timestep.flatten()[0]) / 1000.0
        t_v, t_a = 1.0 - sigma, 1.0 - 0.8 * sigma
        conds = payload.get("cond_video_latents", [])
        segments = [("text", L)] + [("cond", _patchify(z).shape[0]) for z in conds] + \
            [("audio", 2 * A), ("video", T * (Hh // 2) * (Ww // 2))]
        seg_t = {"text": t_v, "video": t_v, "audio": t_a, "cond": max(t_v, 0.999)}
        video_rows_t = audio_rows_t = None
        if denoise_mask is not None:  # [1, 1, T, H, W] -> one value per 2x2 patch row
            m = denoise_mask[0, 0].float().reshape(T, Hh // 2, 2, Ww // 2, 2).amax(dim=(2, 4)).reshape(-1)
            rows_t = (1.0 - m * sigma).clamp(max=max(t_v, 0.999))
            video_rows_t = rows_t if rows_t.unique().numel() > 1 else None
        if audio_denoise_mask is not None:  # [1, 1, 2, A]
            m = audio_denoise_mask[0, 0].float().reshape(-1)
            rows_t = (1.0 - m * (1.0 - t_a)).clamp(max=1.0)
            audio_rows_t = rows_t if rows_t.unique().numel() > 1 else None
        levels = {t_v, t_a} | {seg_t[k] for k, _ in segments}
        for r in (video_rows_t, audio_rows_t):
            if r is not None:
                levels |= set(r.tolist())
        unique_t = sorted(levels)
        t_row = {t: i for i, t in enumerate(unique_t)}
        tag = {"text": 1, "video": 0, "audio": 2, "cond": 0}

        def per_token(rows_t, tg):
            return torch.tensor([t_row[v] * 3 + tg for v in rows_t.tolist()], dtype=torch.long, device=dev)

        tags = payload.get("text_token_tags")
        mod_segments, seg_abs, off = [], [], 0
        for kind, n in segments:
            a, b = off, off + n
            seg_abs.append((a, b, kind))
            base = t_row[seg_t[kind]] * 3
            if kind == "text" and tags is not None:
                run = 0
                for i in range(1, n + 1):
                    if i == n or tags[i] != tags[run]:
                        mod_segments.append((a + run, a + i, base + int(tags[run])))
                        run = i
            elif kind == "video" and video_rows_t is not None:
                mod_segments.append((a, b, per_token(video_rows_t, 0)))
            elif kind == "audio" and audio_rows_t is not None:
                mod_segments.append((a, b, per_token(audio_rows_t, 2)))
            else:
                mod_segments.append((a, b, base + tag[kind]))
            off = b
        S = off
        # embed
        v_rows = torch.cat([_patchify(z.float()) for z in conds] + [_patchify(video.float())], dim=0)
        a_rows = audio[0].float().permute(1, 2, 0).reshape(2 * A, -1)
        v_emb = self.video_patch_proj(v_rows).to(dtype)
        a_emb = self.audio_patch_proj(a_rows).to(dtype)
        h = torch.empty(S, self.hidden_size, dtype=dtype, device=dev)
        voff = 0
        for a, b, kind in seg_abs:
            if kind == "text":
                h[a:b] = context[0]
            elif kind == "audio":
                h[a:b] = a_emb
            else:
                h[a:b] = v_emb[voff:voff + b - a]
                voff += b - a
        # time embedding: sinusoid of each unique t through one fp32 linear
        tv = torch.tensor(unique_t, dtype=torch.float32, device=dev)
        half = self.t_dim // 2
        fr = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=dev) / half)
        t_emb = self.time_proj(torch.cat([torch.cos(tv[:, None] * 1000 * fr), torch.sin(tv[:, None] * 1000 * fr)],
                                         dim=-1)).to(dtype)
        # rotation table [1, S, 1, P, 2, 2], P = 3 * rope_len pairs
        pos = torch.stack([torch.arange(S, dtype=torch.float32, device=dev) * 0.7,
                           (torch.arange(S, device=dev) % 5).float(), (torch.arange(S, device=dev) % 3).float()], -1)
        inv = 10000.0 ** (-torch.arange(self.rope_len, dtype=torch.float32, device=dev) / self.rope_len)
        ang = (pos[:, :, None] * inv[None, None, :]).reshape(S, -1)  # [S, P]
        c, s_ = torch.cos(ang), torch.sin(ang)
        rope = torch.stack([c, -s_, s_, c], dim=-1).reshape(1, S, 1, ang.shape[1], 2, 2).to(dtype)
        if payload.get("no_rope"):
            rope = None
        blocks_replace = transformer_options.get("patches_replace", {}).get("dit", {})
        for i, block in enumerate(self.blocks):
            transformer_options["block_index"] = i
            if ("double_block", i) in blocks_replace:
                def block_wrap(args, block=block):
                    return {"img": block(args["img"], args["t_emb"], args["mod_segments"], args["rope_freqs"],
                                         transformer_options=args["transformer_options"],
                                         attention=args.get("attention"))}
                h = blocks_replace[("double_block", i)](
                    {"img": h, "t_emb": t_emb, "mod_segments": mod_segments, "rope_freqs": rope,
                     "transformer_options": transformer_options}, {"original_block": block_wrap})["img"]
            else:
                h = block(h, t_emb, mod_segments, rope, transformer_options=transformer_options)
        va, vb, _ = next(sg for sg in seg_abs if sg[2] == "video")
        aa, ab, _ = next(sg for sg in seg_abs if sg[2] == "audio")
        vseg = (va, vb, per_token(video_rows_t, 0) // 3 if video_rows_t is not None else t_row[seg_t["video"]])
        aseg = (aa, ab, per_token(audio_rows_t, 0) // 3 if audio_rows_t is not None else t_row[seg_t["audio"]])
        v, a = self.final_layer(h, t_emb, vseg, aseg, sigma, transformer_options.get("sample_sigmas"), (12.0, 3.0))
        vo = _unpatchify(v, C, T, Hh, Ww)
        ao = a.reshape(2, A, -1).permute(2, 0, 1).unsqueeze(0)
        return [-vo.to(video.dtype), -ao.to(audio.dtype)]


def make_inputs(model, seed, T=2, H=8, W=6, A=7, L=5, case="t2va", device="cpu"):
    """(args, kwargs) of one forward call: x = [video, audio], timestep, context, options."""
    g = torch.Generator().manual_seed(seed)
    video = torch.randn((1, model.latents_dim, T, H, W), generator=g)
    audio = torch.randn((1, model.audio_latents_dim, 2, A), generator=g)
    context = (torch.randn((1, L, model.hidden_size), generator=g) * 2).to(model.dtype)
    timestep = torch.tensor([730.0])
    payload, kw = {}, {}
    if case in ("keyframes", "all"):
        payload["cond_video_latents"] = [torch.randn((1, model.latents_dim, 1, H, W), generator=g)]
        payload["text_token_tags"] = [1, 1, 0, 0, 1][:L] + [1] * max(0, L - 5)
    if case in ("mask", "all"):
        pm = torch.tensor([0.0, 0.5, 1.0])[torch.randint(0, 3, (T, H // 2, W // 2), generator=g)]
        kw["denoise_mask"] = pm.repeat_interleave(2, 1).repeat_interleave(2, 2)[None, None]
        kw["audio_denoise_mask"] = torch.tensor([0.25, 1.0])[torch.randint(0, 2, (2, A), generator=g)][None, None]
    to_dev = (lambda t: t.to(device) if torch.is_tensor(t) else t)
    payload = {k: ([to_dev(z) for z in v] if k == "cond_video_latents" else v) for k, v in payload.items()}
    kw = {k: to_dev(v) for k, v in kw.items()}
    args = ([video.to(device), audio.to(device)], timestep.to(device), context.to(device), {})
    return args, dict(minimax_payload=payload, **kw)
