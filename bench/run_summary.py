#!/usr/bin/env python3
"""One line per bench/llm_bench.py result, for a device call's output (bench/h200_call32.sh,
bench/h200_call34.sh): each measured step and their median, GPU max allocated, and for teraio the
Session's prediction (with its plan-time replay and its own host time per operator), the callbacks'
host time, the recomputes, moves and full sweeps per measured step, the warm-up steps and the plan's
variant (which says when the Session planned again for its host times). A failed run prints its error;
a path that does not exist (an unmatched glob) is skipped.

    python3 bench/run_summary.py RESULT.json ...
"""
import json
import os
import sys

for path in sys.argv[1:]:
    if not os.path.exists(path):  # a shell glob that matched nothing
        continue
    r = json.load(open(path))
    name = os.path.basename(path)
    if not r.get("ok"):
        print(name, r.get("error", "")[:300])
        continue
    line = [name, "steps", " ".join("%.3f" % s for s in r["step_s"]), "median %.3f s" % r["step_s_median"],
            "maxalloc %.2f GiB" % (r.get("memory", {}).get("cuda_max_allocated_bytes", 0) / 2**30)]
    st = r.get("system_info", {}).get("stats")
    if st:  # teraio
        d, n = r["system_info"]["measured_delta"], len(r["step_s"])
        line += ["predicted %.3f s" % (st["predicted_iteration_us"] / 1e6),
                 "Session measured %.3f s" % (st.get("measured_step_us", 0) / 1e6),
                 "(plan-time %.3f s, runner %.1f us/op, recomputes' host %.1f ms/step)" % (
                     st.get("plan_predicted_us", 0) / 1e6, st.get("runner_host_us_per_operator", 0),
                     st.get("recompute_host_us_per_step", 0) / 1e3),
                 "hook %.1f ms/step (controller %.1f, submits %.1f)" % (
                     d["hook_us"] / n / 1e3, d.get("controller_us", 0) / n / 1e3, d.get("submit_us", 0) / n / 1e3),
                 "waits ms/step: read %.1f (at a use %.1f), write %.1f (due %.1f, read back %.1f, writeback %.1f), room %.1f" % tuple(
                     d.get(k, 0) / n / 1e3 for k in ("stall_read_us", "stall_read_use_us", "stall_write_us", "stall_write_due_us",
                                                     "stall_write_readback_us", "stall_writeback_us",
                                                     "stall_room_us")),
                 "writebacks %d (taken over %d)" % (d.get("writebacks", 0) / n, d.get("writebacks_taken_over", 0) / n),
                 "reads after writes %d" % (d.get("reads_after_writes", 0) / n),
                 "recompute %.1f ms" % (d["recompute_us"] / n / 1e3), "n %d" % (d["recomputes"] / n),
                 "moves %d" % (d["plan_moves"] / n), "full sweeps %d" % (d.get("full_sweeps", 0) / n),
                 "warm-up steps " + " ".join("%.3f" % s for s in r.get("warmup_step_s", [])),
                 "host scale %.2f, replans %d (%d not kept) of %d searches" % (
                     st.get("host_time_scale", 1), st.get("host_replans", 0),
                     st.get("host_replans_reverted", 0), st.get("host_replan_searches", 0)),
                 "links " + "; ".join(
                     "%s read %.1f (%s, in use %.1f) write %.1f (%s, in use %.1f) GB/s" % (
                         t["name"], t["read_gbps"], t["read_source"], t.get("read_gbps_in_use", 0),
                         t["write_gbps"], t["write_source"], t.get("write_gbps_in_use", 0))
                     for t in st.get("tiers", [])) + ", corrected %d" % st.get("link_replans", 0),
                 "drifts %d" % st.get("drift_events", 0),
                 "variant '%s'" % st.get("plan_variant", "")]  # says when it was planned again for the host
    print(*line)
