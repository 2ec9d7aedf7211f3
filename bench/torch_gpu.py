"""GPU checks of the PyTorch integration (run by bench/torch_gpu.sh on the H200):
1. bitwise: parameters and losses after several steps are equal with and without teraio on CUDA
   (deterministic algorithms), for an MLP, a small CNN and a HF Llama built from a config, with a
   budget below the footprint (host + file tiers), reactive, planned and planned with
   stream_ordered_offloads; stats and max_memory_allocated are recorded;
2. overhead: step time of a Llama with a budget that holds everything (empty plan) vs without
   teraio, median of many steps.
Writes one JSON file with everything to argv[1]. TORCH_GPU_CASES=a,b runs those cases alone;
TORCH_GPU_BITWISE_ONLY=1 leaves out the overhead measurement."""
import gc
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch

import teraio

torch.use_deterministic_algorithms(True)
dev = torch.device(os.environ.get("TERAIO_CHECK_DEVICE", "cuda"))
if dev.type == "cpu":  # smoke test of this script on a machine without a GPU
    for _name, _value in [("synchronize", None), ("reset_peak_memory_stats", None), ("empty_cache", None),
                          ("max_memory_allocated", 0), ("get_device_name", "cpu")]:
        setattr(torch.cuda, _name, lambda *a, _v=_value, **k: _v)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                               torch.nn.GELU(), torch.nn.Linear(4096, 1000))


def mlp_batch(g):
    return (torch.randn(256, 1024, generator=g), torch.randint(0, 1000, (256,), generator=g))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 64, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(64)
        self.c2 = torch.nn.Conv2d(64, 128, 3, padding=1)
        self.fc = torch.nn.Linear(128 * 8 * 8, 1000)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def cnn_batch(g):
    return (torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 1000, (64,), generator=g))


def llama_factory(hidden, layers, vocab=32000):
    import transformers

    class Llama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4,
                                           num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                                           num_key_value_heads=max(1, hidden // 128), max_position_embeddings=2048)
            cfg._attn_implementation = "eager"
            self.m = transformers.LlamaForCausalLM(cfg)

        def forward(self, ids):
            return self.m(input_ids=ids).logits

    def batch(g, seq=256, bs=4):
        ids = torch.randint(0, vocab, (bs, seq + 1), generator=g)
        return (ids[:, :-1], ids[:, 1:])

    return Llama, batch


def train_step(model, opt, batch, session=None, amp=False, zero_after=False):
    """One timed training step (CUDA-synchronised on both ends): (detached loss, seconds). `amp`:
    the forward under bf16 autocast (fp32 parameters and AdamW states), as users train.
    `zero_after`: gradients freed right after optimizer.step() (so dead once the optimizer read
    them: the Session discards them) instead of before the forward."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with (session.step() if session is not None else _null()):
        if not zero_after:
            opt.zero_grad()
        with (torch.autocast(dev.type, dtype=torch.bfloat16) if amp else _null()):
            out = model(*batch[:-1])
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch[-1].reshape(-1))
        loss.backward()
        opt.step()
        if zero_after:
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return loss.detach(), time.perf_counter() - t0


def run(make_model, make_batch, steps, session=None, lr=1e-3, peak_from=None, amp=False,
        zero_after=False, in_backward=False):
    """Trains `steps` steps. Returns (losses, model, optimizer, step times, peak, per-step Session
    counters): with `peak_from`, the allocator's peak is reset before that step, so `peak` is the
    later steps' max_memory_allocated. `in_backward`: watch(..., step_in_backward=True)."""
    torch.manual_seed(0)
    model = make_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    if session is not None:
        session.watch(model, opt, step_in_backward=in_backward)
    g = torch.Generator().manual_seed(1)
    losses, times, per_step = [], [], []
    for i in range(steps):
        if peak_from is not None and i == peak_from:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        loss, seconds = train_step(model, opt, [t.to(dev) for t in make_batch(g)], session, amp,
                                   zero_after)
        times.append(seconds)
        losses.append(loss.clone())
        if session is not None:  # per-step counters, to see which steps leave the plan
            st = session.stats()
            per_step.append({k: st[k] for k in ("mode", "step_peak_resident_bytes", "urgent_fetches", "evictions",
                                                "skipped_moves", "aligned_moves", "plan_moves", "recomputes", "clean_offloads",
                                                "stream_ordered_offloads", "discards")})
    return losses, model, opt, times, torch.cuda.max_memory_allocated(), per_step


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def to_cpu(result):
    """Losses and named parameters on the CPU (the reference must not occupy the GPU)."""
    losses, model = result[0], result[1]
    return [x.cpu() for x in losses], [(n, p.detach().cpu()) for n, p in model.named_parameters()]


def equal(a, b):
    la, pa = a
    lb, pb = b
    bad = [i for i, (x, y) in enumerate(zip(la, lb)) if not torch.equal(x, y)]
    badp = [n for (n, p), (_, q) in zip(pa, pb) if not torch.equal(p, q)]
    return not bad and not badp, {"losses_differ_at": bad, "params_differ": badp[:5]}


def footprint(model_fn):
    """(bytes of params + grads + 2 Adam states, bytes of the largest parameter)."""
    torch.manual_seed(0)
    m = model_fn()
    sizes = [p.numel() * p.element_size() for p in m.parameters()]
    return 4 * sum(sizes), max(sizes)


def nested_recomputes(trace_path, plan_path):
    """Recompute moves of the plan whose tensor a nested operator made (autocast's copies:
    docs/formats.md, "Recompute", recompute_inputs); None when a file is missing."""
    try:
        with open(trace_path) as f:
            nested = {t["id"] for t in json.load(f)["tensors"] if "recompute_inputs" in t}
        with open(plan_path) as f:
            return sum(1 for m in json.load(f)["moves"] if m["op"] == "recompute" and m["tensor"] in nested)
    except (OSError, ValueError, KeyError):
        return None


def main(out_path):
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "bitwise": {}, "overhead": {}}
    tmp = tempfile.mkdtemp(prefix="teraio-gpu-", dir=os.environ.get("TERAIO_FILE_DIR", "/tmp"))
    llama, llama_batch = llama_factory(512, 4, vocab=4096)
    # llama-amp: bf16 autocast over fp32 parameters and states (recompute and clean offloads are
    # the Session's defaults, so the planned modes exercise both)
    # llama-amp-dead: gradients freed right after optimizer.step(), so dead tensors (discards) run;
    # llama-amp-inbwd: that, with each parameter's AdamW update run in backward
    # (watch(..., step_in_backward=True)); both in the Session's default mode only
    all_modes = (("reactive", False, False), ("planned", True, False), ("planned-sof", True, True))
    cases = [("mlp", mlp, mlp_batch, False, {}), ("cnn", CNN, cnn_batch, False, {}),
             ("llama", llama, llama_batch, False, {}), ("llama-amp", llama, llama_batch, True, {}),
             ("llama-amp-dead", llama, llama_batch, True, dict(zero_after=True)),
             ("llama-amp-inbwd", llama, llama_batch, True, dict(zero_after=True, in_backward=True))]
    only = os.environ.get("TORCH_GPU_CASES")  # e.g. "llama-amp,llama-amp-inbwd": those cases alone
    if only:
        cases = [c for c in cases if c[0] in only.split(",")]
    for name, mf, bf, amp, opts in cases:
        # planned-sof: Session(stream_ordered_offloads=True), offloads due waited for on the GPU
        for mode, planning, sof in (all_modes if not opts else all_modes[2:]):
            key = f"{name}-{mode}"
            s = None
            try:
                # the last case's model and optimizer are garbage in reference cycles (torch's
                # optimizers are in one): collect them, or the Session counts their device memory
                # as used outside its tensors
                gc.collect()
                torch.cuda.empty_cache()
                ref = to_cpu(run(mf, bf, 6, amp=amp, zero_after=opts.get("zero_after", False)))
                fp, largest = footprint(mf)
                # below the footprint, above what one AdamW operator needs (addcdiv_: 3 tensors),
                # plus room for what is not a tracked tensor (cuBLAS/cuDNN workspaces, the batch:
                # 70-90 MiB measured on the H200)
                budget = max(fp // 2, 4 * largest) + (128 << 20)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                trace_path, plan_path = os.path.join(tmp, f"{key}.trace.json"), os.path.join(tmp, f"{key}.plan.json")
                s = teraio.Session(budget=budget, tiers=[teraio.HostTier(fp // 2), teraio.FileTier([tmp], 4 * fp)],
                                   planning=planning, min_tensor_bytes=65536, stream_ordered_offloads=sof,
                                   trace_path=trace_path, plan_path=plan_path)
                # 2 profiling steps, then planned ones: the planned steps' peak must fit the budget
                got = run(mf, bf, 6, session=s, peak_from=3 if planning else None, amp=amp, **opts)
                st = s.stats()
                peak, per_step = got[4], got[5]
                s.fetch_all()
                ok, why = equal(ref, to_cpu(got))
                del got
                res["bitwise"][key] = {"equal": ok, **why, "footprint_bytes": fp, "budget_bytes": budget,
                                       "max_memory_allocated": peak, "stats": st,
                                       "per_step": per_step}
                if planning:  # steps 4-6 are planned: torch.cuda.max_memory_allocated() <= budget
                    res["bitwise"][key]["planned_peak_within_budget"] = peak <= budget
                    res["bitwise"][key]["nested_recomputes"] = nested_recomputes(trace_path, plan_path)
            except Exception as e:  # record and go on
                res["bitwise"][key] = {"equal": False, "error": repr(e)}
            finally:
                if s is not None:
                    s.close()
            print(key, json.dumps(res["bitwise"][key])[:400], flush=True)
    # Overhead with an empty plan (the budget holds everything). One model and optimizer, blocks of
    # steps alternating without and with a Session (its 2 profiling steps are not timed), so that
    # clock and allocator drift show as spread instead of as overhead.
    # TORCH_GPU_BITWISE_ONLY=1: the bitwise checks alone (a short device call)
    overheads = [("overhead", 1024, 8, 256), ("overhead_gpu_bound", 2048, 8, 1024)]
    if os.environ.get("TORCH_GPU_BITWISE_ONLY") == "1":
        overheads = []
    for name, hidden, layers, seq in overheads:
        res[name] = overhead(*llama_factory(hidden, layers), seq)
        print(name, res[name], flush=True)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    ok = all(v.get("equal") and v.get("planned_peak_within_budget", True) for v in res["bitwise"].values())
    return 0 if ok else 1


def overhead(big, big_batch, seq):
    block = int(os.environ.get("TERAIO_OVERHEAD_STEPS", "15"))
    rounds = int(os.environ.get("TERAIO_OVERHEAD_ROUNDS", "4"))
    torch.manual_seed(0)
    model = big().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    g = torch.Generator().manual_seed(1)

    def timed_steps(n, s=None):
        return [train_step(model, opt, [t.to(dev) for t in big_batch(g, seq=seq)], s)[1] for _ in range(n)]

    timed_steps(5)  # warm-up
    base_med, ter_med, st = [], [], {}
    for _ in range(rounds):
        base_med.append(statistics.median(timed_steps(block)))
        s = teraio.Session(budget="120GiB", tiers=[teraio.HostTier("1GiB")])
        timed_steps(2, s)  # profiling, then the (empty) plan
        ter_med.append(statistics.median(timed_steps(block, s)))
        st = s.stats()
        s.close()
    b = statistics.median(base_med)
    w = statistics.median(ter_med)
    return {"baseline_step_s": base_med, "teraio_step_s": ter_med,
            "overhead_pct": 100.0 * (w - b) / b,
            "paired_overhead_pct": [100.0 * (y - x) / x for x, y in zip(base_med, ter_med)],
            "baseline_spread_pct": 100.0 * (max(base_med) - min(base_med)) / b,
            "operators_per_step": st["operators"], "plan_moves": st["plan_moves"],
            "per_operator_us": 1e6 * (w - b) / max(1, st["operators"]),
            "mode": st["mode"], "steps_per_block": block, "rounds": rounds, "seq": seq}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
