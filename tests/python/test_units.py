"""One size syntax everywhere: the pure-Python parser (teraio.units, which the bench scripts load by
path) reads every text exactly as the C++ one (teraio._C.parse_size, what teraio.parse_size and the
`teraio` commands use) does: the same bytes, or an error with the same message; and both benches
read "24G" as 24 GiB."""
import os
import sys

import pytest

import teraio
from teraio import _C, units

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TEXTS = ["0", "1", "4096", "24G", "24g", "24GiB", "24gib", "24GB", "24gb", "1.5GiB", "1.5GB", "1.5G",
         "512MiB", "512M", "512MB", "3K", "3KiB", "3KB", "2T", "2TiB", "2TB", "7B", "7 B", "7  GiB", "0.5K",
         "1.", ".5K", "1e3", "", "GiB", " 1G", "1G ", "-1G", "1.2.3", ".", "0.3", "0.1K", "1PiB", "1XB",
         "8000000TiB", "9007199254740993", "12GiBs", "１G"]


def outcome(parse, text):
    try:
        return parse(text, "budget")
    except (ValueError, units.SizeError) as e:  # teraio.Error is a ValueError
        return f"error: {e}"


@pytest.mark.parametrize("text", TEXTS)
def test_python_parser_matches_cpp(text):
    assert outcome(units.parse_size, text) == outcome(_C.parse_size, text)


def test_binary_and_decimal_units():
    assert units.parse_size("24G") == 24 * 2**30 == teraio.parse_size("24G")
    assert units.parse_size("24GB") == 24 * 10**9
    assert units.parse_size("1.5GiB") == 3 * 2**29


def test_benches_read_sizes_as_teraio_does():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import llm_bench
        import ddp_bench
    finally:
        sys.path.pop(0)
    assert ddp_bench.parse_size is llm_bench.parse_size
    for text in ("24G", "12GiB", "500MB", "4096", "1.5G"):
        assert llm_bench.parse_size(text) == teraio.parse_size(text), text
    with pytest.raises(Exception, match="unknown unit"):
        llm_bench.parse_size("12XB")
