"""Training with teraio is bitwise identical to training without it (CPU; the budget is below the
footprint so tensors really go to files and come back): an MLP, a small CNN and, when transformers
is installed, a tiny LlamaForCausalLM built from a config. Reactive and planned modes."""
import contextlib
import json

import pytest
import torch

import teraio
from conftest import TinyLlama, assert_bitwise, token_batch, train


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.GELU(), torch.nn.Linear(128, 10))


def mlp_batch(g):
    return (torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def cnn_batch(g):
    return (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g))


def session(tmp_path, budget, planning=True, **kw):
    return teraio.Session(budget=budget, tiers=[teraio.HostTier("48KiB"),
                                                teraio.FileTier([str(tmp_path)], "256MiB")],
                          planning=planning, min_tensor_bytes=1024, **kw)


# planned-sof: stream_ordered_offloads=True, which on CPU tensors (no stream) must change nothing
@pytest.mark.parametrize("planning,sof", [(False, False), (True, False), (True, True)],
                         ids=["reactive", "planned", "planned-sof"])
@pytest.mark.parametrize("model,batch,budget", [(mlp, mlp_batch, "200KiB"), (SmallCNN, cnn_batch, "80KiB")],
                         ids=["mlp", "cnn"])
def test_bitwise_cpu(tmp_path, model, batch, budget, planning, sof):
    steps = 5
    ref = train(model, batch, steps)
    with session(tmp_path, budget, planning=planning, stream_ordered_offloads=sof) as s:
        got = train(model, batch, steps, session=s)
        st = s.stats()
        assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, st
        assert st["peak_resident_bytes"] > st["budget_bytes"] or st["evictions"] > 0
        assert st["iteration"] == steps
        assert st["mode"] == ("planned" if planning else "reactive"), st
        if planning:
            assert st["plan_moves"] > 0, st
        assert st["stream_ordered_offloads"] == 0, st  # CPU tensors have no stream
        with s.resident():
            assert_bitwise(ref, got)


def test_planned_steps_follow_the_plan_within_budget(tmp_path):
    """Once planned, a step moves only what the plan says: no urgent fetch, no eviction, no
    skipped move, and the tracked bytes resident never exceed the budget (gradients kept alive
    until zero_grad and Python temporaries held past their last use included)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.GELU(), torch.nn.Linear(512, 100))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(1)
    with teraio.Session(budget="3MiB", tiers=[teraio.HostTier("8MiB")], min_tensor_bytes=4096) as s:
        s.watch(model, opt)
        before = None
        for step in range(7):
            x, y = torch.randn(64, 256, generator=g), torch.randint(0, 100, (64,), generator=g)
            with s.step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            st = s.stats()
            if step == 3:
                before = st
            if step > 3:
                assert st["mode"] == "planned", st
                assert st["step_peak_resident_bytes"] <= st["budget_bytes"], st
        for key in ("urgent_fetches", "evictions", "skipped_moves", "drift_events"):
            assert st[key] == before[key], (key, before, st)
        assert st["plan_moves"] > before["plan_moves"], st


def deep_mlp():
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))


def deep_mlp_batch(g):
    return (torch.randn(16, 256, generator=g), torch.randint(0, 10, (16,), generator=g))


@pytest.mark.parametrize("planning", [False, True], ids=["reactive", "planned"])
def test_parameters_larger_than_the_budget_train_bitwise(tmp_path, planning):
    """Parameters that exceed the budget on their own (2.1 MiB against 768 KiB): the watched
    model's parameters are tracked from the first step's start (Note [Adopted tensors]), so the
    first step moves the ones it does not need yet instead of failing at the first operator that
    needs room, and training stays bitwise."""
    ref = train(deep_mlp, deep_mlp_batch, 5)
    param_bytes = sum(p.numel() * p.element_size() for p in ref[1].parameters())
    budget = 768 * 1024
    assert param_bytes > 2 * budget
    with session(tmp_path, f"{budget}B", planning=planning) as s:
        got = train(deep_mlp, deep_mlp_batch, 5, session=s)
        st = s.stats()
        assert st["last_error"] == "", st["last_error"]
        assert st["evictions"] > 0 and st["bytes_offloaded"] > 0, st
        assert st["mode"] == ("planned" if planning else "reactive"), st
        with s.resident():
            assert_bitwise(ref, got)


def test_watched_parameters_count_against_the_budget_from_the_first_step(tmp_path):
    """The watched model's parameters are tracked when the first step begins, before any operator
    uses them: the first operator that needs room moves out the ones not needed yet (here the 8
    layers a step that runs only the first layer never reaches), and the tracked bytes resident
    are then within the budget."""
    torch.manual_seed(0)
    model = deep_mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    tracked = [p for p in model.parameters() if p.numel() * p.element_size() >= 1024]
    with session(tmp_path, f"{768 * 1024}B") as s:
        s.watch(model, opt)
        with s.step():
            assert s.stats()["tracked_tensors"] == len(tracked)
            model[1](model[0](torch.randn(16, 256)))
        st = s.stats()
        assert st["evictions"] > 0 and st["bytes_offloaded"] > 0, st
        assert st["resident_bytes"] <= st["budget_bytes"], st
        assert st["last_error"] == "", st["last_error"]


def test_optimizer_states_loaded_before_the_session_are_tracked_from_its_first_step(tmp_path):
    """Resuming: the AdamW states exist before the first step (here from two steps without teraio,
    as after loading a checkpoint) and, with the parameters, exceed the budget: they are tracked
    from the first step's start and moved before their first use, and training goes on bitwise as
    without teraio."""
    ref = train(deep_mlp, deep_mlp_batch, 6)
    torch.manual_seed(0)
    model = deep_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(1)
    from conftest import step
    losses = [step(model, opt, deep_mlp_batch(g)).detach().clone() for _ in range(2)]
    states = [v for st in opt.state.values() for v in st.values()
              if isinstance(v, torch.Tensor) and v.numel() * v.element_size() >= 1024]
    assert len(states) > 0
    with session(tmp_path, f"{768 * 1024}B") as s:
        s.watch(model, opt)
        for i in range(4):
            with s.step():
                if i == 0:
                    st = s.stats()
                    big = [p for p in model.parameters() if p.numel() * p.element_size() >= 1024]
                    grads = [p for p in big if p.grad is not None]  # kept from the last step
                    assert st["tracked_tensors"] == len(big) + len(grads) + len(states), st
                losses.append(step(model, opt, deep_mlp_batch(g)).detach().clone())
        st = s.stats()
        assert st["last_error"] == "", st["last_error"]
        assert st["evictions"] > 0, st
        with s.resident():
            assert_bitwise(ref, (losses, model, opt))


def test_a_watched_fsdp2_model_trains_as_without_teraio(tmp_path):
    """FSDP2's DTensor parameters are tensor subclasses: watch() leaves them to the plain tensors
    their operators see (Note [Adopted tensors]), and the steps train as they do without teraio. A
    one-rank gloo group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        def run(session):
            torch.manual_seed(0)
            model = deep_mlp()
            fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
            if session is not None:
                session.watch(model, opt)
            g = torch.Generator().manual_seed(1)
            losses = []
            for _ in range(4):
                x, y = deep_mlp_batch(g)
                with session.step() if session is not None else contextlib.nullcontext():
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                losses.append(loss.detach().clone())
            return losses, [p.full_tensor().detach().clone() for p in model.parameters()]

        ref_losses, ref_params = run(None)
        with teraio.Session(budget="64MiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=1024) as s:
            losses, params = run(s)
            st = s.stats()
        assert st["last_error"] == "" and st["mode"] == "planned", st
        assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
        assert all(torch.equal(a, b) for a, b in zip(ref_params, params))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("foreach,budget", [(False, "200KiB"), (True, "310KiB")])
def test_sgd_foreach_false_and_true(tmp_path, foreach, budget):
    # A foreach step touches all parameters, gradients and momenta of the group in one operator:
    # the budget must hold them all (docs/pytorch.md); per-parameter stepping needs far less.
    ref = train(mlp, mlp_batch, 4, optimizer="sgd", foreach=foreach)
    with session(tmp_path, budget) as s:
        got = train(mlp, mlp_batch, 4, session=s, optimizer="sgd", foreach=foreach)
        assert s.stats()["evictions"] > 0
        s.fetch_all()
        assert_bitwise(ref, got)


transformers = pytest.importorskip("transformers")


LlamaWrap = TinyLlama
llama_batch = token_batch(2, 16)


@pytest.mark.parametrize("planning", [False, True])
def test_bitwise_llama_cpu(tmp_path, planning):
    steps = 4
    ref = train(LlamaWrap, llama_batch, steps, lr=1e-3)
    with session(tmp_path, "160KiB", planning=planning) as s:
        got = train(LlamaWrap, llama_batch, steps, session=s, lr=1e-3)
        st = s.stats()
        assert st["bytes_offloaded"] > 0, st
        s.fetch_all()
        assert_bitwise(ref, got)


def test_bitwise_llama_every_tensor_tracked(tmp_path):
    """min_tensor_bytes=0 tracks every tensor the step makes, the small ones the loop makes outside
    the recorded operators too: the trace the Session records must still be one its planner takes
    (a nested producer reading such a tensor failed the first step's end), and training stays
    bitwise. HF's default attention and its own loss (labels=)."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

    def run(session):
        torch.manual_seed(0)
        m = transformers.LlamaForCausalLM(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
        g = torch.Generator().manual_seed(1)
        if session:
            session.watch(m, opt)
        losses = []
        for _ in range(4):
            ids = torch.randint(0, 128, (2, 16), generator=g)
            with session.step() if session else contextlib.nullcontext():
                loss = m(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            losses.append(loss.detach())
        return losses, m, opt

    ref = run(None)
    with teraio.Session(budget="160KiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=0) as s:
        got = run(s)
        st = s.stats()
        assert st["mode"] == "planned" and st["bytes_offloaded"] > 0, st
        with s.resident():
            assert_bitwise(ref, got)


def test_libtorch_cpp_adamw_with_cpp_session(tmp_path):
    # libtorch's C++ AdamW and the C++ teraio::Session API (StepGuard), no Python in the step.
    ref = teraio._C._cpp_adamw_train(5, 0, "")
    got = teraio._C._cpp_adamw_train(5, 200 * 1024, str(tmp_path))
    assert len(ref) == len(got) == 5 + 6
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


def test_tensors_saved_inside_composite_operators_are_tracked(tmp_path):
    """cross_entropy is one top-level operator; the log_softmax it computes inside is saved for the
    backward pass. That tensor takes memory from the forward pass on, so the trace must have it
    from there (an activation born inside the composite), not only from its use in backward."""
    trace = tmp_path / "trace.json"
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 2000)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with teraio.Session(budget="64MiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=4096,
                        trace_path=str(trace), profiling_iterations=1) as s:
        for _ in range(2):
            x, y = torch.randn(128, 64, generator=g), torch.randint(0, 2000, (128,), generator=g)
            with s.step():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    t = json.loads(trace.read_text())
    names = [k["name"] for k in t["kernels"]]
    ce = names.index("aten::cross_entropy_loss")
    saved = [i for i in t["kernels"][ce]["tensors"]
             if t["tensors"][i]["bytes"] == 128 * 2000 * 4 and t["tensors"][i]["kind"] == "activation"]
    assert saved, [t["tensors"][i] for i in t["kernels"][ce]["tensors"]]
    later = [k for k, kern in enumerate(t["kernels"]) if saved[0] in kern["tensors"]]
    assert max(later) > ce, "used again in the backward pass"


def scale_weights_between_steps(how):
    """After every second step, the model's weights scaled in place outside the step: through
    `.data` (whose version counter is not the parameter's) or through the parameter."""
    def after_step(i, model):
        if i % 2 == 1:
            with torch.no_grad():
                for p in model.parameters():
                    (p.data if how == "data" else p).mul_(0.5)
    return after_step


@pytest.mark.parametrize("how", ["data", "param"])
def test_clean_offloads_skip_writes_and_stay_bitwise(tmp_path, how):
    """Note [Clean offloads]: tensors read back and not written since go out again without a write
    (fewer bytes written than with clean_offloads=False, the same training), and a write between
    steps — through `.data` too — is seen, so a stale copy is never read back."""
    steps = 8
    ref = train(mlp, mlp_batch, steps, after_step=scale_weights_between_steps(how))
    written = {}
    for clean in (True, False):
        with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("4MiB")], min_tensor_bytes=1024,
                            clean_offloads=clean) as s:
            got = train(mlp, mlp_batch, steps, session=s,
                        after_step=scale_weights_between_steps(how))
            st = s.stats()
            assert st["mode"] == "planned", st
            assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, st
            if clean:
                assert st["clean_offloads"] > 0 and st["clean_bytes"] > 0, st
                assert st["tiers"][0]["bytes_clean"] == st["clean_bytes"], st
            else:
                assert st["clean_offloads"] == 0 and st["clean_bytes"] == 0, st
            written[clean] = st["bytes_offloaded"]
            with s.resident():
                assert_bitwise(ref, got)
    assert written[True] < written[False], written


@pytest.mark.parametrize("model", ["mlp", "llama"])
def test_dead_gradients_are_discarded_and_training_stays_bitwise(model):
    """Note [Dead tensors]: gradients freed right after optimizer.step() are never read after the
    optimizer has used them; the plan takes them away without writing them (fewer bytes written
    than with discard_dead=False), and training is bitwise the same. The planner's own plan in both
    runs (plan_search=False): the search keeps whichever variant the simulator finds faster, which
    may spend the writes saved on other moves (and the CPU's operator times it plans with vary from
    run to run)."""
    if model == "llama":
        pytest.importorskip("transformers")
        make, batch, budget = TinyLlama, token_batch(4, 16), "160KiB"
    else:
        make, batch, budget = mlp, mlp_batch, "200KiB"
    steps = 7
    ref = train(make, batch, steps, zero_grad_after=True)
    written = {}
    for discard in (True, False):
        with teraio.Session(budget=budget, tiers=[teraio.HostTier("4MiB")], min_tensor_bytes=1024,
                            discard_dead=discard, plan_search=False) as s:
            got = train(make, batch, steps, session=s, zero_grad_after=True)
            st = s.stats()
            assert st["mode"] == "planned" and st["drift_events"] == 0, st
            if discard:
                assert st["discards"] > 0 and st["discarded_bytes"] > 0, st
            else:
                assert st["discards"] == 0 and st["discarded_bytes"] == 0, st
            assert st["lost_tensors"] == 0, st
            written[discard] = st["bytes_offloaded"]
            with s.resident():
                assert_bitwise(ref, got)
    assert written[True] < written[False], written


def test_a_discarded_tensor_used_after_all_raises_and_the_session_goes_on():
    """A step off the profile that reads a gradient after optimizer.step() (logging every N steps)
    finds it discarded: teraio's error names it and says what to do; nothing reads other bytes, and
    training continues once the gradients are freed."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(1)
    from conftest import step
    with teraio.Session(budget="200KiB", tiers=[teraio.HostTier("4MiB")], min_tensor_bytes=1024) as s:
        s.watch(model, opt)
        for _ in range(5):
            with s.step():
                step(model, opt, mlp_batch(g), zero_grad_after=True)
        assert s.stats()["mode"] == "planned" and s.stats()["discards"] > 0, s.stats()
        with pytest.raises(Exception, match="was discarded after its last use.*discard_dead=False"):
            with s.step():
                x, y = mlp_batch(g)  # the profiled steps' operators, up to the optimizer step
                out = model(x)
                loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                loss.backward()
                opt.step()
                norms = [p.grad.norm() for p in model.parameters()]  # read after the optimizer
                print(norms)
        opt.zero_grad(set_to_none=True)  # the discarded gradients go; the next ones are new tensors
        for _ in range(3):
            with s.step():
                loss = step(model, opt, mlp_batch(g), zero_grad_after=True)
        assert torch.isfinite(loss)
        with s.resident():
            assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("foreach", [False, True])
def test_steps_in_backward_llama_bitwise(foreach):
    """Session.watch(..., step_in_backward=True) on HF Llama with recompute and dead tensors on:
    each parameter is updated while backward runs (its gradient is then dead, so discarded), and
    parameters and AdamW states are bitwise those of the loop without teraio."""
    steps = 6
    ref = train(TinyLlama, token_batch(4, 16), steps, foreach=foreach, lr=1e-3, zero_grad_after=True)
    with teraio.Session(budget="160KiB", tiers=[teraio.HostTier("4MiB")],
                        min_tensor_bytes=1024) as s:
        got = train(TinyLlama, token_batch(4, 16), steps, session=s, foreach=foreach, lr=1e-3,
                    zero_grad_after=True, step_in_backward=True)
        st = s.stats()
        assert st["mode"] == "planned" and st["drift_events"] == 0, st
        assert st["bytes_offloaded"] > 0 and st["discards"] > 0 and st["lost_tensors"] == 0, st
        n = len(list(got[1].parameters()))
        assert got[2]._teraio_splitter.backward_updates == n
        with s.resident():
            assert_bitwise(ref, got)
