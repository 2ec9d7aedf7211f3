"""Writeback moves in the Session (docs/pytorch.md, "Writebacks"): on unless TERAIO_WRITEBACKS=0;
with them on, training stays bitwise identical to training without teraio, and a plan that has
writebacks runs them (stats() counts them). CPU."""
import json

import pytest
import torch

import teraio
from conftest import assert_bitwise, train
from test_bitwise import SmallCNN, cnn_batch, mlp, mlp_batch


def plan_ops(path):
    with open(path) as f:
        return [m["op"] for m in json.load(f)["moves"]]


@pytest.mark.parametrize("env", [None, "1", "0"])
def test_writebacks_by_default_and_off_with_zero(tmp_path, monkeypatch, env):
    """On by default (unset, as with TERAIO_WRITEBACKS=1): the setups train bitwise and at least one
    plan keeps writebacks, which the Session runs; TERAIO_WRITEBACKS=0 plans and runs none."""
    if env is None:
        monkeypatch.delenv("TERAIO_WRITEBACKS", raising=False)
    else:
        monkeypatch.setenv("TERAIO_WRITEBACKS", env)
    planned = {}
    for setup in SETUPS:
        st, planned[setup] = train_with_writebacks(tmp_path, setup, 7)
        if env == "0":
            assert planned[setup] == 0 and st["writebacks"] == 0 and st["writeback_bytes"] == 0, st
    if env != "0":
        assert any(planned.values()), "no setup's plan kept a writeback: pick another setup"


def test_no_writebacks_without_clean_offloads(tmp_path, monkeypatch):
    """A writeback only makes its offload clean: clean_offloads=False writes every offload, so its
    plans have none even with TERAIO_WRITEBACKS=1 (the setup below that plans them otherwise)."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")
    make, batch, budget, tiers = SETUPS["mlp-file"]
    ref = train(make, batch, 6)
    plan = tmp_path / "plan.json"
    with teraio.Session(budget=budget, tiers=tiers(tmp_path), min_tensor_bytes=1024,
                        plan_path=str(plan), clean_offloads=False) as s:
        got = train(make, batch, 6, session=s)
        st = s.stats()
        with s.resident():
            assert_bitwise(ref, got)
    assert st["mode"] == "planned", st
    assert "writeback" not in plan_ops(plan)
    assert st["writebacks"] == 0 and st["clean_offloads"] == 0 and st["clean_bytes"] == 0, st


# Setups for the planner's search with writebacks on the CPU: which keep a writeback variant depends
# on the tiers' measured bandwidth (on the dev machine, 2026-12-05: all three did, with 7-11
# writebacks per plan; the CNN at 80 KiB and the MLP at 200 KiB on a host tier alone got none).
SETUPS = {
    "mlp-file": (mlp, mlp_batch, "200KiB", lambda p: [teraio.FileTier([str(p)], "256MiB")]),
    "mlp-host-file": (mlp, mlp_batch, "200KiB",
                      lambda p: [teraio.HostTier("48KiB"), teraio.FileTier([str(p)], "256MiB")]),
    "mlp-host": (mlp, mlp_batch, "300KiB", lambda p: [teraio.HostTier("4MiB")]),
}


def train_with_writebacks(tmp_path, setup, steps, after_step=None, zero_grad_after=False):
    """Trains with TERAIO_WRITEBACKS=1 (set by the caller); asserts bitwise equality with training
    without teraio; returns (stats, writebacks in the plan)."""
    make, batch, budget, tiers = SETUPS[setup]
    ref = train(make, batch, steps, after_step=after_step, zero_grad_after=zero_grad_after)
    d = tmp_path / setup
    d.mkdir()
    plan = d / "plan.json"
    with teraio.Session(budget=budget, tiers=tiers(d), min_tensor_bytes=1024,
                        plan_path=str(plan)) as s:
        got = train(make, batch, steps, session=s, after_step=after_step,
                    zero_grad_after=zero_grad_after)
        st = s.stats()
        assert st["mode"] == "planned", st
        assert st["lost_tensors"] == 0 and st["failed_transfers"] == 0, st
        with s.resident():
            assert_bitwise(ref, got)
    planned = plan_ops(plan).count("writeback")
    if planned:
        assert st["writebacks"] > 0 and st["writeback_bytes"] > 0, st
        assert st["stale_writebacks"] <= st["writebacks"], st
        assert st["clean_offloads"] > 0, st
    else:
        assert st["writebacks"] == 0, st
    return st, planned


def test_writebacks_run_and_keep_training_bitwise(tmp_path, monkeypatch):
    """Each setup trains bitwise as without teraio; at least one plan has writebacks, and the
    Session runs them (stats() counts them; none stale: nothing writes a tensor the plan wrote
    back before its offload)."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")
    ran = {}
    for setup in SETUPS:
        st, planned = train_with_writebacks(tmp_path, setup, 7)
        if planned:
            assert st["stale_writebacks"] == 0, st
            ran[setup] = st["writebacks"]
    assert ran, "no setup's plan kept a writeback: the planner's choice changed, pick another setup"


@pytest.mark.parametrize("how", ["data", "param"])
def test_a_write_after_a_writeback_makes_it_stale(tmp_path, monkeypatch, how):
    """Weights scaled in place between steps (outside the step, through `.data` too) after the plan
    wrote them back: the copies are stale, so their offloads write and the new bytes come back."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")

    def after_step(i, model):
        if i % 2 == 1:
            with torch.no_grad():
                for p in model.parameters():
                    (p.data if how == "data" else p).mul_(0.5)

    for setup in SETUPS:
        train_with_writebacks(tmp_path, setup, 8, after_step=after_step)


def test_failed_writeback_copies_are_faults_and_training_stays_bitwise(tmp_path, monkeypatch):
    """Write faults while the plan's writebacks run: a failed copy is a fault like a failed offload
    write (never silent: counted in failed_transfers, raised from its step saying nothing was lost),
    and costs only its offload's write; nothing is lost, training stays bitwise."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")
    from test_faults import Loop, batch, make_session
    ref = train(mlp, batch, 8)
    s = make_session(tmp_path, fault_injection=True, plan_path=str(tmp_path / "plan.json"))
    try:
        loop = Loop(s)
        raised = []
        for i in range(8):
            if i == 3:
                s.inject_fault("EIO", direction="write", count=20)
            try:
                loop.run(loop.next_batch())
            except teraio.IoError as e:
                assert "no data was lost" in str(e), e
                raised.append(str(e))
        st = s.stats()
        assert st["lost_tensors"] == 0, st
        assert st["failed_transfers"] == 20, st  # every injected fault reported, none silent
        assert raised, "the failed writes raised"
        assert_bitwise(ref, (loop.losses, loop.model, loop.opt))
    finally:
        s.close()


def test_every_write_of_a_step_failing_fails_its_writebacks_loudly(tmp_path, monkeypatch, capfd):
    """Every write of one planned step fails, the writebacks' copies among them (which of a step's
    writes 20 faults hit depends on the plan, which depends on the profiled times): each failed copy
    is reported (TERAIO_LOG's failed-writeback, docs/pytorch.md "Diagnostics"; counted in
    failed_transfers), the steps raise saying nothing was lost, and training stays bitwise."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")
    monkeypatch.setenv("TERAIO_LOG", "1")
    from test_faults import Loop, batch, make_session
    ref = train(mlp, batch, 8)
    s = make_session(tmp_path, fault_injection=True, plan_path=str(tmp_path / "plan.json"))
    try:
        loop = Loop(s)
        raised, tried = [], 0
        for i in range(8):
            if i == 4:  # planned steps (2 profiled), writebacks planned in the step before too
                s.inject_fault("EIO", direction="write", count=1_000_000)
                before = s.stats()["writebacks"]
            try:
                loop.run(loop.next_batch())
            except teraio.IoError as e:
                assert "no data was lost" in str(e), e
                raised.append(str(e))
            if i == 4:
                s.clear_faults()
                tried = s.stats()["writebacks"] - before
        st = s.stats()
        assert st["lost_tensors"] == 0, st
        assert raised and st["failed_transfers"] > 0, st
        log = capfd.readouterr().err
        if "writeback" in plan_ops(tmp_path / "plan.json"):
            assert tried > 0, st  # the faulted step ran writebacks ...
            assert log.count("failed-writeback") >= tried, log[-2000:]  # ... and every one failed loudly
        assert_bitwise(ref, (loop.losses, loop.model, loop.opt))
    finally:
        s.close()


def test_tensors_freed_after_their_writeback_stay_bitwise(tmp_path, monkeypatch):
    """Gradients freed right after optimizer.step() (as the HF Trainer does): tensors the plan wrote
    back may die while their copy runs; the Session holds their storage until it has ended (Note
    [Lent bytes]) and training is bitwise the same."""
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1")
    for setup in SETUPS:
        st, _ = train_with_writebacks(tmp_path, setup, 7, zero_grad_after=True)
        assert st["drift_events"] == 0, st
