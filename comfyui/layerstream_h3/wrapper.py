"""The DIFFUSION_MODEL wrapper: MiniMaxH3Model._forward on the LayerStream engine.

ComfyUI calls every DIFFUSION_MODEL wrapper as wrapper(executor, x, timestep, context,
transformer_options, **kwargs) from MiniMaxH3Model.forward (comfy/patcher_extension.py
WrapperExecutor; comfy/ldm/minimax/model.py @ 01a56b76). `executor.class_obj` is the
MiniMaxH3Model; `executor(...)` runs the next wrapper or the stock `_forward`. This
wrapper returns what `_forward` returns, [-video.to(bf16), -audio.to(bf16)], from ONE
Engine.denoise call and never calls `executor` -- so ComfyUI never faults the DiT's
weights into VRAM -- except to fall back, and then it says why.

Fallbacks (each logged once per sampling run with the reason, and on the node):
  static (found when the node runs, or at the start of a run by the ON_PRE_RUN callback):
    not MiniMax H3; no checkpoint path; unsupported checkpoint format; weight patches the
    engine cannot merge (the others -- plain LoRA, diff, set -- go to the engine as exported
    LoRA files, lora_export.py), weight wrappers, hook patches, object patches on the
    diffusion model; layerstream not importable; the engine refusing the file, the device or
    the exported LoRAs.
  per call: batch > 1 (raises stock's ValueError instead), a ControlNet (`control`),
    block replacements (transformer_options["patches_replace"]["dit"]), an attention
    override other than ComfyUI's PyTorch or Comfy Kitchen INT8 attention (those two run on
    the engine as its bf16 or int8 attention, attention_choice), wrappers registered after
    this one, and everything mapping.Unsupported names. Every check that needs no engine
    runs before the engine is opened (mapping.precheck).
One engine per MODEL and memory setting: vram_budget auto is read once, at the first call
this wrapper opens an engine for, and kept for the MODEL's life (issue 25).
The run: ON_PRE_RUN starts a record, every call adds to it (path, seconds, the engine's
own seconds, device peak, fallbacks and their reasons), ON_CLEANUP logs it (run_status).
Where it goes: `path` auto -> comfy-sliced (H7's runner) when that supports the model,
else the fallback policy; policy stock -> executor(...); policy error -> RuntimeError.
"""

import inspect
import logging
import sys
import threading
import time
import weakref

from . import budget as budget_mod
from . import lora_export
from . import mapping

LOG = logging.getLogger("layerstream_h3")
PREFIX = "[LayerStream] "
WRAPPER_KEY = "layerstream_h3"


def log(msg, level=logging.INFO):
    LOG.log(level, PREFIX + msg)


class FallbackError(RuntimeError):
    """fallback = error: the engine cannot run this call (the message says why)."""


# ---- the engine cache: one engine (one copy of the weights on the device) per process ----
_ENGINE_LOCK = threading.Lock()
# The LoRA exports by patch set, shared by every node sampling it (weak: the wrappers and the
# cached engine hold them; an export's directory is removed when the last holder lets go).
_SHARED_EXPORTS = weakref.WeakValueDictionary()

# "hold": what the engine was opened from and must outlive it (the exported LoRA files).
_ENGINE = {"key": None, "engine": None, "hold": None}


def _cached_engine(key, factory, hold=None):
    with _ENGINE_LOCK:
        if _ENGINE["key"] == key and _ENGINE["engine"] is not None:
            return _ENGINE["engine"], False
        old = _ENGINE["engine"]
        _ENGINE["key"], _ENGINE["engine"], _ENGINE["hold"] = None, None, None  # releases the old exports
        if old is not None:
            close = getattr(old, "close", None)
            if close is not None:
                close()  # free the previous engine's device memory before the next one takes its own
            del old
        eng = factory()
        _ENGINE["key"], _ENGINE["engine"], _ENGINE["hold"] = key, eng, hold
        return eng, True


def drop_cached_engine():
    """Free the cached engine (tests; a node that changes its checkpoint does it implicitly)."""
    _cached_engine(("dropped",), lambda: None)
    with _ENGINE_LOCK:
        _ENGINE["key"] = None


def is_h3_model(obj):
    """True for ComfyUI's MiniMaxH3Model (isinstance when ComfyUI is importable, else by name)."""
    try:
        from comfy.ldm.minimax.model import MiniMaxH3Model
        return isinstance(obj, MiniMaxH3Model)
    except ImportError:
        return type(obj).__name__ == "MiniMaxH3Model"


def weight_patch_reason(patcher, plan=None):
    """Why the engine cannot give this MODEL's weights, or None.

    `patches` (LoRA loaders, model merges) go to the engine as exported LoRA files
    (lora_export.py) when every patch is one the engine merges by ComfyUI's formula; the
    reason then names those it cannot. Weight wrappers, hook (scheduled) patches and object
    patches on the diffusion model have no engine counterpart: ComfyUI would apply them and
    the engine would silently lose them."""
    if getattr(patcher, "patches", None):
        plan = plan if plan is not None else lora_export.plan_patches(patcher.patches)
        if plan.reason:
            return plan.reason
    return other_patch_reason(patcher)


def other_patch_reason(patcher):
    """weight_patch_reason without `patches`."""
    if getattr(patcher, "weight_wrapper_patches", None):
        return "weight wrappers are registered ({} weight(s))".format(len(patcher.weight_wrapper_patches))
    if getattr(patcher, "hook_patches", None):
        return "hook (scheduled LoRA) patches are registered"
    injections = {k: v for k, v in (getattr(patcher, "injections", None) or {}).items() if v}
    if injections:
        # model_patcher.set_injections: e.g. a bypass-mode LoRA (comfy/weight_adapter/bypass.py
        # replaces module forwards at inject time), which the engine would silently lose.
        return "injections replace module forwards ({}; e.g. a bypass LoRA)".format(", ".join(sorted(injections)[:3]))
    ours = {"diffusion_model.blocks"}
    other = [k for k in (getattr(patcher, "object_patches", {}) or {})
             if k.startswith("diffusion_model") and k not in ours]
    if other:
        return "object patches replace parts of the diffusion model ({})".format(", ".join(sorted(other)[:3]))
    return None


# ---- ComfyUI's attention choice (issue 26 item 4) ----
# ComfyUI's "Model Attention Backend" node (comfy_extras/nodes_model_advanced.py at 0f1fa67a)
# calls ModelPatcher.set_model_optimized_attention(fn) with fn = get_attention_function(
# "comfy_kitchen_int8" | "pytorch"); that puts a closure optimized_attention_override(_, *a,
# **kw) -> fn(*a, **kw) into transformer_options. --use-ck-attention instead makes
# comfy.ldm.modules.attention.optimized_attention attention_comfy_kitchen_int8, which
# model.py imported by name at import time. Names, registered and as functions:
KITCHEN_INT8 = ("comfy_kitchen_int8", "attention_comfy_kitchen_int8")
PYTORCH = ("pytorch", "attention_pytorch")


class AttentionChoice(object):
    """What ComfyUI selected and what the engine runs for it.

    algorithm: the engine's numerics attention ("int8") or None (its default, bf16);
    reason: why the engine cannot honour the choice (the call falls back), else None;
    text: the status line."""

    def __init__(self, algorithm=None, reason=None, text="attention: bf16 (ComfyUI's default choice)"):
        self.algorithm, self.reason, self.text = algorithm, reason, text

    def key(self):
        return self.algorithm


def _attention_name(fn):
    """The registered name (comfy.ldm.modules.attention.REGISTERED_ATTENTION_FUNCTIONS) of an
    attention function, else its __name__ (wrap_attn keeps it through functools.wraps)."""
    try:
        import comfy.ldm.modules.attention as cattn
        for name, f in getattr(cattn, "REGISTERED_ATTENTION_FUNCTIONS", {}).items():
            if f is fn:
                return name
    except Exception:  # no ComfyUI attention module (the test double may not have one)
        pass
    return getattr(fn, "__name__", type(fn).__name__)


def _override_target(override):
    """The function set_model_optimized_attention wrapped (the closure's one callable), or None."""
    for cell in getattr(override, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if callable(v):
            return v
    return None


def attention_choice(model, transformer_options):
    """AttentionChoice for one call: an override set by the Model Attention Backend node
    (PyTorch -> bf16, Comfy Kitchen INT8 -> the engine's "int8"; any other override ->
    reason), else ComfyUI's global attention as MiniMax H3's model module holds it
    (--use-ck-attention -> "int8"; anything else -> bf16, named in the text)."""
    ov = (transformer_options or {}).get("optimized_attention_override")
    if ov is not None:
        fn = _override_target(ov)
        name = _attention_name(fn) if fn is not None else None
        if name in KITCHEN_INT8:
            return AttentionChoice("int8", None, "attention: int8 (Comfy Kitchen INT8 attention chosen with the "
                                                 "Model Attention Backend node; the engine's own int8 attention)")
        if name in PYTORCH:
            return AttentionChoice(None, None, "attention: bf16 (PyTorch attention chosen with the Model Attention "
                                               "Backend node)")
        return AttentionChoice(None, "an attention override is set (optimized_attention_override: {}); the engine "
                                     "runs bf16 or int8 attention only".format(name or getattr(ov, "__name__", "?")))
    # model.py imported optimized_attention by name: its module's global is what H3 calls.
    glob = None
    for name in ((type(model).__module__ if model is not None else None), "comfy.ldm.minimax.model"):
        glob = getattr(sys.modules.get(name) if name else None, "optimized_attention", None)
        if glob is not None:
            break
    name = _attention_name(glob) if glob is not None else None
    if name in KITCHEN_INT8:
        return AttentionChoice("int8", None, "attention: int8 (ComfyUI runs Comfy Kitchen INT8 attention, "
                                             "--use-ck-attention; the engine's own int8 attention)")
    if name is None or name in PYTORCH:
        return AttentionChoice()
    return AttentionChoice(None, None, "attention: bf16 (ComfyUI's global attention is {}; the engine runs its own "
                                       "bf16 attention)".format(name))


class RunRecord(object):
    """One sampling run as the wrapper saw it (ON_PRE_RUN to ON_CLEANUP)."""

    def __init__(self):
        self.engine_calls = []   # dicts: sigma, seconds, engine_seconds, device_peak, budget, tables_computed
        self.fallbacks = {}      # (target, reason) -> calls
        self.attention = None    # the last call's AttentionChoice text
        self.opens = 0           # engines opened during the run

    def add_fallback(self, target, reason):
        self.fallbacks[(target, reason)] = self.fallbacks.get((target, reason), 0) + 1

    def lines(self, sliced_runner=None):
        out = []
        n = len(self.engine_calls)
        nf = sum(self.fallbacks.values())
        if n == 0 and nf == 0:
            return ["run: no denoiser call reached the node"]
        out.append("run: {} call(s) on the engine, {} elsewhere; engine opened {} time(s) in this run".format(
            n, nf, self.opens))
        if n:
            secs = [c["seconds"] for c in self.engine_calls]
            eng = [c["engine_seconds"] for c in self.engine_calls if c["engine_seconds"] is not None]
            out.append("steps: " + ", ".join("{:.3f}".format(x) for x in secs) + " s per call")
            if len(eng) == n:
                outside = [a - b for a, b in zip(secs, eng)]
                out.append("outside the engine: mean {:.1f} ms, max {:.1f} ms per call ({:.1f} % of the call)".format(
                    1e3 * sum(outside) / n, 1e3 * max(outside), 100.0 * sum(outside) / max(sum(secs), 1e-12)))
                if n > 1:  # the first call opens the engine and computes the run's AdaLN tables
                    later, later_s = outside[1:], secs[1:]
                    out.append("outside the engine after the first call: mean {:.1f} ms ({:.1f} % of the call)".format(
                        1e3 * sum(later) / len(later), 100.0 * sum(later) / max(sum(later_s), 1e-12)))
            peaks = [c["device_peak"] for c in self.engine_calls if c["device_peak"] is not None]
            budget = self.engine_calls[-1]["budget"]
            if peaks:
                over = [i for i, c in enumerate(self.engine_calls)
                        if budget and c["device_peak"] is not None and c["device_peak"] > budget]
                out.append("device peak: {} (max over the calls){}".format(
                    budget_mod.format_bytes(max(peaks)),
                    "" if not budget else (" within vram_budget {}".format(budget_mod.format_bytes(budget))
                                           if not over else " OVER vram_budget {} at call(s) {}".format(
                                               budget_mod.format_bytes(budget), ", ".join(str(i + 1) for i in over)))))
            computed = sum(1 for c in self.engine_calls if c.get("tables_computed"))
            if any(c.get("tables_computed") is not None for c in self.engine_calls):
                out.append("AdaLN tables: computed at {} of {} call(s) (kept for the schedule otherwise)".format(
                    computed, n))
            if self.attention:
                out.append(self.attention)
        for (target, reason), k in sorted(self.fallbacks.items()):
            out.append("fallback to {} at {} call(s): {}".format(target, k, reason))
        if sliced_runner is not None and any(t == "comfy-sliced" for t, _ in self.fallbacks):
            out.extend("comfy-sliced " + str(l) for l in sliced_runner.status())
        return out


class Settings(object):
    """The node's knobs, resolved (see node.py for their meaning)."""

    def __init__(self, path="auto", fallback="stock", device="cpu", vram_budget="auto", mlp_chunk=0,
                 attn_chunk=0, kv_tile=0, mlp_chunk_tokens=8192, attn_chunk_tokens=8192):
        self.path = path
        self.fallback = fallback
        self.device = device
        self.vram_budget_text = str(vram_budget)
        self.vram_budget = budget_mod.parse_budget(vram_budget)  # None = auto (or no budget on the CPU)
        self.mlp_chunk = int(mlp_chunk)
        self.attn_chunk = int(attn_chunk)
        self.kv_tile = int(kv_tile)
        self.mlp_chunk_tokens = int(mlp_chunk_tokens)
        self.attn_chunk_tokens = int(attn_chunk_tokens)
        # The library's one memory validation, as at every other door (issue 27): an explicit
        # vram_budget together with explicit slices, or on the CPU, is refused with the message
        # the CLI, the C API and Python give. "auto" is no budget given, so explicit slices or
        # the CPU engine simply run without one.
        budget_mod.check_memory(vram_budget=self.vram_budget, mlp_chunk=self.mlp_chunk or None,
                                attn_chunk=self.attn_chunk or None,
                                device=None if self.vram_budget is None else self.device)

    def explicit_slices(self):
        return self.mlp_chunk > 0 or self.attn_chunk > 0 or self.device == "cpu"

    def memory_text(self):
        if self.device == "cpu":
            return "memory: CPU engine (slices {}/{}; a vram budget applies to devices only)".format(
                self.mlp_chunk or "all", self.attn_chunk or "stock")
        if self.mlp_chunk > 0 or self.attn_chunk > 0:
            return "memory: explicit slices mlp {} / attention {} (no vram budget: vram_budget is auto)".format(
                self.mlp_chunk or "all", self.attn_chunk or "stock")
        if self.vram_budget is None:
            return "memory: vram_budget auto = free VRAM at the first call minus 1 GiB + 5 % of the device"
        return "memory: vram_budget {}".format(budget_mod.format_bytes(self.vram_budget))


def lora_dtype_of(patcher):
    """The engine's lora_dtype for this MODEL: the dtype ComfyUI merges its LoRAs in, for the
    path its patcher takes (docs/comfyui.md, LoRAs; model_patcher.py at 08d0e510):

    - the whole-weight path (patch_weight_to_device: the legacy ModelPatcher loading the
      model, every load on the CPU): model_management.lora_compute_dtype of the load device,
      fp16 where ComfyUI runs fp16 kernels, else fp32 (it follows --force-fp32 / --fp16):
      "f16" / "f32";
    - the cast-time path (LowVramPatch, calculate_weight with intermediate_dtype = the cast
      weight's dtype, bf16 for H3's bf16 weights): every patched module over 16 KiB of a
      dynamic-VRAM patcher (ModelPatcherDynamic.load; ComfyUI's NVIDIA default; a CPU load
      device reroutes to the legacy patcher), and every module of a legacy patcher in
      --novram (VRAMState.NO_VRAM: nothing fits, every module is lowvram): "bf16", the
      engine's cast-time mode, which also merges fp32 weights in fp32 (their cast dtype) and
      a PDD bank, which ComfyUI force-loads through the whole-weight path, in f16. That mode
      is exact only when the whole-weight dtype is fp16 and the model computes in bf16; with
      an fp32 LoRA dtype (--force-fp32: the model runs fp32, every cast is fp32) "f32" is.

    A legacy patcher that loads the model partially (--lowvram, or too little free VRAM)
    patches its lowvram modules at cast time and the rest whole; which modules those are
    depends on the free memory at load, so that case gets the whole-weight dtype. "auto"
    (the engine's choice for its device, the same rule) without ComfyUI."""
    try:
        import comfy.model_management as mm
        device = getattr(patcher, "load_device", None)
        whole = {"torch.float16": "f16", "torch.float32": "f32"}.get(str(mm.lora_compute_dtype(device)), "auto")
    except Exception:  # no ComfyUI, or a device it does not know
        return "auto"
    if whole != "f16":
        return whole
    on_cpu = getattr(device, "type", None) == "cpu"
    try:
        dynamic = bool(patcher.is_dynamic()) and not on_cpu
    except Exception:
        dynamic = False
    states = getattr(mm, "VRAMState", None)
    novram = states is not None and getattr(mm, "vram_state", None) == getattr(states, "NO_VRAM", object())
    if not (dynamic or (novram and not on_cpu)):
        return whole
    # The cast dtype of H3's bf16 weights is the model's compute dtype.
    compute = getattr(getattr(patcher, "model", None), "manual_cast_dtype", None)
    if compute is None:
        try:
            compute = patcher.model_dtype()
        except Exception:
            compute = None
    if compute is not None and str(compute) != "torch.bfloat16":
        return whole
    return "bf16"


def supports_output_masks(eng):
    """Whether this engine's denoise takes output_masks= (Engine.denoise(..., output_masks=False)
    leaves the velocities unmasked, as _forward does): read from its signature, not its version."""
    fn = getattr(eng, "denoise", None)
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "output_masks" in params


class EngineWrapper(object):
    """The callable registered as ComfyUI's DIFFUSION_MODEL wrapper (see the module doc).

    engine_factory(settings, budget_bytes[, loras=, lora_dtype=]) -> a layerstream.Engine;
    the default opens `checkpoint` on settings.device (LoRA keywords only when the MODEL
    carries patches). Tests pass their own (the tiny preset).

    lora = (cache key, lora_export.Plan) of the MODEL the node was given, or None; the
    ON_PRE_RUN callback replaces it with the sampled patcher's."""

    def __init__(self, settings, checkpoint=None, static_reason=None, sliced_runner=None, sliced_module=None,
                 detached=False, engine_factory=None, layerstream_module=None, lora=None, lora_dtype="auto"):
        self.settings = settings
        self.checkpoint = checkpoint
        self.static_reason = static_reason
        self.run_reason = None
        self.sliced_runner = sliced_runner
        self.sliced = sliced_module
        self.detached = detached
        self._factory = engine_factory
        self._ls = layerstream_module
        self._logged = set()
        self._planned = set()
        self._refused = {}  # engine key -> the engine's message (opening a file is not retried every step)
        self.calls = 0
        self.last = None  # (report dict, seconds) of the last engine call
        self.lora = lora if lora is not None and lora[1].groups else None
        self.lora_dtype = lora_dtype
        self._plans = {} if lora is None else {lora[0]: lora[1]}  # cache key -> Plan
        self._exports = {}  # cache key -> lora_export.Export (one export per patch set)
        self.exports_made = 0
        self._masks_cap = (None, False)  # (id(engine), supports output_masks)
        self._budget = None  # vram_budget auto, fixed when first taken (the MODEL's life)
        self.opens = 0  # engines this wrapper opened (tests count them)
        self.record = RunRecord()  # the current sampling run (ON_PRE_RUN .. ON_CLEANUP)

    # -- ComfyUI callbacks --------------------------------------------------------------
    def on_pre_run(self, patcher):
        """CallbacksMP.ON_PRE_RUN: the patcher that is about to sample (clones made after this
        node, e.g. by a LoRA loader, carry this callback too). Its patches become the engine's
        LoRAs (planned once per patch set; exported at the first engine call)."""
        key = lora_export.cache_key(patcher)
        plan = self._plans.get(key)
        if plan is None:
            plan = lora_export.plan_patches(getattr(patcher, "patches", None))
            if len(self._plans) >= 4:
                self._plans.clear()
            self._plans[key] = plan
        self.run_reason = plan.reason or other_patch_reason(patcher)
        self.lora = (key, plan) if self.run_reason is None and plan.groups else None
        self.lora_dtype = lora_dtype_of(patcher)
        self._logged.clear()
        self.record = RunRecord()

    def on_cleanup(self, patcher=None):
        """CallbacksMP.ON_CLEANUP (ModelPatcher.cleanup, after sampling): logs the run."""
        for line in self.run_status():
            log(line)

    def run_status(self):
        """The last (or current) sampling run: what ran, per-step time, peak, fallbacks."""
        return self.record.lines(self.sliced_runner)

    # -- the wrapper -----------------------------------------------------------------
    def __call__(self, executor, x, timestep, context, transformer_options=None, **kwargs):
        t_start = time.perf_counter()
        if transformer_options is None:
            transformer_options = {}
        args = (x, timestep, context, transformer_options)
        model = getattr(executor, "class_obj", None)
        reason = self.static_reason or self.run_reason or self.call_reason(executor, model, transformer_options, kwargs)
        choice = None
        if not reason:
            choice = attention_choice(model, transformer_options)
            reason = choice.reason
        if not reason:
            # Everything that decides whether the engine can run the call, before it is
            # opened (issue 25: an fp32 MODEL opened the engine twice and never used it).
            try:
                mapping.precheck(x, context)
            except mapping.Unsupported as e:
                reason = str(e)
        if reason:
            return self.fall_back(executor, model, reason, args, kwargs)
        try:
            eng = self.engine(choice)
        except mapping.Unsupported as e:
            return self.fall_back(executor, model, str(e), args, kwargs)
        self.record.attention = choice.text
        info = eng.info()
        try:
            req = mapping.build_request(model, info, x, timestep, context, transformer_options,
                                        kwargs.get("minimax_payload"), kwargs.get("denoise_mask"),
                                        kwargs.get("audio_denoise_mask"),
                                        output_masks_supported=self.masks_supported(eng))
        except mapping.Unsupported as e:
            return self.fall_back(executor, model, str(e), args, kwargs)
        self._write_layout(model, transformer_options, kwargs.get("minimax_payload"), req)
        try:
            return self.run(eng, req, t_start)
        except mapping.Unsupported as e:
            return self.fall_back(executor, model, str(e), args, kwargs)

    def call_reason(self, executor, model, transformer_options, kwargs):
        if model is None or not is_h3_model(model):
            return "the diffusion model is {}, not MiniMax H3".format(type(model).__name__)
        if kwargs.get("control") is not None:
            return "a ControlNet is attached (control); the engine runs no control branch"
        if (transformer_options.get("patches_replace") or {}).get("dit"):
            return "block replacement patches are set (patches_replace['dit'], e.g. a Fun ControlNet)"
        wrappers = getattr(executor, "wrappers", None)
        idx = getattr(executor, "idx", None)
        if wrappers is not None and idx is not None and idx + 1 < len(wrappers):
            return "{} DIFFUSION_MODEL wrapper(s) registered after LayerStream's expect the stock _forward".format(
                len(wrappers) - idx - 1)
        return None

    def fall_back(self, executor, model, reason, args, kwargs):
        s = self.settings
        target = "stock"
        if s.path == "auto" and self.sliced_runner is not None and self.sliced is not None and not self.detached:
            ok, why = self.sliced.supported(model)
            if ok:
                target = "comfy-sliced"
            else:
                reason += "; comfy-sliced cannot run it either: " + str(why)
        if target == "stock" and s.fallback == "error":
            raise FallbackError(PREFIX + "the engine cannot run this call: " + reason + " (fallback = error; "
                                "set fallback = stock, or bypass the node for stock ComfyUI)")
        if self.detached:
            raise FallbackError(PREFIX + "the engine cannot run this call: " + reason + "; stock is impossible "
                                "because this MODEL's DiT blocks were detached so the legacy loader would not copy "
                                "them to the GPU (path = engine). Bypass the node, or use dynamic VRAM with path = auto.")
        key = (target, reason)
        self.record.add_fallback(target, reason)
        if key not in self._logged:
            self._logged.add(key)
            log("fallback to {}: {}".format(target, reason), logging.WARNING)
        if target == "comfy-sliced":
            return self.sliced_runner(executor, *args, **kwargs)
        return executor(*args, **kwargs)

    # -- the engine ------------------------------------------------------------------
    def layerstream(self):
        if self._ls is None:
            try:
                import layerstream
            except ImportError as e:
                raise mapping.Unsupported("the layerstream Python package is not importable ({})".format(e))
            self._ls = layerstream
        return self._ls

    def _lora_files(self):
        """The exported LoRA files of the current patch set: (((path, strength), ...), Export)
        or ((), None). Exported once per patch set and kept while this wrapper or the cached
        engine holds it."""
        if self.lora is None:
            return (), None
        key, plan = self.lora
        exp = self._exports.get(key)
        if exp is None or not exp.alive:
            exp = _SHARED_EXPORTS.get(key)  # another node sampling the same patch set
        if exp is None or not exp.alive:
            try:
                exp = lora_export.Export(plan)
            except lora_export.ExportError as e:
                raise mapping.Unsupported(str(e))
            _SHARED_EXPORTS[key] = exp
            self.exports_made += 1
            log("LoRA: {} exported to {} ({}), merged by the engine in this order".format(
                plan.describe(), exp.directory, budget_mod.format_bytes(exp.nbytes)))
        self._exports[key] = exp
        return tuple(exp.loras), exp

    def budget(self):
        """The engine's device budget: the node's size, or auto's figure, read once (at the
        first engine this wrapper opens) and kept: re-reading free memory after the engine
        took its own would give another figure and re-open the engine (issue 25)."""
        s = self.settings
        if s.explicit_slices() or s.vram_budget is not None:
            return s.vram_budget
        if self._budget is None:
            self._budget = self._auto_budget()
            log("vram_budget auto = {} (taken once; kept for this MODEL)".format(budget_mod.format_bytes(self._budget)))
        return self._budget

    def engine(self, choice=None):
        s = self.settings
        attention = choice.algorithm if choice is not None else None
        loras, export = self._lora_files()
        ls = self.layerstream()
        budget = self.budget()
        key = (self.checkpoint, s.device, None if s.explicit_slices() else budget, s.mlp_chunk, s.attn_chunk,
               s.kv_tile, attention, id(self._factory), loras, self.lora_dtype if loras else None)
        lora_kw = {"loras": list(loras), "lora_dtype": self.lora_dtype} if loras else {}
        if attention is not None:
            lora_kw["attention"] = attention

        def make():
            if self._factory is not None:
                return self._factory(s, budget, **lora_kw)
            return open_engine(ls, self.checkpoint, s, budget, **lora_kw)

        if key in self._refused:
            raise mapping.Unsupported(self._refused[key])
        try:
            eng, fresh = _cached_engine(key, make, hold=export)
        except ls.Error as e:
            what = " or device"
            if loras:
                what = ", the device or the MODEL's LoRA patches"
            if attention is not None:
                what += " or {} attention (ComfyUI selected Comfy Kitchen INT8 attention)".format(attention)
            self._refused[key] = "the engine refused the checkpoint{}: {}".format(what, e)
            raise mapping.Unsupported(self._refused[key])
        if fresh:
            self.opens += 1
            self.record.opens += 1
            # The engine was rebuilt: this wrapper lets go of the exports of other patch sets;
            # each one's directory goes when no wrapper and no cached engine hold it.
            for k in [k for k, v in self._exports.items() if v is not export]:
                del self._exports[k]
            info = eng.info()
            log("engine {} on {}: {} blocks, hidden {}; {}".format(
                info.get("version", ls.version()), info.get("device", s.device), info.get("num_layers"),
                info.get("hidden"), s.memory_text() if budget is None or s.explicit_slices()
                else "vram_budget " + budget_mod.format_bytes(budget)))
        return eng

    def masks_supported(self, eng):
        if self._masks_cap[0] != id(eng):
            self._masks_cap = (id(eng), supports_output_masks(eng))
        return self._masks_cap[1]

    def _auto_budget(self):
        try:
            import torch
            dev = torch.device(self.settings.device)
            # PyTorch's cached but unused blocks are not free for the engine's own cudaMalloc:
            # hand them back to the driver first (ComfyUI's soft_empty_cache does the same).
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(dev)
        except Exception as e:  # no CUDA in this torch, or a bad device string
            raise mapping.Unsupported("cannot read free VRAM for vram_budget auto on {}: {}".format(
                self.settings.device, e))
        b = budget_mod.auto_budget(free, total)
        if b is None:
            raise mapping.Unsupported("vram_budget auto: only {} free on {}, less than the reserve {}".format(
                budget_mod.format_bytes(free), self.settings.device, budget_mod.format_bytes(
                    budget_mod.auto_reserve(total))))
        return b

    def run(self, eng, req, t_start=None):
        """One Engine.denoise call; returns [video, audio] as _forward does. t_start: when
        the wrapper was entered (the call's time counts everything the node does)."""
        import torch
        ls = self.layerstream()
        clip = mapping.make_clip(ls, req)
        dev = torch.device(self.settings.device)
        video, audio = req["video"], req["audio"]
        out_dev = video.device
        s = req["shapes"]
        text = req["text"].to(dev) if req["text"] is not None else None
        refined = req["refined_text"].to(dev) if req["refined_text"] is not None else None
        # Outputs: bf16 on the engine's device, [C, T, Hl, Wl] views of [1, ...] tensors (the
        # engine rounds its fp32 velocities to bf16 exactly as .to(torch.bfloat16) does).
        v_out = torch.empty((1, s["C"], s["T"], s["Hl"], s["Wl"]), dtype=torch.bfloat16, device=dev)
        a_out = torch.empty((1, s["Ca"], 2, s["A"]), dtype=torch.bfloat16, device=dev)
        stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
        extra = {}
        if req["output_masks"] is not None:
            extra["output_masks"] = req["output_masks"]
        first = self.calls == 0 or (s["T"], s["Hl"], s["Wl"], s["L"]) not in self._planned
        t0 = time.perf_counter() if t_start is None else t_start
        t1 = time.perf_counter()
        try:
            eng.denoise(clip, video.to(dev), audio.to(dev), req["sigma"], text=text, refined_text=refined,
                        video_out=v_out[0], audio_out=a_out[0], stream=stream, **extra)
        except ls.Error as e:
            raise mapping.Unsupported("the engine failed: {}".format(e))
        except TypeError as e:
            if extra:
                raise mapping.Unsupported("this layerstream build cannot leave masks out of its output ({})".format(e))
            raise
        t_engine = time.perf_counter() - t1
        report = {}
        try:
            # Without the output fingerprint: it reads every output byte (about 50 ms at
            # S = 111k) and the node reports every step (issue 25). An engine whose report()
            # takes no argument gives its full report.
            # The first call of a clip shape logs the plan and the fingerprint.
            try:
                report = eng.report() if first else eng.report(output_hash=False)
            except TypeError:
                report = eng.report()
        except Exception:  # a report is for the log only
            report = {}
        if out_dev != dev:
            v_out, a_out = v_out.to(out_dev), a_out.to(out_dev)
        seconds = time.perf_counter() - t0
        self.calls += 1
        self.last = (report, seconds)
        wall = _find(report, "wall_seconds")
        peak = _find(report, "device_peak_bytes")
        adaln = report.get("adaln") if isinstance(report, dict) else None
        self.record.engine_calls.append({
            "sigma": req["sigma"], "seconds": seconds,
            "engine_seconds": float(wall) if isinstance(wall, (int, float)) else None,
            "call_seconds": t_engine,  # the Engine.denoise call (the C API around the forward included)
            "api_outside_forward": _find(report, "outside_forward"),  # the C API's share of the call, not the forward
            "device_peak": int(peak) if isinstance(peak, (int, float)) else None,
            "budget": None if self.settings.explicit_slices() else self._budget or self.settings.vram_budget,
            "tables_computed": adaln.get("tables_computed") if isinstance(adaln, dict) else None})
        if first:
            self._planned.add((s["T"], s["Hl"], s["Wl"], s["L"]))
            log("call: " + mapping.describe_request(req))
            for line in plan_lines(report):
                log(line)
        log(after_call_line(report, seconds, None, req["sigma"]))
        return [v_out, a_out]

    def _write_layout(self, model, transformer_options, payload, req):
        """_forward writes transformer_options['minimax_h3_layout'] for attention patches; so
        does this replacement (the payload's prebuilt layout when its signature fits)."""
        s = req["shapes"]
        layout = (payload or {}).get("layout")
        if layout is not None and getattr(layout, "signature", None) == (s["L"], s["T"], s["Hl"], s["Wl"], s["A"]):
            transformer_options["minimax_h3_layout"] = layout


def open_engine(ls, checkpoint, s, budget, loras=None, lora_dtype="auto", attention=None):
    """layerstream.Engine for the node's settings (budget None = explicit knobs); loras =
    [(file, strength), ...] merged in that order; attention: the engine's numerics attention
    ("int8" where ComfyUI chose Comfy Kitchen INT8 attention), None = its default."""
    kw = {"model": checkpoint, "device": s.device}
    if loras:
        kw["loras"] = list(loras)
        kw["lora_dtype"] = lora_dtype
    numerics = {}
    if s.kv_tile > 0:
        numerics["kv_tile"] = s.kv_tile
    if attention is not None:
        numerics["attention"] = attention
    if numerics:
        kw["numerics"] = numerics
    if s.explicit_slices() or budget is None:
        kw["mlp_chunk"] = s.mlp_chunk
        kw["attn_chunk"] = s.attn_chunk
    else:
        kw["vram_budget"] = int(budget)
    return ls.Engine(**kw)


def _find(d, key):
    """The first value of `key` anywhere in a nested report dict (None if absent)."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            r = _find(v, key)
            if r is not None:
                return r
    return None


def plan_lines(report):
    """The plan as the log shows it at the first call of a clip shape."""
    lines = []
    plan = report.get("plan") if isinstance(report, dict) else None
    if isinstance(plan, dict):
        text = str(plan.get("describe", "")).strip()
        if "peak" not in text:
            text += "; predicted activation peak {} (stock {})".format(
                budget_mod.format_bytes(plan.get("predicted_peak_bytes")), budget_mod.format_bytes(plan.get("stock_peak_bytes")))
        lines.append("plan: " + text)
    vb = report.get("vram_budget") if isinstance(report, dict) else None
    if isinstance(vb, dict):
        lines.append("budget: {} -> {} resident blocks, {} slot(s), K/V {}, residual {}; predicted device peak {}".format(
            budget_mod.format_bytes(vb.get("budget_bytes")), vb.get("resident_blocks"), vb.get("slots"),
            "offloaded" if vb.get("kv_offload") else "on the device",
            "offloaded" if vb.get("residual_offload") else "on the device",
            budget_mod.format_bytes(vb.get("predicted_peak_bytes"))))
    num = report.get("numerics") if isinstance(report, dict) else None
    if num is not None:
        lines.append("numerics: {}".format(num if isinstance(num, str) else ", ".join(
            "{} {}".format(k, v) for k, v in sorted(num.items()) if not isinstance(v, (dict, list)) and v != "")))
    if isinstance(report, dict) and report.get("weights") is not None:
        lines.append("weights: {}".format(report.get("weights")))
    return lines


def after_call_line(report, seconds, output_hash, sigma):
    peak = _find(report, "device_peak_bytes")
    held = _find(report, "device_held_bytes")
    act = _find(report, "measured_peak_bytes")
    wall = _find(report, "wall_seconds")
    h = _find(report, "output_hash")
    if h is None and output_hash is not None:
        h = output_hash() if callable(output_hash) else output_hash
        h = "{:016x}".format(h) if isinstance(h, int) else h
    return "denoise sigma {:.6g}: {:.3f} s ({} in the engine), device peak {} (held {}), activation peak {}{}".format(
        sigma, seconds, "{:.3f} s".format(wall) if isinstance(wall, (int, float)) else "?",
        budget_mod.format_bytes(peak), budget_mod.format_bytes(held), budget_mod.format_bytes(act),
        ", output hash {}".format(h) if h is not None else "")
