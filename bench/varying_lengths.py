#!/usr/bin/env python3
"""A loop whose batches vary in length (dynamic padding), on the CPU: a tiny HF Llama (tests/python/
conftest.py's TinyLlama), 60 steps of 2 sequences of 8 to 47 tokens (40 lengths), per-parameter
AdamW, a Session at 400 KiB with a host tier, against the same loop without a Session; training
checked bitwise. Prints both times and the Session's drift_events, steps_on_larger_plans and
plans_cached (docs/pytorch.md, "Batches of varying length").

    python3 bench/varying_lengths.py [REPEATS]     (default 3)
"""
import os
import sys
import time

import teraio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from conftest import TinyLlama, assert_bitwise, length_batches, train  # noqa: E402

BATCHES = length_batches([8 + (i * 7) % 40 for i in range(60)])


def run(session):
    return train(TinyLlama, None, len(BATCHES), session=session, lr=1e-3, batches=BATCHES)


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for r in range(repeats):
        t = time.perf_counter()
        ref = run(None)
        without = time.perf_counter() - t
        with teraio.Session(budget="400KiB", tiers=[teraio.HostTier("64MiB")], min_tensor_bytes=1024) as s:
            t = time.perf_counter()
            got = run(s)
            with_s = time.perf_counter() - t
            st = s.stats()
            s.fetch_all()
            assert_bitwise(ref, got)
        print(f"run {r}: {without:.2f} s without a Session, {with_s:.2f} s with ({with_s / without:.2f}x); "
              f"drift_events {st['drift_events']}, steps_on_larger_plans {st['steps_on_larger_plans']}, "
              f"plans_cached {st['plans_cached']}, budget_violations {st['budget_violations']}", flush=True)


if __name__ == "__main__":
    main()
