#!/usr/bin/env python3
"""Prints what a recorded plan (teraio.plan JSON: a Session's plan_path or llm_bench's --plan-out)
was planned with, as `teraio plan` takes it: "BUDGET_BYTES host:CAPACITY:READ:WRITE:BOTH" (its
planner budget and its first tier; docs/formats.md, "Tier specs"). BOTH is the tier's duplex_gbps;
a plan that has none gets 0 (independent directions) or, with --duplex-default min, the slower of
its two directions.

Usage: python3 bench/recorded_plan_args.py PLAN.json [--duplex-default {zero,min}]
"""
import argparse
import json

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("plan")
ap.add_argument("--duplex-default", choices=("zero", "min"), default="zero")
a = ap.parse_args()
with open(a.plan) as f:
    p = json.load(f)
t = p["tiers"][0]
both = t.get("duplex_gbps", 0 if a.duplex_default == "zero" else min(t["read_gbps"], t["write_gbps"]))
print(p["budget_bytes"], "host:%d:%r:%r:%r" % (t["capacity_bytes"], t["read_gbps"], t["write_gbps"], both))
