#!/usr/bin/env python3
"""Where the Session's operator callbacks spend their host time, from a py-spy profile with native
frames (`py-spy record --native --idle -f raw`: one collapsed stack and its sample count per line;
bench/host_spy.sh records one). Counts the samples whose stack is inside teraio's RecordFunction
callbacks (on_start_cb / on_end_cb) and splits them by the deepest teraio function and by the leaf
frame; for the functions that wait (Completion::wait, cudaEventSynchronize, a mutex), the chains of
teraio callers that reached them.

    python3 bench/spy_summary.py PROFILE.txt[.xz] [--top N]
"""
import argparse
import collections
import lzma

CALLBACKS = ("on_start_cb", "on_end_cb")
WAITS = ("Completion::wait", "Completion::stream_wait", "cudaEventSynchronize", "cudaStreamSynchronize",
         "pthread_mutex_lock", "pthread_cond_wait", "pthread_cond_timedwait", "__lll_lock_wait")


def short(frame):
    name = frame.split(" (")[0]
    for noise in ("teraio::", "(anonymous namespace)::"):
        name = name.replace(noise, "")
    return name[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    f = lzma.open(a.profile, "rt") if a.profile.endswith(".xz") else open(a.profile)
    total = inside = 0
    deepest, leaf = collections.Counter(), collections.Counter()
    waits = collections.defaultdict(collections.Counter)
    for line in f:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not n.isdigit():
            continue
        n, frames = int(n), stack.split(";")
        total += n
        at = next((i for i, fr in enumerate(frames) if any(c in fr for c in CALLBACKS)), None)
        if at is None:
            continue
        inside += n
        sub = frames[at:]
        leaf[short(sub[-1])] += n
        ours = [fr for fr in sub if "teraio" in fr]
        deepest[short(ours[-1] if ours else sub[0])] += n
        for i, fr in enumerate(sub):
            w = next((w for w in WAITS if w in fr), None)
            if w:
                chain = [short(x) for x in sub[:i] if "teraio" in x]
                waits[w][" > ".join(chain[-4:])] += n
                break
    print(f"samples {total}, inside the callbacks {inside} ({100 * inside / max(total, 1):.1f}%)")
    for title, counter in (("deepest teraio function", deepest), ("leaf frame", leaf)):
        print(f"-- {title} (share of the callbacks' samples)")
        for k, v in counter.most_common(a.top):
            print(f"{v:7d} {100 * v / max(inside, 1):5.1f}%  {k}")
    for w, chains in sorted(waits.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"-- waits in {w}: {sum(chains.values())} samples")
        for k, v in chains.most_common(6):
            print(f"{v:7d}  {k}")


if __name__ == "__main__":
    main()
