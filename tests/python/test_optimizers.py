"""Foreach and fused optimizers under a budget smaller than their parameter group (CPU): with
Session.watch(optimizer=...) each step runs in parts that fit, and parameters, optimizer states,
learning rates and state_dict() are bitwise those of the same optimizer without teraio; the
gradient norm in parts (teraio.clip_grad_norm_) is bitwise torch's (docs/pytorch.md,
"Optimizers")."""
import contextlib
import copy
import warnings

import pytest
import torch

import teraio
from teraio import optim as teraio_optim

STEPS = 5
# deep_mlp(): 95 KiB of parameters, 380 KiB with gradients and two AdamW states; its largest
# parameter with gradient and states is 64 KiB. The budget holds a fraction of the group.
BUDGET = "160KiB"


def deep_mlp():
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU()]
    for _ in range(5):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n)]


OPTIMIZERS = {
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adam-foreach-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.01, amsgrad=True,
                                                       foreach=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "sgd-momentum-foreach": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                                      foreach=True),
    "sgd-momentum-fused": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
}


def session(tmp_path, budget=BUDGET):
    # Bandwidths given: no probe.
    return teraio.Session(budget=budget, tiers=[
        teraio.HostTier("32KiB", read_gbps=5, write_gbps=5),
        teraio.FileTier([str(tmp_path)], "64MiB", read_gbps=1.5, write_gbps=1.5)],
        min_tensor_bytes=1024)


def run(make_opt, s=None, steps=STEPS, clip=None, schedule=True, watch=True, start=None):
    """Trains deep_mlp() `steps` steps; returns (losses, model, optimizer, lrs). start: (model
    state, optimizer state, scheduler state, first batch) to resume from."""
    torch.manual_seed(0)
    model = deep_mlp()
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.7 ** i) if schedule else None
    data, first = batches(STEPS), 0
    if start is not None:
        model.load_state_dict(start[0])
        opt.load_state_dict(start[1])
        sched.load_state_dict(start[2])
        first = start[3]
    if s is not None and watch:
        s.watch(model, opt)
    losses, lrs = [], []
    for x, y in data[first:first + steps]:
        def body():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if clip is not None:
                clip(model.parameters(), 0.5)
            opt.step()
            if sched is not None:
                sched.step()
            return loss.detach().clone()
        if s is None:
            losses.append(body())
        else:
            with s.step():
                losses.append(body())
        lrs.append(opt.param_groups[0]["lr"])
    if sched is not None:
        opt.teraio_test_sched = sched.state_dict()
    return losses, model, opt, lrs


def assert_same(a, b):
    (la, ma, oa, lra), (lb, mb, ob, lrb) = a, b
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert torch.equal(x, y), (x, y)
    assert lra == lrb
    for (n, p), q in zip(ma.named_parameters(), mb.parameters()):
        assert torch.equal(p, q), n
        sa, sb = oa.state[p], ob.state[q]
        assert sa.keys() == sb.keys(), n
        for k in sa:
            assert torch.equal(sa[k], sb[k]) if torch.is_tensor(sa[k]) else sa[k] == sb[k], (n, k)


def group_bytes(opt):
    """Parameters, gradients and tensor states of the optimizer's first group."""
    out = 0
    for p in opt.param_groups[0]["params"]:
        tensors = [p, p.grad] + [v for v in opt.state[p].values() if torch.is_tensor(v)]
        out += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return out


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_steps_in_parts_are_bitwise(tmp_path, name):
    ref = run(OPTIMIZERS[name])
    assert ref[3][-1] < ref[3][0]  # the scheduler changed the learning rate every step
    with session(tmp_path) as s:
        got = run(OPTIMIZERS[name], s)
        opt = got[2]
        assert opt._teraio_splitter.parts > 2  # the step ran in parts
        st = s.stats()
        assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, st
        assert st["iteration"] == STEPS and st["mode"] == "planned", st
        assert st["drift_events"] == 0, st  # the parts are the same every step
        assert len(opt.param_groups) == 1 and len(opt.param_groups[0]["params"]) == 14
        with s.resident():
            # The group is larger than the budget: the step's operators could not run whole.
            assert group_bytes(opt) > st["budget_bytes"]
            assert_same(ref, got)
            # state_dict() sees the one group, as without teraio.
            assert opt.state_dict()["param_groups"] == ref[2].state_dict()["param_groups"]
    # The step() that was there (the scheduler's wrapper) is back.
    assert not hasattr(opt, "_teraio_splitter") and opt.step._wrapped_by_lr_sched


@pytest.mark.parametrize("name", ["adamw-foreach", "adamw-fused"])
def test_unwatched_step_raises_and_names_the_fix(tmp_path, name):
    with session(tmp_path) as s:
        with pytest.raises(teraio.Error) as info:
            run(OPTIMIZERS[name], s, steps=1, watch=False)
    msg = str(info.value)
    assert "the step needs a budget of at least" in msg, msg
    assert ("_foreach_" if "foreach" in name else "_fused_adam") in msg, msg
    assert "session.watch(optimizer=optimizer)" in msg and "foreach=False" in msg, msg


def test_resume_from_state_dict_under_a_new_session(tmp_path):
    # Three steps under a Session, the state_dict() of model, optimizer and scheduler taken (inside
    # resident()), two more steps from them under a new Session: as five steps without teraio.
    make = OPTIMIZERS["adamw-foreach"]
    ref = run(make)
    with session(tmp_path) as s:
        _, model, opt, _ = run(make, s, steps=3)
        with s.resident():
            saved = copy.deepcopy((model.state_dict(), opt.state_dict(), opt.teraio_test_sched))
    assert saved[1]["param_groups"][0]["params"] == list(range(14))
    assert saved[1]["param_groups"][0]["lr"] == ref[3][2]
    with session(tmp_path) as s:
        got = run(make, s, steps=2, start=saved + (3,))
        with s.resident():
            for (n, p), q in zip(ref[1].named_parameters(), got[1].parameters()):
                assert torch.equal(p, q), n
            assert got[3] == ref[3][3:]
            want = ref[2].state_dict()
            assert got[2].state_dict()["param_groups"] == want["param_groups"]
            for k, v in got[2].state_dict()["state"].items():
                for key in v:
                    assert torch.equal(v[key], want["state"][k][key]), (k, key)


def test_scheduler_made_after_watch_and_closed_session_pass_through(tmp_path):
    torch.manual_seed(0)
    model = deep_mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    with session(tmp_path) as s:
        s.watch(optimizer=opt)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # wraps step() too
        x, y = batches(1)[0]
        with s.step():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
        assert opt._teraio_splitter.parts > 2
        assert opt.param_groups[0]["lr"] == 5e-4
    # The scheduler's wrapper calls ours, which stays and passes through once the Session closed.
    assert opt._teraio_splitter.session_ref() is None
    opt.step()
    assert opt._teraio_splitter.parts == 0
    sched.step()
    assert opt.param_groups[0]["lr"] == 2.5e-4


def test_group_that_fits_runs_whole_and_lbfgs_is_left_alone(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)  # 1 KiB of parameters
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    lbfgs = torch.optim.LBFGS(model.parameters())
    with session(tmp_path) as s:
        s.watch(model, opt).watch(optimizer=lbfgs)
        assert "step" not in lbfgs.__dict__ and not teraio_optim.splits_steps(lbfgs)
        with s.step():
            model(torch.randn(2, 16)).sum().backward()
            opt.step()
        assert opt._teraio_splitter.parts == 0


class FakeSession:
    """Gives a part size without a Session: the parts alone, over every optimizer teraio splits."""

    def __init__(self, part_bytes):
        self.part_bytes = part_bytes

    def _part_bytes(self):
        return self.part_bytes


@pytest.mark.parametrize("cls", teraio_optim._SPLITTABLE, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_every_splittable_optimizer_is_bitwise_in_parts(cls, kind):
    kw = {"lr": 1e-2, kind: True}
    if kind == "fused" and "fused" not in cls.__init__.__code__.co_varnames:
        pytest.skip(f"{cls.__name__} has no fused implementation")
    if cls is torch.optim.SGD:
        kw["momentum"] = 0.9
    ref = run(lambda p: cls(p, **kw), schedule=False, steps=3)
    fake = FakeSession(16 * 1024)
    torch.manual_seed(0)
    model = deep_mlp()
    opt = cls(model.parameters(), **kw)
    teraio_optim._install(opt, fake)
    for x, y in batches(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        assert opt._teraio_splitter.parts > 3
    for (n, p), q in zip(ref[1].named_parameters(), model.parameters()):
        assert torch.equal(p, q), n
    teraio_optim._uninstall(opt, fake)
    assert "step" not in opt.__dict__


def grads_of_many_kinds():
    g = torch.Generator().manual_seed(3)
    shapes = [(64, 64), (64,), (128, 32), (7,), (32, 32, 3), (1000,), (64, 64)]
    dtypes = [torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float32,
              torch.float64, torch.float16]
    params = []
    for shape, dtype in zip(shapes, dtypes):
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
        p.grad = (torch.randn(shape, generator=g) * 3).to(dtype)
        params.append(p)
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.5, float("inf")])
@pytest.mark.parametrize("part_bytes", [1, 5000, 40000])
def test_clip_grad_norm_in_parts_is_torch_bitwise(norm_type, part_bytes):
    a, b = grads_of_many_kinds(), grads_of_many_kinds()
    want = torch.nn.utils.clip_grad_norm_(a, 1.0, norm_type)
    got = teraio.clip_grad_norm_(b, 1.0, norm_type, part_bytes=part_bytes)
    assert torch.equal(want, got), (want, got)
    for p, q in zip(a, b):
        assert torch.equal(p.grad, q.grad)
    assert torch.equal(torch.nn.utils.get_total_norm([p.grad for p in a], norm_type),
                       teraio.get_total_norm([p.grad for p in b], norm_type, part_bytes=part_bytes))
    with pytest.raises(teraio.Error, match="part_bytes"):
        teraio.clip_grad_norm_(b, 1.0, part_bytes=0)


def test_clip_grad_norm_under_a_session(tmp_path):
    # The gradients (95 KiB) are more than the budget: torch's norm is one operator over all of
    # them; teraio's takes parts of half the budget and gives torch's norms and parameters.
    def clip(params, max_norm):
        clip.norms.append(teraio.clip_grad_norm_(params, max_norm).clone())
    clip.norms = []

    def torch_clip(params, max_norm):
        torch_clip.norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).clone())
    torch_clip.norms = []

    ref = run(OPTIMIZERS["adamw-fused"], clip=torch_clip)
    with session(tmp_path, "80KiB") as s:
        got = run(OPTIMIZERS["adamw-fused"], s, clip=clip)
        with s.resident():
            assert_same(ref, got)
    assert [n.item() for n in clip.norms] == [n.item() for n in torch_clip.norms]
    with session(tmp_path, "80KiB") as s:
        with pytest.raises(teraio.Error) as info:
            run(OPTIMIZERS["adamw-fused"], s, clip=torch.nn.utils.clip_grad_norm_, steps=1)
    msg = str(info.value)
    assert "_foreach_norm" in msg and "teraio.clip_grad_norm_" in msg, msg
    assert "session.watch(optimizer" not in msg, msg
    # Neither the optimizer watched nor teraio's norm: the message gives both fixes.
    with session(tmp_path, "80KiB") as s:
        with pytest.raises(teraio.Error) as info:
            run(OPTIMIZERS["adamw-foreach"], s, clip=torch.nn.utils.clip_grad_norm_, steps=1,
                watch=False)
    msg = str(info.value)
    assert "teraio.clip_grad_norm_" in msg and "session.watch(optimizer=optimizer)" in msg, msg


def test_a_parameter_larger_than_the_budget_says_raise_the_budget(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 4))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    with session(tmp_path, "150KiB") as s:  # the 64 KiB weight, its gradient and states: 256 KiB
        s.watch(model, opt)
        with pytest.raises(teraio.Error) as info:
            with s.step():
                model(torch.randn(4, 128)).sum().backward()
                opt.step()
    msg = str(info.value)
    assert "_fused_adamw" in msg and "raise the budget" in msg, msg
    assert "session.watch(optimizer" not in msg, msg


# --- steps in backward (Note [Steps in backward]) ---------------------------------------------

def run_in_backward(make_opt, s, steps=STEPS, between=None, accumulate=False):
    """run() with watch(..., step_in_backward=True); between(model, opt, sched) runs between
    backward and optimizer.step(); accumulate: gradients of two half batches per step."""
    torch.manual_seed(0)
    model = deep_mlp()
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.7 ** i)
    s.watch(model, opt, step_in_backward=True)
    losses, lrs = [], []
    for x, y in batches(STEPS)[:steps]:
        with s.step():
            opt.zero_grad()
            if accumulate:
                torch.nn.functional.cross_entropy(model(x[:8]), y[:8]).backward()
                x, y = x[8:], y[8:]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if between is not None:
                between(model, opt, sched)
            opt.step()
            sched.step()
            losses.append(loss.detach().clone())
        lrs.append(opt.param_groups[0]["lr"])
    return losses, model, opt, lrs


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_steps_in_backward_are_bitwise(tmp_path, name):
    ref = run(OPTIMIZERS[name])
    with session(tmp_path) as s:
        got = run_in_backward(OPTIMIZERS[name], s)
        opt = got[2]
        # Every parameter was updated from its hook; optimizer.step() had nothing left to do.
        assert opt._teraio_splitter.backward_updates == 14
        st = s.stats()
        assert st["mode"] == "planned" and st["drift_events"] == 0, st
        assert st["bytes_offloaded"] > 0, st
        with s.resident():
            assert_same(ref, got)
            assert opt.state_dict()["param_groups"] == ref[2].state_dict()["param_groups"]
    # Closed: step() and the parameters' hooks are gone; a backward no longer updates.
    assert not hasattr(opt, "_teraio_splitter") and opt.step._wrapped_by_lr_sched
    model = got[1]
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_parameters_update_during_backward_and_tied_weights_once():
    # No Session: the mechanism alone. A weight used twice in the forward (tied embedding and
    # output layer) gets one update, from its summed gradient, as optimizer.step() gives it.
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.mid = torch.nn.Linear(16, 16)

        def forward(self, ids):
            return torch.nn.functional.linear(torch.tanh(self.mid(self.emb(ids))), self.emb.weight)

    def train(in_backward):
        torch.manual_seed(0)
        model = Tied()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        fake = FakeSession(1 << 30)
        if in_backward:
            teraio_optim._install(opt, fake, in_backward=True)
        g = torch.Generator().manual_seed(2)
        for _ in range(3):
            ids = torch.randint(0, 50, (4, 8), generator=g)
            loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 50), ids.reshape(-1))
            before = model.emb.weight.detach().clone()
            loss.backward()
            assert torch.equal(before, model.emb.weight) != in_backward  # updated by backward
            opt.step()
            opt.zero_grad()
        return model, opt

    ref, got = train(False), train(True)
    for (n, p), q in zip(ref[0].named_parameters(), got[0].parameters()):
        assert torch.equal(p, q), n
    assert got[1]._teraio_splitter.backward_updates == 3
    assert ref[1].state[ref[0].emb.weight]["step"] == got[1].state[got[0].emb.weight]["step"] == 3


def clip(model, opt, sched):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)


def sched_first(model, opt, sched):
    sched.step()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
@pytest.mark.parametrize("case, message", [
    (dict(between=clip), r"gradient of '12\.bias' changed between backward and optimizer\.step\(\)"),
    (dict(between=sched_first), r"group value 'lr' changed between backward and optimizer.step"),
    (dict(accumulate=True), r"'12\.bias' got a second gradient before optimizer\.step\(\)"),
])
def test_step_in_backward_refuses_a_loop_it_would_change(tmp_path, case, message):
    # Clipping, a scheduler stepped before optimizer.step(), gradient accumulation: the update made
    # in backward would differ from optimizer.step()'s, so teraio says so at once and how to fix
    # it. The Session goes on: the next steps, done right, train.
    with session(tmp_path) as s:
        with pytest.raises(teraio.Error, match=message) as info:
            run_in_backward(OPTIMIZERS["adamw-foreach"], s, steps=1, **case)
        assert "step_in_backward=False" in str(info.value)
        _, model, opt, _ = run_in_backward(OPTIMIZERS["adamw-foreach"], s, steps=2)
        assert opt._teraio_splitter.backward_updates == 14
        with s.resident():
            assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_step_that_fails_in_backward_keeps_its_updates_and_the_next_step_runs(tmp_path):
    # The body fails halfway through the backward (an exception from a hook on the first layer's
    # output, after the later layers' parameters were updated): the exception says how many
    # updates were made and that they stay, and the next step runs normally, without a "second
    # gradient" error for the parameters the failed step updated.
    class Stop(Exception):
        pass

    with session(tmp_path) as s:
        torch.manual_seed(0)
        model = deep_mlp()
        opt = OPTIMIZERS["adamw-foreach"](model.parameters())
        s.watch(model, opt, step_in_backward=True)
        data = batches(4)
        for i, (x, y) in enumerate(data):
            fail = i == 2
            try:
                with s.step():
                    opt.zero_grad()
                    h = model[0](x)
                    if fail:
                        h.register_hook(lambda g: (_ for _ in ()).throw(Stop("from the backward")))
                    loss = torch.nn.functional.cross_entropy(model[1:](h), y)
                    before = [p.detach().clone() for p in model.parameters()]
                    loss.backward()
                    opt.step()
                assert not fail
            except Stop as e:
                assert fail
                notes = " ".join(getattr(e, "__notes__", []))
                after = [p.detach().clone() for p in model.parameters()]
                changed = sum(not torch.equal(a, b) for a, b in zip(before, after))
                assert 0 < changed < 14, changed
                if hasattr(e, "add_note"):
                    assert f"had already updated {changed} parameter(s)" in notes, notes
        assert opt._teraio_splitter.backward_updates == 14, "the last step updated all in backward"
        with s.resident():
            assert all(torch.isfinite(p).all() for p in model.parameters())


def test_step_in_backward_needs_a_per_parameter_optimizer(tmp_path):
    model = torch.nn.Linear(4, 4)
    with session(tmp_path) as s:
        with pytest.raises(teraio.Error, match="LBFGS"):
            s.watch(model, torch.optim.LBFGS(model.parameters()), step_in_backward=True)
        with pytest.raises(teraio.Error, match="needs the optimizer"):
            s.watch(model, step_in_backward=True)
        with pytest.raises(teraio.Error, match="step_in_backward must be True, False or .auto."):
            s.watch(model, step_in_backward=1)


@pytest.mark.parametrize("foreach", [False, True])
def test_plans_predict_steps_in_backward(tmp_path, foreach):
    # A watched per-parameter optimizer whose updates run after backward (foreach: in parts, its
    # _foreach_sqrt's unnamed outputs given to parameters by position): each plan also predicts
    # the loop with them in the backward (Note [Predicting steps in backward]); a PerformanceHint
    # says so once when that is at least teraio.HINT_GAIN faster. Stepping in backward already,
    # nothing is predicted.
    loop = lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=foreach)  # noqa: E731
    with session(tmp_path) as s:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(loop, s)
        st = s.stats()
        assert st["mode"] == "planned" and st["predicted_iteration_us"] > 0, st
        assert st["predicted_step_in_backward_us"] > 0, st
        hints = [w for w in caught if issubclass(w.category, teraio.PerformanceHint)]
        # both replays without the Session's measured host time (Note [The runner's host time])
        faster = st["predicted_step_in_backward_us"] <= (1 - teraio.HINT_GAIN) * st["plan_predicted_us"]
        assert len(hints) == int(faster), (hints, st)
    with session(tmp_path) as s:
        run_in_backward(loop, s)
        st = s.stats()
        assert st["mode"] == "planned" and st["predicted_step_in_backward_us"] == 0, st


def test_predictions_stop_once_the_hint_is_decided(tmp_path):
    # After the first plan's prediction (hint or not), a plan for a new step signature (another
    # batch size) does not plan the rewritten profile again; the stats keep the first number.
    torch.manual_seed(0)
    model = deep_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with session(tmp_path) as s, warnings.catch_warnings():
        warnings.simplefilter("ignore", teraio.PerformanceHint)
        s.watch(model, opt)
        g = torch.Generator().manual_seed(1)
        plans = []
        for rows in (16, 16, 16, 24, 24, 24):
            x, y = torch.randn(rows, 32, generator=g), torch.randint(0, 10, (rows,), generator=g)
            with s.step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            st = s.stats()
            if st["mode"] == "planned":
                plans.append((rows, st["predicted_iteration_us"], st["predicted_step_in_backward_us"]))
        assert s._hinted
        first = [p for p in plans if p[0] == 16]
        second = [p for p in plans if p[0] == 24]
        assert first and second, plans
        assert first[-1][2] > 0, plans
        assert second[-1][1] != first[-1][1], "a new plan for the new batch size"
        assert second[-1][2] == first[-1][2], "not predicted again"


def test_the_hint_names_the_fix_and_comes_once(tmp_path):
    with session(tmp_path) as s:
        s._predict_in_backward = True
        st = {"mode": "planned", "predicted_iteration_us": 1000.0,
              "predicted_step_in_backward_us": 960.0}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s._hint_steps_in_backward(st)  # 4% less: no hint, and none later
            assert not caught and s._hinted
            s._hinted = False
            s._hint_steps_in_backward({**st, "predicted_step_in_backward_us": 700.0})
            s._hint_steps_in_backward({**st, "predicted_step_in_backward_us": 500.0})
        assert len(caught) == 1 and issubclass(caught[0].category, teraio.PerformanceHint)
        msg = str(caught[0].message)
        assert "0.7 ms per step" in msg and "1.0 ms as it runs (30% less)" in msg, msg
        assert "step_in_backward=True" in msg and "clips" in msg, msg


def train_auto(make_opt, s=None, steps=14):
    """deep_mlp() trained `steps` steps over batches(STEPS) in turn, watched with
    step_in_backward="auto" under `s`; returns (losses, model, optimizer, lrs)."""
    torch.manual_seed(0)
    model = deep_mlp()
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.9 ** i)
    if s is not None:
        s.watch(model, opt, step_in_backward="auto")
    data = batches(STEPS)
    losses, lrs = [], []
    for i in range(steps):
        x, y = data[i % len(data)]
        with (s.step() if s is not None else contextlib.nullcontext()):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach().clone())
        lrs.append(opt.param_groups[0]["lr"])
    return losses, model, opt, lrs


@pytest.mark.parametrize("predicted, measured", [
    ("faster", "faster"), ("faster", "slower"), ("slower", None)])
def test_step_in_backward_auto_chooses_by_prediction_then_measurement(tmp_path, monkeypatch,
                                                                     predicted, measured):
    # Note [Auto steps in backward]: the prediction (forced here: on a loaded CPU it varies) picks
    # whether to try; the steps timed on each side (a fake clock: in backward steps take half or
    # twice as long) decide whether to keep. Training is bitwise whatever is chosen, and no
    # PerformanceHint is given.
    monkeypatch.setattr(teraio, "HINT_GAIN", -10.0 if predicted == "faster" else 10.0)
    loop = lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False)  # noqa: E731
    ref = train_auto(loop)
    with session(tmp_path) as s:
        clock = [0.0]

        def fake_clock():
            clock[0] += (0.5 if measured == "faster" else 2.0) if s.steps_in_backward else 1.0
            return clock[0]
        monkeypatch.setattr(teraio, "_clock", fake_clock)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train_auto(loop, s)
        assert not [w for w in caught if issubclass(w.category, teraio.PerformanceHint)]
        d, st, opt = s.step_in_backward_decision, s.stats(), got[2]
        assert d["predicted_gain"] is not None, d
        if predicted == "slower":
            assert d == {**d, "before_s": None, "after_s": None, "kept": False}, d
            assert st["drift_events"] == 0, st
        else:
            assert d["before_s"] == 1.0 and d["after_s"] == (0.5 if measured == "faster" else 2.0), d
            assert d["kept"] == (measured == "faster"), d
            assert st["drift_events"] == (1 if measured == "faster" else 2), st
        kept = predicted == "faster" and measured == "faster"
        assert s.steps_in_backward == kept
        assert opt._teraio_splitter.backward_updates == (14 if kept else 0)
        assert st["mode"] == "planned", st
        with s.resident():
            assert_same(ref, got)
