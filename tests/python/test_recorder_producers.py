"""The Session's traces carry producers (teraio.trace v2): every tensor made in the profiled step
names the operator that made it, and is recomputable only when rerunning that operator gives the
same bytes (src/offload/recorder.cpp, Note [Recomputable tensors]): not after dropout, not when
written in place later (directly or through a view), never for views (a view is no tensor of its
own: its storage's producer made the bytes) nor for parameters. Training stays bitwise."""
import json

import pytest
import torch

import teraio
from conftest import assert_bitwise, train

D = 256  # biases of D floats are 1 KiB: tracked with min_tensor_bytes=1024


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(D, D)
        self.l2 = torch.nn.Linear(D, D)
        self.l3 = torch.nn.Linear(D, D)
        self.drop = torch.nn.Dropout(0.25)
        self.out = torch.nn.Linear(D, 16)

    def forward(self, x):
        a = torch.tanh(self.l1(x))   # linear, tanh: recomputable
        b = self.l2(a)
        b.relu_()                    # written in place after its production
        c = self.drop(b)             # random numbers
        h = self.l3(c)
        h.view(-1).mul_(0.5)         # written through a view
        return self.out(torch.sigmoid(h))


def batch(g):
    return torch.randn(32, D, generator=g), torch.randint(0, 16, (32,), generator=g)


def session(tmp_path, **kw):
    return teraio.Session(budget="1MiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                          min_tensor_bytes=1024, **kw)


def test_trace_has_producers_and_recomputable_verdicts(tmp_path):
    path = tmp_path / "trace.json"
    with session(tmp_path, trace_path=str(path)) as s:
        train(Net, batch, 3, session=s)
    t = json.loads(path.read_text())
    assert t["format"] == "teraio.trace" and t["version"] == 2
    names = [k["name"] for k in t["kernels"]]
    made = {}  # producer kernel name -> [tensor, ...] in kernel order
    for x in t["tensors"]:
        if "producer" in x:
            assert not x["persistent"]
            assert x["id"] in t["kernels"][x["producer"]]["tensors"]
            made.setdefault(names[x["producer"]], []).append(x)
        else:
            assert "recomputable" not in x
    for x in t["tensors"]:
        if x["kind"] == "parameter":
            assert x["persistent"] and "producer" not in x, x
    activations = [x for x in t["tensors"] if x["kind"] == "activation" and not x["persistent"]]
    assert activations and all("producer" in x for x in activations), activations
    # Forward linears in order: l1 (recomputable), l2 (relu_ after), l3 (written through a view).
    linears = made["aten::linear"]
    assert [x["recomputable"] for x in linears[:3]] == [True, False, False], linears
    assert all(x["recomputable"] for x in made["aten::tanh"]), made["aten::tanh"]
    dropped = [x for n, xs in made.items() if "dropout" in n for x in xs]
    assert dropped and not any(x["recomputable"] for x in dropped), dropped
    # The in-place operators and the view produce nothing: their outputs alias an input.
    assert "aten::relu_" in names and "aten::view" in names and "aten::mul_" in names
    assert not {"aten::relu_", "aten::view", "aten::mul_"} & made.keys(), made.keys()
    # Backward operators may use atomics: never recomputable.
    backward = [x for n, xs in made.items() if n.endswith("_backward") for x in xs]
    assert backward and not any(x["recomputable"] for x in backward)


def test_training_with_producers_recorded_is_bitwise(tmp_path):
    ref = train(Net, batch, 5)
    with session(tmp_path) as s:
        got = train(Net, batch, 5, session=s)
        st = s.stats()
    assert_bitwise(ref, got)
    assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, st  # plans were executed


def test_tiny_llama_trace_marks_decoder_activations(tmp_path):
    pytest.importorskip("transformers")
    from test_bitwise import LlamaWrap, llama_batch
    path = tmp_path / "trace.json"
    ref = train(LlamaWrap, llama_batch, 3, lr=1e-3)
    with teraio.Session(budget="160KiB", tiers=[teraio.FileTier([str(tmp_path)], "64MiB")],
                        min_tensor_bytes=256, trace_path=str(path)) as s:
        got = train(LlamaWrap, llama_batch, 3, session=s, lr=1e-3)
    assert_bitwise(ref, got)
    t = json.loads(path.read_text())
    assert t["version"] == 2
    names = [k["name"] for k in t["kernels"]]
    acts = [x for x in t["tensors"] if x["kind"] == "activation" and not x["persistent"]]
    assert acts and all("producer" in x for x in acts)
    by_op = {}
    for x in acts:
        by_op.setdefault(names[x["producer"]], []).append(x["recomputable"])
    # The MLP's activation function and the projections are rerunnable; each layer has one.
    assert by_op["aten::silu"] == [True, True], by_op
    assert any(by_op["aten::linear"]), by_op
    # matmul's internal copies saved for backward are made by nested operators from matmul's own
    # inputs: recomputable by those operators alone, reading only what matmul lists
    # (recompute_inputs; Note [Nested producers]).
    internals = [x for x in acts if names[x["producer"]] == "aten::matmul" and "recompute_inputs" in x]
    assert internals and all(x["recomputable"] for x in internals), by_op
    for x in internals:
        listed = t["kernels"][x["producer"]]["tensors"]
        assert x["recompute_inputs"] and set(x["recompute_inputs"]) <= set(listed), x
        assert x["id"] not in x["recompute_inputs"], x
