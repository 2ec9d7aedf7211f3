"""CPU smoke test of bench/ddp_bench.py (issue 7's multi-GPU benchmark): the tiny HF Llama, world
sizes 1 and 2 with gloo, a Session per rank at half its footprint with host and file tiers. The
script must exit 0 and its JSON must say, on every rank of both world sizes, that the run with
teraio is bitwise the run without it and that the Session offloaded."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "ddp_bench.py")


def test_ddp_bench_cpu_smoke(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ)
    # the workers import teraio from wherever this test did
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--world", "1,2", "--model", "tiny", "--budget", "1/2",
           "--warmup", "3", "--steps", "2", "--seq", "32", "--tiers", "host+disk", "--disk-dir", str(tmp_path),
           "--timeout", "150", "--out", str(out)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=360)
    log = p.stdout.decode(errors="replace")
    assert p.returncode == 0, log[-6000:]

    summary = json.loads((out / "ddp_bench_tiny_summary.json").read_text())
    assert summary["ok"], summary
    assert set(summary["scaling_efficiency"]["teraio"]) == {"2"}, summary
    for world in (1, 2):
        res = json.loads((out / f"ddp_bench_tiny_w{world}.json").read_text())
        assert res["ok"] and res["bitwise"]["equal"], res.get("errors")
        assert res["teraio"]["tokens_per_s"] > 0 and res["reference"]["tokens_per_s"] > 0
        assert len(res["ranks"]) == world
        for rank in res["ranks"]:
            assert rank["bitwise"]["equal"], (world, rank["rank"], rank["bitwise"])
            stats = rank["teraio"]["stats"]
            assert stats["bytes_offloaded"] > 0, (world, rank["rank"], stats)
            assert stats["mode"] == "planned" and stats["last_error"] == "", (world, rank["rank"], stats)
