"""Shared helpers for the teraio pytest suite: deterministic training with and without a Session."""
import copy
import os
import pathlib
import sys

import pytest

import torch

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


def train(make_model, make_batch, steps, session=None, optimizer="adamw", foreach=False, lr=1e-2,
          batches=None, after_step=None, zero_grad_after=False, step_in_backward=False):
    """Trains `steps` steps from seed 0; returns (losses, model, optimizer). after_step(i, model)
    runs after step i, outside it. zero_grad_after: each step frees the gradients right after
    optimizer.step() (as the HF Trainer does) instead of before the forward. step_in_backward:
    watch(..., step_in_backward=True)."""
    torch.manual_seed(0)
    model = make_model()
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=foreach)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=foreach)
    if session is not None:
        session.watch(model, opt, step_in_backward=step_in_backward)
    losses = []
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        batch = batches[i] if batches is not None else make_batch(g)
        if session is None:
            loss = step(model, opt, batch, zero_grad_after)
        else:
            with session.step():
                loss = step(model, opt, batch, zero_grad_after)
        losses.append(loss.detach().clone())
        if after_step is not None:
            after_step(i, model)
    return losses, model, opt


def step(model, opt, batch, zero_grad_after=False):
    if not zero_grad_after:
        opt.zero_grad()
    out = model(*batch[:-1])
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch[-1].reshape(-1))
    loss.backward()
    opt.step()
    if zero_grad_after:
        opt.zero_grad(set_to_none=True)
    return loss


def assert_bitwise(a, b):
    la, ma, oa = a
    lb, mb, ob = b
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert torch.equal(x, y), (x, y)
    for (n, p), (_, q) in zip(ma.named_parameters(), mb.named_parameters()):
        assert torch.equal(p, q), n
    for p, q in zip(ma.parameters(), mb.parameters()):
        sa, sb = oa.state[p], ob.state[q]
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


def footprint_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def trace_bounds(trace_path):
    """(the most bytes one operator touches, the most bytes alive at once) in a teraio.trace file:
    a budget between the two makes the planner move or recompute, and a budget under the first
    cannot be planned. Both depend on the machine's kernels (a CPU without bf16 convolutions runs
    autocast's conv2d through im2col buffers several times its input), so tests that need a budget
    below a model's footprint take it from here rather than a fixed size."""
    import json
    t = json.loads(pathlib.Path(trace_path).read_text())
    size = {x["id"]: x["bytes"] for x in t["tensors"]}
    first, last = {}, {}
    for k, kern in enumerate(t["kernels"]):
        for i in kern["tensors"]:
            first.setdefault(i, k)
            last[i] = k
    persistent = sum(x["bytes"] for x in t["tensors"] if x.get("persistent"))
    delta = [0] * (len(t["kernels"]) + 1)
    for x in t["tensors"]:
        if not x.get("persistent") and x["id"] in first:
            delta[first[x["id"]]] += x["bytes"]
            delta[last[x["id"]] + 1] -= x["bytes"]
    live, peak = persistent, persistent
    for d in delta:
        live += d
        peak = max(peak, live)
    widest = max(sum(size[i] for i in set(k["tensors"])) for k in t["kernels"])
    return widest, peak


class TinyLlama(torch.nn.Module):
    """A LlamaForCausalLM from a config (needs transformers): 2 layers, hidden 64, vocab 128,
    eager attention; forward(ids) returns the logits."""

    def __init__(self, intermediate_size=128):
        super().__init__()
        import transformers
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=intermediate_size,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64)
        cfg._attn_implementation = "eager"
        self.m = transformers.LlamaForCausalLM(cfg)

    def forward(self, ids):
        return self.m(input_ids=ids).logits


def length_batches(lengths, batch=2):
    """TinyLlama batches of `batch` sequences, the i-th `lengths[i]` tokens long (dynamic padding:
    each batch as long as its longest sequence), with their next tokens; the same every call."""
    g = torch.Generator().manual_seed(1)
    out = []
    for n in lengths:
        ids = torch.randint(0, 128, (batch, n + 1), generator=g)
        out.append((ids[:, :-1], ids[:, 1:]))
    return out


def token_batch(batch, seq):
    """A make_batch for TinyLlama: `batch` sequences of `seq` tokens and their next tokens."""
    def make(g):
        ids = torch.randint(0, 128, (batch, seq + 1), generator=g)
        return (ids[:, :-1], ids[:, 1:])
    return make
