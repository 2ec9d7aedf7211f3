"""The profiler writes a valid trace v2 (every operator of forward, backward and optimizer, kinds
labelled, stable ids); plans are made and executed; drift (a new input shape) is detected, the
iteration finishes safely, the shape is re-profiled, and plans are cached per shape."""
import json
import os
import shutil
import subprocess

import pytest
import torch

import teraio
from conftest import assert_bitwise, step, train
from test_bitwise import mlp, mlp_batch


def test_trace_v2_written_and_valid(tmp_path):
    trace = tmp_path / "trace.json"
    plan = tmp_path / "plan.json"
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024, trace_path=str(trace), plan_path=str(plan)) as s:
        train(mlp, mlp_batch, 3, session=s)
        ops = s.stats()["operators"]
    t = json.loads(trace.read_text())
    assert t["format"] == "teraio.trace" and t["version"] == 2  # with producers
    assert [x["id"] for x in t["tensors"]] == list(range(len(t["tensors"])))
    assert len(t["kernels"]) == ops
    kinds = {x["kind"] for x in t["tensors"]}
    assert {"parameter", "gradient", "optimizer_state", "activation"} <= kinds, kinds
    params = [x for x in t["tensors"] if x["kind"] == "parameter"]
    # Biases (512 and 40 bytes) are below min_tensor_bytes and not tracked.
    assert all(x["persistent"] for x in params)
    assert {x["name"] for x in params} == {"0.weight", "2.weight", "4.weight"}
    states = [x for x in t["tensors"] if x["kind"] == "optimizer_state"]
    assert any(x["name"].endswith(".exp_avg_sq") for x in states), states
    names = [k["name"] for k in t["kernels"]]
    # forward (top-level operators), backward (autograd's formulas), optimizer (AdamW, foreach=False)
    assert "aten::linear" in names and "aten::threshold_backward" in names and "aten::lerp_" in names
    for k in t["kernels"]:
        assert k["time_us"] >= 0
        assert all(0 <= i < len(t["tensors"]) for i in k["tensors"])
    p = json.loads(plan.read_text())
    # version 2 when the plan recomputes or writes back (on by default), else 1 (docs/formats.md)
    v2 = any(m["op"] in ("recompute", "writeback") for m in p["moves"])
    assert p["format"] == "teraio.plan" and p["version"] == (2 if v2 else 1) and p["moves"]
    tool = shutil.which("teraio") or os.path.join(os.path.dirname(__file__), "../../build/bin/teraio")
    if os.path.exists(tool):  # the C++ reader validates the same file
        r = subprocess.run([tool, "analyze", str(trace)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_watched_tensors_are_named_again_only_when_new_ones_are_tracked(tmp_path):
    """Naming every watched tensor after every step cost a few ms a step: the Session names them
    again only when it tracks a tensor it has no name for. Names still reach a later trace."""
    trace = tmp_path / "trace.json"
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024, trace_path=str(trace)) as s:
        generations = []
        train(mlp, mlp_batch, 6, session=s,
              after_step=lambda i, model: generations.append(s._require().names_generation()))
        assert s.stats()["mode"] == "planned"
    # the same tensors every step once the gradients and states exist: nothing new to name
    assert generations[3] == generations[4] == generations[5], generations
    assert generations[0] < generations[2], generations
    t = json.loads(trace.read_text())
    names = {x["name"] for x in t["tensors"] if x["kind"] in ("parameter", "gradient", "optimizer_state")}
    assert {"0.weight", "0.weight.grad", "0.weight.exp_avg", "4.weight.exp_avg_sq"} <= names, names


def test_drift_is_detected_and_plans_are_cached_per_shape(tmp_path):
    g = torch.Generator().manual_seed(1)
    batches = []
    for i in range(9):
        n = 16 if (i < 4 or i % 2 == 0) else 32  # 4 steps of 16, then alternate 32 / 16
        batches.append((torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)))
    ref = train(mlp, None, 9, batches=batches)
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024, profiling_iterations=2) as s:
        got = train(mlp, None, 9, session=s, batches=batches)
        st = s.stats()
        # the first 32 drifts (and is its shape's profile: a 16's plan does not cover it); later
        # shape changes switch plans at their first operator (test below)
        assert st["drift_events"] >= 1 and st["drift_events"] + st["plan_switches"] >= 3, st
        assert st["plans_cached"] == 2, st
        assert st["mode"] == "planned", st
        s.fetch_all()
        assert_bitwise(ref, got)


def test_a_step_of_a_cached_shape_runs_its_plan_from_its_first_operator(tmp_path):
    """Two shapes alternating (an epoch's shorter last batch, at its extreme): once each has a plan,
    a step starts its own shape's plan at its first operator (plan_switches) instead of drifting and
    running reactively; every such step stays within the budget, and training is bitwise."""
    g = torch.Generator().manual_seed(1)
    batches = []
    for i in range(12):
        n = 16 if (i < 3 or i % 2 == 0) else 32  # the shorter first: each shape gets a plan
        batches.append((torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)))
    ref = train(mlp, None, 12, batches=batches)
    seen = []

    def after_step(i, model):
        st = s.stats()
        seen.append((i, st["drift_events"], st["plan_switches"], st["step_peak_resident_bytes"]))

    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024) as s:
        got = train(mlp, None, 12, session=s, batches=batches, after_step=after_step)
        st = s.stats()
        assert st["mode"] == "planned" and st["plans_cached"] == 2, st
        s.fetch_all()
        assert_bitwise(ref, got)
    # steps 0-1 profiled, 2 planned, 3 the first 32: a drift and its profile; from 4 on, switches
    drifts_at_4 = seen[4][1]
    for i, drifts, switches, peak in seen[4:]:
        assert drifts == drifts_at_4, seen
        assert peak <= st["budget_bytes"], seen
    assert seen[-1][2] - seen[3][2] == 8, seen  # steps 4-11 each began as the other shape


def test_a_shape_larger_than_the_budget_leaves_the_other_shapes_planned(tmp_path):
    """One batch far longer than the rest (variable-length data): its operators alone exceed the
    budget, so no plan can be made for its shape. That step raises teraio.Error saying so once and
    its results stand; the steps of the usual shape keep running their plan (they used to run
    reactively for the rest of the Session), a later long batch raises only its own budget error,
    and training is bitwise that of a run without teraio."""
    g = torch.Generator().manual_seed(1)
    sizes = [32] * 5 + [1024] + [32] * 4 + [1024] + [32] * 2
    batches = [(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    ref = train(mlp, None, len(sizes), batches=batches)
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    errors, modes, losses = {}, [], []
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024) as s:
        s.watch(model, opt)
        for i, batch in enumerate(batches):
            try:
                with s.step():
                    losses.append(step(model, opt, batch).detach().clone())
            except teraio.Error as e:
                errors[i] = str(e)
            modes.append(s.stats()["mode"])
        st = s.stats()
        s.fetch_all()
        assert sorted(errors) == [5, 10], errors
        assert "the step needs a budget of at least" in errors[5], errors[5]
        assert "No plan was made for this step's shape" in errors[5], errors[5]
        assert "the next steps of this shape run reactively" in errors[5], errors[5]
        assert "No plan was made" not in errors[10], errors[10]  # not planned again
        assert "the step needs a budget of at least" in errors[10], errors[10]
        assert modes[2:] == ["planned"] * (len(sizes) - 2), modes
        assert st["plans_cached"] == 1, st
        assert_bitwise(ref, (losses, model, opt))


def test_batches_of_varying_length_run_the_plan_of_a_longer_one(tmp_path):
    """Dynamic padding (each batch as long as its longest sequence): a step of a length without a
    plan runs the plan made for a longer one (steps_on_larger_plans) instead of drifting, running
    reactively and planning again; within the budget, bitwise."""
    from conftest import TinyLlama, length_batches
    batches = length_batches([40, 40, 40, 17, 33, 8, 25, 40, 12, 39, 21, 30])
    ref = train(TinyLlama, None, len(batches), lr=1e-3, batches=batches)
    peaks = []
    with teraio.Session(budget="400KiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=1024) as s:
        got = train(TinyLlama, None, len(batches), session=s, lr=1e-3, batches=batches,
                    after_step=lambda i, m: peaks.append(s.stats()["step_peak_resident_bytes"]))
        st = s.stats()
        s.fetch_all()
    assert_bitwise(ref, got)
    assert st["mode"] == "planned" and st["plans_cached"] == 1, st
    assert st["drift_events"] == 0 and st["steps_on_larger_plans"] == 8, st  # all but the 40s
    assert st["plan_moves"] > 0 and st["budget_violations"] == 0, st
    assert max(peaks[3:]) <= 400 * 1024, peaks


def test_checkpoint_while_offloaded_is_identical(tmp_path):
    ref = train(mlp, mlp_batch, 3)
    (tmp_path / "ref").mkdir()
    (tmp_path / "got").mkdir()
    torch.save({"model": ref[1].state_dict(), "opt": ref[2].state_dict()}, tmp_path / "ref" / "ckpt.pt")
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024) as s:
        got = train(mlp, mlp_batch, 3, session=s)
        assert s.stats()["resident_bytes"] <= 200 * 1024
        with s.resident():
            torch.save({"model": got[1].state_dict(), "opt": got[2].state_dict()}, tmp_path / "got" / "ckpt.pt")
    assert (tmp_path / "ref" / "ckpt.pt").read_bytes() == (tmp_path / "got" / "ckpt.pt").read_bytes()


def test_ops_outside_a_step_fetch_what_they_read(tmp_path):
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024) as s:
        losses, model, opt = train(mlp, mlp_batch, 2, session=s)
        before = s.stats()["urgent_fetches"]
        total = sum(p.sum() for p in model.parameters())  # dispatched ops: fetched on demand
        assert torch.isfinite(total)
        assert s.stats()["urgent_fetches"] > before


def test_empty_plan_still_detects_drift(tmp_path):
    # Everything fits: the plan is empty and operators take the lock-free fast path, which still
    # checks every operator's signature against the profile.
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
               for n in [16, 16, 16, 16, 32, 32]]  # a larger shape: a smaller one runs the plan
    ref = train(mlp, None, 6, batches=batches)
    with teraio.Session(budget="64MiB", tiers=[teraio.HostTier("1MiB")], min_tensor_bytes=1024) as s:
        got = train(mlp, None, 6, session=s, batches=batches)
        st = s.stats()
        assert st["mode"] == "planned" and st["plan_moves"] == 0 and st["bytes_offloaded"] == 0, st
        assert st["drift_events"] == 1 and st["plans_cached"] == 2, st
        assert_bitwise(ref, got)
    # and a smaller shape stays on the lock-free path (Note [Smaller shapes on a larger shape's plan])
    batches = [(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
               for n in [32, 32, 32, 16, 24, 16]]
    ref = train(mlp, None, 6, batches=batches)
    with teraio.Session(budget="64MiB", tiers=[teraio.HostTier("1MiB")], min_tensor_bytes=1024) as s:
        got = train(mlp, None, 6, session=s, batches=batches)
        st = s.stats()
        assert st["mode"] == "planned" and st["plan_moves"] == 0, st
        assert st["drift_events"] == 0 and st["steps_on_larger_plans"] == 3 and st["plans_cached"] == 1, st
        assert_bitwise(ref, got)


def test_other_threads_do_not_shift_operator_indices(tmp_path):
    # A helper thread running operators during the step (like a DataLoader's pin-memory thread)
    # must neither be counted nor cause drift.
    import threading

    def helper():
        for _ in range(20):
            torch.randn(64, 64) @ torch.randn(64, 64)

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(6)]
    ref = train(mlp, None, 6, batches=batches)
    with teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=1024) as s:
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        losses = []
        for b in batches:
            with s.step():
                t = threading.Thread(target=helper)
                t.start()
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(b[0]), b[1])
                loss.backward()
                opt.step()
                t.join()
            losses.append(loss.detach().clone())
        st = s.stats()
        assert st["drift_events"] == 0 and st["mode"] == "planned", st
        s.fetch_all()
        assert_bitwise(ref, (losses, model, opt))


def test_failed_fetch_fails_the_operator_loudly(tmp_path):
    # A tensor whose bytes cannot come back must make its operator fail, never read garbage:
    # an absent storage has no data pointer, and the error is also raised from the step.
    import glob

    from conftest import step

    s = teraio.Session(budget="200KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                       min_tensor_bytes=1024, planning=False)
    try:
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        b = mlp_batch(torch.Generator().manual_seed(1))
        with s.step():
            step(model, opt, b)
        assert s.stats()["bytes_offloaded"] > 0
        files = [f for f in glob.glob(str(tmp_path / "**" / "*"), recursive=True) if os.path.isfile(f)]
        assert files
        for f in files:
            os.truncate(f, 0)
        with pytest.raises((RuntimeError, teraio.Error)):
            with s.step():
                step(model, opt, b)
        assert s.stats()["last_error"]
    finally:
        try:
            s.close()
        except teraio.Error:
            pass
