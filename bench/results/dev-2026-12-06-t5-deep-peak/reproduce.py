import os, sys, json
os.environ["TERAIO_DEEP_RECOMPUTE"] = "1"; os.environ["TERAIO_WRITEBACKS"] = "1"
sys.path.insert(0, ".")
import torch, teraio
from test_architectures import maker, ids_batch
from conftest import *  # noqa
import test_architectures as ta
make = maker("t5", amp=False)
torch.manual_seed(0)
footprint = 4 * sum(p.numel() * p.element_size() for p in make().parameters())
budget = footprint // 2
for trial in range(8):
    with teraio.Session(budget=f"{budget}B", min_tensor_bytes=1024, trace_path="/tmp/t5trace.json", plan_path="/tmp/t5plan.json",
                        tiers=[teraio.HostTier("256MiB", read_gbps=0.01, write_gbps=0.01)]) as s:
        got = ta.train(make, ids_batch, 5, session=s)
        st = s.stats()
    print(trial, st["step_peak_resident_bytes"], st["budget_bytes"], st["plan_budget_bytes"], st["plan_variant"], flush=True)
    if st["step_peak_resident_bytes"] > st["budget_bytes"]:
        break
