"""The node's comfy-sliced path (issue 18): ComfyUI's own MiniMaxH3Model submodules on token
slices, bit-identical to stock wherever the kernels allow, and saying so where they do not.

Written against ComfyUI's comfy/ldm/minimax/model.py (read at 01a56b76bba3), the attention
entry point in comfy/ldm/modules/attention.py (05080f6022b2) and comfy/ops.py (0271a469fe29).
Interface: /tmp/briefs/sliced_api.md, documented in docs/comfyui-sliced.md.

What runs on slices, and why each step keeps every bit:
  * A DiT block (model.py DiTBlock.forward) as two halves over the residual x, bf16 [S, D],
    updated in place slice by slice, exactly as stock updates it in place per segment.
  * Attention half, two passes. Pass 1: for every slice, norm1 + modulation, the block's own
    qkv_proj, the same fused q/k RMSNorm + RoPE call on that slice's rows of the rotation
    table; K and V kept for all tokens, bf16 [S, H, Dh] each. Pass 1 finishes before pass 2
    writes the residual, so every slice reads what stock reads. Pass 2: per query slice, the
    same norm1 + modulation + qkv_proj again (Q cannot be taken out of ComfyUI's fused qkv
    op without bypassing it; keep_q=True stores Q from pass 1 instead, S x I more memory),
    ComfyUI's optimized_attention against all K/V, out_proj, and the gated add
    (model.py's own _mod_gate) into that slice of the residual.
  * MLP half: per slice, norm2 + modulation, the block's mlp module, gated add in place.
  * The fp32 output head (FinalLayer.forward) runs stock unless its working set would exceed
    the sliced blocks' peak; then ComfyUI's own FinalLayer.forward runs once per slice of the
    target rows (PDD banks included: it rebuilds the same blended head each time).
Every call goes through the model's own modules and module-level helpers (found through the
model class's module), so ComfyUI's Linear / quantised ops, weight patches (LoRA) and its
attention backend all still apply. Slice sizes follow sliced_table.py: no kernel sees fewer
rows than its measured threshold, and a short last slice is merged into the one before.

Installed as a DIFFUSION_MODEL wrapper: for the length of one call the runner puts bound
forwards on the model's block and final-layer *instances* (object patches, removed in a
finally), never on the classes, so other models and other clones are untouched.
"""

import functools
import logging
import sys
import time

import torch

from . import sliced_table

LOG = logging.getLogger("layerstream_h3")

GIB = float(1 << 30)
DEFAULT_MLP_CHUNK = 8192
DEFAULT_ATTN_CHUNK = 8192
CHUNK_STEP = 256  # the node's widget step (mlp_chunk_tokens)


# ----------------------------------------------------------------------------------------
# Slice planning (pure functions)
# ----------------------------------------------------------------------------------------
def plan_slices(S, chunk, floor=1):
    """[(start, stop)] covering [0, S): slices of max(chunk, floor) rows; a last slice
    shorter than floor is merged into the one before. chunk <= 0 or >= S: one slice.
    E.g. S 1000, chunk 300, floor 1 -> 300, 300, 300, 100; floor 193 -> 300, 300, 400."""
    if S <= 0:
        return []
    floor = max(1, int(floor))
    if chunk is None or chunk <= 0 or chunk >= S:
        return [(0, S)]
    c = max(int(chunk), floor)
    if c >= S:
        return [(0, S)]
    out = [(a, min(a + c, S)) for a in range(0, S, c)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < floor:
        last = out.pop()
        out[-1] = (out[-1][0], last[1])
    return out


def describe_plan(plan):
    """'3 x 300 + 1 x 400 rows' for a slice plan."""
    if not plan:
        return "none"
    sizes = [b - a for a, b in plan]
    parts, i = [], 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        parts.append(f"{j - i} x {sizes[i]}")
        i = j
    return " + ".join(parts) + " rows"


def local_segments(segments, a, b):
    """model.py's mod segments [(start, stop, row)] restricted to rows [a, b), in slice
    coordinates. row is a mod-row index (int) or a per-token LongTensor of indices (masks):
    the tensor is cut to the same rows, so every row keeps its own modulation row."""
    out = []
    for s0, s1, row in segments:
        lo, hi = max(s0, a), min(s1, b)
        if lo >= hi:
            continue
        if torch.is_tensor(row) and row.dim() > 0:
            row = row[lo - s0:hi - s0]
        out.append((lo - a, hi - a, row))
    return out


def head_segment(seg, a, b):
    """A FinalLayer segment (start, stop, row) cut to [a, b) of its rows (absolute)."""
    s0, _, row = seg
    if torch.is_tensor(row) and row.dim() > 0:
        row = row[a - s0:b - s0]
    return (a, b, row)


# Activation estimates in bytes (e = activation element size, bf16 = 2). Stock, per block
# (model.py's DiTBlock): attention half x + h + qkv + out = S (2D + 4I); MLP half x + h +
# fc1 out (2F) + SwiGLU out (F) + fc2 out (D) = S (3D + 3F). Sliced: x + K + V for all tokens
# plus one attention slice c_a (2D + 4I), or x plus one MLP slice c_m (3D + 3F).
def stock_block_bytes(S, D, I, F, e=2):
    return e * S * max(2 * D + 4 * I, 3 * D + 3 * F)


def sliced_block_bytes(S, D, I, F, c_attn, c_mlp, e=2, keep_q=False, attn_sliced=True):
    c_attn = min(S, c_attn) if c_attn and c_attn > 0 else S
    c_mlp = min(S, c_mlp) if c_mlp and c_mlp > 0 else S
    if attn_sliced:
        attn = S * D + (3 if keep_q else 2) * S * I + c_attn * (2 * D + 4 * I)
    else:
        attn = S * (2 * D + 4 * I)
    mlp = S * D + c_mlp * (2 * D + 3 * F)
    return e * max(attn, mlp)


def head_bytes(S, rows, D, e=2, scale_e=2):
    """FinalLayer over `rows` target rows: the residual (S D e) plus norm * (1 + scale) +
    shift and its fp32 copy alive together: rows D (2 scale_e + 4)."""
    return e * S * D + rows * D * (2 * scale_e + 4)


# ----------------------------------------------------------------------------------------
# What the model is made of
# ----------------------------------------------------------------------------------------
_BLOCK_PARTS = ("norm1", "norm2", "attn", "mlp", "adaln_proj")
_ATTN_PARTS = ("qkv_proj", "out_proj", "q_norm", "k_norm", "heads", "head_dim")
_FINAL_PARTS = ("norm", "adaln_proj", "video_out", "audio_out")
_MODULE_HELPERS = ("_mod_scale_shift", "_mod_gate", "optimized_attention", "AttentionTensorContainer")


def _model_module(model):
    return sys.modules.get(type(model).__module__)


def supported(model, blocks=None):
    """(ok, reason): whether this MiniMaxH3Model instance (or a mirror with the same
    structure) has every submodule and helper the sliced path calls. blocks: the model's
    own blocks where the instance shows others now (the node passes the patcher's
    get_model_object("diffusion_model.blocks"): another clone of the same model may have
    them detached by an object patch until ComfyUI loads this one)."""
    if blocks is None:
        blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return False, "the model has no DiT blocks (model.blocks)"
    fl = getattr(model, "final_layer", None)
    if fl is None:
        return False, "the model has no final_layer"
    for p in _FINAL_PARTS:
        if not hasattr(fl, p):
            return False, f"final_layer has no {p}"
    for i, blk in enumerate(blocks):
        for p in _BLOCK_PARTS:
            if not hasattr(blk, p):
                return False, f"block {i} has no {p}"
        for p in _ATTN_PARTS:
            if not hasattr(blk.attn, p):
                return False, f"block {i}.attn has no {p}"
        if "forward" in vars(blk):
            return False, f"block {i}.forward is already patched on the instance (another node's object patch)"
    if "forward" in vars(fl):
        return False, "final_layer.forward is already patched on the instance (another node's object patch)"
    mod = _model_module(model)
    if mod is None:
        return False, f"the model's module {type(model).__module__} is not loaded"
    for h in _MODULE_HELPERS:
        if not hasattr(mod, h):
            return False, f"{mod.__name__} has no {h} (another ComfyUI revision)"
    ck = getattr(getattr(getattr(mod, "comfy", None), "quant_ops", None), "ck", None)
    if ck is None or not hasattr(ck, "rms_rope_split_half_"):
        return False, f"{mod.__name__}: comfy.quant_ops.ck.rms_rope_split_half_ not found"
    return True, "ComfyUI's MiniMaxH3Model structure found"


def _is_quantized(w):
    return getattr(w, "_layout_cls", None) is not None


def classify_linear(lin, role, act_dtype):
    """Table key of the GEMM a ComfyUI Linear runs for activations of act_dtype (role: qkv,
    out_proj, fc1, fc2, head). int8 ConvRot / tensorwise int8 weights without an on-the-fly
    patch run ComfyUI's int8 GEMM (exact by construction); a plain weight is cast to the
    activation dtype by comfy.ops, so bf16 activations run a bf16 GEMM."""
    w = getattr(lin, "weight", None)
    patched = len(getattr(lin, "weight_function", None) or []) + len(getattr(lin, "bias_function", None) or [])
    if _is_quantized(w):
        full = bool(getattr(lin, "_full_precision_mm", False))
        if getattr(w, "_layout_cls") == "TensorWiseINT8Layout" and not patched and not full:
            return "gemm.int8"
        return f"gemm.other({getattr(w, '_layout_cls')}{', patched' if patched else ''})"
    if type(lin).__qualname__.startswith("fp8_ops"):  # comfy.ops fp8_ops: an fp8 _scaled_mm, not measured
        return "gemm.other(fp8 matmul)"
    if role == "head":
        return "gemm.f32.head"
    if act_dtype == torch.bfloat16:
        return f"gemm.bf16.{role}"
    return f"gemm.other({str(act_dtype).replace('torch.', '')})"


def _sdpa_backend(q, k, v):
    """Which SDPA kernel runs for q/k/v [1, H, M, Dh] under ComfyUI's priority (comfy/ops.py:
    flash, cuDNN, efficient, math), from PyTorch's own can_use_* checks."""
    cuda = torch.backends.cuda
    try:
        try:
            params = cuda.SDPAParams(q, k, v, None, 0.0, False, False)
        except TypeError:  # PyTorch < 2.5: no enable_gqa argument
            params = cuda.SDPAParams(q, k, v, None, 0.0, False)
        checks = [("flash", "flash_sdp_enabled", "can_use_flash_attention"),
                  ("cudnn", "cudnn_sdp_enabled", "can_use_cudnn_attention"),
                  ("efficient", "mem_efficient_sdp_enabled", "can_use_efficient_attention")]
        for name, enabled, can_use in checks:
            if hasattr(cuda, enabled) and getattr(cuda, enabled)() and hasattr(cuda, can_use) \
                    and getattr(cuda, can_use)(params, False):
                return name
        return "math"
    except Exception as e:  # noqa: BLE001 - an old or new PyTorch without these checks
        return f"unknown ({type(e).__name__})"


def override_name(transformer_options):
    """The attention function an optimized_attention_override wraps (ComfyUI's Model Attention
    Backend node: ModelPatcher.set_model_optimized_attention), by its registered name; None
    without an override, "unknown" for an override that wraps no function."""
    from . import wrapper
    ov = (transformer_options or {}).get("optimized_attention_override")
    if ov is None:
        return None
    fn = wrapper._override_target(ov)
    return wrapper._attention_name(fn) if fn is not None else "unknown"


def _per_query_override(name):
    """Overrides that compute each query from that query and all keys: the Model Attention
    Backend's choices (PyTorch SDPA, Comfy Kitchen INT8). They run slice by slice; any other
    override (sparse attention, patches) may look at every query and runs stock."""
    from . import wrapper
    return name in wrapper.PYTORCH + wrapper.KITCHEN_INT8


def classify_attention(mod, attn, transformer_options, device_type, k_probe=None):
    """(key, stock_reason): the table key of the attention kernel a query slice runs, or
    stock_reason (not None) when attention must see every query at once."""
    to = transformer_options or {}
    if "optimized_attention_override" in to:
        name = override_name(to)
        if not _per_query_override(name):
            return None, "an attention override is installed ({}: sparse or patched attention sees every query)".format(
                name)
        from . import wrapper
        if name in wrapper.PYTORCH and device_type == "cuda" and k_probe is not None:
            return f"attention.sdpa.{_sdpa_backend(k_probe, k_probe, k_probe)}", None
        if name in wrapper.PYTORCH and device_type == "cpu" and not hasattr(torch.nn.functional,
                                                                              "scaled_dot_product_attention"):
            return "attention.cpu.math", None
        return f"attention.other({name})", None
    pref = getattr(getattr(attn, "comfy_attention", None), "function", None)
    if pref is not None:
        return f"attention.other({getattr(pref, '__name__', 'checkpoint attention')})", None
    fn = getattr(mod, "optimized_attention")
    name = getattr(fn, "__name__", type(fn).__name__)
    if device_type == "cuda":
        if name == "attention_pytorch" and k_probe is not None:
            return f"attention.sdpa.{_sdpa_backend(k_probe, k_probe, k_probe)}", None
        return f"attention.other({name})", None
    if device_type == "cpu" and not hasattr(torch.nn.functional, "scaled_dot_product_attention") \
            and name in ("attention_pytorch", "attention_basic"):
        return "attention.cpu.math", None  # PyTorch < 2.0 has no fused attention on the CPU
    return f"attention.other({name})", None


def _floor(table, keys):
    return max(sliced_table.lookup(table, k).min_rows for k in keys)


def _exactness(table, note, keys):
    """One statement for the kernels that ran on slices (keys): the weakest kind wins."""
    entries = {k: sliced_table.lookup(table, k) for k in keys}
    kinds = {e.kind for e in entries.values()}
    if "unmeasured" in kinds or note:
        bad = [k for k, e in entries.items() if e.kind == "unmeasured"]
        why = "; ".join(filter(None, [", ".join(bad) + (" not measured" if bad else ""), note]))
        return f"not guaranteed ({why})"
    floors = ", ".join(f"{k} >= {e.min_rows}" for k, e in sorted(entries.items()) if e.min_rows > 1)
    if kinds <= {"construction"}:
        return "exact by construction (int8)" if "gemm.int8" in entries else "exact by construction (row-local kernels)"
    int8 = "; int8 GEMMs by construction" if "gemm.int8" in entries else ""
    return "exact by measurement (table" + (f": {floors}" if floors else "") + int8 + ")"


# ----------------------------------------------------------------------------------------
# The runner
# ----------------------------------------------------------------------------------------
class SlicedRunner:
    """A ComfyUI WrappersMP.DIFFUSION_MODEL wrapper: runner(executor, *args, **kwargs) runs
    executor (the model's _forward) with the model's blocks and final layer sliced.

    mlp_chunk_tokens: rows per MLP slice (default 8192, widget step 256).
    attn_chunk_tokens: rows per attention query slice (default 8192); 0 = stock attention
        (only the MLP half is sliced).
    head: "auto" (slice the fp32 head only where its working set would exceed the blocks'),
        "stock" or "sliced".
    keep_q: store Q from pass 1 (S x I more memory) instead of running qkv_proj again.
    reason: why this path runs (the node sets it; shown in status())."""

    def __init__(self, mlp_chunk_tokens=DEFAULT_MLP_CHUNK, attn_chunk_tokens=DEFAULT_ATTN_CHUNK,
                 head="auto", keep_q=False, reason="comfy-sliced selected"):
        if int(mlp_chunk_tokens) < 1:
            raise ValueError(f"mlp_chunk_tokens must be >= 1 (got {mlp_chunk_tokens})")
        if int(attn_chunk_tokens) < 0:
            raise ValueError(f"attn_chunk_tokens must be >= 0, 0 = stock attention (got {attn_chunk_tokens})")
        if head not in ("auto", "stock", "sliced"):
            raise ValueError(f"head must be auto, stock or sliced (got {head!r})")
        self.mlp_chunk_tokens = int(mlp_chunk_tokens)
        self.attn_chunk_tokens = int(attn_chunk_tokens)
        self.head = head
        self.keep_q = bool(keep_q)
        self.reason = reason
        self._last = None   # facts of the last call, for status()
        self._call = None   # facts of the call in progress
        self._run = {"calls": 0, "seconds": [], "peak": None}  # the sampling run (ON_PRE_RUN .. ON_CLEANUP)

    # -- the run (ComfyUI's ON_PRE_RUN / ON_CLEANUP callbacks; node.py registers them) ------
    def on_pre_run(self, patcher=None):
        self._run = {"calls": 0, "seconds": [], "peak": None}

    def on_cleanup(self, patcher=None):
        for line in self.run_status():
            LOG.info("[LayerStream] " + line)

    def run_status(self):
        """The sampling run on this path: calls, per-step time, the largest measured
        activation peak, then status() of the last call (exactness, slices)."""
        r = self._run
        lines = []
        if r["calls"]:
            peak = r["peak"]
            lines.append("run: {} call(s) on comfy-sliced; steps {} s; activation peak {}".format(
                r["calls"], ", ".join("{:.3f}".format(x) for x in r["seconds"]),
                "{:.2f} GiB measured (max over the calls)".format(peak / GIB) if peak is not None
                else "not measured (no CUDA device)"))
        else:
            lines.append("run: no call reached comfy-sliced")
        return lines + self.status()

    # -- the wrapper ----------------------------------------------------------------------
    def __call__(self, executor, *args, **kwargs):
        model = executor.class_obj
        ok, why = supported(model)
        if not ok:
            self._last = {"path": "stock", "why": f"comfy-sliced not applicable: {why}"}
            return executor(*args, **kwargs)
        if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
            self._last = {"path": "stock", "why": "gradients are enabled (training): the sliced path updates in place"}
            return executor(*args, **kwargs)
        device = _first_tensor_device(args, kwargs)
        t0 = time.perf_counter()
        self._call = {"path": "comfy-sliced", "why": self.reason, "blocks": 0, "keys": set(),
                      "device": device, "notes": []}
        mod = _model_module(model)
        patched = []
        try:
            for blk in model.blocks:
                blk.forward = functools.partial(self._block_forward, mod, blk)
                patched.append(blk)
            fl = model.final_layer
            fl.forward = functools.partial(self._final_forward, fl, type(fl).forward.__get__(fl))
            patched.append(fl)
            base = _peak_reset(device)
            out = executor(*args, **kwargs)
            self._call["peak"] = _peak_read(device, base)
            r = self._run
            r["calls"] += 1
            r["seconds"].append(time.perf_counter() - t0)
            if self._call["peak"] is not None:
                r["peak"] = max(r["peak"] or 0, self._call["peak"])
        finally:
            for m in patched:
                del m.forward  # the instance attribute; the class's forward shows again
            self._last, self._call = self._call, None
        return out

    # -- one DiT block (model.py DiTBlock.forward, sliced) ---------------------------------
    def _block_forward(self, mod, blk, x, t_emb, mod_segments, rope_freqs, transformer_options={},  # noqa: B006
                       attention=None):
        call = self._call
        S, D = x.shape
        attn = blk.attn
        H, Dh = attn.heads, attn.head_dim
        I = H * Dh  # noqa: E741 - the model's inner width
        Fw = getattr(blk.mlp.fc2, "in_features", None) or blk.mlp.fc2.weight.shape[-1]
        table, note = sliced_table.table_for(x.device.type, torch.__version__, _device_name(x.device))
        qkv_k = classify_linear(attn.qkv_proj, "qkv", x.dtype)
        out_k = classify_linear(attn.out_proj, "out_proj", x.dtype)
        fc1_k = classify_linear(blk.mlp.fc1, "fc1", x.dtype)
        fc2_k = classify_linear(blk.mlp.fc2, "fc2", x.dtype)

        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = blk.adaln_proj(t_emb)
        stock_attn = None
        if self.attn_chunk_tokens == 0:
            stock_attn = "attn_chunk_tokens = 0"
        elif self.attn_chunk_tokens >= S:
            # One query slice would hold every row: the stock half is the same computation
            # without the second qkv_proj pass (at 7.7k tokens two passes cost 1.33x stock).
            stock_attn = "one slice holds all {} rows".format(S)
        elif attention is not None and attention is not attn:
            stock_attn = "a block patch passed its own attention module"
        elif "optimized_attention_override" in (transformer_options or {}) and \
                not _per_query_override(override_name(transformer_options)):
            stock_attn = "an attention override is installed ({}: sparse or patched attention sees every " \
                         "query)".format(override_name(transformer_options))

        if stock_attn is not None:
            # Stock attention half: the same calls model.py makes, on all S rows.
            att = attn if attention is None else attention
            h = mod._mod_scale_shift(blk.norm1(x), shift_msa, scale_msa, mod_segments)
            x = mod._mod_gate(x, gate_msa, att(h, rope_freqs=rope_freqs, transformer_options=transformer_options),
                              mod_segments)
            del h
            attn_plan, attn_keys = [(0, S)], []
        else:
            attn_plan, attn_keys = self._attention_two_pass(mod, blk, x, mod_segments, rope_freqs, transformer_options,
                                                            shift_msa, scale_msa, gate_msa, table, qkv_k, out_k, S, H, Dh)

        mlp_keys = [fc1_k, fc2_k, "rowwise"]
        mlp_plan = plan_slices(S, self.mlp_chunk_tokens, _floor(table, mlp_keys))
        for a, b in mlp_plan:
            xs = x[a:b]  # a view: the gated add lands in the residual
            segs = local_segments(mod_segments, a, b)
            h = mod._mod_scale_shift(blk.norm2(xs), shift_mlp, scale_mlp, segs)
            mod._mod_gate(xs, gate_mlp, blk.mlp(h), segs)
            del h
        if len(mlp_plan) > 1:
            call["keys"].update(mlp_keys)

        if call is not None and call["blocks"] == 0:
            call.update(S=S, D=D, I=I, F=Fw, e=x.element_size(), table_note=note, table=table,
                        attn_plan=attn_plan, mlp_plan=mlp_plan, stock_attn=stock_attn,
                        kernels={"qkv": qkv_k, "out_proj": out_k, "fc1": fc1_k, "fc2": fc2_k,
                                 "attention": call.get("attention_key")})
        if call is not None:
            call["blocks"] += 1
        return x

    def _attention_two_pass(self, mod, blk, x, mod_segments, rope_freqs, to, shift, scale, gate, table,
                            qkv_k, out_k, S, H, Dh):
        attn = blk.attn
        I = H * Dh  # noqa: E741
        call = self._call
        mm = getattr(getattr(mod, "comfy", None), "model_management", None)
        training = bool(getattr(mm, "in_training", False))
        ck = mod.comfy.quant_ops.ck
        if rope_freqs is not None:
            cast_to = getattr(mm, "cast_to", None)
            qw = cast_to(attn.q_norm.weight, device=x.device) if cast_to else attn.q_norm.weight
            kw = cast_to(attn.k_norm.weight, device=x.device) if cast_to else attn.k_norm.weight
            rot = rope_freqs.shape[-3] * 2

        def qk(h, a, b):
            """qkv_proj + q/k RMSNorm + RoPE on rows [a, b), as model.py Attention.forward
            does on all rows: q, k [s, H, Dh] (views into the slice's qkv), v [s, H, Dh]."""
            s = h.shape[0]
            q, k, v = attn.qkv_proj(h).split(I, dim=-1)
            v = v.view(s, H, Dh)
            if rope_freqs is None:
                return attn.q_norm(q.view(s, H, Dh)), attn.k_norm(k.view(s, H, Dh)), v
            q = q.view(1, s, H, Dh)
            k = k.view(1, s, H, Dh)
            fr = rope_freqs[:, a:b]  # [1, s, 1, rot/2, 2, 2]: this slice's rotations
            if training:
                q, k = ck.rms_rope_split_half(q, k, fr, qw, kw, epsilon=attn.q_norm.eps, rot_dim=rot)
            else:
                ck.rms_rope_split_half_(q, k, fr, qw, kw, epsilon=attn.q_norm.eps, rot_dim=rot)
            return q[0], k[0], v

        # Pass 1: K and V for all tokens (qkv slices see >= the qkv floor).
        p1_keys = [qkv_k, "rowwise"]
        plan1 = plan_slices(S, self.attn_chunk_tokens, _floor(table, p1_keys))
        K = torch.empty((S, H, Dh), dtype=x.dtype, device=x.device)  # bf16 [S, H, Dh]
        V = torch.empty((S, H, Dh), dtype=x.dtype, device=x.device)  # bf16 [S, H, Dh]
        Q = torch.empty((S, H, Dh), dtype=x.dtype, device=x.device) if self.keep_q else None
        for a, b in plan1:
            segs = local_segments(mod_segments, a, b)
            h = mod._mod_scale_shift(blk.norm1(x[a:b]), shift, scale, segs)
            q, k, v = qk(h, a, b)
            K[a:b] = k
            V[a:b] = v
            if Q is not None:
                Q[a:b] = q
            del h, q, k, v

        # [1, H, S, Dh] views, the layout model.py hands to optimized_attention.
        k4 = K.transpose(0, 1).unsqueeze(0)
        v4 = V.transpose(0, 1).unsqueeze(0)
        att_key, stock_reason = classify_attention(mod, attn, to, x.device.type, k_probe=k4)
        if call is not None:
            call["attention_key"] = att_key
        p2_keys = [qkv_k if Q is None else "rowwise", out_k, att_key, "rowwise"]
        plan2 = plan_slices(S, self.attn_chunk_tokens, _floor(table, p2_keys))
        Container = mod.AttentionTensorContainer
        for a, b in plan2:
            xs = x[a:b]
            segs = local_segments(mod_segments, a, b)
            if Q is None:
                h = mod._mod_scale_shift(blk.norm1(xs), shift, scale, segs)
                q, _, _ = qk(h, a, b)
                del h
            else:
                q = Q[a:b]
            # Containers are single-owner: a fresh one per call; K/V stay alive here.
            out = mod.optimized_attention(Container(q.transpose(0, 1).unsqueeze(0)), Container(k4), Container(v4),
                                          H, preferred_attention=getattr(attn, "comfy_attention", None), mask=None,
                                          skip_reshape=True, transformer_options=to)
            del q
            mod._mod_gate(xs, gate, attn.out_proj(out.squeeze(0)), segs)
            del out
        del K, V, Q, k4, v4
        if call is not None:
            if len(plan1) > 1:
                call["keys"].update(p1_keys)
            if len(plan2) > 1:
                call["keys"].update(p2_keys)
            call["attn_plan1"] = plan1
        return plan2, p2_keys

    # -- the final layer (model.py FinalLayer.forward, sliced only where it must be) ---------
    def _final_forward(self, fl, orig, x, t_emb, video_seg, audio_seg, *rest):
        call = self._call
        S, D = x.shape
        nv = video_seg[1] - video_seg[0]
        na = audio_seg[1] - audio_seg[0]
        rows = max(nv, na)
        e = x.element_size()
        scale_e = t_emb.element_size()  # the adaln output (scale, shift) has t_emb's dtype
        table, note = sliced_table.table_for(x.device.type, torch.__version__, _device_name(x.device))
        head_k = classify_linear(fl.video_out, "head", x.dtype)
        if call is not None:
            call["head_rows"] = rows
        keys = [head_k, "rowwise"]
        floor = _floor(table, keys)
        budget = None
        if call is not None and "S" in call:
            budget = sliced_block_bytes(S, call["D"], call["I"], call["F"], self._attn_c(), self.mlp_chunk_tokens,
                                        e, self.keep_q, call.get("stock_attn") is None)
        if self.head == "stock" or (self.head == "auto" and (budget is None or head_bytes(S, rows, D, e, scale_e) <= budget)):
            if call is not None:
                call["head"] = "stock (fits within the blocks' sliced peak)" if self.head == "auto" else "stock"
            return orig(x, t_emb, video_seg, audio_seg, *rest)
        if self.head == "sliced" or budget is None:
            per = self.mlp_chunk_tokens
        else:
            per = max(1, (budget - e * S * D) // (D * (2 * scale_e + 4)))
            per = max(CHUNK_STEP, per // CHUNK_STEP * CHUNK_STEP)
        vplan = plan_slices(nv, per, floor)
        aplan = plan_slices(na, per, floor)
        vs, as_ = [], []
        for i in range(max(len(vplan), len(aplan))):
            # Both heads run in every FinalLayer call; a stream already done gets an empty
            # segment (0 rows), so each row is computed exactly once.
            va, vb = vplan[i] if i < len(vplan) else (nv, nv)
            aa, ab = aplan[i] if i < len(aplan) else (na, na)
            v, a = orig(x, t_emb, head_segment(video_seg, video_seg[0] + va, video_seg[0] + vb),
                        head_segment(audio_seg, audio_seg[0] + aa, audio_seg[0] + ab), *rest)
            vs.append(v)
            as_.append(a)
        if call is not None:
            call["head"] = f"sliced: video {describe_plan(vplan)}, audio {describe_plan(aplan)}"
            if len(vplan) > 1 or len(aplan) > 1:
                call["keys"].update(keys)
        return torch.cat(vs, dim=0), torch.cat(as_, dim=0)

    def _attn_c(self):
        return self.attn_chunk_tokens if self.attn_chunk_tokens > 0 else 0

    # -- status -----------------------------------------------------------------------------
    def status(self):
        """Lines for the node: path and why, slice sizes, exactness, activation peak."""
        c = self._last
        if c is None:
            return ["path: comfy-sliced (not run yet)",
                    f"slices: mlp {self.mlp_chunk_tokens} tokens, attention "
                    f"{self.attn_chunk_tokens if self.attn_chunk_tokens else 'stock'}"]
        lines = [f"path: {c['path']} ({c['why']})"]
        if c["path"] != "comfy-sliced" or "S" not in c:
            return lines
        S = c["S"]
        if c.get("stock_attn"):
            att = f"stock ({c['stock_attn']})"
        else:
            att = f"2 passes, {describe_plan(c['attn_plan'])}"
            if c.get("attn_plan1") and c["attn_plan1"] != c["attn_plan"]:
                att += f" (K/V pass {describe_plan(c['attn_plan1'])})"
            if self.keep_q:
                att += ", Q kept from pass 1"
        lines.append(f"slices: S {S} tokens, {c['blocks']} blocks; attention {att}; "
                     f"mlp {describe_plan(c['mlp_plan'])}; head {c.get('head', 'not run')}")
        raised = []
        for name, want, plan in (("attention", self.attn_chunk_tokens, c["attn_plan"]),
                                 ("mlp", self.mlp_chunk_tokens, c["mlp_plan"])):
            if want and len(plan) > 1 and plan[0][1] - plan[0][0] > want:
                raised.append(f"{name} slices raised from {want} to {plan[0][1] - plan[0][0]} rows (kernel threshold)")
        if raised:
            lines.append("note: " + "; ".join(raised))
        keys = sorted(k for k in c["keys"] if k)
        if keys:
            lines.append("exactness: " + _exactness(c["table"], c["table_note"], keys))
        else:
            lines.append("exactness: exact (nothing was sliced: every op saw all rows)")
        kern = c["kernels"]
        lines.append("kernels: " + ", ".join(f"{k} {v}" for k, v in kern.items() if v))
        est_stock = max(stock_block_bytes(S, c["D"], c["I"], c["F"], c["e"]),
                        head_bytes(S, c.get("head_rows", S), c["D"], c["e"], c["e"]))
        est_sliced = sliced_block_bytes(S, c["D"], c["I"], c["F"], self._attn_c(), self.mlp_chunk_tokens, c["e"],
                                        self.keep_q, not c.get("stock_attn"))
        peak = c.get("peak")
        measured = f"{peak / GIB:.2f} GiB (torch.cuda.max_memory_allocated above the call's start)" \
            if peak is not None else "not measured (no CUDA device)"
        # The estimates count a block's working set (residual, K/V, one slice) only; the
        # forward's other tensors (embeddings, RoPE table, text, outputs) come on top: measured
        # in a real ComfyUI, 1.20 GiB against 0.85 at S = 7,730 and 6.50 against 4.69 at 111,274.
        lines.append(f"activation peak: {measured}; block working-set estimate sliced {est_sliced / GIB:.2f} GiB "
                     f"vs stock {est_stock / GIB:.2f} GiB (the forward's other tensors not counted)")
        return lines


def _first_tensor_device(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if torch.is_tensor(a):
            return a.device
        if isinstance(a, (list, tuple)):
            for t in a:
                if torch.is_tensor(t):
                    return t.device
    return torch.device("cpu")


def _device_name(device):
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:  # noqa: BLE001
            return "unknown GPU"
    return device.type


def _peak_reset(device):
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_read(device, base):
    if base is None:
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base
