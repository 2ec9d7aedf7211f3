"""bench/timeline.py's reading of a profiler trace (docs/benchmarks.md, "Where a planned step
waits"): the compute stream's idle time is split into starved (the next kernel launched after the
previous one ended) and waiting (launched in time), a wait is put on the copy that ended just
before it, and the copies are summed per direction."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import timeline  # noqa: E402


def x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "args": args}


def test_idle_time_is_starved_or_waiting_and_copies_are_summed():
    ev = [
        x("cpu_op", "aten::mm", 0, 50), x("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
        x("cpu_op", "aten::mul", 60, 20), x("cuda_runtime", "cudaLaunchKernel", 65, 5, correlation=3),
        x("cpu_op", "aten::add", 200, 50), x("cuda_runtime", "cudaLaunchKernel", 210, 5, correlation=2),
        x("kernel", "k1", 20, 100, stream=7, correlation=1),
        # launched at 70, starts at 130 right after a read ended at 125: 10 us waiting on the read
        x("kernel", "k3", 130, 30, stream=7, correlation=3),
        # launched at 215, after k3 ended at 160: 55 us starved, then 15 us of launch latency
        x("kernel", "k2", 230, 30, stream=7, correlation=2),
        x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 50, 75, stream=20, correlation=9, bytes=75 * 55000),
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 100, 40, stream=21, correlation=10, bytes=40 * 50000),
    ]
    s = timeline.analyze({"traceEvents": ev})
    assert s["compute_stream"] == 7
    assert s["span_us"] == 240 and s["compute_busy_us"] == 160 and s["compute_idle_us"] == 80
    assert s["idle_starved_us"] == 55 and s["idle_waiting_us"] == 25
    assert s["idle_waiting_after"] == {"read": 10, "launch": 15}
    assert s["starved_by_launching_op"] == {"aten::add": 55}
    assert s["copies"]["read"]["bytes"] == 75 * 55000 and abs(s["copies"]["read"]["gbps_while_busy"] - 55) < 1e-9
    assert s["copies"]["write"]["busy_us"] == 40
    assert s["link_busy_either_us"] == 90 and s["link_busy_both_us"] == 25
