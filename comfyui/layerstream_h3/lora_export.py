"""The MODEL's weight patches -> LoRA files the engine reads (issue 17, item 5).

A LoRA loader (LoraLoader, LoraLoaderModelOnly, any stack node) leaves its work in
`patcher.patches` (comfy/model_patcher.py @ 08d0e510, `add_patches`): per model state-dict
key ("diffusion_model.blocks.3.attn.qkv_proj.weight") a list of patches in the order they
were added, each (strength_patch, value, strength_model, offset, function). `value` is what
comfy/lora.py `load_lora` made of the file: a weight adapter (LoRAAdapter: weights = (up,
down, alpha, mid, dora_scale, reshape)), ("diff", (tensor,)), ("set", (tensor,)), or a bare
(tensor,) (a diff; model merges use it). ComfyUI applies them at cast time, one key at a
time, in list order (comfy/lora.py `calculate_weight`).

The engine merges LoRA files by the same formula (docs/lora.md), file by file in the order
given, one strength per file. This module writes the patches back out as such files:

  grouping   every key's patches keep their order and their own strength_patch. Files
             ("groups") are made greedily, keys with the most patches first: a key's i-th patch
             goes into the first group after the one that took its (i-1)-th patch whose strength
             equals the patch's; else a new group is appended. Different keys are independent in ComfyUI's merge, so this is
             the same arithmetic. A plain stack (LoRA A at 1.0, then B at 0.6) gives 2 files.
  names      key K = "diffusion_model." + the engine's tensor name; the file names the layer
             K minus ".weight" (a bias keeps its full name), which is one of the aliases the
             engine's key map gives (ComfyUI's own key map for MiniMaxH3).
  tensors    written as stored (F32, BF16 or F16: the engine widens them exactly, as
             ComfyUI's cast_to_device to fp32 does); alpha as an F32 scalar (ComfyUI reads it
             with .item(); it is used only when it is an fp32 value, else the patch is refused).
  skipped    a diff with strength 0 (ComfyUI skips it too: `if strength != 0.0`).
  PDD banks  ComfyUI PR #15908 loads a PDD LoRA's head bank as ("set", (bank,)) on the heads'
             weights and biases, of the bank's shape ([n*96, D], [n*96], [n*32, D], [n*32]);
             they are exported like any set (the bias as "<...>.bias.set_weight") and the
             engine enlarges its heads from them (docs/lora.md, "PDD LoRAs").

Refused, with a reason that names them (the wrapper then falls back): strength_model != 1
(ComfyUI scales the weight before the patch: model merges), offset or function patches,
keys outside the diffusion model, adapters other than plain LoRA (LoHa, LoKr, GLoRA, OFT,
BOFT), DoRA, LoCon mid weights, enlarging adapters and diffs (reshape_weight / pad_weight; no
H3 LoRA uses them), nested (list) patches, "model_as_lora", tensors of other dtypes, and a LoRA pair on
a bias. What the engine refuses beyond that (a key that is no layer of its model, shapes
that do not make the layer) it says when it opens the files; that message is the fallback's
reason.

Files are written to a temporary name and renamed, in a fresh directory per export; the
Export object removes its directory when it is released (no wrapper cache and no cached
engine hold it any more), or at interpreter exit.
"""

import json
import os
import shutil
import struct
import tempfile
import weakref

_SUFFIX_UP, _SUFFIX_DOWN, _SUFFIX_ALPHA = ".lora_up.weight", ".lora_down.weight", ".alpha"
_DTYPES = {"torch.float32": ("F32", 4), "torch.bfloat16": ("BF16", 2), "torch.float16": ("F16", 2)}
_MARGIN = 1 << 30  # free disk space to leave beside an export


class ExportError(Exception):
    """The patches could not be written (disk full, I/O error); str(e) says why."""


def _dtype_name(t):
    return str(getattr(t, "dtype", type(t).__name__))


def _is_tensor(t):
    return hasattr(t, "dtype") and hasattr(t, "shape") and hasattr(t, "detach")


def _f32_exact(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return False
    return struct.unpack("<f", struct.pack("<f", v))[0] == v if v == v and abs(v) != float("inf") else False


class Entry(object):
    """One patch of one key, as the engine's LoRA file will hold it."""

    __slots__ = ("key", "base", "kind", "tensors", "strength")

    def __init__(self, key, base, kind, tensors, strength):
        self.key, self.base, self.kind, self.tensors, self.strength = key, base, kind, tensors, strength

    def nbytes(self):
        n = 0
        for t in self.tensors.values():
            n += int(t.numel()) * _DTYPES[str(t.dtype)][1] if _is_tensor(t) else 4
        return n


class Group(object):
    """One exported file: one strength, at most one patch per key."""

    def __init__(self, strength):
        self.strength = strength
        self.entries = {}  # key -> Entry


class Plan(object):
    """What the MODEL's patches become: groups (files) or the problems that prevent it."""

    def __init__(self):
        self.groups = []
        self.keys = 0
        self.patches = 0
        self.problems = {}  # what -> [keys]

    def refuse(self, what, key):
        self.problems.setdefault(what, []).append(key)

    @property
    def reason(self):
        """None when every patch can go to the engine, else why not (names them)."""
        if not self.problems:
            return None
        parts = []
        for what, keys in sorted(self.problems.items(), key=lambda kv: -len(kv[1])):
            parts.append("{} ({} weight(s), e.g. {})".format(what, len(keys), keys[0]))
        return "LoRA / weight patches the engine cannot apply: " + "; ".join(parts)

    def nbytes(self):
        return sum(e.nbytes() for g in self.groups for e in g.entries.values())

    def describe(self):
        """'2 files from the MODEL's patches (24 weights, 30 patches)'."""
        return "{} file{} from the MODEL's patches ({} weight(s), {} patch(es))".format(
            len(self.groups), "" if len(self.groups) == 1 else "s", self.keys, self.patches)


def _base(key):
    """The layer name the engine's key map reads for a state-dict key."""
    return key[:-len(".weight")] if key.endswith(".weight") else key


def _tensor_problem(t, what):
    if not _is_tensor(t):
        return "{} that is not a tensor".format(what)
    if str(t.dtype) not in _DTYPES:
        return "{} stored as {} (the engine reads F32, BF16, F16)".format(what, _dtype_name(t).replace("torch.", ""))
    return None


def _refused(plan, key, checks):
    """Refuses key with the reason of the first (condition, reason) in checks that holds;
    True when one did."""
    for bad, reason in checks:
        if bad:
            plan.refuse(reason, key)
            return True
    return False


def _entry(key, patch, plan):
    """The Entry of one patch, or None (refused: recorded in plan, or skipped)."""
    if not isinstance(patch, (tuple, list)) or len(patch) < 2:
        plan.refuse("patches of an unknown form", key)
        return None
    strength = patch[0]
    value = patch[1]
    strength_model = patch[2] if len(patch) > 2 else 1.0
    offset = patch[3] if len(patch) > 3 else None
    function = patch[4] if len(patch) > 4 else None
    if _refused(plan, key, ((not key.startswith("diffusion_model."), "patches outside the diffusion model"),
                            (offset is not None, "offset patches (a slice of a fused weight)"),
                            (function is not None, "patches with a function"))):
        return None
    try:
        strength_model = float(strength_model)
        strength = float(strength)
    except (TypeError, ValueError):
        plan.refuse("patches whose strength is not a number", key)
        return None
    if strength_model != 1.0:
        plan.refuse("strength_model != 1 (ComfyUI scales the weight first: a model merge)", key)
        return None
    if strength != strength or abs(strength) == float("inf"):
        plan.refuse("patches of non-finite strength", key)
        return None
    base = _base(key)
    if isinstance(value, list):
        plan.refuse("nested (list) patches", key)
        return None
    name = getattr(value, "name", None)
    weights = getattr(value, "weights", None)
    if name is not None and weights is not None and not isinstance(value, tuple):  # a weight adapter
        if name != "lora":
            plan.refuse("{} adapters".format(name), key)
            return None
        w = tuple(weights) + (None,) * (6 - len(weights))
        up, down, alpha, mid, dora, reshape = w[:6]
        if _refused(plan, key, ((mid is not None, "LoCon mid weights"), (dora is not None, "DoRA (dora_scale)"),
                                (reshape is not None, "enlarging LoRAs (reshape_weight)"),
                                (not key.endswith(".weight"), "a LoRA pair on a bias"))):
            return None
        for t, what in ((up, "LoRA up"), (down, "LoRA down")):
            p = _tensor_problem(t, what)
            if p is None and t.ndim != 2:
                p = "{} that is not a matrix".format(what)
            if p:
                plan.refuse(p, key)
                return None
        tensors = {base + _SUFFIX_UP: up, base + _SUFFIX_DOWN: down}
        if alpha is not None:
            if _is_tensor(alpha):
                alpha = alpha.item()
            if not _f32_exact(alpha):
                plan.refuse("alpha that is no fp32 value", key)
                return None
            tensors[base + _SUFFIX_ALPHA] = float(alpha)
        return Entry(key, base, "lora", tensors, strength)
    if isinstance(value, tuple) and len(value) == 1:
        kind, data = "diff", value
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        kind, data = value[0], value[1]
    else:
        plan.refuse("patches of an unknown form", key)
        return None
    if kind not in ("diff", "set"):
        plan.refuse("'{}' patches".format(kind), key)
        return None
    if not isinstance(data, (tuple, list)) or not data:
        plan.refuse("'{}' patches without a tensor".format(kind), key)
        return None
    if kind == "diff" and len(data) > 1 and isinstance(data[1], dict) and data[1].get("pad_weight"):
        plan.refuse("enlarging diffs (pad_weight)", key)
        return None
    p = _tensor_problem(data[0], kind)
    if p:
        plan.refuse(p, key)
        return None
    if kind == "diff" and strength == 0.0:
        return None  # ComfyUI skips it
    return Entry(key, base, kind, {base + (".diff" if kind == "diff" else ".set_weight"): data[0]}, strength)


def plan_patches(patches):
    """A Plan for `patcher.patches` (dict key -> list of patch tuples)."""
    plan = Plan()
    # Keys with the longest patch lists first: they fix the order of the groups, and the
    # keys with fewer patches then fit into those (a stack of two LoRAs gives two files).
    for key in sorted(patches or {}, key=lambda k: (-len(patches[k] or ()), k)):
        lst = patches[key] or []
        entries = []
        for patch in lst:
            e = _entry(key, patch, plan)
            if e is not None:
                entries.append(e)
        if not entries:
            continue
        plan.keys += 1
        plan.patches += len(entries)
        after = -1  # the group that took this key's previous patch
        for e in entries:
            g = next((i for i in range(after + 1, len(plan.groups)) if plan.groups[i].strength == e.strength), None)
            if g is None:
                plan.groups.append(Group(e.strength))
                g = len(plan.groups) - 1
            plan.groups[g].entries[key] = e
            after = g
    return plan


def cache_key(patcher):
    """What identifies a patch set: ComfyUI renews patches_uuid on every add_patches (a clone
    keeps it); the key and patch counts guard against a dict edited in place."""
    patches = getattr(patcher, "patches", None) or {}
    return (str(getattr(patcher, "patches_uuid", None)), len(patches), sum(len(v or ()) for v in patches.values()))


# ---- writing --------------------------------------------------------------------------------
def _raw(t):
    """(dtype name, shape, bytes) of a tensor (CPU copy) or of an fp32 scalar."""
    if not _is_tensor(t):
        return "F32", [], struct.pack("<f", float(t))
    import torch
    c = t.detach().to("cpu").contiguous()
    name = _DTYPES[str(c.dtype)][0]
    if c.dtype == torch.bfloat16:
        c = c.view(torch.int16)  # numpy has no bf16: the same bytes as int16
    return name, [int(s) for s in t.shape], c.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> tensor or float; written to `path` + '.tmp', then renamed. The data are
    laid out 4-byte elements first, then 2-byte ones (each group by name), so every tensor
    starts at a multiple of its element size (the safetensors library orders them the same
    way; the engine maps tensors in place and refuses misaligned ones)."""
    header, blobs, off = {}, [], 0
    raws = sorted(((name,) + _raw(t) for name, t in tensors.items()),
                  key=lambda r: (-{"F32": 4, "BF16": 2, "F16": 2}[r[1]], r[0]))
    for name, dtype, shape, raw in raws:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _remove_dir(path):
    shutil.rmtree(path, ignore_errors=True)


def temp_root():
    """ComfyUI's temp directory when ComfyUI is importable (it empties it at start-up), else
    the system's."""
    try:
        import folder_paths
        d = folder_paths.get_temp_directory()
        os.makedirs(d, exist_ok=True)
        return d
    except Exception:
        return tempfile.gettempdir()


class Export(object):
    """The files of one plan in one fresh directory; removed when this object goes away (or
    by remove()). `loras` is the engine's list: [(path, strength), ...] in merge order."""

    def __init__(self, plan, root=None):
        root = root or temp_root()
        need = plan.nbytes()
        try:
            free = shutil.disk_usage(root).free
        except OSError:
            free = None
        if free is not None and free < need + _MARGIN:
            raise ExportError("exporting the MODEL's LoRA patches needs {:.1f} MiB in {} and only {:.1f} MiB are "
                              "free".format(need / 2.0 ** 20, root, free / 2.0 ** 20))
        try:
            self.directory = tempfile.mkdtemp(prefix="layerstream_lora_", dir=root)
        except OSError as e:
            raise ExportError("cannot make a directory for the MODEL's LoRA patches in {}: {}".format(root, e))
        self._finalizer = weakref.finalize(self, _remove_dir, self.directory)
        self.loras = []
        self.nbytes = need
        try:
            for i, g in enumerate(plan.groups):
                tensors = {}
                for key in sorted(g.entries):
                    tensors.update(g.entries[key].tensors)
                path = os.path.join(self.directory, "patches_{:02d}.safetensors".format(i))
                write_safetensors(path, tensors, metadata={
                    "layerstream": "exported from a ComfyUI MODEL's weight patches",
                    "strength": repr(float(g.strength)), "weights": len(g.entries)})
                self.loras.append((path, float(g.strength)))
        except (OSError, ValueError, RuntimeError) as e:
            self.remove()
            raise ExportError("cannot write the MODEL's LoRA patches to {}: {}".format(self.directory, e))

    def remove(self):
        self._finalizer()

    @property
    def alive(self):
        return self._finalizer.alive
