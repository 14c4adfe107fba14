"""The node "LayerStream: H3 Engine" (MODEL -> MODEL; the status shows on the node).

apply_node() does the work and needs ComfyUI's patcher API only through the MODEL it is
given (clone, add_wrapper_with_key, add_callback_with_key, add_object_patch), so the
tests drive it with a test double. make_node_class() builds the ComfyUI v3 class
(comfy_api.latest io.ComfyNode) around it.
"""

import logging

from . import budget as budget_mod
from . import checkpoint as ckpt
from . import lora_export
from .wrapper import (EngineWrapper, Settings, WRAPPER_KEY, attention_choice, log, weight_patch_reason, is_h3_model,
                      lora_dtype_of)

NODE_ID = "LayerStreamH3Engine"
DISPLAY_NAME = "LayerStream: H3 Engine"
PATHS = ("auto", "engine", "comfy-sliced")
FALLBACKS = ("stock", "error")

DESCRIPTION = (
    "Runs MiniMax H3's denoiser (the part ComfyUI's MiniMaxH3Model._forward runs) on the LayerStream engine "
    "inside a total VRAM budget, or on ComfyUI's own modules in token slices (comfy-sliced). The engine "
    "opens the checkpoint this MODEL was loaded from; ComfyUI's copy of the DiT blocks is never used. "
    "Memory settings never change the engine's output bits. Bypass the node for the stock A/B.")

TOOLTIPS = {
    "vram_budget": "Total device memory for the engine: 'auto' = free VRAM at the first step minus 1 GiB + 5 % "
                   "of the card, or a size such as 12G / 900M. Never changes the output.",
    "mlp_chunk": "Rows per MLP slice; 0 = the planner's choice under vram_budget. Non-zero slices need "
                 "vram_budget auto (a size together with slices is refused, as at every LayerStream door). "
                 "Never changes the output.",
    "attn_chunk": "Rows per attention slice (two-pass attention); 0 = the planner's choice.",
    "kv_tile": "Keys per attention tile; 0 = the device's default. A numerics setting: changing it may change bits.",
    "device": "The engine's device; auto = the MODEL's load device.",
    "fallback": "When the engine (and, for path auto, comfy-sliced) cannot run a call: stock = ComfyUI's own "
                "forward (the reason is logged), error = stop with the reason.",
    "path": "auto = the engine where it supports the model, else comfy-sliced; engine; comfy-sliced = "
            "ComfyUI's own kernels on token slices, bit-identical to stock where the kernels allow.",
    "mlp_chunk_tokens": "comfy-sliced: rows per MLP / projection slice.",
    "attn_chunk_tokens": "comfy-sliced: rows per attention slice; 0 = stock attention (only the MLP half sliced).",
    "sliced_keep_q": "comfy-sliced: keep Q from the K/V pass instead of running qkv_proj again per query slice. "
                     "Saves one qkv GEMM per slice (about 6 % of a block at 111k tokens), costs S x 7168 bf16 "
                     "(1.5 GiB at 111k). Never changes the output.",
}


def device_options():
    opts = ["auto", "cpu"]
    try:
        import torch
        opts += ["cuda:{}".format(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return opts


def _resolve_device(patcher, device):
    if device != "auto":
        return device
    d = getattr(patcher, "load_device", None)
    t = getattr(d, "type", None)
    if t == "cuda":
        return "cuda:{}".format(d.index or 0)
    if t == "cpu" or d is None:
        return "cpu"
    return str(d)


def _import_sliced():
    try:
        from . import sliced
        return sliced, None
    except Exception as e:  # H7's module missing or failing to import: comfy-sliced unavailable
        return None, "the comfy-sliced runner is not available ({}: {})".format(type(e).__name__, e)


def _sliced_supported(sliced, m, dm):
    """sliced.supported for the MODEL's own blocks: a legacy-loader engine node on another
    clone of the same model detaches diffusion_model.blocks with an object patch, which
    stays applied on the shared module until ComfyUI loads another clone (and restores it
    from object_patches_backup); get_model_object gives the backup while it is patched."""
    if len(getattr(dm, "blocks", None) or ()) == 0:
        try:
            blocks = m.get_model_object("diffusion_model.blocks")
        except Exception:  # a double or patcher without nested names
            blocks = None
        if blocks is not None and len(blocks) > 0:
            return sliced.supported(dm, blocks=blocks)
    return sliced.supported(dm)


def _patcher_api():
    import comfy.patcher_extension as pe
    return pe.WrappersMP.DIFFUSION_MODEL, pe.CallbacksMP.ON_PRE_RUN


def _cleanup_kind():
    """CallbacksMP.ON_CLEANUP (ModelPatcher.cleanup runs it after sampling), or None."""
    try:
        import comfy.patcher_extension as pe
        return getattr(pe.CallbacksMP, "ON_CLEANUP", None)
    except ImportError:
        return None


def _add_run_callbacks(m, kind_pre_run, on_pre_run, on_cleanup):
    """The run's record: reset at ON_PRE_RUN, logged at ON_CLEANUP (after sampling). A
    runner without them (an older comfy-sliced runner) registers nothing."""
    if on_pre_run is not None:
        m.add_callback_with_key(kind_pre_run, WRAPPER_KEY, on_pre_run)
    kind_cleanup = _cleanup_kind()
    if kind_cleanup is not None and on_cleanup is not None:
        m.add_callback_with_key(kind_cleanup, WRAPPER_KEY, on_cleanup)


def apply_node(model, vram_budget="auto", mlp_chunk=0, attn_chunk=0, kv_tile=0, device="auto", fallback="stock",
               path="auto", mlp_chunk_tokens=8192, attn_chunk_tokens=8192, sliced_keep_q=True, engine_factory=None,
               layerstream_module=None, patcher_api=None):
    """(patched MODEL clone, status text). Raises ValueError for knobs it cannot read, and a
    RuntimeError when fallback = error and nothing can run the model."""
    if path not in PATHS:
        raise ValueError("path must be one of {} (got {!r})".format(", ".join(PATHS), path))
    if fallback not in FALLBACKS:
        raise ValueError("fallback must be stock or error (got {!r})".format(fallback))
    settings = Settings(path=path, fallback=fallback, device=_resolve_device(model, device), vram_budget=vram_budget,
                        mlp_chunk=mlp_chunk, attn_chunk=attn_chunk, kv_tile=kv_tile,
                        mlp_chunk_tokens=mlp_chunk_tokens, attn_chunk_tokens=attn_chunk_tokens)
    kind_dm, kind_pre_run = patcher_api or _patcher_api()
    m = model.clone()
    for fn in ("remove_wrappers_with_key", "remove_callbacks_with_key"):
        if hasattr(m, fn):
            getattr(m, fn)(kind_dm if fn.startswith("remove_wrappers") else kind_pre_run, WRAPPER_KEY)
    if hasattr(m, "remove_callbacks_with_key") and _cleanup_kind() is not None:
        m.remove_callbacks_with_key(_cleanup_kind(), WRAPPER_KEY)
    if isinstance(getattr(m, "object_patches", None), dict):
        m.object_patches.pop("diffusion_model.blocks", None)  # an earlier LayerStream node's legacy detach
    dm = m.get_model_object("diffusion_model")
    lines = ["LayerStream: H3 Engine, path {}".format(path)]

    # Reasons the engine cannot run this MODEL at all (the comfy-sliced path may still).
    reason = None
    if not is_h3_model(dm):
        reason = "the input model is {}, not MiniMax H3".format(type(dm).__name__)
    path_text = None
    fmt = None
    quantised = False  # int8 / fp8 block linears: LoRAs take the engine's side path
    plan = lora_export.plan_patches(getattr(model, "patches", None))
    if reason is None:
        reason = weight_patch_reason(model, plan)
    if reason is None or path != "comfy-sliced":
        path_text, why = ckpt.checkpoint_path(model)
        if path_text is None:
            reason = reason or why
        else:
            try:
                fmt, fmt_info = ckpt.describe_format(path_text)
                quantised = bool(fmt_info.get("quantised")) or "F8_E4M3" in (fmt_info.get("dtypes") or {})
            except (ckpt.HeaderError, OSError) as e:
                fmt = "unreadable header ({})".format(e)
            lines.append("checkpoint: {} ({})".format(path_text, fmt))
            reason = reason or ckpt.unsupported_reason(path_text)
    ls = layerstream_module
    if path != "comfy-sliced":
        if ls is None and engine_factory is None:
            try:
                import layerstream as ls
            except ImportError as e:
                reason = reason or "the layerstream Python package is not importable ({})".format(e)
        if ls is not None:
            lines.append("engine: {}".format(ls.version()))

    sliced, sliced_err = (None, None)
    runner = None
    if path in ("auto", "comfy-sliced"):
        sliced, sliced_err = _import_sliced()
        if sliced is not None:
            kw = {"keep_q": True} if sliced_keep_q else {}
            try:
                runner = sliced.SlicedRunner(mlp_chunk_tokens=settings.mlp_chunk_tokens,
                                             attn_chunk_tokens=settings.attn_chunk_tokens, **kw)
            except TypeError:  # a runner without keep_q
                runner = sliced.SlicedRunner(mlp_chunk_tokens=settings.mlp_chunk_tokens,
                                             attn_chunk_tokens=settings.attn_chunk_tokens)

    if path == "comfy-sliced":
        ok, why = (False, sliced_err) if sliced is None else _sliced_supported(sliced, m, dm)
        if not ok:
            return _refuse(model, m, settings, lines, "comfy-sliced cannot run this model: {}".format(why))
        m.add_wrapper_with_key(kind_dm, WRAPPER_KEY, runner)
        _add_run_callbacks(m, kind_pre_run, getattr(runner, "on_pre_run", None), getattr(runner, "on_cleanup", None))
        lines.extend(str(l) for l in runner.status())
        lines.append("A/B: bypass this node for stock ComfyUI")
        return _done(m, lines)

    if reason is not None:
        if path == "auto" and sliced is not None:
            ok, why = _sliced_supported(sliced, m, dm)
            if ok:
                m.add_wrapper_with_key(kind_dm, WRAPPER_KEY, runner)
                _add_run_callbacks(m, kind_pre_run, getattr(runner, "on_pre_run", None), getattr(runner, "on_cleanup", None))
                lines.append("engine not used: {}; running comfy-sliced".format(reason))
                lines.extend(str(l) for l in runner.status())
                lines.append("A/B: bypass this node for stock ComfyUI")
                log("engine not used: {}; comfy-sliced runs instead".format(reason), logging.WARNING)
                return _done(m, lines)
            reason += "; comfy-sliced cannot run it either: {}".format(why)
        elif path == "auto" and sliced_err:
            reason += "; " + sliced_err
        return _refuse(model, m, settings, lines, reason)

    dynamic = bool(getattr(m, "is_dynamic", lambda: False)())
    lora_dtype = lora_dtype_of(model)
    wrapper = EngineWrapper(settings, checkpoint=path_text, sliced_runner=runner if path == "auto" else None,
                            sliced_module=sliced if path == "auto" else None, engine_factory=engine_factory,
                            layerstream_module=ls, lora=(lora_export.cache_key(model), plan), lora_dtype=lora_dtype)
    m.add_wrapper_with_key(kind_dm, WRAPPER_KEY, wrapper)
    _add_run_callbacks(m, kind_pre_run, wrapper.on_pre_run, wrapper.on_cleanup)
    lines.append("device: {}; {}".format(settings.device, settings.memory_text()))
    choice = attention_choice(dm, (getattr(m, "model_options", None) or {}).get("transformer_options"))
    lines.append(choice.text if choice.reason is None else "attention: {} -> fallback at each call".format(choice.reason))
    lines.append("numerics: kv_tile {}".format("{} (changes bits against the default)".format(settings.kv_tile)
                                               if settings.kv_tile else "default (the device's)"))
    lines.append("plan: made at the first step (it depends on the clip); the log shows it, each step's device "
                 "peak and time, and after sampling the run: steps, time outside the engine, peak, fallbacks")
    lines.append(lora_line(plan, quantised, lora_dtype))
    if dynamic:
        lines.append("weights: dynamic VRAM; ComfyUI only stages the DiT blocks and never loads them, the "
                     "text refiner runs once per run on ComfyUI's copy")
    elif path == "engine":
        import torch
        m.add_object_patch("diffusion_model.blocks", torch.nn.ModuleList())
        wrapper.detached = True
        lines.append("weights: legacy loader; the DiT blocks are detached from this MODEL so ComfyUI does not "
                     "copy them to the GPU (no stock fallback on this MODEL)")
    else:
        lines.append("weights: legacy loader; ComfyUI will also load what fits of the DiT onto the GPU (use "
                     "path engine to detach the blocks, or run ComfyUI with dynamic VRAM)")
    lines.append("fallback: {}{} when a call cannot run on the engine (batch > 1, ControlNet, block patches, "
                 "weight patches it cannot merge, ...); the log says why".format(
                     "comfy-sliced, else " if runner is not None else "", fallback))
    lines.append("A/B: bypass this node for stock ComfyUI")
    return _done(m, lines)


def lora_line(plan, quantised, lora_dtype):
    """The status line of the MODEL's LoRAs: 'LoRA: 2 files from the MODEL's patches (...),
    merged (f32)', or the side path of an int8 / fp8 checkpoint (the engine's report, in the
    log's weights line after the first call, says what it did)."""
    if not plan.groups:
        return "LoRA: none on this MODEL (a LoRA loader after this node is picked up when sampling starts)"
    how = "merged ({})".format({"auto": "the engine's dtype for the device",
                                "bf16": "bf16: ComfyUI's cast-time path under dynamic VRAM"}.get(lora_dtype, lora_dtype))
    if quantised:
        how = ("side path (int8/fp8: ComfyUI requantises with stochastic rounding, which no engine reproduces; "
               "an engine without the side path refuses the files and the log says so)")
    return "LoRA: {}, {}".format(plan.describe(), how)


def _refuse(model, m, settings, lines, reason):
    if settings.fallback == "error":
        raise RuntimeError("[LayerStream] " + reason + " (fallback = error)")
    lines.append("fallback: stock (the MODEL passes through unchanged): " + reason)
    log("fallback to stock: " + reason, logging.WARNING)
    return m, "\n".join(lines)


def _done(m, lines):
    text = "\n".join(lines)
    for l in lines:
        log(l)
    return m, text


def make_node_class():
    """The ComfyUI v3 node (imports comfy_api; only called inside ComfyUI)."""
    from comfy_api.latest import io, ui

    class LayerStreamH3Engine(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id=NODE_ID,
                display_name=DISPLAY_NAME,
                category="LayerStream",
                description=DESCRIPTION,
                search_aliases=["layerstream", "h3 engine", "h3 memory", "minimax h3"],
                inputs=[
                    io.Model.Input("model"),
                    io.String.Input("vram_budget", default="auto", tooltip=TOOLTIPS["vram_budget"]),
                    io.Int.Input("mlp_chunk", default=0, min=0, max=1 << 20, step=256, tooltip=TOOLTIPS["mlp_chunk"]),
                    io.Int.Input("attn_chunk", default=0, min=0, max=1 << 20, step=256, tooltip=TOOLTIPS["attn_chunk"]),
                    io.Int.Input("kv_tile", default=0, min=0, max=1 << 16, step=64, advanced=True,
                                 tooltip=TOOLTIPS["kv_tile"]),
                    io.Combo.Input("device", options=device_options(), default="auto", tooltip=TOOLTIPS["device"]),
                    io.Combo.Input("fallback", options=list(FALLBACKS), default="stock", tooltip=TOOLTIPS["fallback"]),
                    io.Combo.Input("path", options=list(PATHS), default="auto", tooltip=TOOLTIPS["path"]),
                    io.Int.Input("mlp_chunk_tokens", default=8192, min=256, max=1000000, step=256,
                                 tooltip=TOOLTIPS["mlp_chunk_tokens"]),
                    io.Int.Input("attn_chunk_tokens", default=8192, min=0, max=1000000, step=256,
                                 tooltip=TOOLTIPS["attn_chunk_tokens"]),
                    io.Boolean.Input("sliced_keep_q", default=True, optional=True, advanced=True,
                                     tooltip=TOOLTIPS["sliced_keep_q"]),
                ],
                outputs=[io.Model.Output()],
            )

        @classmethod
        def execute(cls, model, vram_budget, mlp_chunk, attn_chunk, kv_tile, device, fallback, path,
                    mlp_chunk_tokens, attn_chunk_tokens, sliced_keep_q=True):
            try:
                patched, text = apply_node(model, vram_budget=vram_budget, mlp_chunk=mlp_chunk,
                                           attn_chunk=attn_chunk, kv_tile=kv_tile, device=device,
                                           fallback=fallback, path=path, mlp_chunk_tokens=mlp_chunk_tokens,
                                           attn_chunk_tokens=attn_chunk_tokens, sliced_keep_q=sliced_keep_q)
            except budget_mod.BudgetError:
                raise
            return io.NodeOutput(patched, ui=ui.PreviewText(text))

    return LayerStreamH3Engine
