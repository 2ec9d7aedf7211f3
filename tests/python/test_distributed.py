"""Data-parallel training under a teraio Session per rank (issue 7, CPU part): two processes with
gloo on CPU, each with its own Session, budget below its footprint and its own FileTier directory,
for DDP (with and without gradient_as_bucket_view) and FSDP2 (fully_shard). The final parameters
and the losses are bitwise those of the same run without teraio, on every rank, the ranks agree
with each other, the Sessions offloaded and ended in planned mode, and the tensors that went
through collectives were pinned (docs/pytorch.md, "Distributed training").

Each test starts 2 worker processes running this file (`python3 test_distributed.py MODE RANK
...`); a worker trains once without a Session and once with one, in the same process group, and
saves what it got for the test to compare. Rendezvous is through a FileStore in the test's
temporary directory, so no TCP port is fixed (gloo itself connects over loopback on ports the
kernel picks)."""
import os
import subprocess
import sys

import pytest
import torch

WORLD = 2
STEPS = 6
WIDTH = 512


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, 100))


def _batch(rank, step):
    # Each rank its own shard of the data.
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(32, 256, generator=g), torch.randint(0, 100, (32,), generator=g)


def _wrap(mode, model):
    import torch.distributed as dist
    if mode in ("ddp", "ddp-bucket-view"):
        # A small bucket cap gives several buckets (several allreduces in flight during backward).
        # gradient_as_bucket_view: the gradients are views of the buckets (pinned with them).
        return torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=1, gradient_as_bucket_view=mode == "ddp-bucket-view")
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    raise ValueError(mode)


def _full_params(mode, model):
    """Every parameter, whole (FSDP2 shards them: gathered here), on every rank."""
    out = []
    for name, p in model.named_parameters():
        if mode == "fsdp2":
            p = p.full_tensor()
        out.append((name, p.detach().clone()))
    return out


def _train(mode, rank, session=None):
    torch.manual_seed(0)
    model = _wrap(mode, _mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    losses = []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        ctx = session.step() if session is not None else _nothing()
        with ctx:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.detach().clone())
    if session is not None:
        session.fetch_all()
    return losses, _full_params(mode, model)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _worker(mode, rank, tmp, budget):
    import torch.distributed as dist

    import teraio
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, f"store-{mode}"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        ref = _train(mode, rank)
        files = os.path.join(tmp, f"rank{rank}")  # one directory (one SSD) per rank
        os.makedirs(files, exist_ok=True)
        with teraio.Session(budget=budget, tiers=[teraio.FileTier([files], "256MiB")],
                            min_tensor_bytes=4096) as s:
            got = _train(mode, rank, session=s)
            stats = s.stats()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save({"ref": ref, "got": got, "stats": stats},
               os.path.join(tmp, f"result-{mode}-{rank}.pt"))


def _run(tmp_path, mode, budget):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(__file__)] + sys.path if p)
    procs = [subprocess.Popen([sys.executable, __file__, mode, str(rank), str(tmp_path), budget],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in range(WORLD)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            outs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{out[-4000:]}"
    return [torch.load(tmp_path / f"result-{mode}-{rank}.pt") for rank in range(WORLD)]


def _check(results):
    for rank, r in enumerate(results):
        (ref_losses, ref_params), (losses, params) = r["ref"], r["got"]
        st = r["stats"]
        assert st["bytes_offloaded"] > 0 and st["bytes_prefetched"] > 0, (rank, st)
        assert st["mode"] == "planned" and st["plan_moves"] > 0, (rank, st)
        assert st["iteration"] == STEPS, (rank, st)
        assert st["last_error"] == "", (rank, st)
        for i, (a, b) in enumerate(zip(ref_losses, losses)):
            assert torch.equal(a, b), (rank, i, a, b)
        for (n, a), (_, b) in zip(ref_params, params):
            assert torch.equal(a, b), (rank, n)
    # The ranks trained one model: their parameters agree.
    for (n, a), (_, b) in zip(results[0]["got"][1], results[1]["got"][1]):
        assert torch.equal(a, b), n


# 8 MiB: the gradient buckets DDP keeps pinned (2.7 MiB) plus the largest operator's tensors and
# what the plan keeps resident around them fit. At 6 MiB the budget cannot be met and every step
# says so (teraio.Error); at 7 MiB some runs (gloo's timing decides) start planned steps with more
# resident than the plan expects and fall short by a few hundred KiB (docs/pytorch.md, "Status").
@pytest.mark.parametrize("mode", ["ddp", "ddp-bucket-view"])
def test_ddp_gloo_bitwise(tmp_path, mode):
    results = _run(tmp_path, mode, "8MiB")
    _check(results)
    for r in results:
        # DDP's gradient buckets (one gradient's worth) go through allreduce: they are pinned.
        assert r["stats"]["pinned_bytes"] > 0, r["stats"]


def test_fsdp2_gloo_bitwise(tmp_path):
    results = _run(tmp_path, "fsdp2", "8MiB")
    _check(results)
    for r in results:
        # The sharded gradients come out of reduce-scatter: pinned until zero_grad frees them.
        assert r["stats"]["pinned_bytes"] > 0, r["stats"]


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])


_FSDP2_SMALL_MOVES = r'''
import sys, torch, teraio
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
tmp = sys.argv[1]
dist.init_process_group("gloo", store=dist.FileStore(tmp + "/store", 1), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
opt = torch.optim.AdamW(model.parameters(), foreach=False)
with teraio.Session(budget="1MiB", tiers=[teraio.FileTier([tmp], "64MiB")], min_tensor_bytes=1024) as s:
    for i in range(4):
        with s.step():
            model(torch.randn(8, 256)).sum().backward()
            opt.step()
            opt.zero_grad()
    st = s.stats()
    assert st["mode"] == "planned" and st["bytes_offloaded"] > 0 and st["last_error"] == "", st
print("ok")
dist.destroy_process_group()
'''


def test_fsdp2_storages_without_bytes_are_not_tracked(tmp_path):
    """FSDP2 (one rank, fresh process) under a budget that moves its small tensors: a storage that
    holds no bytes when an operator first reads it is not tracked (lookup_or_bind), where binding it
    made a planned step fail with "BufferView: null pointer"."""
    r = subprocess.run([sys.executable, "-c", _FSDP2_SMALL_MOVES, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


_FSDP2_FREES_OFFLOADED = r"""
import contextlib, os, sys, torch, teraio
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
tmp = sys.argv[1]
dist.init_process_group("gloo", store=dist.FileStore(tmp + "/store", 1), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))

def build():
    torch.manual_seed(0)
    layers = []
    for _ in range(9):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
    # Unsharded from the forward all-gather until each layer's post-backward frees them: the first
    # layer's weight is not read in backward, so budgets below the step's footprint move it out.
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), foreach=False)

def train(step):
    model, opt = build()
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(5):
        with step():
            loss = model(torch.randn(8, 256, generator=g)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.full_tensor().clone() for p in model.parameters()]

runs = []
def run(budget):
    with teraio.Session(budget=budget, tiers=[teraio.FileTier([tmp], "64MiB")],
                        min_tensor_bytes=1024) as s:
        try:
            runs.append((budget, train(s.step), s.stats()))
        except teraio.Error as e:  # below what FSDP2's copy-out needs at once: said clearly
            assert "the step needs a budget of at least" in str(e), str(e)
            print(budget, "too small")
for budget in ["1MiB", "2MiB", "4MiB"]:
    run(budget)
# The search keeps writebacks only where its replay finds them faster, from operator times measured
# on this CPU: on a loaded machine none of the three may have them. More budgets then, so that the
# copies FSDP2's resize_(0) must wait for are made at least once.
extra = iter(["1536KiB", "3MiB", "1MiB", "2MiB", "1536KiB", "3MiB"])
while os.environ.get("TERAIO_WRITEBACKS") == "1" and not any(st["writebacks"] for _, _, st in runs):
    budget = next(extra, None)
    if budget is None:
        break
    run(budget)
want = train(contextlib.nullcontext)
resized = 0
for budget, got, st in runs:
    assert got[0] == want[0], (budget, got[0], want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1])), budget
    assert st["mode"] == "planned" and st["last_error"] == "", (budget, st)
    resized += st["owner_resizes"]
    print(budget, "bitwise", st["owner_resizes"], "owner resizes", st["writebacks"], "writebacks")
assert len(runs) >= 3 and resized > 0, (len(runs), resized)
if os.environ.get("TERAIO_WRITEBACKS") == "1":  # the copies FSDP2's resize_(0) must wait for
    assert sum(st["writebacks"] for _, _, st in runs) > 0, [st for _, _, st in runs]
print("ok")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("writebacks", ["0", "1"])
def test_fsdp2_frees_unsharded_parameters_teraio_offloaded(tmp_path, writebacks):
    """FSDP2 (one rank, reshard_after_forward=False) under budgets that move its unsharded parameters:
    FSDP2 frees them with untyped_storage().resize_(0) after backward, which PyTorch refuses for a
    storage whose bytes are in a tier ("invalid python storage"), and which a writeback's copy may
    still be reading (TERAIO_WRITEBACKS=1); teraio hands the storage over first (Note [Storages
    their owner resizes]). Each budget trains bitwise as without teraio, or says clearly that it is
    below what one FSDP2 operator needs."""
    env = dict(os.environ, TERAIO_WRITEBACKS=writebacks)
    r = subprocess.run([sys.executable, "-c", _FSDP2_FREES_OFFLOADED, str(tmp_path)], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
