"""Faults are loud, precise and recoverable (docs/pytorch.md, "Faults"): damaged, truncated and
unwritable tier files, injected EIO/ENOSPC/EPERM/short transfers, full tiers. Each case checks the
error text, that the process survives, that the Session is usable again once the fault clears (and
bitwise where the fault lost nothing), and that close() leaves nothing on disk."""
import glob
import io
import os
import shutil
import subprocess

import pytest
import torch

import teraio
from conftest import assert_bitwise, step, train


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.GELU(), torch.nn.Linear(128, 10))


def batch(g):
    return (torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))


BUDGET = "200KiB"  # under the MLP's ~350 KiB of parameters, gradients and AdamW states


def make_session(tmp_path, **kw):
    kw.setdefault("min_tensor_bytes", 1024)
    return teraio.Session(budget=BUDGET, tiers=[teraio.FileTier([str(tmp_path)], "64MiB")], **kw)


def stripe_file(tmp_path):
    files = glob.glob(str(tmp_path / "teraio-*" / "stripe.dat"))
    assert len(files) == 1, files
    return files[0]


def tier_dirs(tmp_path):
    return glob.glob(str(tmp_path / "teraio-*"))


class Loop:
    """The conftest training loop, one step at a time, so that faults can come between steps."""

    def __init__(self, session=None):
        torch.manual_seed(0)
        self.model = mlp()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2, foreach=False)
        self.g = torch.Generator().manual_seed(1)
        self.session = session
        self.losses = []
        if session is not None:
            session.watch(self.model, self.opt)

    def next_batch(self):
        return batch(self.g)

    def run(self, b):
        """One step; its loss is kept when the body completed, also when the step then raised."""
        loss = None
        try:
            with self.session.step():
                loss = step(self.model, self.opt, b)
        finally:
            if loss is not None:
                self.losses.append(loss.detach().clone())
        return loss


def assert_names_the_fault(msg, *parts):
    for p in ("teraio:", "tier 'file'", "bytes") + parts:
        assert p in msg, (p, msg)


def damage(path, how):
    if how == "flip":
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            for i in range(0, len(data), 4096):
                data[i] ^= 0xFF
            f.seek(0)
            f.write(data)
    else:
        os.truncate(path, 0)


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_tier_file_raises_and_never_feeds_wrong_numbers(tmp_path, how):
    s = make_session(tmp_path)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    path = stripe_file(tmp_path)
    damage(path, how)
    with pytest.raises(teraio.IoError) as info:
        loop.run(loop.next_batch())
    msg = str(info.value)
    assert_names_the_fault(msg, path, "offset", "contents are lost", "checkpoint")
    assert ("checksum mismatch (written" in msg and "read " in msg) or "unexpected end of file" in msg
    assert len(loop.losses) == 3, "the damaged step produced no loss"
    st = s.stats()
    assert st["lost_tensors"] >= 1 and st["failed_transfers"] >= 1, st
    # Every lost tensor stays unreadable with teraio's message; nothing crashes.
    tensors = list(loop.model.parameters()) + [v for st in loop.opt.state.values() for v in st.values()
                                               if isinstance(v, torch.Tensor) and v.numel() > 256]
    refused = 0
    for t in tensors:
        for access in (lambda: t.detach().clone(), lambda: str(t), lambda: t.detach().numpy().sum(),
                       lambda: torch.save(t, io.BytesIO())):
            try:
                access()
            except (RuntimeError, teraio.Error) as e:
                assert "teraio" in str(e), str(e)
                refused += 1
    assert refused > 0
    with pytest.raises(teraio.IoError):  # the lost tensors are lost in every later step too
        loop.run(loop.next_batch())
    with pytest.raises(teraio.IoError, match="could not be brought back"):
        s.close()
    assert tier_dirs(tmp_path) == []


def test_verify_is_what_catches_damage(tmp_path):
    """verify=False turns the checksums off: the same damage then goes unnoticed (documented)."""
    s = make_session(tmp_path, verify=False)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    damage(stripe_file(tmp_path), "flip")
    loop.run(loop.next_batch())  # no error: wrong bytes reached the model
    assert s.stats()["failed_transfers"] == 0
    ref = train(mlp, batch, 4)
    assert not all(torch.equal(p, q) for p, q in zip(loop.model.parameters(), ref[1].parameters()))
    s.close()


def test_passing_read_fault_is_retried_and_training_stays_bitwise(tmp_path):
    s = make_session(tmp_path, fault_injection=True)
    loop = Loop(s)
    for i in range(6):
        if i == 3:
            s.inject_fault("EIO", direction="read", count=2)  # within the engine's retries
        loop.run(loop.next_batch())
    st = s.stats()
    assert st["retried_reads"] >= 2 and st["failed_transfers"] == 0, st
    assert_bitwise(train(mlp, batch, 6), (loop.losses, loop.model, loop.opt))
    s.close()
    assert tier_dirs(tmp_path) == []


@pytest.mark.parametrize("error,text", [("EIO", "Input/output error"), ("short", "short read")])
def test_lasting_read_fault_raises_then_the_session_recovers(tmp_path, error, text):
    s = make_session(tmp_path, fault_injection=True)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    s.inject_fault(error, direction="read", count=10_000)
    with pytest.raises(teraio.IoError) as info:
        loop.run(loop.next_batch())
    msg = str(info.value)
    assert_names_the_fault(msg, text, "stripe.dat", "offset", "could not be read back",
                           "after 3 attempts", "the next use reads it again")
    assert isinstance(info.value.__cause__, RuntimeError), "the operator's own error is the cause"
    s.clear_faults()
    for _ in range(3):  # the fault cleared: the Session goes on, nothing was lost
        loss = loop.run(loop.next_batch())
        assert torch.isfinite(loss)
    assert s.stats()["lost_tensors"] == 0
    for p in loop.model.parameters():
        p.detach().clone()
    s.close()
    assert tier_dirs(tmp_path) == []


@pytest.mark.parametrize("error,text", [("EIO", "Input/output error"),
                                        ("ENOSPC", "No space left on device"),
                                        ("EPERM", "Operation not permitted"),
                                        ("short", "short write")])
def test_write_faults_lose_nothing_and_training_stays_bitwise(tmp_path, error, text):
    s = make_session(tmp_path, fault_injection=True)
    loop = Loop(s)
    for i in range(6):
        if i == 2:
            s.inject_fault(error, direction="write", count=3)
            with pytest.raises(teraio.IoError) as info:
                loop.run(loop.next_batch())
            msg = str(info.value)
            assert_names_the_fault(msg, text, "stays on the device", "no data was lost",
                                   "results are intact")
        else:
            loop.run(loop.next_batch())
    assert s.stats()["failed_transfers"] == 3
    assert_bitwise(train(mlp, batch, 6), (loop.losses, loop.model, loop.opt))
    s.close()
    assert tier_dirs(tmp_path) == []


def test_immutable_tier_file(tmp_path):
    """A real read-only file (chattr +i, as a remounted or failing disk gives): the step raises,
    the Session is not stuck, and once the file is writable again training goes on bitwise."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    s = make_session(tmp_path)
    loop = Loop(s)
    for _ in range(2):
        loop.run(loop.next_batch())
    path = stripe_file(tmp_path)
    if subprocess.run(["chattr", "+i", path], capture_output=True).returncode != 0:
        s.close()
        pytest.skip("chattr +i is not permitted here")
    try:
        for _ in range(2):
            with pytest.raises(teraio.IoError, match="Operation not permitted"):
                loop.run(loop.next_batch())
    finally:
        subprocess.run(["chattr", "-i", path])
    for _ in range(2):
        loop.run(loop.next_batch())
    assert_bitwise(train(mlp, batch, 6), (loop.losses, loop.model, loop.opt))
    s.close()
    assert tier_dirs(tmp_path) == []


def test_close_after_a_lasting_fault_loses_loudly_and_removes_the_files(tmp_path):
    s = make_session(tmp_path, fault_injection=True)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    assert s.stats()["resident_bytes"] < s.stats()["budget_bytes"] + 1
    s.inject_fault("EIO", direction="read", count=10_000)
    with pytest.raises(teraio.IoError, match="could not be brought back"):
        s.close()
    assert tier_dirs(tmp_path) == []
    lost = 0
    for st in loop.opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.numel() > 256:
                try:
                    v.clone()
                except RuntimeError as e:
                    assert "before the Session closed" in str(e), str(e)
                    lost += 1
    assert lost > 0
    teraio.Session(budget="1MiB", tiers=[teraio.HostTier("1MiB")]).close()  # a new one can start


def test_a_failed_steps_tensors_are_not_reported_lost_at_close(tmp_path):
    """A read that fails for good in a step whose plan recomputes activations (GPT-2 at 3/5 of its
    footprint, a slow link): the step raises; its graph, kept by the exception's traceback, holds
    activations freed to be recomputed from parameters that later steps update. Those must not be
    reported lost (they are dead), nor make close() raise: the model and optimizer are intact."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    footprint = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    s = teraio.Session(budget=f"{footprint * 3 // 5}B", min_tensor_bytes=1024, fault_injection=True,
                       tiers=[teraio.FileTier([str(tmp_path)], "256MiB", read_gbps=0.05, write_gbps=0.05)])
    s.watch(model, opt)
    failed = 0
    for i in range(9):
        if i == 4:
            s.inject_fault("EIO", direction="read", count=10_000)
        if i == 5:
            s.clear_faults()
        ids = torch.randint(0, 128, (4, 32), generator=g)
        try:
            with s.step():
                opt.zero_grad()
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
        except teraio.IoError:
            failed += 1
    assert failed == 1
    assert s.stats()["recomputes"] > 0 and s.stats()["lost_tensors"] == 0, s.stats()
    s.close()
    assert tier_dirs(tmp_path) == []


def test_full_tier_is_an_error_not_a_silent_overrun(tmp_path):
    s = teraio.Session(budget=BUDGET, tiers=[teraio.FileTier([str(tmp_path)], "64KiB")],
                       min_tensor_bytes=1024)
    loop = Loop(s)
    for _ in range(4):
        with pytest.raises(teraio.Error, match="no tier has room left.*give the tiers more capacity"):
            loop.run(loop.next_batch())
    assert s.stats()["budget_violations"] > 0
    s.close()


def test_planned_steps_stay_within_the_budget_to_the_byte(tmp_path):
    s = make_session(tmp_path)
    loop = Loop(s)
    for i in range(6):
        loop.run(loop.next_batch())
        st = s.stats()
        if i >= 2:
            assert st["mode"] == "planned"
            assert st["step_peak_resident_bytes"] <= st["budget_bytes"], st
    s.close()


def test_a_step_cannot_nest_and_misuse_does_not_wedge_the_session(tmp_path):
    s = make_session(tmp_path)
    loop = Loop(s)
    with s.step():
        with pytest.raises(teraio.Error, match="already running"):
            with s.step():
                pass
        step(loop.model, loop.opt, loop.next_batch())
    loop.run(loop.next_batch())  # the next step runs
    s.close()
    with pytest.raises(teraio.Error, match="closed"):
        with s.step():
            pass


def test_argument_edges_are_clear_errors(tmp_path):
    host = teraio.HostTier("1MiB")
    with pytest.raises(teraio.Error, match="2\\*\\*64"):
        teraio.Session(budget=2**64, tiers=[host])
    with pytest.raises(teraio.Error, match="min_tensor_bytes"):
        teraio.Session(budget="1MiB", tiers=[host], min_tensor_bytes=-1)
    with pytest.raises(teraio.Error, match="tiers must be a list"):
        teraio.Session(budget="1MiB", tiers="host")
    with pytest.raises(teraio.Error, match="tiers must be a list"):
        teraio.Session(budget="1MiB", tiers=host)
    for bad in (-1.0, float("nan"), float("inf"), "fast", True):
        with pytest.raises(teraio.Error, match="read_gbps"):
            teraio.HostTier("1MiB", read_gbps=bad)
        with pytest.raises(teraio.Error, match="write_gbps"):
            teraio.FileTier([str(tmp_path)], "1MiB", write_gbps=bad)
    with pytest.raises(teraio.Error, match="verify"):
        teraio.Session(budget="1MiB", tiers=[host], verify="yes")
    s = teraio.Session(budget="1MiB", tiers=[host], min_tensor_bytes="4KiB")
    with pytest.raises(teraio.Error, match="fault_injection"):
        s.inject_fault("EIO")
    s.close()
    s = teraio.Session(budget="1MiB", tiers=[host], fault_injection=True)
    with pytest.raises(teraio.Error, match="errno name"):
        s.inject_fault("EWHATEVER")
    with pytest.raises(teraio.Error, match="tier 3 does not exist"):
        s.inject_fault("EIO", tier=3)
    s.close()


def test_budget_errors_say_what_would_work(tmp_path):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    s = teraio.Session(budget="120KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                       min_tensor_bytes=1024)
    g = torch.Generator().manual_seed(1)
    with pytest.raises(teraio.Error) as info:
        with s.step():
            step(model, opt, batch(g))
    msg = str(info.value)
    assert "the step needs a budget of at least" in msg and "_foreach_" in msg, msg
    assert "foreach=False" in msg, msg
    s.close()


def test_torch_save_of_an_offloaded_tensor_points_to_resident(tmp_path):
    s = make_session(tmp_path)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    with pytest.raises(teraio.Error, match="session.resident"):
        torch.save(loop.opt.state_dict(), io.BytesIO())
    with s.resident():
        torch.save(loop.opt.state_dict(), io.BytesIO())
    s.close()
    assert torch.save is teraio._torch_save  # unwrapped once no Session is open


def test_an_interrupt_wins_over_a_fault_of_its_step(tmp_path):
    s = make_session(tmp_path, fault_injection=True)
    loop = Loop(s)
    for _ in range(3):
        loop.run(loop.next_batch())
    s.inject_fault("EIO", direction="read", count=10_000)
    with pytest.raises(KeyboardInterrupt):
        with s.step():
            try:
                loop.model(loop.next_batch()[0])  # a read fails here ...
            except RuntimeError:
                pass
            raise KeyboardInterrupt  # ... and the user presses Ctrl-C
    s.clear_faults()
    loop.run(loop.next_batch())
    s.close()


@pytest.mark.parametrize("direction", ["write", "read"])
def test_a_slow_tier_costs_time_and_nothing_else(tmp_path, direction):
    """A degraded disk (inject_fault("slow")): every transfer of one direction lags from the third
    step on. Training goes on, the Session waits for the late transfers (counted as stalls), nothing
    fails, and the result is bitwise the run without teraio."""
    steps = 6
    ref = train(mlp, batch, steps)
    with make_session(tmp_path, fault_injection=True) as s:
        before = {}

        def after_step(i, model):
            if i == 1:
                before.update(s.stats())
                s.inject_fault("slow", direction=direction, count=10_000, delay_ms=3)

        got = train(mlp, batch, steps, session=s, after_step=after_step)
        st = s.stats()
        assert st["mode"] == "planned" and st["last_error"] == "", st
        assert st["failed_transfers"] == 0 and st["lost_tensors"] == 0, st
        key = "stall_write_us" if direction == "write" else "stall_read_us"
        assert st[key] - before[key] > 3000 * (steps - 2), (before[key], st[key])
        s.fetch_all()
        assert_bitwise(ref, got)


def test_slow_faults_need_a_delay(tmp_path):
    with make_session(tmp_path, fault_injection=True) as s:
        with pytest.raises(teraio.Error, match="delay_ms > 0"):
            s.inject_fault("slow", direction="write")
        with pytest.raises(teraio.Error, match="delay_ms is for error='slow'"):
            s.inject_fault("EIO", delay_ms=3)
