"""The Python API: names, argument validation (clear errors before anything is moved), stats keys."""
import os

import pytest
import time
import torch

import teraio


def test_names_exist():
    assert callable(teraio.Session) and callable(teraio.HostTier) and callable(teraio.FileTier)
    assert issubclass(teraio.Error, ValueError)


def test_sizes_parse():
    assert teraio.parse_size("24GiB") == 24 * 2**30
    assert teraio.parse_size("1.5GB") == 1_500_000_000
    assert teraio.parse_size(4096) == 4096
    with pytest.raises(teraio.Error, match="budget"):
        teraio.Session(budget="lots", tiers=[teraio.HostTier("1GiB")])
    with pytest.raises(teraio.Error, match="budget"):
        teraio.Session(budget=0, tiers=[teraio.HostTier("1GiB")])


def test_bad_tiers(tmp_path):
    with pytest.raises(teraio.Error, match="unknown tier"):
        teraio.Session(budget="1GiB", tiers=["nvme"])
    with pytest.raises(teraio.Error, match="at least one tier"):
        teraio.Session(budget="1GiB", tiers=[])
    with pytest.raises(teraio.Error, match="not a directory"):
        teraio.FileTier([str(tmp_path / "missing")], "1GiB")
    with pytest.raises(teraio.Error, match="capacity"):
        teraio.FileTier([str(tmp_path)], "1 parsec")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_path(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    with pytest.raises(teraio.Error, match="not writable"):
        teraio.FileTier([str(d)], "1GiB")


def test_unwritable_path_in_native_layer(tmp_path):
    # The native Session checks writability by writing (works as root too: /proc is not writable).
    with pytest.raises(teraio.Error, match="not writable|not a directory"):
        teraio._C.Session(1 << 20, [{"kind": "file", "paths": ["/proc"], "capacity_bytes": 1 << 20}])


def test_stats_keys_and_one_session_at_a_time(tmp_path):
    s = teraio.Session(budget="1MiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")])
    st = s.stats()
    for k in ["mode", "iteration", "budget_bytes", "peak_resident_bytes", "bytes_offloaded",
              "bytes_prefetched", "stall_us", "plan_moves", "drift_events"]:
        assert k in st
    assert st["mode"] == "profiling" and st["iteration"] == 0 and st["budget_bytes"] == 1 << 20
    with pytest.raises(teraio.Error, match="another"):
        teraio.Session(budget="1MiB", tiers=[teraio.HostTier("1MiB")])
    s.close()
    teraio.Session(budget="1MiB", tiers=[teraio.HostTier("1MiB")]).close()


def test_options_and_stats_are_declared_once(tmp_path):
    """Note [Options and stats fields]: the Python Session takes every SessionOptions field (as
    `budget` for budget_bytes) with the C++ defaults, and stats() returns every SessionStats field and
    every SessionTierStats field per tier, in the one list's order. A field added in C++ but not
    here fails."""
    import inspect
    params = inspect.signature(teraio.Session.__init__).parameters
    names = ["budget_bytes" if n == "budget" else n for n in params if n != "self"]
    assert names == list(teraio.SESSION_OPTIONS)
    for name, default in teraio._C.SESSION_OPTION_DEFAULTS.items():
        p = params["budget" if name == "budget_bytes" else name]
        if p.default is inspect.Parameter.empty:
            continue  # required in Python
        assert (p.default if p.default is not None else "") == default, name
    assert set(teraio.STATS_COUNTERS) <= set(teraio.STATS_FIELDS)
    s = teraio.Session(budget="1MiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")])
    try:
        st = s.stats()
        assert list(st) == list(teraio.STATS_FIELDS)
        assert [list(t) for t in st["tiers"]] == [list(teraio.TIER_STATS_FIELDS)]
    finally:
        s.close()
    with pytest.raises(teraio.Error, match="unknown option 'budget'"):
        teraio._C.Session(budget=1 << 20, tiers=[])


def train_linears(s, steps, after_step=lambda i: None):
    """Eight 512-wide Linear layers (8 MiB of parameters, 24 MiB with AdamW's states) trained
    `steps` steps under Session `s`, watched; after_step(i) runs after step i."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    opt = torch.optim.AdamW(m.parameters(), foreach=False)
    x = torch.randn(64, 512)
    s.watch(m, opt)
    for i in range(steps):
        with s.step():
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        after_step(i)


def test_tier_counters_say_which_tier_moved_and_stalled(tmp_path):
    """stats()["tiers"][i] counts each tier's stalls and bytes; over the tiers they add up to the
    Session's totals, and a tier the plan does not use moves nothing."""
    tiers = [teraio.HostTier("256MiB"), teraio.FileTier([str(tmp_path)], "256MiB")]
    with teraio.Session(budget="6MiB", tiers=tiers) as s:
        train_linears(s, 4)
        st = s.stats()
    host, disk = st["tiers"]
    assert host["bytes_written"] > 0 and host["bytes_read"] > 0
    # Writebacks (on by default) write too: their completed copies count, those still running
    # not yet (none stale or failed here).
    assert st["stale_writebacks"] == 0 and st["failed_transfers"] == 0, st
    written = host["bytes_written"] + disk["bytes_written"]
    assert st["bytes_offloaded"] <= written <= st["bytes_offloaded"] + st["writeback_bytes"], st
    assert host["bytes_read"] + disk["bytes_read"] == st["bytes_prefetched"]
    stalls = sum(t["stall_read_us"] + t["stall_write_us"] for t in st["tiers"])
    assert stalls == pytest.approx(st["stall_us"], rel=1e-9)


def test_predictions_include_the_sessions_own_host_time(tmp_path):
    """Note [The runner's host time]: once planned steps ran, predicted_iteration_us replays the plan
    with the Session's own callback time per operator as measured in them
    (runner_host_us_per_operator); plan_predicted_us keeps the plan-time replay. On the CPU the
    callbacks run in series with the operators: the prediction grows by that time per operator (the
    stalls can only shrink with it)."""
    with teraio.Session(budget="6MiB", tiers=[teraio.HostTier("256MiB")]) as s:
        def after_step(i):
            if i == 1:  # the plan is made; no planned step has run yet
                st = s.stats()
                assert st["mode"] == "planned" and st["runner_host_us_per_operator"] == 0, st
                assert st["predicted_iteration_us"] == st["plan_predicted_us"] > 0, st
        train_linears(s, 7, after_step)
        st = s.stats()
    assert st["plan_moves"] > 0 and st["drift_events"] == 0, st
    runner = st["runner_host_us_per_operator"]
    assert runner > 0, st
    extra = st["predicted_iteration_us"] - st["plan_predicted_us"]
    assert 0 < extra <= st["operators"] * runner * (1 + 1e-9), (extra, st)


def test_measured_step_is_the_loops_step_under_the_plan(tmp_path):
    """stats()["measured_step_us"] is 0 until planned steps have run, then the median of the plan's
    steps from one step's end to the next (on the CPU the host clock's, the plan's first step left
    out): never more than the loop's slowest step under the plan, never less than its fastest."""
    ends = []
    with teraio.Session(budget="6MiB", tiers=[teraio.HostTier("256MiB")]) as s:
        def after_step(i):
            ends.append(time.perf_counter())
            st = s.stats()
            if i <= 2:  # profiled, then the first planned step (which aligns to the plan)
                assert st["measured_step_us"] == 0, (i, st)
        train_linears(s, 9, after_step)
        st = s.stats()
    assert st["mode"] == "planned" and st["drift_events"] == 0 and st["host_replans"] == 0, st
    # The planned steps after the first, each timed by the loop from the step before's end.
    periods_us = [1e6 * (b - a) for a, b in zip(ends[2:], ends[3:])]
    assert 0.9 * min(periods_us) <= st["measured_step_us"] <= 1.1 * max(periods_us), (periods_us, st)


def test_callbacks_say_where_their_time_goes(tmp_path):
    """stats()["controller_us"] is the part of hook_us inside the controller's per-operator calls,
    and stats()["submit_us"] the host time inside the tiers' submit calls: nothing submitted, none
    counted."""
    with teraio.Session(budget="6MiB", tiers=[teraio.HostTier("256MiB")]) as s:
        train_linears(s, 5)
        st = s.stats()
    assert st["plan_moves"] > 0 and st["bytes_offloaded"] > 0, st
    assert 0 < st["controller_us"] <= st["hook_us"], st
    assert st["submit_us"] > 0, st
    with teraio.Session(budget="1GiB", tiers=[teraio.HostTier("256MiB")]) as s:
        train_linears(s, 5)
        st = s.stats()
    assert st["plan_moves"] == 0 and st["bytes_offloaded"] == 0 and st["submit_us"] == 0, st
    assert 0 <= st["controller_us"] <= st["hook_us"], st


def test_budget_smaller_than_one_operator(tmp_path):
    a = torch.randn(256, 256, requires_grad=True)  # 256 KiB; a parameter-like leaf sets the device
    b = torch.randn(256, 256)
    with teraio.Session(budget="64KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")]) as s:
        with pytest.raises(teraio.Error, match="smaller than the tensors of operator"):
            with s.step():
                c = a @ b
        assert torch.equal(c, a @ b)


def test_profile_says_how_operators_were_timed(tmp_path):
    # On CPU the host clock times operators (CUDA: CUPTI, docs/pytorch.md "Operator times"); the
    # stats and the trace say which, and the summed times are what the plan was made for.
    trace = tmp_path / "t.json"
    s = teraio.Session(budget="64MiB", tiers=[teraio.HostTier("64MiB")], trace_path=str(trace))
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with s.step():
            model(torch.randn(64, 256)).sum().backward()
            opt.step()
            opt.zero_grad()
    st = s.stats()
    s.close()
    assert st["kernel_timing"] == "host clock"
    assert st["profiled_kernel_us"] > 0 and st["profiled_event_us"] == 0
    import json
    t = json.loads(trace.read_text())
    assert t["meta"]["kernel_timing"] == "host clock"
    assert abs(sum(k["time_us"] for k in t["kernels"]) - st["profiled_kernel_us"]) < 1e-3 * st["profiled_kernel_us"] + 1
    # Host times go into the trace only where the kernel times are the device's (CUDA): on CPU
    # the host clock's time is the kernel time, and a host lane would count it twice.
    assert not any("host_us" in k for k in t["kernels"])


# --- torch.compile (Note [Compiled graphs] in python/teraio/__init__.py) -----------------------

def _compiled_mlp(backend):
    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.GELU(), torch.nn.Linear(128, 10))
        m.forward = torch.compile(m.forward, backend=backend)
        return m
    return make


def _mlp_batch(g):
    return (torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))


def test_aot_eager_compiled_model_trains_bitwise_under_a_session():
    from conftest import assert_bitwise, train
    torch._dynamo.reset()
    ref = train(_compiled_mlp("aot_eager"), _mlp_batch, 5)
    with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("8MiB")], min_tensor_bytes=1024) as s:
        got = train(_compiled_mlp("aot_eager"), _mlp_batch, 5, session=s)
        st = s.stats()
        assert st["mode"] == "planned" and st["bytes_offloaded"] > 0, st
        with s.resident():
            assert_bitwise(ref, got)


def test_an_inductor_graph_under_a_session_is_a_clear_error_not_a_crash():
    # Inductor's kernels read tensors by raw pointer: under a Session (here with dead tensors kept,
    # where an offloaded one crashed the process) the graph must not run at all.
    torch._dynamo.reset()
    model = _compiled_mlp("inductor")()
    x = torch.randn(32, 64)
    try:
        model(x)  # compiles (a C++ compiler is needed) and runs outside any Session
    except Exception as e:  # pragma: no cover - a machine that cannot compile
        pytest.skip(f"inductor cannot compile here: {e}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("8MiB")], min_tensor_bytes=1024,
                        discard_dead=False) as s:
        s.watch(model, opt)
        for _ in range(3):
            with pytest.raises(teraio.Error, match=r'backend="aot_eager"'):
                with s.step():
                    torch.nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long)).backward()
                    opt.step()
                    opt.zero_grad()
    assert torch.isfinite(model(x)).all(), "the Session closed: the compiled graph runs again"
