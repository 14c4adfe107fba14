"""The node's memory knobs as the engine takes them (no torch, no ComfyUI).

vram_budget is a string: "auto" (free device memory at the first denoiser call minus a
reserve, see auto_budget) or a size such as "12G", "12.5GiB", "900M", "17179869184".
Sizes are binary: K = 2^10, M = 2^20, G = 2^30, T = 2^40 bytes, with or without "iB"/"B".
"""

import re

GIB = 1 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


class BudgetError(ValueError):
    """A vram_budget string the node cannot read (the message says what it accepts)."""


def parse_size(text):
    """'12G' -> 12 * 2^30 bytes (int). Raises BudgetError on anything else."""
    m = _SIZE.match(str(text))
    if not m:
        raise BudgetError("vram_budget must be 'auto' or a size such as 12G, 12.5GiB, 900M "
                          "(got {!r})".format(text))
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise BudgetError("vram_budget must be at least one byte (got {!r})".format(text))
    return int(value)


def parse_budget(text):
    """None for 'auto' (decided at the first call), else bytes."""
    if str(text).strip().lower() in ("auto", ""):
        return None
    return parse_size(text)


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
