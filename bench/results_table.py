#!/usr/bin/env python3
"""One markdown row per bench/llm_bench.py result, the columns of docs/benchmarks.md's tables.

Usage: python3 bench/results_table.py [--ideal SECONDS] RESULT ... (JSON files, folders of them, or
the .tgz archives bench/h200_run.sh writes). --ideal is the Ideal step of the same model and
dtype, for the "% of Ideal" column (left out: the column says "–"). Runs that failed are rows with
their error. Columns: run, step median [min, max], tokens/s, % of Ideal, the Session's prediction
(and its error against the median), the run's floor and its bound, step / floor (and / the floor
with the link busy both ways at its probed both-ways rate, where that is higher), GiB written
(offloads and writebacks) / read / discarded per measured step, recomputes per measured step (their time), GPU max allocated against
the budget, and the plan variant the Session kept. --kinds prints instead, per run, the plan's GiB
per step offloaded / prefetched / recomputed for each kind of tensor (which bytes cross the link).
"""
import argparse
import io
import json
import os
import statistics
import sys
import tarfile

GIB = 1 << 30


def load(paths):
    """(name, result) for every llm_bench result under paths."""
    for p in paths:
        if os.path.isdir(p):
            for f in sorted(os.listdir(p)):
                if f.endswith(".json") and not f.startswith(("trace-", "plan-", "timeline-")):
                    yield from load([os.path.join(p, f)])
        elif p.endswith((".tgz", ".tar.gz")):
            with tarfile.open(p) as tf:
                for m in sorted(tf.getmembers(), key=lambda m: m.name):
                    base = os.path.basename(m.name)
                    if m.isfile() and base.endswith(".json") and not base.startswith(("trace-", "plan-", "timeline-")):
                        yield base[:-5], json.load(io.TextIOWrapper(tf.extractfile(m)))
        else:
            with open(p) as f:
                yield os.path.basename(p)[:-5], json.load(f)


def row(name, r, ideal):
    if not r.get("ok"):
        return f"| {name} | failed: {r.get('error', 'no result')} |"
    steps = r["step_s"]
    med = statistics.median(steps)
    cells = [name, f"{med:.3f} s [{min(steps):.3f}, {max(steps):.3f}]", f"{r['tokens_per_s']:,.0f}",
             f"{100 * ideal / med:.1f}%" if ideal else "–"]
    stats = r.get("system_info", {}).get("stats", {})
    pred = stats.get("predicted_iteration_us")
    cell = f"{pred / 1e6:.3f} s ({100 * (pred / 1e6 / med - 1):+.1f}%)" if pred else "–"
    plan_pred = stats.get("plan_predicted_us")  # without the Session's measured host time
    if pred and plan_pred and plan_pred != pred:
        cell += f"; plan-time {plan_pred / 1e6:.3f} s ({100 * (plan_pred / 1e6 / med - 1):+.1f}%)"
    cells.append(cell)
    fl = r.get("floor") or {}
    if fl.get("floor_s"):
        ratio = f"{med / fl['floor_s']:.2f}x"
        if fl.get("floor_duplex_s") and fl["floor_duplex_s"] > fl["floor_s"] * 1.005:
            # the link with both directions busy at the probe's both-ways rate (llm_bench step_floor)
            ratio += f" ({med / fl['floor_duplex_s']:.2f}x of {fl['floor_duplex_s']:.3f} s both ways)"
        cells += [f"{fl['floor_s']:.3f} s, {fl['bound']}", ratio]
    else:
        cells += ["–", "–"]
    d = stats and r["system_info"].get("measured_delta") or {}
    n = r["config"]["steps"]
    if d:
        written = d.get("bytes_offloaded", 0) + d.get("writeback_bytes", 0)  # writebacks write too
        cells.append(" / ".join(f"{b / n / GIB:.1f}" for b in (written, d.get("bytes_prefetched", 0),
                                                                d.get("discarded_bytes", 0))))
        cells.append(f"{d.get('recomputes', 0) / n:.0f} ({d.get('recompute_us', 0) / n / 1e3:.1f} ms)")
        # the Session's callbacks' host time per step (stats()["hook_us"], stalls included)
        cells.append(f"{d.get('hook_us', 0) / n / 1e3:.1f} ms")
    else:
        cells += ["–", "–", "–"]
    mem = r["memory"]["cuda_max_allocated_bytes"] / GIB
    budget = stats.get("budget_bytes")
    cells.append(f"{mem:.2f} / {budget / GIB:.2f} GiB" if budget else f"{mem:.2f} GiB")
    cells.append(stats.get("plan_variant", "–"))
    return "| " + " | ".join(cells) + " |"


def kinds_row(name, r):
    """The plan's bytes per tensor kind (GiB per step): offloaded / prefetched / recomputed."""
    by = r.get("plan_bytes_by_kind") or {}
    cells = [name]
    for kind in ("parameter", "optimizer_state", "gradient", "activation", "temporary"):
        b = by.get(kind, {})
        cells.append(" / ".join(f"{b.get(k, 0) / GIB:.2f}" for k in ("offload_bytes", "prefetch_bytes",
                                                                      "recompute_bytes")))
    return "| " + " | ".join(cells) + " |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ideal", type=float, default=0.0, help="the Ideal step in seconds (for %% of Ideal)")
    ap.add_argument("--kinds", action="store_true",
                    help="instead: the plan's bytes per tensor kind (offloaded / prefetched / recomputed GiB)")
    ap.add_argument("results", nargs="+")
    a = ap.parse_args()
    if a.kinds:
        print("| run | parameters | optimizer states | gradients | activations | temporaries |")
        print("|---" * 6 + "|")
        for name, r in load(a.results):
            if r.get("ok"):
                print(kinds_row(name, r))
        return
    print("| run | step, median [min, max] | tokens/s | % of Ideal | predicted (Session) | floor, bound | "
          "step / floor | written / read / discarded (GiB per step) | recomputes per step | "
          "callbacks' host time per step | GPU max allocated / budget | plan variant |")
    print("|---" * 12 + "|")
    for name, r in load(a.results):
        print(row(name, r, a.ideal))


if __name__ == "__main__":
    sys.exit(main())
