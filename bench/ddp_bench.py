#!/usr/bin/env python3
"""Data-parallel (DDP) training under a teraio Session per rank: throughput scaling from one to
several GPUs at the same per-GPU budget, and bitwise equality with the same run without offloading
(issue 7).

What is measured, for each world size W of --world (one process per rank, rank r on cuda:r with
NCCL, or on the CPU with gloo):
  (a) reference: a HF LlamaForCausalLM (random init, the same seed on every rank, fp32) wrapped in
      DistributedDataParallel, AdamW (lr 1e-4, foreach=False), --warmup + --steps steps, each rank
      training on its own seeded shard of --batch x --seq tokens per step;
  (b) teraio: the same run, same seeds, inside `with session.step():` of a teraio.Session per rank
      whose budget is --budget (a size, or a fraction "1/2" of the reference run's
      torch.cuda.max_memory_allocated() over the measured steps on that rank; on the CPU, of the
      parameters + gradients + 2 AdamW states), each rank offloading to its own tiers.
Per rank: every step's time (between torch.cuda.synchronize() calls; the warm-up steps are not
measured: the Session's profiling steps, the step that DDP's bucket rebuild makes it profile again
and the first planned step), the losses, max_memory_allocated over the measured steps, the
Session's stats. Then every loss and every parameter of (b) is compared with (a) on every rank
(torch.equal), and the ranks' parameters with each other (SHA-256 of their bytes).
A step of W ranks lasts as long as its slowest rank (DDP's allreduce joins them): tokens/s of a
world size = W x batch x seq / mean over the measured steps of the slowest rank's step time.
Scaling efficiency of W = tokens/s(W) / (W / W0 x tokens/s(W0)), W0 the smallest world size run
(1 with --world 1,2), for the reference and for teraio.

Output in --out: ddp_bench_<model>_w<W>.json per world size (config, per-rank results, aggregate
throughput, bitwise results; a failing run still writes it, with the error and traceback tail of
every rank) and ddp_bench_<model>_summary.json (tokens/s, scaling efficiency, bitwise, bytes
offloaded per rank). Exit status 1 when a run failed or a comparison did not hold.

On the machine with 2 H200s (NCCL; NCCL_NVLS_ENABLE=0 is set for the workers: NVLink multicast
must stay off there):
  python3 bench/ddp_bench.py --world 1,2 --model llama-1b --budget 1/2 --steps 5 --out out/ddp-1b
  python3 bench/ddp_bench.py --world 1,2 --model llama-3b --budget 1/2 --steps 3 --out out/ddp-3b
  python3 bench/ddp_bench.py --world 1,2 --model llama-1b --budget 1/4 --steps 3 --out out/ddp-disk \\
      --tiers host+disk --host-gib 8 --disk-dir "$DISK_DIR"
Every rank pins its own HostTier (--host-gib, 64 GiB by default); the per-rank FileTier directory
is --disk-dir/rank<r> (created if missing; make it a link to that rank's own SSD to give every GPU
its own disk). teraio must be importable (pip install . or PYTHONPATH=python with the extension
built in place).

CPU smoke test (gloo, 2 processes, a few minutes at most on 2 cores):
  python3 bench/ddp_bench.py --device cpu --world 1,2 --model tiny --budget 1/2 --steps 4 \\
      --tiers host+disk --disk-dir /tmp --out /tmp/ddpout
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# The model shapes, AdamW hyper-parameters, size parser and environment record of the single-GPU
# benchmark (bench/llm_bench.py, stdlib-only at import), so that both measure the same models.
from llm_bench import BETAS, EPS, LR, WEIGHT_DECAY, _HelpFormatter, environment, parse_size
from llm_bench import MODELS as LLM_BENCH_MODELS

MODELS = {name: LLM_BENCH_MODELS[name] for name in ("tiny", "llama-1b", "llama-3b")}
PROFILING_ITERATIONS = 2  # teraio.Session's default


# The Session's fields are teraio's lists: per step every field but the tiers (teraio.STATS_FIELDS),
# and for the measured steps the deltas of the cumulative ones (teraio.STATS_COUNTERS).
def step_keys(teraio):
    return tuple(k for k in teraio.STATS_FIELDS if k != "tiers")


def log(msg: str, tag: str = "") -> None:
    # One write per line: the ranks share stdout and their lines must not interleave.
    sys.stdout.write(f"[ddp_bench {time.strftime('%H:%M:%S')}{tag}] {msg}\n")
    sys.stdout.flush()


def budget_arg(text: str) -> str:
    """A size ("12GiB") or a fraction "N/D" of the reference run's memory (checked here, applied by
    each rank once its reference run has measured that memory)."""
    if "/" in text:
        num, _, den = text.partition("/")
        try:
            frac = float(num) / float(den)
        except (ValueError, ZeroDivisionError):
            frac = 0.0
        if not 0 < frac:
            raise argparse.ArgumentTypeError(f"not a fraction: {text!r} (example: 1/2)")
        return text
    parse_size(text)
    return text


def worlds_arg(text: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",")]
    except ValueError:
        worlds = []
    if not worlds or min(worlds) < 1 or len(set(worlds)) != len(worlds):
        raise argparse.ArgumentTypeError(f"not a list of distinct world sizes: {text!r} (example: 1,2)")
    return sorted(worlds)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="ddp_bench.py",
        description="DDP training of a randomly initialised HF Llama model, one process per rank, once "
                    "without teraio and once with a teraio.Session per rank, for each world size: "
                    "throughput scaling and bitwise equality (issue 7). Writes one JSON per world size and "
                    "a summary JSON; exit status 1 if a run fails or a comparison does not hold.",
        formatter_class=_HelpFormatter,
        epilog="models: " + "; ".join(
            f"{k} (hidden {v['hidden_size']}, {v['num_hidden_layers']} layers, {v['num_attention_heads']} heads, "
            f"kv {v['num_key_value_heads']}, ffn {v['intermediate_size']}, vocab {v['vocab_size']})"
            for k, v in MODELS.items()) + " (shapes of bench/llm_bench.py). Run with 2 GPUs: "
            "python3 bench/ddp_bench.py --world 1,2 --model llama-1b --budget 1/2 --steps 5 --out out/ddp")
    p.add_argument("--world", type=worlds_arg, default="1,2",
                   help="comma-separated world sizes (processes, one GPU each on cuda), each run in turn")
    p.add_argument("--model", default="tiny", choices=list(MODELS), help="model shape (listed at the end)")
    p.add_argument("--budget", type=budget_arg, default="1/2",
                   help="teraio budget per rank: a size (12GiB, 500MB) or a fraction N/D of the reference run's "
                        "torch.cuda.max_memory_allocated() over the measured steps on that rank (on cpu: of the "
                        "parameter + gradient + 2 AdamW state bytes)")
    p.add_argument("--steps", type=int, default=5, help="measured steps after the warm-up")
    p.add_argument("--warmup", type=int, default=PROFILING_ITERATIONS + 2,
                   help="unmeasured steps first, at least the Session's profiling steps + 1. The default also "
                        "skips the step that DDP's bucket rebuild (in step 2) makes teraio profile again and the "
                        "first planned step, which moves persistent tensors to where the plan begins")
    p.add_argument("--batch", type=int, default=4, help="sequences per step per rank")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 1024 on cuda, 64 on cpu)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model init (the same on every rank) and of the data (each rank its own "
                        "shard); default 0")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"),
                   help="cuda (rank r on cuda:r, NCCL) when available, else cpu (gloo), if not given")
    p.add_argument("--attention", default=None, choices=("sdpa", "eager"),
                   help="attention implementation of the HF model (default: sdpa on cuda, eager on cpu); eager is "
                        "the fallback if SDPA has no deterministic kernel for this case")
    p.add_argument("--no-bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view=False (separate gradient copies, offloadable, plus the "
                        "buckets; the default True makes gradients views of the buckets: less memory)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    g = p.add_argument_group("teraio")
    g.add_argument("--tiers", default="host", choices=("host", "disk", "host+disk"),
                   help="where each rank's offloaded bytes go, in this order of preference")
    g.add_argument("--host-gib", type=float, default=None,
                   help="HostTier capacity per rank in GiB, allocated (pinned on cuda) at start by every rank "
                        "(default: 64 on cuda, 1 on cpu)")
    g.add_argument("--host-gbps", type=float, default=50.0, help="HostTier GB/s given to the planner")
    g.add_argument("--disk-dir", default="/tmp",
                   help="rank r's FileTier directory is DISK_DIR/rank<r> (created if missing; may be a link to the "
                        "rank's own SSD); teraio writes its files in a private sub-directory and removes them")
    g.add_argument("--disk-gib", type=float, default=None,
                   help="FileTier capacity per rank in GiB, reserved (fallocate) at start (default: on cuda, 200 "
                        "or 80%% of the free space of the rank's directory divided by the world size, whichever "
                        "is smaller; 1 on cpu)")
    g.add_argument("--disk-gbps", type=float, default=1.7, help="FileTier GB/s given to the planner")
    g.add_argument("--trace-dir", default=None,
                   help="write every rank's profiled trace and plan there (trace-w<W>-r<r>.json, plan-w<W>-r<r>.json)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds a world size may run before its processes are killed")
    p.add_argument("--out", default="out/ddp_bench", help="directory for the JSON results")
    a = p.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or (a.seq is not None and a.seq < 2):
        p.error("need --steps >= 1, --batch >= 1, --seq >= 2")
    if a.warmup < PROFILING_ITERATIONS + 1:
        p.error(f"--warmup must be at least {PROFILING_ITERATIONS + 1} (the Session's profiling steps + 1)")
    if a.seq is not None and a.seq > MODELS[a.model]["max_position_embeddings"]:
        p.error(f"--seq {a.seq} exceeds max_position_embeddings of {a.model}")
    return a


# ---------------------------------------------------------------------------------------------------
# worker: one process per rank (this file, started with `--worker RUN_DIR RANK` by the launcher)

def build_model(cfg: dict, device):
    import torch
    import transformers
    attn = cfg["attention"]
    lcfg = transformers.LlamaConfig(**MODELS[cfg["model"]], use_cache=False, tie_word_embeddings=False,
                                    attn_implementation=attn)
    lcfg._attn_implementation = attn
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank and in both runs
    # Initialised on the device itself: no host copy, and seconds instead of minutes for llama-3b
    # (built twice per rank).
    with device:
        model = transformers.LlamaForCausalLM(lcfg)
    model.train()
    return model


def make_batches(cfg: dict, rank: int):
    import torch
    # Each rank its own shard; rank r gets the same data whatever the world size.
    g = torch.Generator().manual_seed((cfg["seed"] + 1) * 1000 + rank)
    vocab = MODELS[cfg["model"]]["vocab_size"]
    return [torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g)
            for _ in range(cfg["warmup"] + cfg["steps"])]


def make_tiers(cfg: dict, rank: int):
    import teraio
    tiers, world, cuda = [], cfg["world"], cfg["device"] == "cuda"
    if "host" in cfg["tiers"]:
        gib = cfg["host_gib"] if cfg["host_gib"] is not None else (64.0 if cuda else 1.0)
        tiers.append(teraio.HostTier(int(gib * 2**30), read_gbps=cfg["host_gbps"], write_gbps=cfg["host_gbps"]))
    if "disk" in cfg["tiers"]:
        d = os.path.join(cfg["disk_dir"], f"rank{rank}")
        os.makedirs(d, exist_ok=True)
        gib = cfg["disk_gib"]
        if gib is None:
            # The ranks may share one filesystem: each takes its part of the free space.
            gib = min(200.0, 0.8 * shutil.disk_usage(d).free / 2**30 / world) if cuda else 1.0
        tiers.append(teraio.FileTier([d], int(gib * 2**30), read_gbps=cfg["disk_gbps"], write_gbps=cfg["disk_gbps"]))
    return tiers


def train(cfg: dict, rank: int, device, tag: str, budget: int | None = None):
    """One DDP run: reference when `budget` is None, else under a teraio.Session with that budget.
    Returns (result dict, the trained model, its losses as CPU tensors)."""
    import torch
    cuda = device.type == "cuda"
    name = "reference" if budget is None else "teraio"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    res = {}
    t = time.perf_counter()
    model = build_model(cfg, device)
    res["build_s"] = time.perf_counter() - t
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if cuda else None, bucket_cap_mb=cfg["bucket_cap_mb"],
        gradient_as_bucket_view=cfg["bucket_view"])
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            foreach=False, fused=False)
    batches = make_batches(cfg, rank)
    session = None
    if budget is not None:
        import teraio
        tiers = make_tiers(cfg, rank)
        res["tiers"] = [repr(x) for x in tiers]
        trace = plan = None
        if cfg["trace_dir"]:
            trace = os.path.join(cfg["trace_dir"], f"trace-w{cfg['world']}-r{rank}.json")
            plan = os.path.join(cfg["trace_dir"], f"plan-w{cfg['world']}-r{rank}.json")
        session = teraio.Session(budget=budget, tiers=tiers, profiling_iterations=PROFILING_ITERATIONS,
                                 trace_path=trace, plan_path=plan)
        session.watch(ddp, opt)
    tokens = cfg["batch"] * cfg["seq"]
    warm_s, step_s, losses, per_step = [], [], [], []
    # closing the Session at the end brings every offloaded tensor back for the comparison
    with session if session is not None else contextlib.nullcontext():
        for i in range(cfg["warmup"] + cfg["steps"]):
            measured = i >= cfg["warmup"]
            if i == cfg["warmup"]:
                sync()
                gc.collect()
                if cuda:  # also undoes the Session's resets of the peak during its profiling steps
                    torch.cuda.reset_peak_memory_stats()
                stats0 = session.stats() if session is not None else None
            if session is not None:
                before = session.stats()  # the mode this step runs in, and the drifts so far
            sync()
            t0 = time.perf_counter()
            ids = batches[i].to(device)
            with session.step() if session is not None else contextlib.nullcontext():
                loss = ddp(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - t0
            losses.append(loss.detach().cpu())
            (step_s if measured else warm_s).append(dt)
            msg = f"{name} {'step' if measured else 'warm-up'} {i + 1}: {dt:.3f} s, loss {losses[-1].item():.4f}"
            if session is not None:
                st = session.stats()
                drifted = st["drift_events"] > before["drift_events"]
                per_step.append(dict({k: st.get(k) for k in step_keys(teraio)}, step_mode=before["mode"], drifted=drifted))
                msg += (f", {before['mode']}{' (drifted: ran reactively)' if drifted else ''}, "
                        f"offloaded {st['bytes_offloaded'] / 2**20:.1f} MiB in all")
            log(msg, tag)
        if cuda:
            res["memory"] = {"cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                             "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved(device)}
        if session is not None:
            st = session.stats()
            res.update(stats=st, per_step_stats=per_step,
                       measured_delta={k: st[k] - stats0[k] for k in teraio.STATS_COUNTERS})
    mean = statistics.fmean(step_s)
    res.update(warmup_step_s=warm_s, step_s=step_s, losses=[x.item() for x in losses], step_s_mean=mean,
               step_s_median=statistics.median(step_s), tokens_per_s=tokens / mean)
    log(f"{name}: {mean:.3f} s/step, {tokens / mean:.0f} tokens/s on this rank"
        + (f", max allocated {res['memory']['cuda_max_allocated_bytes'] / 2**30:.2f} GiB" if cuda else ""), tag)
    return res, model, losses


def footprint_bytes(model) -> int:
    """Parameters + gradients + AdamW's two states (fp32): the CPU basis of a fractional budget."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())


def run_rank(cfg: dict, rank: int, tag: str, res: dict, save) -> None:
    """The reference run, then the teraio run, then the comparison; fills `res` as it goes and
    saves it after the reference run (a rank killed later still leaves that)."""
    import torch
    import torch.distributed as dist

    import teraio  # here, not after the reference run: a missing extension fails at once
    res["teraio_file"] = teraio.__file__
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(cfg["threads_per_rank"])
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    res["device"] = str(device)
    store = dist.FileStore(os.path.join(cfg["run_dir"], "store"), cfg["world"])
    if cuda:
        dist.init_process_group("nccl", store=store, rank=rank, world_size=cfg["world"], device_id=device)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg["world"])
    log(f"{dist.get_backend()} process group up on {device}", tag)

    ref, model, ref_losses = train(cfg, rank, device, tag)
    res["reference"] = ref
    res["parameters"] = sum(p.numel() for p in model.parameters())
    ref_params = [(n, p.detach().to("cpu", copy=True)) for n, p in model.named_parameters()]
    res["param_sha256_reference"] = params_sha256(ref_params)
    save()
    basis = ref["memory"]["cuda_max_allocated_bytes"] if cuda else footprint_bytes(model)
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()  # the teraio run starts from an empty device

    spec = cfg["budget"]
    if "/" in spec:
        num, _, den = spec.partition("/")
        budget = int(float(num) / float(den) * basis)
    else:
        budget = parse_size(spec)
    res["budget"] = {"spec": spec, "bytes": budget, "basis_bytes": basis,
                     "basis": "reference cuda_max_allocated_bytes" if cuda else "params + grads + 2 AdamW states"}
    log(f"teraio budget {budget / 2**20:.1f} MiB ({spec} of {basis / 2**20:.1f} MiB)", tag)
    got, model, losses = train(cfg, rank, device, tag, budget=budget)
    res["teraio"] = got
    params = [(n, p.detach().cpu()) for n, p in model.named_parameters()]
    res["param_sha256_teraio"] = params_sha256(params)
    bitwise = {"loss_mismatch_steps": [i + 1 for i, (a, b) in enumerate(zip(ref_losses, losses))
                                       if not torch.equal(a, b)],
               "param_mismatches": [n for (n, a), (_, b) in zip(ref_params, params) if not torch.equal(a, b)]}
    bitwise["equal"] = (len(losses) == len(ref_losses) and len(params) == len(ref_params)
                        and not bitwise["loss_mismatch_steps"] and not bitwise["param_mismatches"])
    res["bitwise"] = bitwise
    log(f"bitwise equal to the reference: {bitwise['equal']}", tag)
    res["environment"] = environment(device)
    res["host_ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(run_dir: str, rank: int) -> int:
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["run_dir"] = run_dir
    tag = f" w{cfg['world']} r{rank}"
    res = {"rank": rank, "world": cfg["world"], "ok": False}

    def save():
        with open(os.path.join(run_dir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    try:
        run_rank(cfg, rank, tag, res, save)
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001  (a failing rank must still write its result)
        res["error"] = f"{type(e).__name__}: {e}"[:4000]
        res["traceback_tail"] = traceback.format_exc()[-6000:]
        log(f"FAILED: {res['error'][:500]}", tag)
    # Saved before the process group is torn down: after a failure, that can block until the
    # launcher kills this process.
    save()
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if res["ok"] else 1


def params_sha256(named) -> str:
    """SHA-256 of the parameters' names and bytes (CPU tensors): equal digests = bitwise equal."""
    import torch
    h = hashlib.sha256()
    for n, t in named:
        h.update(n.encode())
        h.update(t.contiguous().view(torch.uint8).numpy())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# launcher: one run per world size, then the summary

def launch(cfg: dict, timeout: float) -> tuple[list[dict], list[str]]:
    """Starts cfg['world'] worker processes, waits for them, returns (per-rank results, errors)."""
    world = cfg["world"]
    errors = []
    with tempfile.TemporaryDirectory(prefix=f"ddp_bench-w{world}-") as run_dir:
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads_per_rank"]))
        if cfg["device"] == "cuda":
            env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast must stay off on the H200 machine
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        else:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", run_dir, str(r)], env=env)
                 for r in range(world)]
        deadline = time.monotonic() + timeout
        first_failure = None
        try:
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if first_failure is None and any(p.returncode not in (None, 0) for p in procs):
                    first_failure = now
                # A rank that failed leaves the others blocked in a collective: give them a minute.
                if now > deadline or (first_failure is not None and now > first_failure + 60):
                    errors.append("timed out" if now > deadline else "killed after another rank failed")
                    break
                time.sleep(0.2)
        finally:
            for r, p in enumerate(procs):
                if p.poll() is None:
                    log(f"killing rank {r} (pid {p.pid})")
                    p.kill()
                    p.wait()
        results = []
        for r, p in enumerate(procs):
            path = os.path.join(run_dir, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
                if not results[-1]["ok"] and "error" not in results[-1]:
                    results[-1]["error"] = f"exited with status {p.returncode} after its reference run"
            else:
                results.append({"rank": r, "world": world, "ok": False,
                                "error": f"exited with status {p.returncode} without writing a result"})
            if not results[-1]["ok"]:
                errors.append(f"rank {r}: {results[-1].get('error', '?')}")
    return results, errors


def aggregate(runs: list[dict], cfg: dict) -> dict:
    """Throughput of one system over the ranks: each measured step lasts as long as its slowest rank."""
    steps = [max(r["step_s"][i] for r in runs) for i in range(cfg["steps"])]
    mean = statistics.fmean(steps)
    tokens = cfg["world"] * cfg["batch"] * cfg["seq"]
    return {"step_s": steps, "step_s_mean": mean, "step_s_median": statistics.median(steps),
            "tokens_per_s": tokens / mean, "tokens_per_s_per_gpu": tokens / mean / cfg["world"]}


def run_world(args, world: int) -> dict:
    cfg = {k: v for k, v in vars(args).items() if k not in ("world", "out", "timeout", "no_bucket_view")}
    cfg.update(world=world, bucket_view=not args.no_bucket_view,
               threads_per_rank=max(1, (os.cpu_count() or 1) // world),
               disk_dir=os.path.abspath(args.disk_dir),
               trace_dir=os.path.abspath(args.trace_dir) if args.trace_dir else None)
    res = {"ok": False, "world": world, "argv": sys.argv,
           "started": datetime.datetime.now().isoformat(timespec="seconds"),
           "config": dict(cfg, model_shape=MODELS[args.model], dtype="fp32",
                          tokens_per_step_per_rank=args.batch * args.seq,
                          optimizer=f"torch.optim.AdamW(lr={LR}, betas={BETAS}, eps={EPS}, "
                                    f"weight_decay={WEIGHT_DECAY}, foreach=False, fused=False)")}
    t = time.perf_counter()
    log(f"world {world}: starting {world} process(es) on {args.device}")
    ranks, errors = launch(cfg, args.timeout)
    res["ranks"] = ranks
    res["total_s"] = time.perf_counter() - t
    # What the ranks finished is aggregated even when a later part failed (a teraio run that ran out
    # of memory leaves the reference's scaling).
    for system in ("reference", "teraio"):
        if all(system in r for r in ranks):
            res[system] = aggregate([r[system] for r in ranks], cfg)
    if "teraio" in res:
        res["teraio"].update(budget_bytes=[r["budget"]["bytes"] for r in ranks],
                             bytes_offloaded=[r["teraio"]["stats"]["bytes_offloaded"] for r in ranks])
        res["offloaded_every_rank"] = all(b > 0 for b in res["teraio"]["bytes_offloaded"])
    if all("bitwise" in r for r in ranks):
        res["bitwise"] = {
            "teraio_equals_reference_every_rank": all(r["bitwise"]["equal"] for r in ranks),
            "ranks_agree_reference": len({r["param_sha256_reference"] for r in ranks}) == 1,
            "ranks_agree_teraio": len({r["param_sha256_teraio"] for r in ranks}) == 1,
        }
        res["bitwise"]["equal"] = all(res["bitwise"].values())
        if not res["bitwise"]["equal"]:
            errors.append(f"bitwise comparison failed: {res['bitwise']}")
    res["errors"] = errors
    res["ok"] = not errors
    if res["ok"]:
        log(f"world {world}: reference {res['reference']['tokens_per_s']:.0f} tokens/s, teraio "
            f"{res['teraio']['tokens_per_s']:.0f} tokens/s, bitwise equal {res['bitwise']['equal']}, offloaded "
            + ", ".join(f"{b / 2**20:.1f}" for b in res["teraio"]["bytes_offloaded"]) + " MiB per rank")
    else:
        log(f"world {world}: FAILED: " + "; ".join(e[:300] for e in errors))
    return res


def summarize(args, results: dict[int, dict]) -> dict:
    worlds = {}
    for w, r in results.items():
        d = {"ok": r["ok"], "errors": r["errors"], "total_s": r["total_s"]}
        for system in ("reference", "teraio"):
            if system in r:
                d[f"{system}_tokens_per_s"] = r[system]["tokens_per_s"]
                d[f"{system}_tokens_per_s_per_gpu"] = r[system]["tokens_per_s_per_gpu"]
                d[f"{system}_step_s_mean"] = r[system]["step_s_mean"]
                if args.device == "cuda":
                    d[f"{system}_cuda_max_allocated_bytes_per_rank"] = [
                        x[system]["memory"]["cuda_max_allocated_bytes"] for x in r["ranks"]]
        if "teraio" in r:
            d.update(budget_bytes_per_rank=r["teraio"]["budget_bytes"],
                     bytes_offloaded_per_rank=r["teraio"]["bytes_offloaded"],
                     offloaded_every_rank=r["offloaded_every_rank"],
                     teraio_over_reference_tokens_per_s=r["teraio"]["tokens_per_s"] / r["reference"]["tokens_per_s"])
        if "bitwise" in r:
            d["bitwise_equal"] = r["bitwise"]["equal"]
        worlds[str(w)] = d
    base = min(results)
    scaling = {}
    for system in ("reference", "teraio"):
        key = f"{system}_tokens_per_s"
        if key in worlds[str(base)]:
            scaling[system] = {str(w): worlds[str(w)][key] / (w / base * worlds[str(base)][key])
                               for w in results if w != base and key in worlds[str(w)]}
    return {"ok": all(r["ok"] for r in results.values()), "model": args.model, "device": args.device,
            "budget": args.budget, "tiers": args.tiers, "batch": args.batch, "seq": args.seq, "steps": args.steps,
            "warmup": args.warmup, "base_world": base,
            "scaling_efficiency_note": f"tokens/s(W) / (W / {base} x tokens/s({base}))",
            "scaling_efficiency": scaling, "worlds": worlds}


def write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    log(f"wrote {path}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # internal: started by the launcher below
        return worker(argv[1], int(argv[2]))
    args = parse_args(argv)
    if args.device is None or args.device == "cuda":
        import torch
        if args.device is None:
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cuda" and torch.cuda.device_count() < max(args.world):
            sys.exit(f"ddp_bench.py: --world {max(args.world)} needs as many GPUs, "
                     f"{torch.cuda.device_count()} visible")
    if args.seq is None:
        args.seq = 1024 if args.device == "cuda" else 64
    if args.attention is None:
        # SDPA is what a GPU run uses; eager on the CPU, where SDPA adds nothing to a smoke test.
        args.attention = "sdpa" if args.device == "cuda" else "eager"
    os.makedirs(args.out, exist_ok=True)
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    results = {}
    for world in args.world:
        results[world] = run_world(args, world)
        write_json(os.path.join(args.out, f"ddp_bench_{args.model}_w{world}.json"), results[world])
    summary = summarize(args, results)
    write_json(os.path.join(args.out, f"ddp_bench_{args.model}_summary.json"), summary)
    for system, eff in summary["scaling_efficiency"].items():
        for w, e in eff.items():
            log(f"scaling efficiency {system} world {w}: {e:.3f}")
    log("all runs ok" if summary["ok"] else "FAILED (see the JSON)")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
