"""Tiers measure their own bandwidth (docs/pytorch.md, "Tier bandwidth"): a Session whose tiers
have no given bandwidth probes each tier once, at the first operator of the first step, reports
the numbers in stats()["tiers"] and plans with them; given bandwidths are used as given."""
import json
import math

import pytest

import teraio
from conftest import train
from test_bitwise import mlp, mlp_batch


def plan_tiers(path):
    return [(t["name"], t["read_gbps"], t["write_gbps"]) for t in json.loads(path.read_text())["tiers"]]


def test_host_tier_is_measured_at_the_first_step_and_the_plan_uses_it(tmp_path):
    plan = tmp_path / "plan.json"
    with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=1024,
                        plan_path=str(plan)) as s:
        (t,) = s.stats()["tiers"]
        assert t["read_source"] == t["write_source"] == "default" and t["probe_s"] == 0
        train(mlp, mlp_batch, 3, session=s)
        st = s.stats()
    assert st["mode"] == "planned" and st["plan_moves"] > 0
    (t,) = st["tiers"]
    assert t["name"] == "host" and t["engine"] == "memcpy"
    assert t["read_source"] == t["write_source"] == "measured"
    for k in ("read_gbps", "write_gbps"):
        assert math.isfinite(t[k]) and t[k] > 0, t
        assert t[k + "_min"] <= t[k] <= t[k + "_max"], t
    assert 0 < t["probe_s"] < 1.0, t  # the host tier's probe is capped at 0.5 s
    assert t["probe_memory"] == "host"  # CPU tensors: the CPU allocator's memory
    assert any("arena" in n for n in t["notes"]), t["notes"]  # pinned or not, and why
    assert plan_tiers(plan) == [("host", pytest.approx(t["read_gbps"]), pytest.approx(t["write_gbps"]))]
    # Reads and writes at once, per direction: measured too, and in the plan.
    assert t["duplex_source"] == "measured" and math.isfinite(t["duplex_gbps"]) and t["duplex_gbps"] > 0
    assert json.loads(plan.read_text())["tiers"][0]["duplex_gbps"] == pytest.approx(t["duplex_gbps"])


def test_given_bandwidths_are_used_as_given_and_the_rest_is_measured(tmp_path):
    plan = tmp_path / "plan.json"
    tiers = [teraio.HostTier("64MiB", read_gbps=7.0, write_gbps=5.0),
             teraio.FileTier([str(tmp_path)], "64MiB", read_gbps=2.0)]
    with teraio.Session(budget="200KiB", tiers=tiers, min_tensor_bytes=1024,
                        plan_path=str(plan)) as s:
        train(mlp, mlp_batch, 3, session=s)
        st = s.stats()
    host, file = st["tiers"]
    assert (host["read_gbps"], host["write_gbps"]) == (7.0, 5.0)
    assert host["read_source"] == host["write_source"] == "given"
    assert host["probe_s"] == 0  # not measured
    assert file["name"] == "file" and file["engine"] in ("io_uring", "threads")
    assert file["read_gbps"] == 2.0 and file["read_source"] == "given"
    assert file["write_source"] == "measured" and file["write_gbps"] > 0
    assert 0 < file["probe_s"] < 2.0, file  # capped at 1.5 s plus the requests in flight
    assert plan_tiers(plan) == [("host", 7.0, 5.0),
                                ("file", 2.0, pytest.approx(file["write_gbps"]))]
    # Not measured: 0.9 of the slower direction; the file tier's probe measured both ways.
    assert host["duplex_source"] == "default" and host["duplex_gbps"] == pytest.approx(4.5)
    assert file["duplex_source"] == "measured" and file["duplex_gbps"] > 0


def test_given_both_ways_bandwidth_is_used_as_given(tmp_path):
    plan = tmp_path / "plan.json"
    with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("64MiB", 7.0, 5.0, duplex_gbps=3.0)],
                        min_tensor_bytes=1024, plan_path=str(plan)) as s:
        train(mlp, mlp_batch, 3, session=s)
        (t,) = s.stats()["tiers"]
    assert (t["duplex_gbps"], t["duplex_source"]) == (3.0, "given")
    assert json.loads(plan.read_text())["tiers"][0]["duplex_gbps"] == 3.0
    with pytest.raises(teraio.Error, match="duplex_gbps"):
        teraio.HostTier("64MiB", duplex_gbps=-1)


def test_the_host_tier_reports_the_rates_its_copies_ran_at(tmp_path):
    """Note [The link's rate in use]: the host tier times its copies of 1 MiB or more, and stats()
    reports their rates beside the figures planned with; nothing corrects a link its copies agree
    with, and given figures are never corrected."""
    import torch

    def big():
        return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    def big_batch(g):
        return (torch.randn(64, 1024, generator=g), torch.randint(0, 10, (64,), generator=g))

    for tier in (teraio.HostTier("256MiB"), teraio.HostTier("256MiB", read_gbps=0.5, write_gbps=0.5)):
        with teraio.Session(budget="12MiB", tiers=[tier]) as s:
            train(big, big_batch, 8, session=s)
            st = s.stats()
        (t,) = st["tiers"]
        assert st["mode"] == "planned" and st["bytes_prefetched"] > 0, st
        assert t["read_gbps_in_use"] > 0 and t["write_gbps_in_use"] > 0, t
        assert math.isfinite(t["read_gbps_in_use"]) and math.isfinite(t["write_gbps_in_use"])
        assert st["link_replans"] <= 2
        if t["read_source"] == "given":
            # 0.5 GB/s given, memcpy runs at GB/s: the user's figure stays all the same
            assert (t["read_gbps"], t["write_gbps"]) == (0.5, 0.5) and st["link_replans"] == 0, t
