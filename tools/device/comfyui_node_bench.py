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

Each case is an API prompt UNETLoader -> [LayerStream: H3 Engine] -> LSBenchTap -> KSampler
(euler, simple, seed fixed) -> LSBenchSave, run by execution.PromptExecutor. Cases without
the LayerStream node are stock ComfyUI. Results: stock against comfy-sliced (torch.equal),
against the engine (relative L2), the engine under a budget / explicit slices against its
auto run (torch.equal), per-step times, time outside the engine (the node's run record:
the wrapper's call minus the engine's forward), engine opens, device peaks against the budget.
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
                             "width": ("INT", {"default": 4096, "min": 1, "max": 1 << 16})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "LayerStream/bench"

    def make(self, seed, tokens, width):
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
            calls.append({"seconds": time.perf_counter() - t0, "torch_peak": torch.cuda.max_memory_allocated(dev)})
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


def comfy_init(comfy_dir, argv):
    sys.path.insert(0, comfy_dir)
    os.chdir(comfy_dir)
    sys.argv = ["main.py"] + argv
    import comfy.options
    comfy.options.enable_args_parsing()
    import execution  # noqa: F401  (imports comfy.model_management, nodes)
    import nodes
    import comfy.model_management as mm
    print("ComfyUI: device {}, vram state {}, dynamic VRAM {}".format(
        mm.get_torch_device_name(mm.get_torch_device()), mm.vram_state,
        bool(getattr(__import__("comfy.memory_management").memory_management, "aimdo_enabled", False))), flush=True)

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
    for n in ("LayerStreamH3Engine", "EmptyMiniMaxH3LatentAV", "LSBenchTap", "KSampler", "UNETLoader"):
        if n not in nodes.NODE_CLASS_MAPPINGS:
            raise SystemExit("node {} is not registered".format(n))
    return execution


def prompt(case, unet, text_dim):
    """An API prompt for one case (dict)."""
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "4": {"class_type": "LSBenchCond", "inputs": {"seed": 11, "tokens": case["L"], "width": text_dim}},
        "5": {"class_type": "LSBenchCond", "inputs": {"seed": 12, "tokens": case["L"], "width": text_dim}},
        "6": {"class_type": "EmptyMiniMaxH3LatentAV",
              "inputs": {"width": case["w"], "height": case["h"], "length": case["frames"]}},
        "3": {"class_type": "LSBenchTap", "inputs": {"model": ["1", 0], "tag": case["tag"]}},
        "7": {"class_type": "KSampler", "inputs": {"model": ["3", 0], "seed": 5, "steps": case["steps"],
                                                    "cfg": case["cfg"], "sampler_name": "euler",
                                                    "scheduler": "simple", "positive": ["4", 0],
                                                    "negative": ["5", 0], "latent_image": ["6", 0], "denoise": 1.0}},
        "8": {"class_type": "LSBenchSave", "inputs": {"samples": ["7", 0], "tag": case["tag"]}},
    }
    if case.get("node"):
        inputs = {"model": ["1", 0], "vram_budget": "auto", "mlp_chunk": 0, "attn_chunk": 0, "kv_tile": 0,
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--unet", required=True, help="file name under models/diffusion_models")
    ap.add_argument("--text-dim", type=int, required=True)
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--steps-small", type=int, default=4)
    ap.add_argument("--steps-large", type=int, default=3)
    ap.add_argument("--json", required=True)
    ap.add_argument("--budget-seconds", type=float, default=400.0, help="skip cases once this much time is spent")
    ap.add_argument("comfy_args", nargs="*")
    a = ap.parse_args()
    t_start = time.perf_counter()
    install_stubs()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with open(os.path.join(a.comfy, "custom_nodes", "ls_bench_nodes.py"), "w") as f:
        f.write(BENCH_NODES)
    execution = comfy_init(a.comfy, a.comfy_args or ["--disable-dynamic-vram"])
    import torch
    executor = execution.PromptExecutor(_Server(), cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
    store = sys.modules["ls_bench_store"]
    sizes = {
        # 448x448, 124 frames, L 64: S = 64 + 2 * 207 + 37 * 196 = 7,730
        "small": dict(w=448, h=448, frames=124, L=64, steps=a.steps_small),
        # 1024x1024, 362 frames, L 500: S = 500 + 2 * 603 + 107 * 1024 = 111,274
        "large": dict(w=1024, h=1024, frames=362, L=500, steps=a.steps_large),
    }
    # Order: what the targets need first (CFG 1 at both sizes: stock, engine, comfy-sliced), then
    # the budget, slices, auto and CFG 3 at the small size; cases past --budget-seconds are skipped.
    cases = []
    chosen = a.sizes.split(",")

    def add(size, cfg, kind, node=None):
        if size in chosen:
            c = "{}_cfg{:g}".format(size, cfg)
            cases.append(dict(sizes[size], tag=c + "_" + kind, cfg=cfg, node=node))

    for size in ("small", "large"):
        add(size, 1.0, "stock")
        add(size, 1.0, "engine", {"path": "engine"})
        add(size, 1.0, "sliced", {"path": "comfy-sliced"})
    add("small", 1.0, "engine_8G", {"path": "engine", "vram_budget": "8G"})
    add("small", 1.0, "engine_slices", {"path": "engine", "mlp_chunk": 2048, "attn_chunk": 1024})
    add("small", 1.0, "auto", {"path": "auto"})
    add("small", 3.0, "stock")
    add("small", 3.0, "engine", {"path": "engine"})
    add("small", 3.0, "sliced", {"path": "comfy-sliced"})
    # stock again, late in the process: run 2 found comfy-sliced equal to stock at CFG 3 and at
    # 111k but not at small CFG 1, whose stock run was the process's first sampling run
    add("small", 1.0, "stock_again")
    results = {"cases": {}, "skipped": [], "errors": {}, "torch": torch.__version__,
               "device": torch.cuda.get_device_name()}
    for case in cases:
        spent = time.perf_counter() - t_start
        if spent > a.budget_seconds:
            results["skipped"].append(case["tag"])
            continue
        print("\n== {} (S from {}x{}x{}, L {}, cfg {}, {} steps){}".format(
            case["tag"], case["w"], case["h"], case["frames"], case["L"], case["cfg"], case["steps"],
            " node " + json.dumps(case["node"]) if case.get("node") else " stock"), flush=True)
        try:
            r = run_case(execution, executor, case, a.unet, a.text_dim)
        except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
            results["errors"][case["tag"]] = "{}: {}".format(type(e).__name__, e)
            print("  FAILED: {}: {}".format(type(e).__name__, e), flush=True)
            continue
        results["cases"][case["tag"]] = r
        print("  steps: " + ", ".join("{:.3f}".format(x) for x in r["step_seconds"]) + " s; wall {:.1f} s".format(
            r["wall_seconds"]), flush=True)
        for line in r.get("status", []):
            print("  " + line, flush=True)
        torch.cuda.empty_cache()

    # ---- comparisons -----------------------------------------------------------------------
    rows = []
    lat = store.latents
    for size in a.sizes.split(","):
        cfgs = (1.0, 3.0) if size == "small" else (1.0,)
        for cfg in cfgs:
            c = "{}_cfg{:g}".format(size, cfg)
            st = results["cases"].get(c + "_stock")
            if st is None:
                continue
            st_step = med(st["step_seconds"][1:] or st["step_seconds"])
            row = {"case": c, "stock_step_s": st_step, "stock_torch_peak_GiB": (st["torch_peak_bytes"] or 0) / 2**30}
            for kind in ("engine", "sliced", "engine_8G", "engine_slices", "auto", "stock_again"):
                r = results["cases"].get(c + "_" + kind)
                if r is None:
                    continue
                step = med(r["step_seconds"][1:] or r["step_seconds"])
                row[kind + "_step_s"] = step
                row[kind + "_vs_stock"] = step / st_step
                if kind == "stock_again":
                    row["stock_again_torch_equal_stock"] = equal(lat[c + "_stock_again"], lat[c + "_stock"])
                    if c + "_sliced" in lat:
                        row["sliced_torch_equal_stock_again"] = equal(lat[c + "_sliced"], lat[c + "_stock_again"])
                    continue
                if kind == "sliced":
                    row["sliced_rel_l2_vs_stock"] = rel_l2(lat[c + "_sliced"], lat[c + "_stock"])
                    row["sliced_torch_equal"] = equal(lat[c + "_sliced"], lat[c + "_stock"])
                    row["sliced_torch_peak_GiB"] = (r["torch_peak_bytes"] or 0) / 2**30
                elif c + "_" + kind in lat:
                    row[kind + "_rel_l2_vs_stock"] = rel_l2(lat[c + "_" + kind], lat[c + "_stock"])
                    if kind != "engine" and c + "_engine" in lat:
                        row[kind + "_equal_engine_auto"] = equal(lat[c + "_" + kind], lat[c + "_engine"])
                ec = r.get("engine_calls") or []
                if ec:
                    # outside the engine = the wrapper's call minus the engine's forward; the first
                    # call (engine open, the run's AdaLN tables) apart from the steady state
                    later = ec[1:] or ec
                    outside = [x["seconds"] - x["engine_seconds"] for x in later if x.get("engine_seconds") is not None]
                    row[kind + "_first_call_outside_ms"] = 1e3 * (ec[0]["seconds"] - (ec[0]["engine_seconds"] or 0))
                    row[kind + "_outside_ms_mean"] = 1e3 * sum(outside) / max(len(outside), 1)
                    row[kind + "_outside_pct"] = 100.0 * sum(outside) / max(sum(x["seconds"] for x in later), 1e-12)
                    api = [x["api_outside_forward"] for x in later if x.get("api_outside_forward") is not None]
                    if api:
                        row[kind + "_api_outside_forward_ms"] = 1e3 * sum(api) / len(api)
                    py = [x["seconds"] - x["call_seconds"] for x in later if x.get("call_seconds") is not None]
                    if py:
                        row[kind + "_node_python_ms"] = 1e3 * sum(py) / len(py)
                    row[kind + "_opens"] = r.get("opens_total")
                    peaks = [x["device_peak"] for x in ec if x.get("device_peak") is not None]
                    budget = ec[-1].get("budget")
                    row[kind + "_device_peak_GiB"] = max(peaks) / 2**30 if peaks else None
                    row[kind + "_budget_GiB"] = budget / 2**30 if budget else None
                    row[kind + "_peak_within_budget_every_call"] = bool(budget) and all(p <= budget for p in peaks)
                    row[kind + "_tables_computed"] = [x.get("tables_computed") for x in ec]
            rows.append(row)
    results["rows"] = rows
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print("\n== summary (median step time over steps 2..n; ratios against stock in this run)")
    for row in rows:
        print(json.dumps(row, default=lambda x: round(x, 4) if isinstance(x, float) else str(x)))
    if results["errors"]:
        print("errors: " + json.dumps(results["errors"]))
    if results["skipped"]:
        print("skipped (time): " + ", ".join(results["skipped"]))


if __name__ == "__main__":
    main()
