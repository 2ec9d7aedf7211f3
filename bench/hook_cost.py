#!/usr/bin/env python3
"""Host cost of teraio's operator callbacks where no GPU bounds the step (docs/benchmarks.md, "Where a
planned step waits"): a small HF Llama trained on the CPU, per-parameter AdamW, 5 planned steps after 4.

    python3 bench/hook_cost.py [teraio|none] [BUDGET]    # BUDGET 40MiB: a plan that moves; 4GiB: none
"""
import sys, time, torch, transformers, teraio
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
m = transformers.LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)
ids = torch.randint(0, 1000, (2, 128))
def step():
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "teraio"
budget = sys.argv[2] if len(sys.argv) > 2 else "40MiB"
if mode == "none":
    for i in range(3): step()
    t = time.perf_counter()
    for i in range(5): step()
    print("no session: %.1f ms/step" % ((time.perf_counter() - t) / 5 * 1e3))
    sys.exit()
s = teraio.Session(budget=budget, tiers=[teraio.HostTier("1GiB", read_gbps=20, write_gbps=20)], min_tensor_bytes=4096)
s.watch(m, opt)
for i in range(4):
    with s.step(): step()
st0 = s.stats(); t = time.perf_counter()
for i in range(5):
    with s.step(): step()
dt = (time.perf_counter() - t) / 5
st = s.stats()
d = {k: (st[k] - st0[k]) / 5 for k in ("hook_us", "stall_us", "plan_moves", "recomputes")}
print(f"{st['mode']} ops {st['operators']} step {dt*1e3:.1f} ms hook {d['hook_us']/1e3:.1f} ms stall {d['stall_us']/1e3:.1f} ms "
      f"own/op {(d['hook_us']-d['stall_us'])/st['operators']:.1f} us moves {d['plan_moves']} recomputes {d['recomputes']}")
