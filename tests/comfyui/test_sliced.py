"""The node's comfy-sliced path (issue 18) on the CPU: sliced output == stock output by
torch.equal, on tests/reference/comfy_modules.py (a mirror of ComfyUI's MiniMaxH3Model).

Run: python3 -m pytest -q tests/comfyui/test_sliced.py   (Debian's python3-torch 1.13 is enough)
1-row slices are used because every CPU kernel these modules run is row-exact on torch 1.13
(TestCpuKernels checks that; sliced_table.py lists it). The GPU twin is test_sliced_gpu.py.
"""

import os
import random
import sys

import pytest
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "comfyui"))

import comfy_modules as cm  # noqa: E402
from layerstream_h3 import sliced, sliced_table  # noqa: E402

CASES = ("t2va", "keyframes", "mask", "all")


def make_model(seed=1, **kw):
    return cm.MiniMaxH3Model(**kw).randomize(seed).eval()


def run(model, args, kwargs, runner=None):
    """One forward; with a runner, through the DIFFUSION_MODEL wrapper list as ComfyUI does."""
    to = {} if runner is None else {"wrappers": {"diffusion_model": [runner]}}
    to.update(args[3])
    with torch.no_grad():
        return model(*args[:3], to, **kwargs)


# The CPU equality tests slice down to 1 row, which is exact only where every CPU kernel is
# row-exact: measured for torch 1.13 (TestCpuKernels, sliced_table.CPU). On another torch
# (the GPU machine's 2.11 on its CPU) bf16 GEMMs differ for small row counts, so there the
# equality is not asserted (the GPU twin, test_sliced_gpu.py, checks it with the CUDA table).
CPU_ROW_EXACT = torch.__version__.startswith(sliced_table.CPU_TORCH)


def assert_equal(ref, out):
    if not CPU_ROW_EXACT:
        pytest.skip(f"CPU kernels row-exactness measured for torch {sliced_table.CPU_TORCH} only, this is "
                    f"{torch.__version__}")
    for r, o in zip(ref, out):
        assert r.shape == o.shape and r.dtype == o.dtype
        assert torch.equal(r, o), f"max |diff| {(r.float() - o.float()).abs().max().item()}"


def assert_nontrivial(ref):
    for r in ref:
        assert torch.isfinite(r).all()
        assert (r != 0).float().mean() > 0.9  # not a pass on zeros
        assert r.float().std() > 0.1


# ---------------------------------------------------------------------------------------
class TestPlan:
    def test_covers_in_order_and_respects_floor(self):
        rng = random.Random(7)
        for _ in range(2000):
            S, chunk, floor = rng.randint(1, 700), rng.randint(0, 800), rng.randint(1, 400)
            plan = sliced.plan_slices(S, chunk, floor)
            assert plan[0][0] == 0 and plan[-1][1] == S
            assert all(a < b for a, b in plan) and all(p[1] == q[0] for p, q in zip(plan, plan[1:]))
            if len(plan) > 1:
                assert min(b - a for a, b in plan) >= floor
                assert all(b - a == max(chunk, floor) for a, b in plan[:-1])

    def test_examples(self):
        assert sliced.plan_slices(1000, 300) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
        assert sliced.plan_slices(1000, 300, 193) == [(0, 300), (300, 600), (600, 1000)]  # 100 < 193 merged
        assert sliced.plan_slices(1000, 256, 321) == [(0, 321), (321, 642), (642, 1000)]  # raised to the floor
        assert sliced.plan_slices(1000, 0) == [(0, 1000)]
        assert sliced.plan_slices(1000, 1000) == [(0, 1000)]
        assert sliced.describe_plan([(0, 300), (300, 600), (600, 1000)]) == "2 x 300 + 1 x 400 rows"

    def test_local_segments_cuts_per_token_rows(self):
        rows = torch.arange(10, 20)
        segs = [(0, 3, 4), (3, 13, rows), (13, 15, 7)]
        loc = sliced.local_segments(segs, 2, 14)
        assert [(a, b) for a, b, _ in loc] == [(0, 1), (1, 11), (11, 12)]
        assert loc[0][2] == 4 and loc[2][2] == 7
        assert torch.equal(loc[1][2], rows)
        loc = sliced.local_segments(segs, 5, 8)
        assert len(loc) == 1 and torch.equal(loc[0][2], rows[2:5])

    def test_memory_estimates_match_design_numbers(self):
        # DESIGN.md §2 at S = 111k: stock about 12 GiB per block, K/V-resident floor about 4.1 GiB.
        S, D, I, Fh = 111_000, 5376, 7168, 14336
        assert 11.5 < sliced.stock_block_bytes(S, D, I, Fh) / sliced.GIB < 12.8
        floor = sliced.sliced_block_bytes(S, D, I, Fh, 1, 1) / sliced.GIB
        assert 4.0 < floor < 4.3
        assert sliced.sliced_block_bytes(S, D, I, Fh, 8192, 8192) / sliced.GIB < 4.8


# ---------------------------------------------------------------------------------------
class TestSlicedEqualsStock:
    @pytest.mark.parametrize("case", CASES)
    def test_random_plans(self, case):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 11, case=case)
        ref = run(model, args, kwargs)
        assert_nontrivial(ref)
        rng = random.Random(hash(case) & 0xFFFF)
        S = None
        for trial in range(8):
            mlp = rng.choice([1, 2, 3, 7, 16, 29, 64, 10_000])
            att = rng.choice([0, 1, 2, 5, 13, 31, 10_000])
            head = rng.choice(["auto", "stock", "sliced"])
            runner = sliced.SlicedRunner(mlp_chunk_tokens=mlp, attn_chunk_tokens=att, head=head,
                                         keep_q=rng.random() < 0.3)
            cm.ATTENTION_CALLS.clear()
            out = run(model, args, kwargs, runner)
            assert_equal(ref, out)
            lines = runner.status()
            assert lines[0].startswith("path: comfy-sliced"), lines
            S = runner._last["S"]
            if 0 < att < S:  # attention really ran on query slices of the planned size
                assert max(cm.ATTENTION_CALLS) == att and len(cm.ATTENTION_CALLS) > len(model.blocks)
            if att == 0:
                assert cm.ATTENTION_CALLS == [S] * len(model.blocks)

    def test_one_row_slices_everywhere(self):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 12, case="all")
        ref = run(model, args, kwargs)
        runner = sliced.SlicedRunner(mlp_chunk_tokens=1, attn_chunk_tokens=1, head="sliced")
        cm.ATTENTION_CALLS.clear()
        assert_equal(ref, run(model, args, kwargs, runner))
        S = runner._last["S"]
        assert cm.ATTENTION_CALLS == [1] * (S * len(model.blocks))
        assert f"mlp {S} x 1 rows" in runner.status()[1]

    def test_pdd_head_bank(self):
        model = make_model(seed=3, pdd=4)
        args, kwargs = cm.make_inputs(model, 13, case="mask")
        args[3]["sample_sigmas"] = torch.tensor([1.0, 0.9, 0.73, 0.5, 0.2, 0.0])
        ref = run(model, args, kwargs)
        assert_nontrivial(ref)
        for head in ("sliced", "auto"):
            assert_equal(ref, run(model, args, kwargs, sliced.SlicedRunner(3, 4, head=head)))

    def test_without_rope_table(self):
        model = make_model(seed=4)
        args, kwargs = cm.make_inputs(model, 14, case="keyframes")
        kwargs["minimax_payload"]["no_rope"] = True
        ref = run(model, args, kwargs)
        assert_equal(ref, run(model, args, kwargs, sliced.SlicedRunner(5, 3, head="sliced")))

    def test_int8_linears_exact_by_construction(self, monkeypatch):
        model = make_model(seed=5)
        for blk in model.blocks:
            for parent, name in ((blk.attn, "qkv_proj"), (blk.attn, "out_proj"), (blk.mlp, "fc1"), (blk.mlp, "fc2")):
                setattr(parent, name, cm.Int8Linear(getattr(parent, name)))
        args, kwargs = cm.make_inputs(model, 15, case="all")
        ref = run(model, args, kwargs)
        assert_nontrivial(ref)
        runner = sliced.SlicedRunner(mlp_chunk_tokens=2, attn_chunk_tokens=0)  # MLP half only
        assert_equal(ref, run(model, args, kwargs, runner))
        st = "\n".join(runner.status())
        # On the CPU the norms' row-exactness is a measurement (sliced_table.CPU "rowwise")
        assert "exactness: exact by measurement (table; int8 GEMMs by construction)" in st, st
        # with row-local kernels by construction (the CUDA table's "rowwise"), the statement is int8's
        table = dict(sliced_table.CPU, rowwise=sliced_table.CUDA["rowwise"])
        monkeypatch.setattr(sliced_table, "table_for", lambda *a: (table, ""))
        assert_equal(ref, run(model, args, kwargs, runner))
        assert "exactness: exact by construction (int8)" in "\n".join(runner.status())
        monkeypatch.undo()
        runner = sliced.SlicedRunner(mlp_chunk_tokens=2, attn_chunk_tokens=3)
        assert_equal(ref, run(model, args, kwargs, runner))
        assert "exact by measurement" in "\n".join(runner.status())  # CPU attention is a float kernel


# ---------------------------------------------------------------------------------------
class TestSensitivity:
    """The equality tests would see a broken slicing: each mutation below makes them fail."""

    def test_wrong_per_token_rows_are_seen(self, monkeypatch):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 16, case="mask")
        ref = run(model, args, kwargs)

        def keep_first_rows(segments, a, b):  # forgets to cut a per-token row tensor at a
            out = []
            for s0, s1, row in segments:
                lo, hi = max(s0, a), min(s1, b)
                if lo < hi:
                    out.append((lo - a, hi - a, row[:hi - lo] if torch.is_tensor(row) and row.dim() else row))
            return out
        monkeypatch.setattr(sliced, "local_segments", keep_first_rows)
        out = run(model, args, kwargs, sliced.SlicedRunner(4, 4))
        assert not torch.equal(ref[0], out[0])

    def test_one_pass_attention_is_seen(self, monkeypatch):
        """K/V computed from a residual that earlier query slices already updated (no pass
        split) differs from stock: the two-pass order is what the equality relies on."""
        model = make_model()
        args, kwargs = cm.make_inputs(model, 17, case="t2va")
        ref = run(model, args, kwargs)
        orig = sliced.SlicedRunner._attention_two_pass

        def one_pass(self, mod, blk, x, segs, rope, to, shift, scale, gate, *rest):
            S = x.shape[0]
            for a, b in sliced.plan_slices(S, 6):
                xs = x[a:b]
                h = mod._mod_scale_shift(blk.norm1(x.clone()), shift, scale, segs)  # reads updated rows
                o = blk.attn(h, rope_freqs=rope, transformer_options=to)[a:b]
                mod._mod_gate(xs, gate, o, sliced.local_segments(segs, a, b))
            return [(0, S)], []
        monkeypatch.setattr(sliced.SlicedRunner, "_attention_two_pass", one_pass)
        out = run(model, args, kwargs, sliced.SlicedRunner(6, 6))
        assert not torch.equal(ref[0], out[0])
        monkeypatch.setattr(sliced.SlicedRunner, "_attention_two_pass", orig)
        assert_equal(ref, run(model, args, kwargs, sliced.SlicedRunner(6, 6)))


# ---------------------------------------------------------------------------------------
class TestInstallAndFallbacks:
    def test_object_patches_are_removed_and_classes_untouched(self):
        model, other = make_model(), make_model(seed=2)
        cls_block, cls_final = type(model.blocks[0]).forward, type(model.final_layer).forward
        args, kwargs = cm.make_inputs(model, 18)
        run(model, args, kwargs, sliced.SlicedRunner(4, 4))
        for m in list(model.blocks) + [model.final_layer]:
            assert "forward" not in vars(m)
        assert type(model.blocks[0]).forward is cls_block and type(model.final_layer).forward is cls_final
        ref_other = run(other, args, kwargs)
        assert_equal(ref_other, run(other, args, kwargs))

    def test_patches_removed_after_an_error(self):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 19)

        def boom(*a, **k):
            raise RuntimeError("boom")
        model.blocks[1].adaln_proj.forward = boom
        with pytest.raises(RuntimeError, match="boom"):
            run(model, args, kwargs, sliced.SlicedRunner(4, 4))
        del model.blocks[1].adaln_proj.forward
        assert all("forward" not in vars(m) for m in list(model.blocks) + [model.final_layer])

    def test_block_replace_patch_and_own_attention(self):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 20, case="keyframes")
        seen = []

        def patch(args_, extra):
            seen.append(True)
            # a sparse-attention style patch: its own attention callable (here: the stock one)
            own = (lambda h, **kw: model.blocks[0].attn(h, **kw))
            return extra["original_block"](dict(args_, attention=own))
        args[3]["patches_replace"] = {"dit": {("double_block", 0): patch}}
        ref = run(model, args, kwargs)
        seen.clear()
        runner = sliced.SlicedRunner(3, 3)
        cm.ATTENTION_CALLS.clear()
        assert_equal(ref, run(model, args, kwargs, runner))
        assert seen == [True]
        # block 0 got the patch's own attention module: stock attention there, sliced in block 1
        S = runner._last["S"]
        assert cm.ATTENTION_CALLS[0] == S and max(cm.ATTENTION_CALLS[1:]) == 3

    def test_attention_override_runs_stock_attention(self):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 21)

        def override(func, q, k, v, heads, **kw):
            return func(q, k, v, heads, **kw)
        args[3]["optimized_attention_override"] = override
        ref = run(model, args, kwargs)
        runner = sliced.SlicedRunner(3, 3)
        cm.ATTENTION_CALLS.clear()
        assert_equal(ref, run(model, args, kwargs, runner))
        S = runner._last["S"]
        assert cm.ATTENTION_CALLS == [S] * len(model.blocks)
        assert "attention override" in runner.status()[1]

    def test_unsupported_model_falls_back_to_stock(self):
        model = make_model()
        args, kwargs = cm.make_inputs(model, 22)
        ref = run(model, args, kwargs)
        delattr(model.blocks[0], "norm2")
        ok, why = sliced.supported(model)
        assert not ok and "norm2" in why
        runner = sliced.SlicedRunner(3, 3)
        with pytest.raises(Exception):
            run(model, args, kwargs, runner)  # the stock forward itself needs norm2
        assert runner.status()[0].startswith("path: stock (comfy-sliced not applicable: block 0 has no norm2")
        assert_nontrivial(ref)

    def test_instance_patched_block_is_not_supported(self):
        model = make_model()
        model.blocks[1].forward = type(model.blocks[1]).forward.__get__(model.blocks[1])
        ok, why = sliced.supported(model)
        assert not ok and "already patched" in why
        args, kwargs = cm.make_inputs(model, 23)
        runner = sliced.SlicedRunner(3, 3)
        ref = run(model, args, kwargs)
        assert_equal(ref, run(model, args, kwargs, runner))
        assert runner.status()[0].startswith("path: stock")
        assert "forward" in vars(model.blocks[1])  # the other node's patch is left alone

    def test_bad_knobs(self):
        with pytest.raises(ValueError, match="mlp_chunk_tokens"):
            sliced.SlicedRunner(mlp_chunk_tokens=0)
        with pytest.raises(ValueError, match="attn_chunk_tokens"):
            sliced.SlicedRunner(attn_chunk_tokens=-1)
        with pytest.raises(ValueError, match="head"):
            sliced.SlicedRunner(head="x")


# ---------------------------------------------------------------------------------------
class TestThresholdTable:
    def test_floors_are_in_force(self, monkeypatch):
        """With a table whose floors exceed the knobs, no kernel sees fewer rows than its
        floor, the last slice is merged, and the status says the slices were raised."""
        table = dict(sliced_table.CPU)
        table["attention.cpu.math"] = sliced_table.Threshold(7, "measured", "test floor")
        table["gemm.bf16.fc2"] = sliced_table.Threshold(9, "measured", "test floor")
        monkeypatch.setattr(sliced_table, "table_for", lambda *a: (table, ""))
        model = make_model()
        args, kwargs = cm.make_inputs(model, 24, case="all")
        ref = run(model, args, kwargs)
        runner = sliced.SlicedRunner(mlp_chunk_tokens=2, attn_chunk_tokens=3)
        cm.ATTENTION_CALLS.clear()
        assert_equal(ref, run(model, args, kwargs, runner))
        c = runner._last
        assert min(cm.ATTENTION_CALLS) >= 7 and max(cm.ATTENTION_CALLS) < 14
        assert min(b - a for a, b in c["mlp_plan"]) >= 9
        st = "\n".join(runner.status())
        assert "raised from 3 to 7" in st and "raised from 2 to 9" in st, st
        assert "attention.cpu.math >= 7" in st and "gemm.bf16.fc2 >= 9" in st, st

    def test_unmeasured_backend_is_not_guaranteed(self, monkeypatch):
        model = make_model()
        model.blocks[0].attn.comfy_attention.function = lambda q, k, v, heads, **kw: cm._attention_math(q, k, v, heads)
        args, kwargs = cm.make_inputs(model, 25)
        ref = run(model, args, kwargs)
        runner = sliced.SlicedRunner(3, 3)
        assert_equal(ref, run(model, args, kwargs, runner))  # equal here, but not promised
        st = "\n".join(runner.status())
        assert "exactness: not guaranteed" in st and "attention.other" in st, st

    def test_other_torch_version_is_not_guaranteed(self, monkeypatch):
        monkeypatch.setattr(torch, "__version__", "9.9.0")
        model = make_model()
        args, kwargs = cm.make_inputs(model, 26)
        runner = sliced.SlicedRunner(3, 3)
        run(model, args, kwargs, runner)
        st = "\n".join(runner.status())
        # Not guaranteed: for the version, or (torch >= 2 picks another attention function than
        # the table measured) for an unmeasured kernel first.
        assert "exactness: not guaranteed" in st, st
        if "attention.other" not in st:
            assert "CPU table measured with torch 1.13, this is 9.9.0" in st, st

    def test_cuda_table_entries(self):
        t = sliced_table.CUDA
        assert t["gemm.bf16.qkv"].min_rows == 9 and t["gemm.bf16.fc2"].min_rows == 321
        assert t["attention.sdpa.flash"].min_rows == 193 and t["attention.sdpa.cudnn"].min_rows == 2
        assert t["gemm.int8"].kind == "construction"
        tab, note = sliced_table.table_for("cuda", "2.11.0+cu130", "NVIDIA H200")
        assert tab is t and note == ""
        assert "H100" in sliced_table.table_for("cuda", "2.11.0", "NVIDIA H100")[1]


# ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.__version__.startswith(sliced_table.CPU_TORCH),
                    reason="the CPU table was measured with torch 1.13")
class TestCpuKernels:
    """The measurement behind sliced_table.CPU: every slice equals the same rows of the full
    product, so the CPU tests may use 1-row slices."""

    MS = (1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 64, 65, 129, 256, 321, 513)

    def check(self, fn, x):
        full = fn(x)
        S = x.shape[0]
        for m in self.MS:
            for a in (0, 1, S - m):
                if 0 <= a and a + m <= S:
                    assert torch.equal(fn(x[a:a + m]), full[a:a + m]), (m, a)

    @pytest.mark.parametrize("N,K", [(288, 64), (64, 96), (96, 64), (1024, 512), (512, 2048)])
    def test_linear(self, N, K):
        g = torch.Generator().manual_seed(N * K)
        W = torch.randn((N, K), generator=g).bfloat16()
        self.check(lambda x: F.linear(x, W), torch.randn((700, K), generator=g).bfloat16())
        self.check(lambda x: F.linear(x, W.float(), W[:, 0].float()), torch.randn((700, K), generator=g))

    def test_attention_and_rowwise(self):
        g = torch.Generator().manual_seed(3)
        k = torch.randn((1, 3, 600, 32), generator=g).bfloat16()
        v = torch.randn((1, 3, 600, 32), generator=g).bfloat16()
        self.check(lambda q: cm._attention_math(q.transpose(0, 1).unsqueeze(0), k, v, 3)[0],
                   torch.randn((600, 3, 32), generator=g).bfloat16())
        norm = cm.RMSNorm(5376)
        self.check(norm, torch.randn((600, 5376), generator=g).bfloat16())
        self.check(lambda u: F.silu(u[:, :128]) * u[:, 128:], torch.randn((600, 256), generator=g).bfloat16())

    def test_bf16_mean_is_not_row_exact(self):
        """Why the mirror's norms reduce in fp32: a bf16 mean over the last dim differs for
        some slices on this CPU build (informational: a later torch may fix it)."""
        g = torch.Generator().manual_seed(4)
        x = torch.randn((600, 96), generator=g).bfloat16()
        full = x.pow(2).mean(-1)
        differs = sum(not torch.equal(x[a:a + m].pow(2).mean(-1), full[a:a + m]) for m in self.MS for a in (0, 1))
        print(f"bf16 mean: {differs} of {2 * len(self.MS)} slices differ from the full reduction")


class TestClassify:
    """Which table entry a ComfyUI Linear reads (comfy/ops.py at 0271a469fe29)."""

    def lin(self, layout=None, patched=False, full=False, qualname=None):
        weight = type("W", (), {"_layout_cls": layout})() if layout else torch.zeros(2, 2, dtype=torch.bfloat16)
        cls = type("Linear", (), {"__qualname__": qualname or "MixedPrecisionOps.Linear"})
        m = cls()
        m.weight, m.weight_function, m.bias_function = weight, ([lambda w: w] if patched else []), []
        m._full_precision_mm = full
        return m

    def test_keys(self):
        bf = torch.bfloat16
        assert sliced.classify_linear(self.lin(), "qkv", bf) == "gemm.bf16.qkv"
        assert sliced.classify_linear(self.lin(), "fc2", torch.float16) == "gemm.other(float16)"
        assert sliced.classify_linear(self.lin("TensorWiseINT8Layout"), "fc1", bf) == "gemm.int8"
        # a LoRA patch on an int8 layer, or full-precision matmul, dequantises: not int8, not measured
        assert sliced.classify_linear(self.lin("TensorWiseINT8Layout", patched=True), "fc1", bf).startswith("gemm.other")
        assert sliced.classify_linear(self.lin("TensorWiseINT8Layout", full=True), "fc1", bf).startswith("gemm.other")
        assert sliced.classify_linear(self.lin("TensorCoreFP8Layout"), "qkv", bf).startswith("gemm.other(TensorCoreFP8")
        assert sliced.classify_linear(self.lin(qualname="fp8_ops.Linear"), "qkv", bf) == "gemm.other(fp8 matmul)"
        assert sliced.classify_linear(self.lin(), "head", torch.float32) == "gemm.f32.head"
        assert sliced_table.lookup(sliced_table.CUDA, "gemm.other(fp8 matmul)").kind == "unmeasured"
        assert sliced_table.lookup(sliced_table.CUDA, "attention.other(attention_sage)").kind == "unmeasured"
