"""The host link one way and both ways at once (issue 16: the simulator models reads and writes as two
independent channels, each at its measured bandwidth; this measures whether the link carries both
at full speed together). Pinned host memory, copies of CHUNK bytes issued on one stream per direction
(torch copy_ with non_blocking, i.e. cudaMemcpyAsync), TOTAL bytes per direction per pass, REPEAT
passes. Prints and writes JSON (argv[1]): GB/s (1e9 bytes/s) per direction, alone and together."""
import json
import statistics
import sys
import time

import torch

CHUNK = 64 << 20
TOTAL = 4 << 30
REPEAT = 5


def timed(streams_work):
    """Runs each (stream, list of (dst, src)) concurrently; returns seconds until all finished."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    jobs = [(s, iter(w)) for s, w in streams_work]
    live = True
    while live:  # interleave the issue so that both streams start at once
        live = False
        for s, it in jobs:
            pair = next(it, None)
            if pair is None:
                continue
            live = True
            with torch.cuda.stream(s):
                pair[0].copy_(pair[1], non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(out):
    n = TOTAL // CHUNK
    dev_a = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(4)]
    dev_b = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(4)]
    host_r = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(4)]
    host_w = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(4)]
    s_read, s_write = torch.cuda.Stream(), torch.cuda.Stream()
    reads = [(dev_a[i % 4], host_r[i % 4]) for i in range(n)]    # host -> device (a tier read)
    writes = [(host_w[i % 4], dev_b[i % 4]) for i in range(n)]   # device -> host (a tier write)
    timed([(s_read, reads[:4]), (s_write, writes[:4])])  # warm-up
    res = {"chunk_bytes": CHUNK, "bytes_per_direction": TOTAL, "repeat": REPEAT,
           "device": torch.cuda.get_device_name()}
    for name, work in [("read_alone", [(s_read, reads)]), ("write_alone", [(s_write, writes)]),
                       ("both", [(s_read, reads), (s_write, writes)])]:
        gbps = [TOTAL / timed(work) / 1e9 for _ in range(REPEAT)]
        res[name] = {"gbps_per_direction_median": statistics.median(gbps), "min": min(gbps), "max": max(gbps)}
        print(name, res[name], flush=True)
    # both directions together, each direction timed on its own stream with events
    ev = {k: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for k in ("r", "w")}
    per = {"r": [], "w": []}
    for _ in range(REPEAT):
        torch.cuda.synchronize()
        ev["r"][0].record(s_read)
        ev["w"][0].record(s_write)
        timed([(s_read, reads), (s_write, writes)])
        ev["r"][1].record(s_read)
        ev["w"][1].record(s_write)
        torch.cuda.synchronize()
        for k in per:
            per[k].append(TOTAL / (ev[k][0].elapsed_time(ev[k][1]) / 1e3) / 1e9)
    res["both_by_direction"] = {"read_gbps_median": statistics.median(per["r"]),
                                "write_gbps_median": statistics.median(per["w"]),
                                "read": per["r"], "write": per["w"]}
    print("both_by_direction", res["both_by_direction"], flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "duplex.json")
