"""teraio.parse_tiers: the tier spec syntax of the teraio commands (docs/formats.md, "Tier specs"),
read by the same C++ parser, as HostTier / FileTier objects a Session takes."""
import os
import shutil
import subprocess

import pytest
import torch

import teraio

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_host_and_file_tiers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    tiers = teraio.parse_tiers(f"host:64GiB,file:{a},{b}:500GiB:6.5:3")
    assert [type(t) for t in tiers] == [teraio.HostTier, teraio.FileTier]
    host, f = tiers
    assert host.capacity_bytes == 64 * 2**30
    assert (host.read_gbps, host.write_gbps) == (0.0, 0.0)  # measured by the Session
    assert f.paths == [str(a), str(b)]
    assert f.capacity_bytes == 500 * 2**30
    assert (f.read_gbps, f.write_gbps) == (6.5, 3.0)
    # The old form with the name host and a kind written as NAME= are the same host tier.
    for text in ("host:1GiB:20:25", "host=host:1GiB:20:25"):
        (t,) = teraio.parse_tiers(text)
        assert isinstance(t, teraio.HostTier)
        assert (t.capacity_bytes, t.read_gbps, t.write_gbps) == (2**30, 20.0, 25.0)
    assert host.duplex_gbps == f.duplex_gbps == 0.0  # not given: measured, or 0.9 of one way
    # A fifth figure: the bandwidth per direction while reads and writes move at once.
    host, f = teraio.parse_tiers(f"host:64GiB:55.2:55.1:49.6,file:{a}:1GiB:6:5:4")
    assert (host.read_gbps, host.write_gbps, host.duplex_gbps) == (55.2, 55.1, 49.6)
    assert (f.read_gbps, f.write_gbps, f.duplex_gbps) == (6.0, 5.0, 4.0)


@pytest.mark.parametrize("text,message", [
    ("", "parse_tiers: an empty tier spec; expected host:CAPACITY"),
    ("host:1GiB,", "parse_tiers: an empty tier spec"),
    ("host:1GiB:5", 'parse_tiers "host:1GiB:5": a host tier is [NAME=]host:CAPACITY'),
    ("ssd:1TiB:5:5", 'parse_tiers "ssd:1TiB:5:5": a Session\'s tier is host:CAPACITY'),
    ("fast=host:1GiB", 'parse_tiers "fast=host:1GiB": a Session names its tiers host and file; drop "fast="'),
    ("host:1XB", "parse_tiers \"host:1XB\" capacity: '1XB' has an unknown unit"),
])
def test_errors_are_one_line(text, message):
    with pytest.raises(teraio.Error) as e:
        teraio.parse_tiers(text)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_file_tier_directories_are_checked(tmp_path):
    with pytest.raises(teraio.Error, match="is not a directory"):
        teraio.parse_tiers(f"file:{tmp_path / 'missing'}:1GiB")
    with pytest.raises(teraio.Error, match="expected a string"):
        teraio.parse_tiers(["host:1GiB"])


def test_a_session_runs_on_parsed_tiers(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    with teraio.Session(budget="512KiB", tiers=teraio.parse_tiers(f"host:4MiB,file:{tmp_path}:64MiB"),
                        min_tensor_bytes=1024) as s:
        for _ in range(3):
            with s.step():
                y = (x @ x).sum()
        st = s.stats()
    assert [t["name"] for t in st["tiers"]] == ["host", "file"]
    assert torch.equal(y, (x @ x).sum())


def teraio_tool():
    tool = shutil.which("teraio") or os.path.join(ROOT, "build", "bin", "teraio")
    if not os.path.exists(tool):
        pytest.skip("the teraio command is not built (cmake --build build)")
    return tool


@pytest.mark.parametrize("text", ["host:1GiB:5", "file:/x,,/y:1GiB", "=host:1GiB", "host:0", "ssd:1TiB:0:1"])
def test_errors_match_the_command_line(text, tmp_path):
    """parse_tiers and `teraio plan --tier` reject a spec with the same message, but for the option
    named."""
    r = subprocess.run([teraio_tool(), "plan", os.path.join(ROOT, "tests", "data", "none.json"),
                        "--budget", "1GiB", "--tier", text, "-o", str(tmp_path / "p.json")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    with pytest.raises(teraio.Error) as e:
        teraio.parse_tiers(text)
    assert r.stderr.strip() == "teraio: error: " + str(e.value).replace("parse_tiers", "--tier", 1), r.stderr
