#!/usr/bin/env python3
"""Step time of a foreach or fused AdamW run in parts (Session.watch(optimizer=...)) against
per-parameter AdamW (foreach=False), under the same Session budget and tiers (issue 17; CPU).

A tiny LlamaForCausalLM (random init, fp32, eager attention), --batch x --seq random tokens per
step. For each optimizer of --optimizers (foreach-false, foreach, fused) and each of --rounds
rounds (the optimizers interleaved, so that load on a shared machine falls on all of them):
  (a) without teraio, (b) inside `with session.step():` of a Session whose budget is --budget of
  the parameters + gradients + 2 AdamW states (a fraction such as 1/4, or a size), watching the
  model and optimizer, with a HostTier of --host-tier and a FileTier in a temporary directory.
--warmup steps are not measured (the Session's profiling steps and the first planned one), then
--steps steps are: the whole step and optimizer.step() alone (perf_counter). The final parameters
of (b) are compared with (a) (torch.equal). Prints one line per optimizer and mode: median
[min, max] over all measured steps of all rounds, in ms; writes --json when given.

  PYTHONPATH=python python3 bench/optim_parts.py --hidden 256 --layers 4 --budget 1/4
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import transformers

import teraio

OPTIMIZERS = {
    "foreach-false": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def make_model(a):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                                   intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=a.seq)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg)


def run(a, name, budget, tier_dir):
    model = make_model(a)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **OPTIMIZERS[name])
    session = None
    if budget is not None:
        session = teraio.Session(budget=budget, tiers=[
            teraio.HostTier(a.host_tier), teraio.FileTier([tier_dir], "4GiB")],
            min_tensor_bytes=4096)
        session.watch(model, opt)
    g = torch.Generator().manual_seed(1)
    steps, opt_steps = [], []
    try:
        for i in range(a.warmup + a.steps):
            ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
            t0 = time.perf_counter()
            ctx = session.step() if session is not None else _null()
            with ctx:
                model(input_ids=ids, labels=ids).loss.backward()
                t1 = time.perf_counter()
                opt.step()
                t2 = time.perf_counter()
                opt.zero_grad()
            t3 = time.perf_counter()
            if i >= a.warmup:
                steps.append((t3 - t0) * 1e3)
                opt_steps.append((t2 - t1) * 1e3)
        stats = None
        if session is not None:
            session.fetch_all()
            stats = session.stats()
            parts = getattr(opt, "_teraio_splitter", None)
            stats["optimizer_parts"] = parts.parts if parts is not None else 0
        params = [p.detach().clone() for p in model.parameters()]
    finally:
        if session is not None:
            session.close()
    return steps, opt_steps, params, stats


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--budget", default="1/4", help="a fraction of parameters + gradients + 2 "
                                                     "AdamW states, or a size such as 8MiB")
    ap.add_argument("--host-tier", default="1GiB")
    ap.add_argument("--optimizers", default="foreach-false,foreach,fused")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()

    state = 4 * sum(p.numel() * p.element_size() for p in make_model(a).parameters())
    if "/" in a.budget:
        n, d = a.budget.split("/")
        budget = state * int(n) // int(d)
    else:
        budget = teraio.parse_size(a.budget)
    names = a.optimizers.split(",")
    print(f"Llama {a.hidden}x{a.layers}, vocab {a.vocab}: training state {state / 2**20:.2f} MiB, "
          f"budget {budget / 2**20:.2f} MiB; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {a.threads} thread(s), torch {torch.__version__}")
    results = {n: {"ref": ([], []), "teraio": ([], []), "bitwise": True, "stats": None}
               for n in names}
    with tempfile.TemporaryDirectory(prefix="teraio-optim-parts-") as tier_dir:
        for _ in range(a.rounds):
            for name in names:
                r = results[name]
                s, o, ref_params, _ = run(a, name, None, tier_dir)
                r["ref"][0].extend(s)
                r["ref"][1].extend(o)
                s, o, params, stats = run(a, name, budget, tier_dir)
                r["teraio"][0].extend(s)
                r["teraio"][1].extend(o)
                r["bitwise"] &= all(torch.equal(p, q) for p, q in zip(ref_params, params))
                r["stats"] = stats
    out = {"config": vars(a), "state_bytes": state, "budget_bytes": budget, "results": {}}
    for name in names:
        r = results[name]
        st = r["stats"]
        row = {"ref_step_ms": summary(r["ref"][0]), "ref_opt_ms": summary(r["ref"][1]),
               "teraio_step_ms": summary(r["teraio"][0]), "teraio_opt_ms": summary(r["teraio"][1]),
               "bitwise": r["bitwise"], "optimizer_parts": st["optimizer_parts"],
               "bytes_offloaded": st["bytes_offloaded"], "mode": st["mode"],
               "drift_events": st["drift_events"]}
        out["results"][name] = row
        f = lambda s: f"{s['median']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"  # noqa: E731
        print(f"{name:14s} without teraio: step {f(row['ref_step_ms'])} ms, optimizer "
              f"{f(row['ref_opt_ms'])} ms | teraio: step {f(row['teraio_step_ms'])} ms, optimizer "
              f"{f(row['teraio_opt_ms'])} ms, {row['optimizer_parts']} parts, "
              f"{st['bytes_offloaded'] / 2**20:.0f} MiB offloaded, {st['mode']}, "
              f"drift {st['drift_events']}, bitwise {row['bitwise']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if all(results[n]["bitwise"] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
