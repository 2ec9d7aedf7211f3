#!/usr/bin/env python3
"""How the host time of teraio's operator callbacks grows with the number of tracked tensors
(docs/benchmarks.md, "Host time per operator in planned steps"): a narrow HF Llama of LAYERS
decoder layers (hidden 64, so that the kernels are short and the host's time shows), trained on the
CPU with per-parameter AdamW, one thread, under a budget that makes the plan move (2 MiB: about 1,500
moves a step at 16 layers). Prints the planned steps' mean time, the callbacks' host time per step
(stats()["hook_us"]) and per operator, and the Session's prediction with and without its own host
time (Note [The runner's host time]); `none` trains without a Session.

    python3 bench/hook_scaling.py [teraio|none] [LAYERS] [STEPS] [BUDGET]   # teraio 16 5 2MiB
"""
import sys
import time

import torch
import transformers

import teraio

mode = sys.argv[1] if len(sys.argv) > 1 else "teraio"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 16
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
budget = sys.argv[4] if len(sys.argv) > 4 else "2MiB"
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = transformers.LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
ids = torch.randint(0, 512, (4, 64))


def step():
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


if mode == "none":
    for _ in range(3):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    print(f"layers {layers} no session: {(time.perf_counter() - t) / steps * 1e3:.1f} ms/step")
    sys.exit()
s = teraio.Session(budget=budget, tiers=[teraio.HostTier("1GiB", read_gbps=20, write_gbps=20)],
                   min_tensor_bytes=1024)
s.watch(model, opt)
for _ in range(4):  # 2 profiled, then planned
    with s.step():
        step()
st0 = s.stats()
t = time.perf_counter()
for _ in range(steps):
    with s.step():
        step()
dt = (time.perf_counter() - t) / steps
st = s.stats()
hook = (st["hook_us"] - st0["hook_us"]) / steps
print(f"layers {layers} {st['mode']}: {dt * 1e3:.1f} ms/step, callbacks {hook / 1e3:.1f} ms/step "
      f"({hook / st['operators']:.2f} us per operator), {st['operators']} operators, "
      f"{st['tracked_tensors']} tracked tensors, {(st['plan_moves'] - st0['plan_moves']) / steps:.0f} moves/step, "
      f"{(st['full_sweeps'] - st0['full_sweeps']) / steps:.0f} full sweeps/step; predicted "
      f"{st['predicted_iteration_us'] / 1e3:.1f} ms (plan-time {st['plan_predicted_us'] / 1e3:.1f}, "
      f"the Session's own {st['runner_host_us_per_operator']:.2f} us per operator)")
