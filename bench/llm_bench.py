#!/usr/bin/env python3
"""Side-by-side training benchmark of a Llama-architecture model (Hugging Face transformers, random
init from a built-in table of shapes, nothing downloaded): one process runs one configuration of one
system and writes one JSON result.

Systems
  ideal          everything on the device; AdamW (foreach=False by default, like teraio)
  teraio         the same step inside `with teraio.Session(...).step():` under --budget
  fsdp2-offload  PyTorch FSDP2 (fully_shard per decoder layer + root) with CPUOffloadPolicy on one
                 rank: sharded params, grads and AdamW states on CPU, optimizer step on CPU
  ds-offload     DeepSpeed ZeRO-2 + offload_optimizer to CPU (DeepSpeedCPUAdam), ZeRO-Offload
  ds-infinity    DeepSpeed ZeRO-3 + offload_param and offload_optimizer to NVMe (--disk-dir),
                 ZeRO-Infinity, async_io (libaio)

Steps: --warmup W unmeasured steps, then --steps N measured ones, each timed between two
torch.cuda.synchronize() calls; the same seeded token batches for every system. See
bench/README-peers.md. A failing configuration still writes its JSON ("ok": false, error, traceback
tail) and exits with status 1.

Smoke test on CPU:  python3 bench/llm_bench.py --system ideal --model tiny --steps 2 --warmup 1 \\
                      --device cpu --out /tmp/x.json
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import resource
import shutil
import socket
import statistics
import sys
import threading
import time
import traceback

SYSTEMS = ("ideal", "teraio", "fsdp2-offload", "ds-offload", "ds-infinity")

# Hugging Face arguments' defaults that the model table's values are compared with: a value equal
# to the default is not passed, so each model's config (recorded as model_shape) stays as it was.
_HF_ROPE_THETA = {"llama": 10000.0, "mixtral": 1e6}


def _load_models():
    """The bench's --model names, from the model table data/models.json (docs/formats.md, "Model
    table"; teraio synth and teraio train compile the same file in), read by its path so that the
    peers' runs need no teraio package. Each name maps to transformers.LlamaConfig fields ("arch":
    "mixtral" for transformers.MixtralConfig); the table's own names of the same shapes are accepted
    too. Returns (models, the shape name of each model name, the bench's own names)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "models.json")
    with open(path) as f:
        table = json.load(f)
    if table.get("format") != "teraio.models" or table.get("version") != 1:
        raise SystemExit(f"{path}: not a teraio.models version 1 file")
    entries = {m["name"]: m for m in table["models"]}
    bench_names = list(table["names"]["bench"])
    names = dict(table["names"]["bench"])
    names.update({shape: shape for shape in list(names.values())})
    models = {}
    for name, shape in names.items():
        m = entries[shape]
        d = {} if m["arch"] == "llama" else {"arch": m["arch"]}
        d.update(hidden_size=m["d_model"], num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
                 num_key_value_heads=m["kv_heads"], intermediate_size=m["ffn"])
        if m["arch"] == "mixtral":
            d.update(num_local_experts=m["experts"], num_experts_per_tok=m["experts_per_token"])
        d.update(vocab_size=m["vocab"], max_position_embeddings=m["max_seq"])
        if float(m["rope_theta"]) != _HF_ROPE_THETA[m["arch"]]:
            d["rope_theta"] = float(m["rope_theta"])
        if m["tied_embeddings"]:  # the HF default is untied, as the Llama family
            d["tie_word_embeddings"] = True
        models[name] = d
    return models, names, bench_names


MODELS, MODEL_SHAPES, BENCH_NAMES = _load_models()

# The per-tier counters of stats()["tiers"] (docs/pytorch.md): measured_delta gives each one's
# difference over the measured steps.
TIER_COUNTERS = ("stall_read_us", "stall_write_us", "bytes_read", "bytes_written")
LR = 1e-4  # torch.optim.AdamW defaults otherwise: betas (0.9, 0.999), eps 1e-8, weight_decay 0.01
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01

def _load_units():
    """python/teraio/units.py by its path: the C++ parser's rules (K/M/G binary) without importing
    the teraio package, which needs the extension (the peers' runs must not)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python", "teraio", "units.py")
    spec = importlib.util.spec_from_file_location("teraio_units", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_units = _load_units()


def parse_size(text: str) -> int:
    """A size as every teraio command reads it: 24G == 24GiB == 24 * 2**30, 24GB == 24 * 10**9."""
    try:
        return _units.parse_size(str(text))
    except _units.SizeError as e:
        raise argparse.ArgumentTypeError(f"{e} (examples: 12GiB, 500MB, 4096)") from None


def size_arg(text: str) -> str:
    parse_size(text)
    return text


def log(msg: str) -> None:
    print(f"[llm_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows '(default: X)' only where there is a default worth showing."""

    def _get_help_string(self, action):
        if action.default in (None, False) or action.required or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="llm_bench.py",
        description="Train a randomly initialised Hugging Face Llama-architecture model for a few steps "
                    "with one offloading system and write one JSON result (timings, losses, memory, I/O).",
        formatter_class=_HelpFormatter,
        epilog="models: " + "; ".join(
            f"{k} (hidden {v['hidden_size']}, {v['num_hidden_layers']} layers, {v['num_attention_heads']} heads, "
            f"kv {v['num_key_value_heads']}, ffn {v['intermediate_size']}, vocab {v['vocab_size']})"
            for k, v in MODELS.items() if k in BENCH_NAMES) + "; or the model table's name of each: " + ", ".join(
            f"{MODEL_SHAPES[k]} = {k}" for k in BENCH_NAMES if MODEL_SHAPES[k] != k) +
        " (data/models.json). Details and GPU commands: bench/README-peers.md.")
    p.add_argument("--system", required=True, choices=SYSTEMS, help="which system trains the model")
    p.add_argument("--model", default="tiny", choices=sorted(MODELS), help="model shape (listed at the end of this help)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "amp", "bf16"),
                   help="fp32: everything fp32. amp: mixed precision as users train, fp32 params, grads and AdamW "
                        "states with bf16 compute (ideal/teraio: torch.autocast; fsdp2: MixedPrecisionPolicy with bf16 "
                        "params in compute, fp32 reduce; DeepSpeed: its bf16 mode). bf16: ideal/teraio/fsdp2 keep "
                        "params, grads and AdamW states in bf16 (no fp32 master copy); DeepSpeed runs its bf16 mode "
                        "(bf16 params/grads, fp32 master weights and Adam states). The JSON's 'precision' says what "
                        "each system did")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers instead of the model's (its width kept): the largest model of a width that "
                        "trains on this machine (bench/largest_model.sh predicts it)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--warmup", type=int, default=3,
                   help="unmeasured steps first (teraio: raised to at least --profiling-iterations + 1, so that "
                        "every measured step runs the plan)")
    p.add_argument("--steps", type=int, default=3, help="measured steps after the warm-up")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and of the token batches")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"),
                   help="cuda when available, else cpu, if not given (cpu is for smoke tests)")
    p.add_argument("--adamw", default="loop", choices=("loop", "foreach", "fused"),
                   help="torch.optim.AdamW implementation for ideal and teraio (loop = foreach=False, "
                        "fused=False: about ten operators a parameter, the benchmarks' default since before teraio "
                        "ran foreach and fused steps in parts; foreach/fused give ideal's best time)")
    p.add_argument("--grad-ckpt", action="store_true",
                   help="activation (gradient) checkpointing of every decoder layer, for every system")
    # teraio
    g = p.add_argument_group("teraio")
    g.add_argument("--budget", type=size_arg, default="12GiB",
                   help="teraio: resident bytes of tracked tensors on the device (ignored by other systems); "
                        "sizes as every teraio command reads them: 24G = 24GiB, 24GB = 24e9 bytes")
    g.add_argument("--tiers", default="host", choices=("host", "disk", "host+disk"),
                   help="teraio: where offloaded bytes go, in this order of preference")
    g.add_argument("--host-gib", type=float, default=None,
                   help="teraio: HostTier capacity in GiB, reserved at start (default 64 with CUDA, 1 on CPU)")
    g.add_argument("--host-gbps", type=float, default=50.0, help="teraio: HostTier read/write GB/s given to the planner")
    g.add_argument("--disk-gib", type=float, default=None,
                   help="teraio: FileTier capacity in GiB, reserved (fallocate) at start "
                        "(default 200 or 80%% of the free space of --disk-dir, whichever is smaller)")
    g.add_argument("--disk-gbps", type=float, default=1.7, help="teraio: FileTier read/write GB/s given to the planner")
    g.add_argument("--trace-out", default=None,
                   help="teraio: write each profiled trace here (Session trace_path; default: "
                        "trace-<name of --out>.json beside --out, so that `teraio simulate` can replay the run)")
    g.add_argument("--plan-out", default=None,
                   help="teraio: write each plan here (Session plan_path; default: plan-<name of --out>.json beside --out)")
    g.add_argument("--profiling-iterations", type=int, default=2, help="teraio: profiled steps before planning")
    g.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="teraio: checksum the FileTier's pieces and verify them on read (Session verify)")
    g.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=True,
                   help="teraio: let the plan recompute activations (Session recompute=)")
    g.add_argument("--discard-dead", action=argparse.BooleanOptionalAction, default=True,
                   help="teraio: Session(discard_dead=...): tensors the profile never uses again before freeing "
                        "them are freed without a write where the plan takes them away (the default)")
    g.add_argument("--step-in-backward", action=argparse.BooleanOptionalAction, default=False,
                   help="teraio: Session.watch(..., step_in_backward=True): each parameter's AdamW update runs "
                        "during backward as soon as its gradient is complete, so the optimizer states move while "
                        "backward computes")
    g.add_argument("--writebacks", action=argparse.BooleanOptionalAction, default=None,
                   help="teraio: TERAIO_WRITEBACKS=1 (--no-writebacks: =0) for the Session: the plan may copy a "
                        "dirty tensor to its tier early so that its later offload is clean (docs/pytorch.md, "
                        "\"Writebacks\"; the Session's default since 2026-12-06: on)")
    g.add_argument("--deep-recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="teraio: TERAIO_DEEP_RECOMPUTE=1 (--no-deep-recompute: =0) for the Session: recompute chains "
                        "of any depth (docs/pytorch.md, \"Recompute\"; the Session's default since 2026-12-06: on)")
    g.add_argument("--step-in-backward-auto", action="store_true",
                   help="teraio: Session.watch(..., step_in_backward='auto'): the Session turns steps in backward on "
                        "after its first plan if it predicts them faster")
    g.add_argument("--stream-ordered-offloads", action=argparse.BooleanOptionalAction, default=True,
                   help="teraio: Session(stream_ordered_offloads=...): offloads due before an operator are "
                        "waited for on the GPU, not the CPU (the Session's default); --no-... waits on the CPU")
    # shared by teraio's FileTier and ds-infinity
    p.add_argument("--disk-dir", default="/tmp",
                   help="directory on the disk for teraio's FileTier and ds-infinity's swap files; a private "
                        "sub-directory is created in it and removed at the end")
    # fsdp2
    g = p.add_argument_group("fsdp2-offload")
    g.add_argument("--fsdp-optim", default="fused", choices=("fused", "foreach", "loop"),
                   help="fsdp2-offload: AdamW implementation for the CPU optimizer step (fused: the fused CPU "
                        "kernel, fastest on CPU; if its first step fails, foreach is used and the JSON says so)")
    g.add_argument("--fsdp-no-reshard", action="store_true",
                   help="fsdp2-offload: reshard_after_forward=False (keep each layer's unsharded params on the GPU "
                        "from forward to backward: fewer H2D copies, more GPU memory)")
    # deepspeed
    g = p.add_argument_group("ds-offload / ds-infinity")
    g.add_argument("--ds-stage", type=int, default=2, choices=(1, 2, 3),
                   help="ds-offload: ZeRO stage (ds-infinity is always 3)")
    g.add_argument("--ds-sub-group-size", type=float, default=1e8,
                   help="ds-infinity: ZeRO-3 sub_group_size (elements per optimizer tile swapped from NVMe)")
    g.add_argument("--aio-block-size", type=int, default=1048576, help="ds-infinity: aio block_size (bytes)")
    g.add_argument("--aio-queue-depth", type=int, default=32, help="ds-infinity: aio queue_depth")
    g.add_argument("--aio-threads", type=int, default=4,
                   help="ds-infinity: aio intra_op_parallelism (named thread_count in older DeepSpeed releases)")
    g.add_argument("--aio-single-submit", action="store_true", help="ds-infinity: aio single_submit")
    g.add_argument("--no-space-check", action="store_true",
                   help="ds-infinity: start even if the estimated swap bytes exceed the free space of --disk-dir")
    p.add_argument("--timeline", default=None, metavar="TRACE",
                   help="CUDA: after the measured steps, run one more under torch.profiler, write its "
                        "Chrome trace to TRACE (.xz: compressed) and the summary of bench/timeline.py "
                        "(compute-stream idle time, starved or waiting; copies per direction) to the result")
    p.add_argument("--out", default=None,
                   help="result JSON (if not given: out/llm_bench_<system>_<model>_<dtype>.json)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.seq < 2 or a.steps < 1 or a.warmup < 0:
        p.error("need --batch >= 1, --seq >= 2, --steps >= 1, --warmup >= 0")
    if a.layers is not None and not 1 <= a.layers <= 4096:
        p.error(f"--layers must be in [1, 4096], got {a.layers}")
    if a.seq > MODELS[a.model]["max_position_embeddings"]:
        p.error(f"--seq {a.seq} exceeds max_position_embeddings of {a.model}")
    if a.out is None:
        a.out = os.path.join("out", f"llm_bench_{a.system}_{a.model}_{a.dtype}.json")
    # The trace and plan of a teraio run (llama-1b: about 0.6 MB and 0.1-0.3 MB of JSON) are what a
    # prediction is checked against later (docs/benchmarks.md, "The link both ways").
    out_dir, out_name = os.path.split(a.out)
    if a.trace_out is None:
        a.trace_out = os.path.join(out_dir, "trace-" + out_name)
    if a.plan_out is None:
        a.plan_out = os.path.join(out_dir, "plan-" + out_name)
    return a


# ---------------------------------------------------------------------------------------------------
# measurement helpers

def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def proc_io() -> dict:
    """/proc/self/io: read_bytes/write_bytes are what reached the block layer (all threads)."""
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def block_device_stat(path: str):
    """(name, sectors_read, sectors_written) of the block device holding `path`, or None."""
    try:
        st = os.stat(path)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        sysdir = os.path.realpath(f"/sys/dev/block/{dev}")
        with open(os.path.join(sysdir, "stat")) as f:
            fields = f.read().split()
        return os.path.basename(sysdir), int(fields[2]), int(fields[6])
    except (OSError, IndexError, ValueError):
        return None


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Monitor:
    """Samples host RSS (and, with NVML, the GPU's used memory) every 20 ms between start() and stop()."""

    def __init__(self, cuda: bool):
        self.peak_rss = 0
        self.peak_nvml = None
        self._stop = threading.Event()
        self._thread = None
        self._nvml = None
        if cuda:
            try:
                import pynvml
                pynvml.nvmlInit()
                import torch
                idx = torch.cuda.current_device()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx))
                self.peak_nvml = 0
            except Exception:
                self._nvml = None

    def _sample(self):
        self.peak_rss = max(self.peak_rss, rss_bytes())
        if self._nvml:
            try:
                mod, h = self._nvml
                self.peak_nvml = max(self.peak_nvml, int(mod.nvmlDeviceGetMemoryInfo(h).used))
            except Exception:
                pass

    def _run(self):
        while not self._stop.wait(0.02):
            self._sample()

    def start(self):
        self.peak_rss = 0
        if self.peak_nvml is not None:
            self.peak_nvml = 0
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._sample()
        if self._thread:
            self._stop.set()
            self._thread.join()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env():
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


# ---------------------------------------------------------------------------------------------------
# model and data

def step_floor(info, steps, step_s):
    """SPEC's floor for a teraio step: max(compute, bytes offloaded per step / write bandwidth, bytes
    prefetched per step / read bandwidth), from the measured steps' counters, the profile's kernel
    time (plus the recomputes) and the bandwidths the tiers were planned with. With several tiers
    the counters do not split the bytes by tier: each direction is then charged at the fastest
    tier's bandwidth (a floor still, not a tight one)."""
    st, delta = info.get("stats") or {}, info.get("measured_delta")
    tiers = st.get("tiers") or []
    if not delta or not tiers or not st.get("profiled_kernel_us"):
        return {"note": "not computed: no measured counters, tiers or profiled kernel time"}
    compute_s = (st["profiled_kernel_us"] + delta.get("recompute_us", 0) / steps) / 1e6
    write_gbps = max(t["write_gbps"] for t in tiers)
    read_gbps = max(t["read_gbps"] for t in tiers)
    # the write direction carries the offloads and the writebacks (a writeback's offload is clean)
    written = delta["bytes_offloaded"] + delta.get("writeback_bytes", 0)
    terms = {"compute": compute_s,
             "offload": written / steps / (write_gbps * 1e9),
             "prefetch": delta["bytes_prefetched"] / steps / (read_gbps * 1e9)}
    bound = max(terms, key=terms.get)
    out = {"compute_s": compute_s, "offload_s": terms["offload"], "prefetch_s": terms["prefetch"],
           "floor_s": terms[bound], "bound": bound, "step_over_floor": step_s / terms[bound],
           "tiers": len(tiers)}
    # The link with both directions busy: one tier whose probe measured its rate each way with both
    # running (duplex_gbps, below the one-way rates on the H100: 35.5 against 53-54 GB/s) cannot move
    # W out and R in faster than min(W, R) at that rate plus the rest one way at a time (when the
    # duplex rate doubled beats either one-way rate; else one way at a time). A floor still: it
    # assumes the link busy the whole step.
    duplex = tiers[0].get("duplex_gbps") if len(tiers) == 1 else None
    if duplex:
        w_b, r_b = written / steps, delta["bytes_prefetched"] / steps
        w_r, r_r, d_r = write_gbps * 1e9, read_gbps * 1e9, duplex * 1e9
        both = min(w_b, r_b) if d_r / w_r + d_r / r_r > 1 else 0.0
        link_s = both / d_r + (w_b - both) / w_r + (r_b - both) / r_r
        floor = max(compute_s, link_s)
        out.update({"link_s": link_s, "floor_duplex_s": floor, "step_over_floor_duplex": step_s / floor})
    return out


def plan_bytes_by_kind(trace_path, plan_path):
    """Which bytes the Session's plan moves per iteration, by tensor kind: {kind: {"offload_bytes",
    "prefetch_bytes", "recompute_bytes", "discard_bytes", "writeback_bytes"}} from the trace and plan it
    wrote (the plan of the last planned shape; an offload a writeback made clean writes nothing at
    run time but still counts in offload_bytes). A persistent tensor no kernel uses (an idle expert) is offloaded once
    and then moves nothing, so it is left out, as `teraio simulate` does; an offload the Session
    discards (the plan's discard_dead, a transient tensor after its last use) counts in
    discard_bytes. {"note": ...} when the files are not there."""
    try:
        with open(trace_path) as f:
            trace = json.load(f)
        with open(plan_path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        return {"note": f"not computed: {e}"}
    last_use = {}
    for k, kernel in enumerate(trace["kernels"]):
        for t in kernel["tensors"]:
            last_use[t] = k
    tensors = {t["id"]: t for t in trace["tensors"]}
    out = {}
    for m in plan["moves"]:
        t = tensors[m["tensor"]]
        if t["persistent"] and t["id"] not in last_use:
            continue
        d = out.setdefault(t["kind"], {"offload_bytes": 0, "prefetch_bytes": 0, "recompute_bytes": 0,
                                       "discard_bytes": 0, "writeback_bytes": 0})
        discard = (plan.get("discard_dead") and m["op"] == "offload" and not t["persistent"]
                   and m["start"] >= last_use.get(t["id"], 0))
        d["discard_bytes" if discard else m["op"] + "_bytes"] += t["bytes"]
    return out


def model_shape(args):
    """The model's transformers config fields, with --layers applied."""
    shape = dict(MODELS[args.model])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    return shape


def build_model(args, torch_dtype):
    import torch
    import transformers
    shape = model_shape(args)
    arch = shape.pop("arch", "llama")
    config_cls, model_cls = ((transformers.MixtralConfig, transformers.MixtralForCausalLM) if arch == "mixtral"
                             else (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    cfg = config_cls(**shape, use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # build directly in the target dtype (no fp32 copy of an 8B model)
    try:
        model = model_cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    if any(p.dtype != torch_dtype for p in model.parameters()):
        model = model.to(torch_dtype)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, cfg


def make_batches(args, vocab: int, count: int):
    import torch
    g = torch.Generator().manual_seed(args.seed + 1)
    return [torch.randint(0, vocab, (args.batch, args.seq), generator=g, dtype=torch.long) for _ in range(count)]


def adamw_kwargs(impl: str) -> dict:
    return {"loop": dict(foreach=False, fused=False), "foreach": dict(foreach=True, fused=False),
            "fused": dict(foreach=False, fused=True)}[impl]


# ---------------------------------------------------------------------------------------------------
# systems: setup(model) -> step(ids) returning the detached loss; info() -> dict for the JSON

class Ideal:
    def __init__(self, args, device, run_dir):
        self.args, self.device = args, device

    def precision(self):
        return {"fp32": "fp32 params, grads, AdamW states",
                "amp": "fp32 params, grads, AdamW states, bf16 compute (torch.autocast)",
                "bf16": "bf16 params, grads and AdamW states (pure bf16, no fp32 master weights)"}[self.args.dtype] + \
            f"; all on {self.device.type}"

    def setup(self, model):
        import torch
        self.model = model.to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY, **adamw_kwargs(self.args.adamw))

    def _train_step(self, ids):
        import torch
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.args.dtype == "amp"):
            loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def step(self, ids):
        return self._train_step(ids.to(self.device, non_blocking=True))

    def info(self):
        return {"optimizer": f"torch.optim.AdamW({adamw_kwargs(self.args.adamw)})"}

    def mark_measured(self):
        """Called just before the first measured step."""

    def close(self):
        pass


class Teraio(Ideal):
    def __init__(self, args, device, run_dir):
        super().__init__(args, device, run_dir)
        self.run_dir = run_dir
        self.per_step_stats = []

    def precision(self):
        return super().precision().replace(f"all on {self.device.type}",
                                           f"resident on {self.device.type} within the budget, the rest "
                                           f"offloaded to {self.args.tiers}")

    def setup(self, model):
        import teraio
        super().setup(model)
        a = self.args
        tiers = []
        if a.host_gib is None:
            a.host_gib = 64.0 if self.device.type == "cuda" else 1.0
        if "host" in a.tiers:
            tiers.append(teraio.HostTier(int(a.host_gib * 2**30), read_gbps=a.host_gbps, write_gbps=a.host_gbps))
        if a.disk_gib is None:
            a.disk_gib = min(200.0, math.floor(0.8 * shutil.disk_usage(self.run_dir or a.disk_dir).free / 2**30))
        if "disk" in a.tiers:
            tiers.append(teraio.FileTier([self.run_dir], int(a.disk_gib * 2**30),
                                         read_gbps=a.disk_gbps, write_gbps=a.disk_gbps))
        self.tiers_repr = [repr(t) for t in tiers]
        if a.writebacks is not None:
            os.environ["TERAIO_WRITEBACKS"] = "1" if a.writebacks else "0"  # read when the Session is made
        if a.deep_recompute is not None:
            os.environ["TERAIO_DEEP_RECOMPUTE"] = "1" if a.deep_recompute else "0"
        self.session = teraio.Session(budget=a.budget, tiers=tiers, profiling_iterations=a.profiling_iterations,
                                      trace_path=a.trace_out, plan_path=a.plan_out,
                                      stream_ordered_offloads=a.stream_ordered_offloads,
                                      verify=a.verify, recompute=a.recompute, discard_dead=a.discard_dead)
        self.session.watch(self.model, self.opt,
                           step_in_backward="auto" if a.step_in_backward_auto else a.step_in_backward)

    def step(self, ids):
        ids = ids.to(self.device, non_blocking=True)
        with self.session.step():
            loss = self._train_step(ids)
        st = self.session.stats()
        # Every field but the tiers: teraio's one list (Note [Options and stats fields]).
        teraio = sys.modules["teraio"]
        self.per_step_stats.append({k: st[k] for k in teraio.STATS_FIELDS if k != "tiers"})
        return loss

    def mark_measured(self):
        self.stats_at_measure = self.session.stats()

    def info(self):
        d = super().info()
        st = self.session.stats()
        d.update(tiers=self.tiers_repr, stats=st, per_step_stats=self.per_step_stats,
                 teraio_file=__import__("teraio").__file__)
        s0 = getattr(self, "stats_at_measure", None)
        if s0 is not None:  # counters are cumulative: what the measured steps alone did
            d["measured_delta"] = {k: st[k] - s0[k] for k in sys.modules["teraio"].STATS_COUNTERS}
            # the same per tier: which tier the measured steps waited for, and what each moved
            d["measured_delta"]["tiers"] = [
                {"name": t["name"], **{k: t[k] - t0.get(k, 0) for k in TIER_COUNTERS if k in t}}
                for t, t0 in zip(st["tiers"], s0["tiers"])]
        return d

    def close(self):
        # Session.close() brings every tensor back to the device: not needed for the measurement, and
        # the process exits next (the destructor does the same, and teraio's atexit hook removes files)
        pass


class Fsdp2Offload:
    mark_measured = Ideal.mark_measured

    def __init__(self, args, device, run_dir):
        self.args, self.device = args, device
        self.note = None

    def precision(self):
        d = "bf16" if self.args.dtype == "bf16" else "fp32"
        return (f"{d} sharded params, grads and AdamW states on CPU (pinned when CUDA), "
                f"{'pure bf16, no fp32 master weights, ' if d == 'bf16' else ''}"
                f"{'bf16 params in compute (MixedPrecisionPolicy), fp32 reduce, ' if self.args.dtype == 'amp' else ''}"
                f"each layer's params copied to {self.device.type} for forward and backward, "
                f"grads copied back, optimizer step on CPU")

    def setup(self, model):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        single_rank_env()
        cuda = self.device.type == "cuda"
        if not dist.is_initialized():
            if cuda:
                dist.init_process_group("nccl", rank=0, world_size=1, device_id=self.device)
            else:
                dist.init_process_group("gloo", rank=0, world_size=1)
        self.backend = dist.get_backend()
        mesh = init_device_mesh(self.device.type, (1,))
        policy = CPUOffloadPolicy(pin_memory=cuda)
        reshard = not self.args.fsdp_no_reshard
        mp = {}
        if self.args.dtype == "amp":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            mp = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, offload_policy=policy, reshard_after_forward=reshard, **mp)
        fully_shard(model, mesh=mesh, offload_policy=policy, reshard_after_forward=reshard, **mp)
        self.model = model
        kw = adamw_kwargs(self.args.fsdp_optim)
        self.opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kw)
        self.opt_kw = kw
        self.param_device = str(next(model.parameters()).device)

    def step(self, ids):
        import torch
        ids = ids.to(self.device, non_blocking=True)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        try:
            self.opt.step()
        except RuntimeError as e:
            if not self.opt_kw.get("fused") or self.opt.state:
                raise
            # the fused kernel refused the DTensor shards before creating any state: fall back to foreach
            self.note = f"fused AdamW failed ({str(e).splitlines()[0][:300]}); foreach used instead"
            log("fsdp2-offload: " + self.note)
            self.opt_kw = adamw_kwargs("foreach")
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                         weight_decay=WEIGHT_DECAY, **self.opt_kw)
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def info(self):
        return {"optimizer": f"torch.optim.AdamW({self.opt_kw}) on CPU DTensor shards", "note": self.note,
                "process_group_backend": self.backend, "sharded_param_device": self.param_device,
                "reshard_after_forward": not self.args.fsdp_no_reshard,
                "offload_policy": "CPUOffloadPolicy(pin_memory=%s)" % (self.device.type == "cuda")}

    def close(self):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


class DeepSpeedSystem:
    mark_measured = Ideal.mark_measured

    def __init__(self, args, device, run_dir):
        self.args, self.device, self.run_dir = args, device, run_dir
        self.infinity = args.system == "ds-infinity"

    def precision(self):
        where = "NVMe (--disk-dir)" if self.infinity else "CPU (pinned)"
        if self.args.dtype == "fp32":
            return (f"fp32 params on {'NVMe, gathered per layer to the device' if self.infinity else 'the device'}; "
                    f"fp32 master copy, grads and Adam states on {where}; DeepSpeedCPUAdam step on CPU")
        return (f"DeepSpeed bf16 mode: bf16 params and grads on the device"
                f"{' (params partitioned to NVMe, gathered per layer)' if self.infinity else ''}; fp32 master "
                f"weights, fp32 grads and fp32 Adam states on {where}; DeepSpeedCPUAdam step on CPU")

    def config(self, model):
        a = self.args
        h = MODELS[a.model]["hidden_size"]
        max_numel = max(p.numel() for p in model.parameters())
        cfg = {
            "train_micro_batch_size_per_gpu": a.batch,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                      "weight_decay": WEIGHT_DECAY}},
            "bf16": {"enabled": a.dtype in ("bf16", "amp")},
        }
        if not self.infinity:
            # ZeRO-2 + CPU optimizer offload (ZeRO-Offload): the bf16/fp32 params and activations stay on
            # the GPU; gradients stream to CPU during backward (overlap_comm); Adam runs on CPU.
            cfg["zero_optimization"] = {
                "stage": a.ds_stage,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "overlap_comm": True,
                "contiguous_gradients": True,
                "reduce_bucket_size": int(5e8),
                "allgather_bucket_size": int(5e8),
            }
            if a.ds_stage == 3:
                cfg["zero_optimization"].update(self._stage3_knobs(h))
        else:
            nvme = self.run_dir
            max_in_cpu = int(1e9)  # DeepSpeed's default: the first 1e9 parameter elements stay in pinned CPU memory
            z = {
                "stage": 3,
                "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": True,
                                  "buffer_count": self._param_buffer_count(model, max_in_cpu, a.ds_sub_group_size),
                                  # every parameter must fit one buffer (elements)
                                  "buffer_size": int(max(1e8, math.ceil(max_numel / 1e6) * 1e6)),
                                  "max_in_cpu": max_in_cpu},
                "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": True, "buffer_count": 4,
                                      "pipeline_read": False, "pipeline_write": False, "fast_init": False},
                "overlap_comm": True,
                "contiguous_gradients": True,
                "sub_group_size": int(a.ds_sub_group_size),
            }
            z.update(self._stage3_knobs(h))
            cfg["zero_optimization"] = z
            cfg["aio"] = {"block_size": a.aio_block_size, "queue_depth": a.aio_queue_depth,
                          "intra_op_parallelism": a.aio_threads, "single_submit": bool(a.aio_single_submit),
                          "overlap_events": True, "use_gds": False}
        return cfg

    @staticmethod
    def _param_buffer_count(model, max_in_cpu, sub_group_size):
        # ZeRO-3 swaps each NVMe-resident parameter into a buffer of its own and holds it there while the
        # parameter is gathered, prefetched or updated; the default of 5 buffers ran out on llama-1b
        # ("Not enough buffers 0 for swapping 1", 2026-12-03). DeepSpeed keeps whole sub-groups of
        # sub_group_size elements in CPU memory up to max_in_cpu, so every parameter after the first
        # (max_in_cpu - sub_group_size) elements may live on NVMe: one buffer each, and at least 5.
        seen, on_nvme = 0, 0
        for p in model.parameters():
            if seen + p.numel() > max_in_cpu - sub_group_size:
                on_nvme += 1
            seen += p.numel()
        return max(5, on_nvme)

    @staticmethod
    def _stage3_knobs(h):
        # Hugging Face's "auto" values for ZeRO-3, from the hidden size
        return {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
                "stage3_param_persistence_threshold": 10 * h, "stage3_max_live_parameters": int(1e9),
                "stage3_max_reuse_distance": int(1e9), "stage3_gather_16bit_weights_on_model_save": False}

    def setup(self, model):
        single_rank_env()
        import setuptools  # noqa: F401  (Python 3.12 has no distutils; op_builder's compile test needs it)
        import deepspeed
        from deepspeed.utils import logger as ds_logger
        import logging
        ds_logger.setLevel(logging.WARNING)
        import torch
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo",
                                   auto_mpi_discovery=False)
        self.cfg = self.config(model)
        log("deepspeed config: " + json.dumps(self.cfg))
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=self.cfg)
        self.engine, self.opt = engine, opt
        self.ds_version = deepspeed.__version__

    def step(self, ids):
        ids = ids.to(self.engine.device, non_blocking=True)
        loss = self.engine(input_ids=ids, labels=ids).loss
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def info(self):
        return {"deepspeed_version": self.ds_version, "deepspeed_config": self.cfg,
                "optimizer": type(self.opt).__name__ + " wrapping " +
                type(getattr(self.opt, "optimizer", self.opt)).__name__}

    def close(self):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


SYSTEM_CLASSES = {"ideal": Ideal, "teraio": Teraio, "fsdp2-offload": Fsdp2Offload,
                  "ds-offload": DeepSpeedSystem, "ds-infinity": DeepSpeedSystem}


# ---------------------------------------------------------------------------------------------------

def environment(device) -> dict:
    import torch
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "hostname": platform.node(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    for mod in ("transformers", "deepspeed", "teraio"):
        if mod in sys.modules:
            env[mod] = getattr(sys.modules[mod], "__version__", "present")
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        env.update(gpu=prop.name, gpu_total_bytes=prop.total_memory)
    try:
        with open("/proc/meminfo") as f:
            env["host_mem_total_bytes"] = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    return env


def estimates(args, nparams: int) -> dict:
    """Rough bytes of the training state, to see early whether a configuration can fit."""
    p = 2 if args.dtype == "bf16" else 4  # amp: fp32 params
    est = {"params_bytes": nparams * p, "train_state_bytes_torch_adamw": nparams * p * 4}
    if args.system.startswith("ds-"):
        est["ds_host_or_nvme_bytes"] = nparams * (4 * 3 + 4)  # fp32 master, m, v + fp32 grads
        if args.system == "ds-infinity":
            est["ds_nvme_bytes"] = nparams * (4 * 3 + p)  # optimizer states + params
    return est


def run(args) -> dict:
    res = {"ok": False, "argv": sys.argv, "started": datetime.datetime.now().isoformat(timespec="seconds"),
           "config": {k: v for k, v in vars(args).items()}}
    t_start = time.perf_counter()
    run_dir = None
    system = None
    try:
        import torch
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda":
            torch.cuda.set_device(0)
            device = torch.device("cuda", 0)
        cuda = device.type == "cuda"
        res["config"]["device"] = str(device)
        torch_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        warmup = args.warmup
        if args.system == "teraio" and warmup < args.profiling_iterations + 1:
            warmup = args.profiling_iterations + 1
            log(f"teraio: warm-up raised to {warmup} (profiling steps + the first planned step)")
        res["config"]["warmup_effective"] = warmup

        if args.system == "ds-infinity" or (args.system == "teraio" and "disk" in args.tiers):
            os.makedirs(args.disk_dir, exist_ok=True)
            run_dir = os.path.join(os.path.abspath(args.disk_dir),
                                   f"llm_bench-{args.system}-{os.getpid()}")
            os.makedirs(run_dir, exist_ok=True)
            res["config"]["run_dir"] = run_dir

        log(f"building {args.model} ({args.dtype}) on CPU, seed {args.seed}")
        t = time.perf_counter()
        model, cfg = build_model(args, torch_dtype)
        nparams = sum(p.numel() for p in model.parameters())
        res["config"]["parameters"] = nparams
        res["config"]["model_shape"] = model_shape(args)
        res["config"]["model_table_name"] = MODEL_SHAPES[args.model]
        res["config"]["tokens_per_step"] = args.batch * args.seq
        res["estimates"] = estimates(args, nparams)
        res["build_s"] = time.perf_counter() - t
        log(f"{nparams / 1e9:.3f} B parameters, built in {res['build_s']:.1f} s")
        if args.system == "ds-infinity" and not args.no_space_check:
            free = shutil.disk_usage(run_dir).free
            need = res["estimates"]["ds_nvme_bytes"]
            res["estimates"]["disk_free_bytes"] = free
            if need > free:
                raise RuntimeError(f"ds-infinity needs about {need / 2**30:.1f} GiB of swap files in {args.disk_dir}, "
                                   f"which has {free / 2**30:.1f} GiB free (--no-space-check to try anyway)")

        batches = make_batches(args, cfg.vocab_size, warmup + args.steps + (1 if args.timeline else 0))
        system = SYSTEM_CLASSES[args.system](args, device, run_dir)
        res["precision"] = system.precision()
        t = time.perf_counter()
        log(f"setting up {args.system}")
        system.setup(model)
        del model
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
        res["setup_s"] = time.perf_counter() - t
        log(f"setup {res['setup_s']:.1f} s")

        def sync():
            if cuda:
                torch.cuda.synchronize()

        monitor = Monitor(cuda)
        warm_times, warm_losses, times, losses = [], [], [], []
        for i in range(warmup + args.steps):
            measured = i >= warmup
            if i == warmup:
                sync()
                gc.collect()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                io0 = proc_io()
                bd0 = block_device_stat(run_dir or args.disk_dir)
                monitor.start()
                system.mark_measured()
            sync()
            t0 = time.perf_counter()
            loss = system.step(batches[i])
            sync()
            dt = time.perf_counter() - t0
            lv = float(loss)
            (times if measured else warm_times).append(dt)
            (losses if measured else warm_losses).append(lv)
            n = i - warmup + 1 if measured else i + 1
            log(f"{'step' if measured else 'warmup'} {n}/{args.steps if measured else warmup}: "
                f"{dt:.3f} s, loss {lv:.4f}, {args.batch * args.seq / dt:.0f} tokens/s")
            if not math.isfinite(lv):
                raise RuntimeError(f"loss is {lv} at step {i}")
        monitor.stop()
        io1 = proc_io()
        bd1 = block_device_stat(run_dir or args.disk_dir)

        mean = statistics.fmean(times)
        res.update({
            "warmup_step_s": warm_times, "warmup_losses": warm_losses,
            "step_s": times, "losses": losses,
            "step_s_mean": mean, "step_s_stdev": statistics.stdev(times) if len(times) > 1 else 0.0,
            "step_s_min": min(times), "step_s_median": statistics.median(times),
            "tokens_per_s": args.batch * args.seq / mean,
            "tokens_per_s_best": args.batch * args.seq / min(times),
        })
        mem = {"host_rss_peak_measured_bytes": monitor.peak_rss,
               "host_ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        if cuda:
            mem.update(cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(),
                       cuda_max_reserved_bytes=torch.cuda.max_memory_reserved())
            if monitor.peak_nvml is not None:
                mem["nvml_used_peak_bytes"] = monitor.peak_nvml
        res["memory"] = mem
        io = {"proc_read_bytes": io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
              "proc_write_bytes": io1.get("write_bytes", 0) - io0.get("write_bytes", 0),
              "note": "over the measured steps; /proc/self/io counts bytes that reached the block layer"}
        if bd0 and bd1:
            io.update(block_device=bd0[0], device_read_bytes=(bd1[1] - bd0[1]) * 512,
                      device_write_bytes=(bd1[2] - bd0[2]) * 512)
        if run_dir:
            io["run_dir_bytes_at_end"] = dir_bytes(run_dir)  # allocated blocks: teraio fallocates its FileTier
        res["io"] = io
        res["system_info"] = system.info()
        if args.system == "teraio":
            res["floor"] = step_floor(res["system_info"], args.steps, res["step_s_median"])
            res["plan_bytes_by_kind"] = plan_bytes_by_kind(args.trace_out, args.plan_out)
        if args.timeline and cuda:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import timeline
            log(f"one more step under torch.profiler -> {args.timeline}")
            t0 = time.perf_counter()
            loss, summary = timeline.profile_step(lambda: system.step(batches[-1]), args.timeline)
            summary["step_s_under_profiler"] = time.perf_counter() - t0
            per_step = getattr(system, "per_step_stats", None)
            if per_step and len(per_step) >= 2:  # what teraio's counters did in that step
                counters = sys.modules["teraio"].STATS_COUNTERS
                summary["teraio_step_delta"] = {k: per_step[-1][k] - per_step[-2][k] for k in counters
                                                if k in per_step[-1]}
            res["timeline"] = summary
            log("timeline: " + json.dumps({k: summary.get(k) for k in (
                "span_us", "compute_busy_us", "idle_starved_us", "idle_waiting_us", "idle_waiting_after")}))
        res["environment"] = environment(device)
        res["ok"] = True
        log(f"{args.system} {args.model} {args.dtype}: mean {mean:.3f} s/step, {res['tokens_per_s']:.0f} tokens/s"
            + (f", max allocated {mem['cuda_max_allocated_bytes'] / 2**30:.2f} GiB" if cuda else "")
            + f", host RSS peak {mem['host_rss_peak_measured_bytes'] / 2**30:.2f} GiB")
    except BaseException as e:  # noqa: BLE001  (a failing configuration must still write its JSON)
        tb = traceback.format_exc()
        res["error"] = f"{type(e).__name__}: {e}"[:4000]
        res["traceback_tail"] = tb[-6000:]
        res["oom"] = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        log(f"FAILED: {res['error'][:500]}")
        if system is not None:
            with contextlib.suppress(BaseException):
                res["system_info"] = system.info()
        with contextlib.suppress(BaseException):
            res.setdefault("environment", environment(device))
    finally:
        if system is not None:
            with contextlib.suppress(BaseException):
                system.close()
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    res["total_s"] = time.perf_counter() - t_start
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    d = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(d, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    log(f"wrote {args.out} (ok={res['ok']})")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
