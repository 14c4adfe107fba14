"""The node over a whole sampling run (issue 25) and ComfyUI's attention choice (issue 26
item 4), against the ComfyUI test double with a recording stand-in for the engine:

- one engine per MODEL and memory setting: vram_budget auto read once, kept for the MODEL's
  life, so the engine is opened once over a multi-step run even when free memory changes
  after the engine took its own;
- the engine is opened only after the checks that decide it can run the call (fp32 MODEL);
- after sampling (ON_CLEANUP) the log gives the run: calls, per-step time, time outside
  the engine, device peak against the budget, AdaLN table computations, every fallback;
- Comfy Kitchen INT8 attention (Model Attention Backend node or the global flag) runs the
  engine with attention "int8"; PyTorch attention or none keeps bf16; another override
  falls back with its reason; an engine that refuses int8 falls back with its message."""

import logging

import pytest
import torch

from conftest import TINY, FakeEngine, FakeError, fake_layerstream

C, T, HL, WL, CA, A, L = 24, 2, 4, 4, 32, 8, 6
KIND = "diffusion_model"
SCHEDULE = [1.0, 0.9, 0.7, 0.4, 0.2, 0.0]


def node_api():
    from layerstream_h3 import node
    return node


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn((1, C, T, HL, WL), generator=g)
    audio = torch.randn((1, CA, 2, A), generator=g)
    ctx = torch.randn((1, L, TINY["hidden"]), generator=g)
    return video, audio, ctx


def wrapper_of(m):
    return m.wrappers[KIND]["layerstream_h3"][0]


def sample(comfy, m, steps=SCHEDULE, dtype=torch.bfloat16, cleanup=True):
    """A sampling run as ComfyUI's sampler makes it: pre_run, one call per sigma of the
    schedule but the last, cleanup."""
    video, audio, ctx = inputs()
    m.pre_run()
    outs = []
    for sigma in steps[:-1]:
        outs.append(comfy.run_step(m, video, audio, sigma, ctx, comfy.make_payload(), sample_sigmas=steps,
                                   dtype=dtype, pre_run=False))
    if cleanup:
        m.cleanup()
    return outs


class ReportingEngine(FakeEngine):
    """A FakeEngine whose report says what the real one says: wall seconds, device peak, and
    the AdaLN tables computed at the first call of a schedule only."""

    def __init__(self, **kw):
        FakeEngine.__init__(self, **kw)
        self.schedule = None

    def denoise(self, clip, *a, **kw):
        sig = getattr(clip, "kw", {}).get("sample_sigmas")
        sig = () if sig is None else tuple(float(v) for v in sig)
        self.computed = sig != self.schedule
        self.schedule = sig
        return FakeEngine.denoise(self, clip, *a, **kw)

    def report(self):
        r = FakeEngine.report(self)
        r["device_peak_bytes"] = 5 << 30
        r["adaln"] = {"tables_computed": self.computed, "sigmas": 5}
        return r


# ---- one engine per MODEL: auto budget fixed when first taken ------------------------------
def test_auto_budget_is_read_once_and_the_engine_opened_once(comfy, bf16_file, monkeypatch):
    """The engine's own allocations change free memory: re-reading auto at every call gave
    another figure, another cache key and a second open that re-read the checkpoint."""
    from layerstream_h3 import wrapper
    free = [100 << 30, 80 << 30, 60 << 30]  # free VRAM falls once the engine holds memory
    reads = []

    def auto(self):
        reads.append(1)
        return free[min(len(reads) - 1, len(free) - 1)]

    monkeypatch.setattr(wrapper.EngineWrapper, "_auto_budget", auto)
    opened = []

    def factory(settings, budget, **kw):
        opened.append(budget)
        return FakeEngine(device=settings.device)

    w = wrapper.EngineWrapper(wrapper.Settings(device="cuda:0", vram_budget="auto"), checkpoint=bf16_file,
                              engine_factory=factory, layerstream_module=fake_layerstream())
    engines = [w.engine(wrapper.AttentionChoice()) for _ in range(5)]
    assert len(reads) == 1, "vram_budget auto must be taken once for the MODEL"
    assert opened == [100 << 30] and w.opens == 1
    assert all(e is engines[0] for e in engines)
    # A new sampling run of the same MODEL keeps the figure (ON_PRE_RUN does not re-read it).
    w.on_pre_run(comfy.make_patcher(path=bf16_file))
    w.engine(wrapper.AttentionChoice())
    assert len(reads) == 1 and w.opens == 1


def test_one_open_over_a_multi_step_run_and_a_second_run(comfy, bf16_file):
    ls = fake_layerstream(ReportingEngine)
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    sample(comfy, m)
    sample(comfy, m)
    assert len(ls.engines) == 1, "one engine for the MODEL's life"
    assert len(ls.engines[0].calls) == 2 * (len(SCHEDULE) - 1)
    assert wrapper_of(m).opens == 1


# ---- the engine is opened only for calls it can run -----------------------------------------
@pytest.mark.parametrize("path", ["auto", "engine"])
def test_an_fp32_model_never_opens_the_engine(comfy, bf16_file, caplog, path):
    ls = fake_layerstream()
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", path=path, layerstream_module=ls)
    if path == "auto":
        # comfy-sliced is not available for the double's model: the fallback goes to stock.
        wrapper_of(m).sliced_runner = None
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        outs = sample(comfy, m, dtype=torch.float32)
    assert ls.engines == [], "the dtype check must come before the engine is opened"
    assert len(p.model.diffusion_model.stock_calls) == len(SCHEDULE) - 1
    assert outs[0][0].dtype == torch.float32
    assert "computes this model in float32" in caplog.text
    assert wrapper_of(m).opens == 0


# ---- the run's status after sampling ----------------------------------------------------------
def test_the_run_is_reported_after_sampling(comfy, bf16_file, caplog):
    ls = fake_layerstream(ReportingEngine)
    p = comfy.make_patcher(path=bf16_file)
    m, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    assert "after sampling the run" in text
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        sample(comfy, m)
    n = len(SCHEDULE) - 1
    log = caplog.text
    assert "run: {} call(s) on the engine, 0 elsewhere; engine opened 1 time(s) in this run".format(n) in log
    assert "steps: " in log and "s per call" in log
    assert "outside the engine: mean" in log
    assert "device peak: 5.0 GiB" in log
    assert "AdaLN tables: computed at 1 of {} call(s)".format(n) in log
    assert "attention: bf16" in log
    lines = wrapper_of(m).run_status()
    assert lines[0].startswith("run: {} call(s)".format(n))


def test_fallbacks_are_counted_with_their_reasons_in_the_run(comfy, bf16_file, caplog):
    ls = fake_layerstream(ReportingEngine)
    p = comfy.make_patcher(path=bf16_file)
    m, _ = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    video, audio, ctx = inputs()
    m.pre_run()
    comfy.run_step(m, video, audio, 0.9, ctx, comfy.make_payload(), sample_sigmas=SCHEDULE, pre_run=False)
    comfy.run_step(m, video, audio, 0.7, ctx, comfy.make_payload(), sample_sigmas=SCHEDULE, control=object(),
                   pre_run=False)
    comfy.run_step(m, video, audio, 0.4, ctx, comfy.make_payload(), sample_sigmas=SCHEDULE, control=object(),
                   pre_run=False)
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        m.cleanup()
    assert "run: 1 call(s) on the engine, 2 elsewhere" in caplog.text
    assert "fallback to stock at 2 call(s): a ControlNet is attached" in caplog.text


def test_the_budget_line_names_calls_over_the_budget(comfy):
    from layerstream_h3 import wrapper
    r = wrapper.RunRecord()
    for peak in (7 << 30, 9 << 30, 8 << 30):
        r.engine_calls.append({"sigma": 0.5, "seconds": 1.0, "engine_seconds": 0.9, "device_peak": peak,
                               "budget": 8 << 30, "tables_computed": False})
    text = "\n".join(r.lines())
    assert "OVER vram_budget 8.0 GiB at call(s) 2" in text
    assert "outside the engine: mean 100.0 ms" in text


# ---- ComfyUI's attention choice (issue 26 item 4) ----------------------------------------------
def numerics_of(engine):
    return engine.kw.get("numerics") or {}


def test_kitchen_int8_from_the_attention_backend_node_runs_the_engine_in_int8(comfy, bf16_file, caplog):
    ls = fake_layerstream(ReportingEngine)
    p = comfy.model_attention_backend(comfy.make_patcher(path=bf16_file), "comfy kitchen attention")
    m, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    assert "attention: int8 (Comfy Kitchen INT8 attention chosen with the Model Attention Backend node" in text
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        sample(comfy, m)
    assert len(ls.engines) == 1 and numerics_of(ls.engines[0]).get("attention") == "int8"
    assert len(ls.engines[0].calls) == len(SCHEDULE) - 1  # no call fell back
    assert p.model.diffusion_model.stock_calls == []
    assert "attention: int8" in caplog.text


def test_pytorch_attention_or_none_keeps_bf16(comfy, bf16_file):
    for attention in (None, "pytorch attention"):
        ls = fake_layerstream()
        p = comfy.make_patcher(path=bf16_file)
        if attention:
            p = comfy.model_attention_backend(p, attention)
        m, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
        assert "attention: bf16" in text
        sample(comfy, m)
        assert len(ls.engines) == 1 and "attention" not in numerics_of(ls.engines[0])
        assert len(ls.engines[0].calls) == len(SCHEDULE) - 1
        from layerstream_h3 import wrapper
        wrapper.drop_cached_engine()


def test_the_global_kitchen_flag_runs_the_engine_in_int8(comfy, bf16_file, monkeypatch):
    import sys
    # --use-ck-attention: attention.optimized_attention is Kitchen's, and model.py imported it by name.
    monkeypatch.setattr(sys.modules["comfy.ldm.minimax.model"], "optimized_attention",
                        comfy.attention_comfy_kitchen_int8)
    ls = fake_layerstream()
    m, text = node_api().apply_node(comfy.make_patcher(path=bf16_file), device="cpu", path="engine",
                                    layerstream_module=ls)
    assert "--use-ck-attention" in text
    sample(comfy, m)
    assert numerics_of(ls.engines[0]).get("attention") == "int8"


def test_another_override_falls_back_with_its_reason(comfy, bf16_file, caplog):
    ls = fake_layerstream()
    p = comfy.model_attention_backend(comfy.make_patcher(path=bf16_file), "sage")
    m, text = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    assert "optimized_attention_override: sage" in text
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        sample(comfy, m)
    assert ls.engines == []
    assert len(p.model.diffusion_model.stock_calls) == len(SCHEDULE) - 1
    assert "fallback to stock at {} call(s): an attention override is set (optimized_attention_override: sage)".format(
        len(SCHEDULE) - 1) in caplog.text


def test_an_engine_without_int8_attention_falls_back_with_its_message(comfy, bf16_file, caplog):
    class NoInt8(FakeEngine):
        def __init__(self, **kw):
            if (kw.get("numerics") or {}).get("attention") == "int8":
                raise FakeError("numerics.attention: 'int8' is not one of default, native, cudnn, hopper")
            FakeEngine.__init__(self, **kw)

    ls = fake_layerstream(NoInt8)
    p = comfy.model_attention_backend(comfy.make_patcher(path=bf16_file), "comfy kitchen attention")
    m, _ = node_api().apply_node(p, device="cpu", path="engine", layerstream_module=ls)
    with caplog.at_level(logging.INFO, logger="layerstream_h3"):
        sample(comfy, m)
    assert ls.engines == []
    assert "int8 attention (ComfyUI selected Comfy Kitchen INT8 attention)" in caplog.text
    assert "'int8' is not one of" in caplog.text


def test_the_sliced_path_slices_under_the_backend_nodes_choices_only(comfy):
    """comfy-sliced keeps calling whatever ComfyUI selected, slice by slice: the Model Attention
    Backend's PyTorch and Kitchen INT8 overrides compute each query alone; any other override
    runs stock attention (it may look at every query)."""
    import fake_comfy
    from layerstream_h3 import sliced
    for name, per_query in (("pytorch", True), ("comfy_kitchen_int8", True), ("sage", False)):
        p = fake_comfy.model_attention_backend(fake_comfy.make_patcher(), name)
        to = p.model_options["transformer_options"]
        key, stock = sliced.classify_attention(None, None, to, "cuda")
        assert (stock is None) == per_query, (name, stock)
        if name == "comfy_kitchen_int8":
            assert key == "attention.other(comfy_kitchen_int8)"


def test_comfy_sliced_is_offered_while_another_clone_has_the_blocks_detached(comfy, bf16_file):
    """A legacy-loader engine node (path engine) detaches diffusion_model.blocks with an object
    patch; ComfyUI leaves it applied on the shared module until it loads another clone (and
    restores the blocks from object_patches_backup). A comfy-sliced node executed meanwhile
    must judge the model by its own blocks (get_model_object), not the detached ones (issue 25:
    the real-ComfyUI run refused comfy-sliced after an engine case)."""
    from layerstream_h3 import node
    p = comfy.make_patcher(path=bf16_file, dynamic=False)
    m_engine, _ = node.apply_node(p, device="cpu", path="engine", layerstream_module=fake_layerstream())
    m_engine.patch_model()  # sampled once: the detach is applied on the shared model
    dm = p.model.diffusion_model
    assert len(dm.blocks) == 0
    seen = {}

    class Sliced:
        @staticmethod
        def supported(model, blocks=None):
            seen["blocks"] = blocks
            b = model.blocks if blocks is None else blocks
            return (len(b) > 0, "ok" if len(b) else "the model has no DiT blocks (model.blocks)")

        class SlicedRunner:
            def __init__(self, **kw):
                pass

            def status(self):
                return ["path: comfy-sliced (not run yet)"]

            def __call__(self, executor, *a, **k):
                return executor(*a, **k)

    import layerstream_h3.node as n
    orig = n._import_sliced
    n._import_sliced = lambda: (Sliced, None)
    try:
        m_sliced, text = node.apply_node(p, device="cpu", path="comfy-sliced", fallback="error",
                                         layerstream_module=fake_layerstream())
    finally:
        n._import_sliced = orig
    assert seen["blocks"] is not None and len(seen["blocks"]) == 2
    assert "path: comfy-sliced" in text


@pytest.mark.parametrize("keep_q", [True, False])
def test_the_sliced_runner_keeps_q_by_default(comfy, bf16_file, monkeypatch, keep_q):
    """comfy-sliced at 111k tokens in a real ComfyUI took 1.084x stock with Q recomputed per
    query slice (one more qkv GEMM per slice); the node now keeps Q from the K/V pass unless
    sliced_keep_q is off (S x I bf16 more memory, the same bytes)."""
    from layerstream_h3 import node
    made = {}

    class Sliced:
        @staticmethod
        def supported(model, blocks=None):
            return True, "ok"

        class SlicedRunner:
            def __init__(self, mlp_chunk_tokens=8192, attn_chunk_tokens=8192, keep_q=False):
                made["keep_q"] = keep_q

            def status(self):
                return ["path: comfy-sliced (not run yet)"]

    monkeypatch.setattr(node, "_import_sliced", lambda: (Sliced, None))
    kw = {} if keep_q else {"sliced_keep_q": False}
    node.apply_node(comfy.make_patcher(path=bf16_file), device="cpu", path="comfy-sliced",
                    layerstream_module=fake_layerstream(), **kw)
    assert made["keep_q"] is keep_q
