"""Sizes in bytes, parsed exactly as the C++ teraio::parse_size (src/core/units.cpp) does.

Standard library only and free of the rest of the package, so that scripts which must run without
the extension (bench/llm_bench.py, bench/ddp_bench.py) load this file by its path and read "24G"
as the same number of bytes as `teraio.parse_size` and every `teraio` command: K, M, G, T, KiB,
MiB, GiB and TiB are binary (powers of 1024); KB, MB, GB and TB are decimal; B or no unit is bytes.
Units are case-insensitive; a fraction is allowed when the result is a whole number of bytes
("1.5GiB"). tests/python/test_units.py checks it against the C++ parser.
"""
from __future__ import annotations

_UNITS = {
    "": 1, "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}


class SizeError(ValueError):
    """A text that is not a size; the message names what was being parsed."""


def parse_size(text: str, what: str = "size") -> int:
    """'24GiB', '24G', '1.5GB', '4096' -> bytes (the C++ parse_size's rules and messages)."""
    i = 0
    while i < len(text) and (text[i].isdigit() and text[i].isascii() or text[i] == "."):
        i += 1
    number, suffix = text[:i], text[i:].lstrip(" ")
    if not number:
        raise SizeError(f"{what}: '{text}' is not a size (expected e.g. 40GiB, 512MiB, 1.5GB or a "
                        "byte count)")
    try:
        value = float(number)
    except ValueError:
        raise SizeError(f"{what}: '{text}' is not a size (bad number)") from None
    scale = _UNITS.get(suffix.lower())
    if scale is None:
        raise SizeError(f"{what}: '{text}' has an unknown unit '{suffix}' (use B, KiB, MiB, GiB, TiB, "
                        "KB, MB, GB, TB)")
    size = value * scale
    if not size < 2.0**63:
        raise SizeError(f"{what}: '{text}' is too large")
    if size != int(size):
        raise SizeError(f"{what}: '{text}' is not a whole number of bytes")
    return int(size)
