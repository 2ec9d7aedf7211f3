"""The Hugging Face Trainer under teraio.integrations.hf.TeraioCallback, on CPU with a tiny
LlamaForCausalLM: logged losses, checkpoints (written while tensors are offloaded), resuming,
evaluation and load_best_model_at_end are bitwise those of the same Trainer without teraio, with a
budget below the training state so that tensors go to a FileTier and come back."""
import os
import subprocess
import sys

import pytest
import torch

import teraio

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
from safetensors.torch import load_file  # noqa: E402  (comes with transformers)

from teraio.integrations.hf import TeraioCallback  # noqa: E402

transformers.logging.set_verbosity_error()
torch_clip = torch.nn.utils.clip_grad_norm_  # torch's, which the callback replaces while it runs

# Parameters are 352 KiB, with gradients and AdamW states 1.4 MiB: the budget holds a third of them.
BUDGET = "512KiB"
STEPS = 6


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.ids = torch.randint(0, 128, (n, 17), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg)


def callback(tier_dir, budget=BUDGET, **kw):
    # Bandwidths given: no probe (it would add a second to every train()).
    os.makedirs(tier_dir, exist_ok=True)
    return TeraioCallback(budget, [teraio.HostTier("48KiB", read_gbps=5, write_gbps=5),
                                   teraio.FileTier([str(tier_dir)], "64MiB", read_gbps=1.5,
                                                   write_gbps=1.5)],
                          min_tensor_bytes=1024, **kw)


def train(out, callbacks=(), resume=None, optimizer=True, close=True, **args):
    """Runs a Trainer from the same seeds; returns (trainer, model). optimizer: True for a
    per-parameter AdamW, False for the Trainer's default (fused AdamW), or (class, kwargs). close:
    close the callbacks' Sessions if train() raises (so that one failing test does not leave a
    Session open)."""
    defaults = dict(output_dir=str(out), use_cpu=True, report_to="none", disable_tqdm=True,
                    max_steps=STEPS, per_device_train_batch_size=2, learning_rate=1e-3,
                    logging_steps=1, save_strategy="steps", save_steps=3, seed=0,
                    dataloader_num_workers=0)
    defaults.update(args)
    model = tiny_llama()
    kw = {}
    if optimizer is True:  # per-parameter AdamW: each of its operators touches one parameter
        kw["optimizer_cls_and_kwargs"] = (torch.optim.AdamW, {"lr": 1e-3, "foreach": False})
    elif optimizer:
        kw["optimizer_cls_and_kwargs"] = optimizer
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(**defaults),
                                   train_dataset=RandomTokens(16, 1),
                                   eval_dataset=RandomTokens(4, 2), callbacks=list(callbacks), **kw)
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:  # a train() that raised from elsewhere than the callback leaves its Session open
        for cb in callbacks:
            if close and isinstance(cb, TeraioCallback):
                cb.close()
    return trainer, model


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def assert_same_parameters(a, b):
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name


def no_session_open():
    # One Session may be active per process: a new one opens only when the callback's is closed.
    teraio.Session(budget="1MiB", tiers=[teraio.HostTier("1MiB")]).close()
    return True


class OffloadedAtSave(transformers.TrainerCallback):
    """Placed before TeraioCallback: at on_step_end of a step that saves, counts the parameters and
    optimizer states whose bytes are in a tier (their storage has no data)."""

    def __init__(self):
        self.counts = {}

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not control.should_save:
            return
        tensors = list(model.parameters()) + [v for s in optimizer.state.values()
                                              for v in s.values() if torch.is_tensor(v) and v.dim()]
        out = 0
        for t in tensors:
            try:
                out += t.untyped_storage().data_ptr() == 0
            except RuntimeError:  # "invalid python storage": offloaded
                out += 1
        self.counts[state.global_step] = out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Six steps with a checkpoint at 3 and 6, without and with teraio."""
    tmp = tmp_path_factory.mktemp("hf")
    ref = train(tmp / "ref")
    probe, cb = OffloadedAtSave(), callback(tmp / "tier")
    got = train(tmp / "got", callbacks=[probe, cb])
    return tmp, ref, got, probe, cb


def test_losses_and_parameters_bitwise(runs):
    tmp, (ref_trainer, ref_model), (got_trainer, got_model), _, cb = runs
    assert len(logged(ref_trainer, "loss")) == STEPS
    assert logged(got_trainer, "loss") == logged(ref_trainer, "loss")
    assert logged(got_trainer, "grad_norm") == logged(ref_trainer, "grad_norm")
    assert_same_parameters(ref_model, got_model)
    st = cb.stats()
    assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, st
    assert st["tiers"][1]["name"] == "file"
    assert st["iteration"] == STEPS and st["mode"] == "planned", st  # one Session step per step


def test_checkpoint_written_while_offloaded_is_identical(runs):
    tmp, _, _, probe, _ = runs
    assert probe.counts.get(3, 0) > 0, probe.counts  # tensors were in a tier when step 3 ended
    for step in (3, 6):
        a, b = tmp / "ref" / f"checkpoint-{step}", tmp / "got" / f"checkpoint-{step}"
        for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), (step, name)
        ma, mb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
        oa = torch.load(a / "optimizer.pt", weights_only=True)
        ob = torch.load(b / "optimizer.pt", weights_only=True)
        assert oa["param_groups"] == ob["param_groups"]
        assert len(oa["state"]) == len(ob["state"]) == len(list(tiny_llama().parameters()))
        for i, s in oa["state"].items():
            for k, v in s.items():
                assert torch.equal(v, ob["state"][i][k]), (step, i, k)


def test_resume_from_a_checkpoint_under_a_session(runs):
    tmp = runs[0]
    ref_trainer, ref_model = train(tmp / "ref-resumed", resume=str(tmp / "ref" / "checkpoint-3"))
    cb = callback(tmp / "tier-resumed")
    got_trainer, got_model = train(tmp / "got-resumed", callbacks=[cb],
                                   resume=str(tmp / "got" / "checkpoint-3"))
    assert logged(got_trainer, "loss") == logged(ref_trainer, "loss")
    assert_same_parameters(ref_model, got_model)
    assert cb.stats()["bytes_offloaded"] > 0 and cb.stats()["iteration"] == STEPS - 3


def test_session_closed_and_tier_empty_after_train(runs):
    tmp, _, _, _, cb = runs
    assert cb.session is None
    assert os.listdir(tmp / "tier") == []
    assert no_session_open()
    assert torch.save is teraio._torch_save  # the Session's torch.save wrapper is gone


def test_gradient_accumulation_evaluation_and_best_model(tmp_path):
    # Two micro-batches per optimizer step; evaluation every 2 steps, a checkpoint when the metric
    # is the best yet (save_strategy="best": decided after the evaluation), which with
    # greater_is_better on the loss is the first one; it is loaded at the end while the Session is
    # open.
    args = dict(max_steps=4, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2,
                save_strategy="best", per_device_eval_batch_size=2, load_best_model_at_end=True,
                metric_for_best_model="loss", greater_is_better=True)
    ref_trainer, ref_model = train(tmp_path / "ref", **args)
    cb = callback(tmp_path / "tier")
    got_trainer, got_model = train(tmp_path / "got", callbacks=[cb], **args)
    for key in ("loss", "grad_norm", "eval_loss"):
        assert logged(got_trainer, key) == logged(ref_trainer, key), key
    assert len(logged(got_trainer, "eval_loss")) == 2
    assert got_trainer.state.best_global_step == ref_trainer.state.best_global_step == 2
    assert sorted(os.listdir(tmp_path / "got")) == ["checkpoint-2"]
    assert_same_parameters(ref_model, got_model)
    st = cb.stats()
    assert st["iteration"] == 4 and st["drift_events"] == 0, st  # micro-steps are inside one step
    assert st["bytes_offloaded"] > 0, st
    assert cb.session is None and os.listdir(tmp_path / "tier") == []


@pytest.mark.parametrize("watch", [True, False])
def test_default_optimizer_and_gradient_clipping_under_a_budget_below_the_gradients(tmp_path,
                                                                                   watch):
    # The Trainer's defaults: fused AdamW (one operator over 1.4 MiB of parameters, gradients and
    # states) and max_grad_norm=1.0 (a norm over 352 KiB of gradients), under 300 KiB: the
    # callback runs the optimizer step and the norm in parts, bitwise as without teraio (also
    # with watch=False, which only stops naming tensors).
    ref_trainer, ref_model = train(tmp_path / "ref", optimizer=False, save_strategy="no")
    assert type(ref_trainer.optimizer.optimizer).__name__ == "AdamW"
    assert ref_trainer.optimizer.optimizer.param_groups[0]["fused"]
    assert ref_trainer.args.max_grad_norm == 1.0
    cb = callback(tmp_path / "tier", budget="300KiB", watch=watch)
    got_trainer, got_model = train(tmp_path / "got", callbacks=[cb], optimizer=False,
                                   save_strategy="no")
    for key in ("loss", "grad_norm", "learning_rate"):
        assert logged(got_trainer, key) == logged(ref_trainer, key), key
    assert_same_parameters(ref_model, got_model)
    st = cb.stats()
    assert st["iteration"] == STEPS and st["mode"] == "planned" and st["drift_events"] == 0, st
    assert st["bytes_offloaded"] > 0, st
    assert torch.nn.utils.clip_grad_norm_ is torch_clip  # put back when the Session closed
    assert "step" not in got_trainer.optimizer.optimizer.__dict__


class VaryingTokens(torch.utils.data.Dataset):
    """Sequences of 5 to 17 tokens, as a tokenized text dataset has them."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(5, 18, (n,), generator=g)
        self.ids = [torch.randint(0, 128, (int(k),), generator=g) for k in lengths]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def pad_to_longest(items):
    """Dynamic padding, as the Trainer's collators do it: each batch as long as its longest item."""
    n = max(len(x["input_ids"]) for x in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    labels = torch.full((len(items), n), -100, dtype=torch.long)
    mask = torch.zeros(len(items), n, dtype=torch.long)
    for i, x in enumerate(items):
        k = len(x["input_ids"])
        ids[i, :k], labels[i, :k], mask[i, :k] = x["input_ids"], x["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def test_dynamic_padding_runs_planned_steps(tmp_path, monkeypatch):
    # Batches padded to their longest item: a batch shorter than one planned before runs that
    # plan (docs/pytorch.md, "Batches of varying length"); bitwise as without teraio.
    data = VaryingTokens(32, 3)
    monkeypatch.setattr(transformers.Trainer, "get_train_dataloader", lambda self: torch.utils.data.DataLoader(
        data, batch_size=2, shuffle=False, collate_fn=pad_to_longest))
    args = dict(max_steps=12, save_strategy="no")
    ref_trainer, ref_model = train(tmp_path / "ref", **args)
    cb = callback(tmp_path / "tier")
    got_trainer, got_model = train(tmp_path / "got", callbacks=[cb], **args)
    assert logged(got_trainer, "loss") == logged(ref_trainer, "loss")
    assert_same_parameters(ref_model, got_model)
    st = cb.stats()
    # Two profiled steps plan the second's length; later, a length planned before runs its plan,
    # a shorter one a longer length's plan, a longer one drifts and is planned.
    lengths = [max(len(data.ids[2 * i]), len(data.ids[2 * i + 1])) for i in range(12)]
    planned, within, drifts = {lengths[1]}, 0, 0
    for n in lengths[2:]:
        if n in planned:
            continue
        if n < max(planned):
            within += 1
        else:
            drifts += 1
            planned.add(n)
    assert within >= 2 and drifts >= 2, lengths
    assert st["mode"] == "planned" and st["plans_cached"] == len(planned), (lengths, st)
    assert (st["steps_on_larger_plans"], st["drift_events"]) == (within, drifts), (lengths, st)


class MyAdamW(torch.optim.AdamW):
    """A subclass: its step might couple parameters, so teraio does not run it in parts."""


@pytest.mark.parametrize("budget,optimizer,operator,fix", [
    # One parameter (the 32 KiB embedding) with its gradient and states is 128 KiB.
    ("100KiB", False, "_fused_adamw", "raise the budget"),
    # An optimizer teraio does not split steps every parameter in one operator.
    (BUDGET, (MyAdamW, {"lr": 1e-3, "fused": True}), "_fused_adamw",
     "teraio does not run MyAdamW steps in parts"),
], ids=["parameter-above-budget", "optimizer-not-split"])
def test_budget_error_propagates_names_the_trainer_fix_and_closes(tmp_path, budget, optimizer,
                                                                   operator, fix):
    cb = callback(tmp_path / "tier", budget=budget)
    with pytest.raises(teraio.Error) as info:
        train(tmp_path / "out", callbacks=[cb], max_steps=2, optimizer=optimizer)
    msg = str(info.value)
    assert "the step needs a budget of at least" in msg and operator in msg, msg
    assert fix in msg, msg
    if optimizer is not False:
        assert "optimizer_cls_and_kwargs" in msg, msg
    assert cb.session is None and os.listdir(tmp_path / "tier") == []
    assert torch.nn.utils.clip_grad_norm_ is torch_clip
    assert no_session_open()


def test_a_train_that_raises_elsewhere_leaves_the_session_to_with_or_the_next_train(tmp_path):
    class Boom(transformers.TrainerCallback):  # an error inside a step, not from teraio
        def on_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 1:
                raise RuntimeError("boom")

    cb = callback(tmp_path / "tier")
    with pytest.raises(RuntimeError, match="boom"):
        train(tmp_path / "a", callbacks=[Boom(), cb], close=False)
    assert cb.session is not None  # the Trainer called no callback after the error
    train(tmp_path / "b", callbacks=[cb], close=False, max_steps=2)  # closes the old one first
    assert cb.session is None and cb.stats()["iteration"] == 2
    with pytest.raises(RuntimeError, match="boom"):
        with cb:
            train(tmp_path / "c", callbacks=[Boom(), cb], close=False)
    assert cb.session is None and os.listdir(tmp_path / "tier") == []
    assert no_session_open()


def test_callback_arguments_are_checked_before_training(tmp_path):
    with pytest.raises(teraio.Error, match="unknown Session argument.*budget_bytes"):
        TeraioCallback("1MiB", [teraio.HostTier("1MiB")], budget_bytes=3)
    with pytest.raises(teraio.Error, match="tiers must be a list"):
        TeraioCallback("1MiB", teraio.HostTier("1MiB"))
    with pytest.raises(teraio.Error, match="at least one tier"):
        TeraioCallback("1MiB", [])
    with pytest.raises(teraio.Error, match="budget"):
        TeraioCallback("lots", [teraio.HostTier("1MiB")])
    with pytest.raises(teraio.Error, match="no train"):
        TeraioCallback("1MiB", [teraio.HostTier("1MiB")]).stats()


def test_import_teraio_does_not_import_transformers():
    code = "import sys, teraio; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_steps_in_backward_under_the_trainer(tmp_path):
    # TeraioCallback(step_in_backward=True) with the Trainer's fused AdamW, no clipping: bitwise the
    # losses and parameters of the Trainer without teraio, every parameter updated in backward.
    ref_trainer, ref_model = train(tmp_path / "ref", optimizer=False, save_strategy="no",
                                   max_grad_norm=0.0)
    class Updates(transformers.TrainerCallback):
        seen = []

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.seen.append(optimizer.optimizer._teraio_splitter.backward_updates)

    cb = callback(tmp_path / "tier", budget="300KiB", step_in_backward=True)
    got_trainer, got_model = train(tmp_path / "got", callbacks=[Updates(), cb], optimizer=False,
                                   save_strategy="no", max_grad_norm=0.0)
    for key in ("loss", "learning_rate"):
        assert logged(got_trainer, key) == logged(ref_trainer, key), key
    assert_same_parameters(ref_model, got_model)
    st = cb.stats()
    assert st["iteration"] == STEPS and st["mode"] == "planned" and st["drift_events"] == 0, st
    assert Updates.seen == [len(list(got_model.parameters()))] * STEPS
    assert "_teraio_splitter" not in got_trainer.optimizer.optimizer.__dict__  # closed
    assert st["bytes_offloaded"] > 0, st
    # The Trainer's defaults (clipping) would change the update: refused before training.
    cb = callback(tmp_path / "tier", step_in_backward=True)
    with pytest.raises(teraio.Error, match=r"max_grad_norm=1.0 \(clipping\).*max_grad_norm=0"):
        train(tmp_path / "clip", callbacks=[cb], save_strategy="no")
    assert no_session_open()
