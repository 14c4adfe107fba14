"""The node's memory knobs as the engine takes them (no torch, no ComfyUI).

vram_budget is a string: "auto" (free device memory at the first denoiser call minus a
reserve, see auto_budget) or a size such as "12G", "12.5GiB", "900M", "17179869184".
Sizes are read by the engine library's one size grammar (layerstream.parse_size, the
C API's ls_parse_size: the CLI's and Python's too): bytes, or a number with a binary
unit K, M, G, T (= KiB, MiB, GiB, TiB; 2^10 .. 2^40 bytes), any case, 1 B .. 1 EiB.
Decimal units ("12GB"), spaces, signs and hex are refused with the library's message.
The memory combination (a vram budget with explicit slices, a vram budget on the CPU)
is the library's one validation too (check_memory -> layerstream.validate_memory).
Where the engine library is absent, a pure-Python copy of the same grammar and messages
answers (tests/python/test_doors.py feeds both the same table).
"""

import re

GIB = 1 << 30
_MAX = 1 << 60  # 1 EiB: the library's range of every budget (src/api/ranges.h)
_SHIFT = {"": 0, "B": 0, "K": 10, "KIB": 10, "M": 20, "MIB": 20, "G": 30, "GIB": 30, "T": 40, "TIB": 40}
_TEXT = re.compile(r"^([0-9]*)(?:\.([0-9]*))?([A-Za-z]*)$")


class BudgetError(ValueError):
    """A vram_budget string the node cannot read (the message says what it accepts)."""


def _engine():
    """The layerstream package when it is importable and has the library's parser, else None."""
    try:
        import layerstream
    except Exception:  # not installed, or its library does not load
        return None
    return layerstream if hasattr(layerstream, "parse_size") and hasattr(layerstream, "validate_memory") else None


def _size_message(what, text):
    return ("{} must be a size in 1 B..1 EiB: bytes, or a number with a 1024-based unit K, M, G, T (the same as "
            "KiB, MiB, GiB, TiB), e.g. 512M, 3G, 3.5GiB".format(what))


def _quoted(text):
    return "an empty value" if text == "" else "'{}'".format(text)


def parse_size_fallback(text, what="vram_budget"):
    """The library's size grammar in Python (src/api/ranges.h parse_size), for machines
    without the engine library: the same results and messages."""
    text = str(text)
    head = _size_message(what, text)
    m = _TEXT.match(text)
    if not m or (m.group(1) == "" and not m.group(2)):
        raise BudgetError("{} (got {})".format(head, _quoted(text)))
    whole, frac, unit = m.group(1), m.group(2) or "", m.group(3).upper()
    if unit in ("KB", "MB", "GB", "TB"):
        raise BudgetError("{}; decimal units (KB, MB, GB, TB) are not accepted: every size in LayerStream is "
                          "1024-based, write {} or {}iB (got {})".format(head, unit[0], unit[0], _quoted(text)))
    if unit not in _SHIFT or (_SHIFT[unit] == 0 and m.group(2) is not None):
        raise BudgetError("{} (got {})".format(head, _quoted(text)))
    shift = _SHIFT[unit]
    frac = frac[:18]
    value = (int(whole or "0") << shift) + ((int(frac or "0") << shift) // (10 ** len(frac)))
    if value < 1 or value > _MAX:
        raise BudgetError("{} (got {})".format(head, _quoted(text)))
    return value


def parse_size(text, what="vram_budget"):
    """'12G' -> 12 * 2^30 bytes (int), by the engine library's grammar. Raises BudgetError
    (a ValueError) with the library's message on anything else."""
    ls = _engine()
    if ls is None:
        return parse_size_fallback(text, what)
    try:
        return ls.parse_size(str(text), what)
    except ValueError as e:  # layerstream.InvalidArgument is a ValueError
        raise BudgetError(str(e))


def parse_budget(text):
    """None for 'auto' (decided at the first call), else bytes."""
    if str(text).strip().lower() in ("auto", ""):
        return None
    return parse_size(text)


def check_memory(vram_budget=None, mlp_chunk=None, attn_chunk=None, device=None):
    """The library's one memory validation (layerstream.validate_memory) of the node's
    inputs: vram_budget bytes (None = "auto" or none), slices (None or 0 = not given) and
    the device. Raises BudgetError with the message every door gives (a vram budget with
    explicit slices, a vram budget on the CPU, ...). Without the engine library: nothing
    to check against, returns None (the engine refuses at load)."""
    ls = _engine()
    if ls is None:
        return None
    kw = {"vram_budget": vram_budget}
    if mlp_chunk:
        kw["mlp_chunk"] = int(mlp_chunk)
    if attn_chunk:
        kw["attn_chunk"] = int(attn_chunk)
    try:
        ls.validate_memory(device=device, **kw)
    except ValueError as e:
        raise BudgetError(str(e))
    return None


def auto_reserve(total_bytes):
    """What 'auto' leaves to ComfyUI on the device: 1 GiB plus 5 % of the device's memory
    (VAE decode, the text encoder, the CUDA context of other libraries). An H200 (141 GiB)
    keeps about 8 GiB, a 24 GiB card about 2.2 GiB."""
    return GIB + int(0.05 * total_bytes)


def auto_budget(free_bytes, total_bytes):
    """The 'auto' budget: free - reserve, or None when nothing would be left."""
    budget = int(free_bytes) - auto_reserve(total_bytes)
    return budget if budget > 0 else None


def format_bytes(n):
    """1536 -> '1.5 KiB' (binary units, one decimal)."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024.0 or unit == "TiB":
            return ("{:.0f} {}" if unit == "B" else "{:.1f} {}").format(n, unit)
        n /= 1024.0
    return "{:.1f} TiB".format(n)
