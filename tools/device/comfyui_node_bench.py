"""The LayerStream node inside a real ComfyUI, run by ComfyUI's own loader and prompt
executor (issue 25). Called by tools/device/comfyui_node.sh (read its header first); not a
test: it prints comparisons and per-step times and writes them as JSON.

One process: ComfyUI (a staged tree, the current working directory) is imported as its
main.py would, its node loader registers EmptyMiniMaxH3LatentAV (comfy_extras), the
LayerStream package from custom_nodes/ and three bench nodes this file writes next to it:

  LSBenchCond   CONDITIONING of seeded random text states [1, L, text_dim] (no text encoder:
                the checkpoint is synthetic, so is the prompt)
  LSBenchTap    MODEL -> MODEL: an APPLY_MODEL wrapper (outside the DIFFUSION_MODEL ones, so
                the LayerStream wrapper stays the last of those) that times every denoiser
                call (CUDA synchronised) and reads torch's peak per call
  LSBenchSave   the sampled LATENT, kept in memory for the comparisons

Each case is an API prompt UNETLoader -> [Model Attention Backend] -> [LayerStream: H3
Engine] -> LSBenchTap -> KSampler (euler, simple, seed fixed) -> LSBenchSave, run by
execution.PromptExecutor. Cases without the LayerStream node are stock ComfyUI. `--plan`
picks the cases of one process (plan()): "legacy" (the legacy ModelPatcher: stock,
comfy-sliced, engine at S = 7,730 and 111,274, ComfyUI's attention choice in front of the
node, stock again at the end), "dynamic" (comfy_aimdo's Dynamic VRAM, started as main.py
starts it), "ck_flag" (run with --use-ck-attention). Each case is compared with its
reference (torch.equal, relative L2 of the sampled latents, where they differ) and timed
against its size's stock; for node cases the node's run record gives the time outside the
engine (the wrapper's call minus the engine's forward), engine opens and device peaks
against the budget, and the status its attention line.
"""

import argparse
import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
import types
import uuid

BENCH_NODES = r'''
import sys, time, types
import torch
import comfy.patcher_extension as pe

STORE = sys.modules.setdefault("ls_bench_store", types.ModuleType("ls_bench_store"))
if not hasattr(STORE, "calls"):
    STORE.calls, STORE.latents, STORE.models = {}, {}, {}


class LSBenchCond:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 1 << 31}),
                             "tokens": ("INT", {"default": 64, "min": 1, "max": 4096}),
                             "width": ("INT", {"default": 4096, "min": 1, "max": 1 << 16})},
                "optional": {"nonce": ("INT", {"default": 0, "min": 0, "max": 1 << 20})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "LayerStream/bench"

    def make(self, seed, tokens, width, nonce=0):  # nonce: a new output object (cache miss), same values
        g = torch.Generator().manual_seed(seed)
        return ([[torch.randn((1, tokens, width), generator=g) * 0.5, {}]],)


class LSBenchTap:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "tag": ("STRING", {"default": "case"})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "tap"
    CATEGORY = "LayerStream/bench"

    def tap(self, model, tag):
        m = model.clone()
        calls = STORE.calls.setdefault(tag, [])
        STORE.models[tag] = m

        def timed(executor, *args, **kwargs):
            dev = torch.device("cuda")
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            out = executor(*args, **kwargs)
            torch.cuda.synchronize(dev)
            rec = {"seconds": time.perf_counter() - t0, "torch_peak": torch.cuda.max_memory_allocated(dev)}
            try:  # the denoiser's output of each call, kept for the small clips (which call differs first)
                parts = out.unbind() if getattr(out, "is_nested", False) or type(out).__name__ == "NestedTensor" \
                    else (list(out) if isinstance(out, (list, tuple)) else [out])
                if sum(p.numel() for p in parts) <= 8 << 20:
                    rec["out"] = [p.detach().cpu().clone() for p in parts]
                    x, ctx = args[0], args[3] if len(args) > 3 else kwargs.get("c_crossattn")
                    xs = x.unbind() if getattr(x, "is_nested", False) or type(x).__name__ == "NestedTensor" else [x]
                    rec["in"] = {"x": [p.detach().cpu().clone() for p in xs],
                                 "context": [ctx.detach().cpu().clone()] if ctx is not None else []}
            except Exception:  # noqa: BLE001 - a form this tap does not know: no per-call output
                pass
            calls.append(rec)
            return out

        m.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, "ls_bench_tap", timed)
        return (m,)


class LSBenchSave:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "tag": ("STRING", {"default": "case"})}}
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"
    CATEGORY = "LayerStream/bench"

    def save(self, samples, tag):
        s = samples["samples"]
        parts = s.unbind() if getattr(s, "is_nested", False) or type(s).__name__ == "NestedTensor" else [s]
        STORE.latents[tag] = [p.detach().float().cpu().clone() for p in parts]
        return {}


NODE_CLASS_MAPPINGS = {"LSBenchCond": LSBenchCond, "LSBenchTap": LSBenchTap, "LSBenchSave": LSBenchSave}
'''


# ---- stand-ins for packages ComfyUI imports but this run never calls ------------------------
class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub

    def __call__(cls, *a, **k):
        return _Stub


class _Stub(metaclass=_StubMeta):
    pass


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules that resolve every attribute to a placeholder: PyAV (a C extension; ComfyUI's
    comfy_api imports it for its video types), trampoline (torchsde imports it for Brownian
    intervals, which the euler sampler never builds). Installed only for roots that are not
    importable here; each use is printed."""

    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []

        def attr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub
        m.__getattr__ = attr
        return m

    def exec_module(self, module):
        pass


def install_stubs(roots=("av", "trampoline", "spandrel")):
    missing = [r for r in roots if importlib.util.find_spec(r) is None]
    if missing:
        sys.meta_path.append(_StubFinder(missing))
        print("stand-ins (import only, never called): " + ", ".join(missing), flush=True)
    return missing


# ---- ComfyUI -------------------------------------------------------------------------------------
class _Server:
    """What PromptExecutor needs of ComfyUI's PromptServer (no web server here)."""
    client_id = None
    last_node_id = None
    last_prompt_id = None
    sockets_metadata = {}

    def send_sync(self, *a, **k):
        pass

    def queue_updated(self):
        pass


def aimdo_preload():
    """Dynamic VRAM as ComfyUI's main.py starts it (0f1fa67a, lines 58-70): comfy_aimdo's
    control.init before the model code runs; False when its native part does not load."""
    import comfy_aimdo.control as control
    for kw in ({"simple_vram_headroom": None, "nvml_pressure": True}, {"simple_vram_headroom": None}, {}):
        try:
            return bool(control.init(**kw)) is not False
        except TypeError:
            continue
    return False


def aimdo_devices():
    """main.py lines 261-289: init_devices, then ModelPatcherDynamic as the core patcher."""
    import comfy.memory_management
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy_aimdo.control as control
    from comfy.cli_args import args
    devices = mm.get_all_torch_devices()
    try:
        ok = control.init_devices((d.index, int(args.vram_headroom * 1024 ** 3)) for d in devices)
    except TypeError:
        ok = control.init_devices(d.index for d in devices)
    if ok:
        control.set_log_warning()
        comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
        comfy.memory_management.aimdo_enabled = True
    return bool(ok)


def comfy_init(comfy_dir, argv, dynamic=False):
    sys.path.insert(0, comfy_dir)
    os.chdir(comfy_dir)
    sys.argv = ["main.py"] + argv
    import comfy.options
    comfy.options.enable_args_parsing()
    if dynamic and not aimdo_preload():
        raise SystemExit("comfy_aimdo's native part did not load (control.init): no Dynamic VRAM here")
    import execution  # noqa: F401  (imports comfy.model_management, nodes)
    import nodes
    import comfy.model_management as mm
    if dynamic and not aimdo_devices():
        raise SystemExit("comfy_aimdo.control.init_devices failed: no Dynamic VRAM here")
    import comfy.ldm.modules.attention as cattn
    import comfy_kitchen
    print("ComfyUI: device {}, vram state {}, dynamic VRAM {}; Comfy Kitchen INT8 attention available {} "
          "(comfy_kitchen.int8_attention_is_available {}, cuda backend: {})".format(
              mm.get_torch_device_name(mm.get_torch_device()), mm.vram_state,
              bool(getattr(__import__("comfy.memory_management").memory_management, "aimdo_enabled", False)),
              cattn.COMFY_KITCHEN_INT8_ATTENTION_IS_AVAILABLE, comfy_kitchen.int8_attention_is_available(),
              getattr(__import__("comfy_kitchen.backends.cuda").backends.cuda, "_EXT_ERROR", None) or "loaded"),
          flush=True)

    async def load():
        await nodes.init_public_apis()
        extras = os.path.join(comfy_dir, "comfy_extras")
        for f in ("nodes_minimax_h3.py", "nodes_model_advanced.py"):
            ok = await nodes.load_custom_node(os.path.join(extras, f), module_parent="comfy_extras")
            print("comfy_extras/{}: {}".format(f, "loaded" if ok else "IMPORT FAILED"), flush=True)
        for name in ("layerstream_h3", "ls_bench_nodes.py"):
            ok = await nodes.load_custom_node(os.path.join(comfy_dir, "custom_nodes", name))
            print("custom_nodes/{}: {}".format(name, "loaded" if ok else "IMPORT FAILED"), flush=True)
    asyncio.run(load())
    for n in ("LayerStreamH3Engine", "EmptyMiniMaxH3LatentAV", "LSBenchTap", "KSampler", "UNETLoader",
              "ModelAttentionBackend"):
        if n not in nodes.NODE_CLASS_MAPPINGS:
            raise SystemExit("node {} is not registered".format(n))
    print("Model Attention Backend offers: {}".format(
        nodes.NODE_CLASS_MAPPINGS["ModelAttentionBackend"].INPUT_TYPES()["required"]["attention"][0]), flush=True)
    return execution


def prompt(case, unet, text_dim):
    """An API prompt for one case (dict)."""
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "4": {"class_type": "LSBenchCond", "inputs": {"seed": 11, "tokens": case["L"], "width": text_dim,
                                                       "nonce": case.get("nonce") or 0}},
        "5": {"class_type": "LSBenchCond", "inputs": {"seed": 12, "tokens": case["L"], "width": text_dim,
                                                       "nonce": case.get("nonce") or 0}},
        "6": {"class_type": "EmptyMiniMaxH3LatentAV",
              "inputs": {"width": case["w"], "height": case["h"], "length": case["frames"]}},
        "3": {"class_type": "LSBenchTap", "inputs": {"model": ["1", 0], "tag": case["tag"]}},
        "7": {"class_type": "KSampler", "inputs": {"model": ["3", 0], "seed": 5, "steps": case["steps"],
                                                    "cfg": case["cfg"], "sampler_name": "euler",
                                                    "scheduler": "simple", "positive": ["4", 0],
                                                    "negative": ["5", 0], "latent_image": ["6", 0], "denoise": 1.0}},
        "8": {"class_type": "LSBenchSave", "inputs": {"samples": ["7", 0], "tag": case["tag"]}},
    }
    model = ["1", 0]
    if case.get("attention"):
        # ComfyUI's own choice in front of the node: "pytorch attention" / "comfy kitchen attention"
        p["9"] = {"class_type": "ModelAttentionBackend", "inputs": {"model": model, "attention": case["attention"]}}
        model = ["9", 0]
        p["3"]["inputs"]["model"] = model
    if case.get("node"):
        inputs = {"model": model, "vram_budget": "auto", "mlp_chunk": 0, "attn_chunk": 0, "kv_tile": 0,
                  "device": "auto", "fallback": "error", "path": "engine", "mlp_chunk_tokens": 8192,
                  "attn_chunk_tokens": 8192}
        inputs.update(case["node"])
        p["2"] = {"class_type": "LayerStreamH3Engine", "inputs": inputs}
        p["3"]["inputs"]["model"] = ["2", 0]
    return p


def run_case(execution, executor, case, unet, text_dim):
    store = sys.modules["ls_bench_store"]
    p = prompt(case, unet, text_dim)
    pid = str(uuid.uuid4())
    valid = asyncio.run(execution.validate_prompt(pid, p, None))
    if not valid[0]:
        raise RuntimeError("invalid prompt: {} {}".format(valid[1], valid[3]))
    t0 = time.perf_counter()
    executor.execute(p, pid, {}, valid[2])
    wall = time.perf_counter() - t0
    if not executor.success:
        msgs = [m for m in executor.status_messages if m[0] == "execution_error"]
        raise RuntimeError("execution failed: " + (msgs[0][1].get("exception_message", "?") if msgs else "?"))
    calls = store.calls.get(case["tag"], [])
    out = {"tag": case["tag"], "wall_seconds": wall, "step_seconds": [c["seconds"] for c in calls],
           "call_outputs": [c.get("out") for c in calls], "call_inputs": [c.get("in") for c in calls],
           "torch_peak_bytes": max((c["torch_peak"] for c in calls), default=None)}
    m = store.models.get(case["tag"])
    w = None
    for lst in ((getattr(m, "wrappers", {}) or {}).get("diffusion_model", {}) or {}).values():
        for fn in lst:
            if hasattr(fn, "run_status") or hasattr(fn, "on_cleanup"):
                w = fn
    if w is not None:
        out["status"] = w.run_status()
        rec = getattr(w, "record", None)
        if rec is not None:
            out["engine_calls"] = rec.engine_calls
            out["fallbacks"] = {"{}: {}".format(*k): v for k, v in rec.fallbacks.items()}
            out["opens_total"] = getattr(w, "opens", None)
    return out


def rel_l2(a, b):
    import torch
    num = sum(float(torch.sum((x - y).double() ** 2)) for x, y in zip(a, b))
    den = sum(float(torch.sum(y.double() ** 2)) for y in b)
    return (num / max(den, 1e-300)) ** 0.5


def equal(a, b):
    import torch
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


SIZES = {
    # 448x448, 124 frames, L 64: S = 64 + 2 * 207 + 37 * 196 = 7,730
    "small": dict(w=448, h=448, frames=124, L=64, steps=4),
    # 1024x1024, 362 frames, L 500: S = 500 + 2 * 603 + 107 * 1024 = 111,274
    "large": dict(w=1024, h=1024, frames=362, L=500, steps=3),
}
CK, PT = "comfy kitchen attention", "pytorch attention"


def plan(name, sizes):
    """The cases of one process, in order: (tag, size, cfg, node inputs or None, Model Attention
    Backend choice or None, the tag it is compared with or None). Every tag is '<size>_<what>';
    '<size>_stock' is the time reference of its size."""
    engine, sliced = {"path": "engine"}, {"path": "comfy-sliced", "sliced_keep_q": True}
    rows = []
    if name == "legacy":
        for size in ("small", "large"):
            rows += [(size + "_stock", size, 1.0, None, None, None),
                     (size + "_sliced", size, 1.0, sliced, None, size + "_stock"),
                     (size + "_engine", size, 1.0, engine, None, size + "_stock")]
            if size == "small":
                # the choice in front of the node: PyTorch keeps bf16 (the same bytes as no choice)
                rows.append(("small_engine_pt", size, 1.0, engine, PT, "small_engine"))
            rows += [(size + "_stock_ck", size, 1.0, None, CK, size + "_stock"),
                     (size + "_sliced_ck", size, 1.0, sliced, CK, size + "_stock_ck"),
                     (size + "_engine_ck", size, 1.0, engine, CK, size + "_stock_ck")]
            if size == "small":
                rows += [  # stock again, late in the process: run 2 found comfy-sliced equal to stock
                         # everywhere but at small CFG 1, whose stock run was the process's first
                         ("small_stock_again", size, 1.0, None, None, "small_stock"),
                         ("small_sliced_vs_again", size, 1.0, None, None, None)]
    elif name == "dynamic":  # ComfyUI's NVIDIA default: comfy_aimdo's ModelPatcherDynamic
        rows += [("small_stock", "small", 1.0, None, None, None),
                 ("small_sliced", "small", 1.0, sliced, None, "small_stock"),
                 ("small_engine", "small", 1.0, engine, None, "small_stock"),
                 ("small_stock_again", "small", 1.0, None, None, "small_stock")]
    elif name == "repeat":  # stock again and again: which part of the first run differs (run 3's finding)
        rows += [("small_stock", "small", 1.0, None, None, None),
                 ("small_stock_2", "small", 1.0, None, None, "small_stock"),  # the cached CONDITIONING again
                 ("small_stock_fresh", "small", 1.0, None, None, "small_stock", 1),  # new CONDITIONING objects
                 ("small_stock_fresh_vs_2", "small", 1.0, None, None, None),
                 ("small_sliced_fresh", "small", 1.0, sliced, None, "small_stock_fresh", 2)]
    elif name == "ck_flag":  # --use-ck-attention: ComfyUI's global attention is Kitchen's INT8
        rows += [("small_stock", "small", 1.0, None, None, None),
                 ("small_engine", "small", 1.0, engine, None, "small_stock"),
                 ("small_engine_pt", "small", 1.0, engine, PT, "small_stock")]
    return [tuple(r) + (None,) * (7 - len(r)) for r in rows if r[1] in sizes]


def engine_figures(r):
    """The node's run record of one case: time outside the engine, opens, device peaks."""
    out = {}
    ec = r.get("engine_calls") or []
    if not ec:
        return out
    # outside the engine = the wrapper's call minus the engine's forward; the first call
    # (engine open, the run's AdaLN tables) apart from the steady state
    later = ec[1:] or ec
    outside = [x["seconds"] - x["engine_seconds"] for x in later if x.get("engine_seconds") is not None]
    out["first_call_outside_ms"] = 1e3 * (ec[0]["seconds"] - (ec[0]["engine_seconds"] or 0))
    out["outside_ms_mean"] = 1e3 * sum(outside) / max(len(outside), 1)
    out["outside_pct"] = 100.0 * sum(outside) / max(sum(x["seconds"] for x in later), 1e-12)
    out["opens"] = r.get("opens_total")
    peaks = [x["device_peak"] for x in ec if x.get("device_peak") is not None]
    budget = ec[-1].get("budget")
    out["device_peak_GiB"] = max(peaks) / 2**30 if peaks else None
    out["budget_GiB"] = budget / 2**30 if budget else None
    out["peak_within_budget_every_call"] = bool(budget) and all(p <= budget for p in peaks)
    out["tables_computed"] = [x.get("tables_computed") for x in ec]
    return out


def where_they_differ(a, b):
    n = sum(int((x != y).sum()) for x, y in zip(a, b))
    m = max(float((x - y).abs().max()) for x, y in zip(a, b))
    return "{} of {} values differ, max |diff| {:.3g}".format(n, sum(x.numel() for x in a), m)


def compare(cases, done, lat):
    """One row per case run: its step time against its size's stock, torch.equal / relative L2
    / where it differs against its reference, the node's run figures and attention line."""
    rows = []
    for tag, size, cfg, node, attention, ref, _ in cases:
        if tag.endswith("_vs_again"):
            tag, ref = size + "_sliced", size + "_stock_again"
        if tag.endswith("_vs_2"):
            tag, ref = size + "_stock_fresh", size + "_stock_2"
        r, st = done.get(tag), done.get(size + "_stock")
        if r is None:
            continue
        step = med(r["step_seconds"][1:] or r["step_seconds"])
        row = {"case": tag, "step_s": step, "torch_peak_GiB": (r["torch_peak_bytes"] or 0) / 2**30}
        if st is not None and tag != size + "_stock":
            row["vs_stock_time"] = step / med(st["step_seconds"][1:] or st["step_seconds"])
        if ref is not None and tag in lat and ref in lat:
            row["ref"] = ref
            row["torch_equal_ref"] = equal(lat[tag], lat[ref])
            row["rel_l2_vs_ref"] = rel_l2(lat[tag], lat[ref])
            if not row["torch_equal_ref"]:
                row["differ"] = where_they_differ(lat[tag], lat[ref])
                a, b = r.get("call_outputs") or [], (done.get(ref) or {}).get("call_outputs") or []
                first = [i for i, (x, y) in enumerate(zip(a, b)) if x is not None and y is not None and not equal(x, y)]
                if first:
                    row["first_differing_call"] = "{} of {} ({})".format(first[0] + 1, len(a), where_they_differ(
                        a[first[0]], b[first[0]]))
                    ia = (r.get("call_inputs") or [None] * (first[0] + 1))[first[0]]
                    ib = ((done.get(ref) or {}).get("call_inputs") or [None] * (first[0] + 1))[first[0]]
                    if ia and ib:  # that call's inputs: the latent x and the refined text context
                        row["that_calls_inputs_equal"] = {k: equal(ia[k], ib[k]) for k in ("x", "context")}
            if ref in done and ref != size + "_stock":
                rr = done[ref]
                row["vs_ref_time"] = step / med(rr["step_seconds"][1:] or rr["step_seconds"])
        row.update(engine_figures(r))
        row["attention_status"] = [x for x in r.get("status", []) if x.startswith("attention")]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--unet", required=True, help="file name under models/diffusion_models")
    ap.add_argument("--text-dim", type=int, required=True)
    ap.add_argument("--plan", default="legacy", choices=("legacy", "dynamic", "ck_flag", "repeat"))
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--json", required=True)
    ap.add_argument("--budget-seconds", type=float, default=400.0, help="skip cases once this much time is spent")
    ap.add_argument("comfy_args", nargs="*")
    a = ap.parse_args()
    t_start = time.perf_counter()
    install_stubs()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with open(os.path.join(a.comfy, "custom_nodes", "ls_bench_nodes.py"), "w") as f:
        f.write(BENCH_NODES)
    execution = comfy_init(a.comfy, a.comfy_args, dynamic=a.plan == "dynamic")
    import torch
    executor = execution.PromptExecutor(_Server(), cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
    store = sys.modules["ls_bench_store"]
    results = {"plan": a.plan, "comfy_args": a.comfy_args, "cases": {}, "skipped": [], "errors": {},
               "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    cases = plan(a.plan, a.sizes.split(","))
    for tag, size, cfg, node, attention, _, nonce in cases:
        if tag.endswith("_vs_again") or tag.endswith("_vs_2"):
            continue
        if time.perf_counter() - t_start > a.budget_seconds:
            results["skipped"].append(tag)
            continue
        case = dict(SIZES[size], tag=tag, cfg=cfg, node=node, attention=attention, nonce=nonce)
        print("\n== {} (S from {}x{}x{}, L {}, cfg {}, {} steps){}{}".format(
            tag, case["w"], case["h"], case["frames"], case["L"], cfg, case["steps"],
            " node " + json.dumps(node) if node else " stock",
            "; Model Attention Backend: " + attention if attention else ""), flush=True)
        try:
            r = run_case(execution, executor, case, a.unet, a.text_dim)
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            results["errors"][tag] = "{}: {}".format(type(e).__name__, e)
            print("  FAILED: {}: {}".format(type(e).__name__, e), flush=True)
            continue
        results["cases"][tag] = r
        print("  steps: " + ", ".join("{:.3f}".format(x) for x in r["step_seconds"]) + " s; wall {:.1f} s".format(
            r["wall_seconds"]), flush=True)
        for line in r.get("status", []):
            print("  " + line, flush=True)
        torch.cuda.empty_cache()

    rows = compare(cases, results["cases"], store.latents)
    results["rows"] = rows
    for r in results["cases"].values():
        r.pop("call_outputs", None)
        r.pop("call_inputs", None)
    results["seconds"] = time.perf_counter() - t_start
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print("\n== summary, plan {} (median step time over steps 2..n; ratios within this process)".format(a.plan))
    for row in rows:
        print(json.dumps(row, default=lambda x: round(x, 4) if isinstance(x, float) else str(x)))
    if results["errors"]:
        print("errors: " + json.dumps(results["errors"]))
    if results["skipped"]:
        print("skipped (time): " + ", ".join(results["skipped"]))


if __name__ == "__main__":
    main()
