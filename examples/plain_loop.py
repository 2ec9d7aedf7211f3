"""The README's training loop under a teraio Session: a Hugging Face Llama built from a config
(random weights, random tokens), AdamW, a budget below what training needs, so that parameters,
gradients, optimizer states and activations go to a host tier and to files and come back.

    python examples/plain_loop.py                      # CPU, a small model, ~10 s
    python examples/plain_loop.py --device cuda --hidden 1024 --layers 8 --budget 2GiB
"""
import argparse
import shutil
import tempfile

import torch
import transformers

import teraio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the Llama")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--budget", help="device bytes for tracked tensors (default: half of the "
                                     "parameters, gradients and AdamW states)")
    ap.add_argument("--host-tier", default="4MiB", help="capacity of the host-memory tier")
    ap.add_argument("--tier-dir", help="directory of the file tier (default: a temporary one)")
    ap.add_argument("--file-tier", default="1GiB", help="capacity of the file tier")
    a = ap.parse_args()

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=a.hidden,
                                   intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=a.seq)
    model = transformers.LlamaForCausalLM(cfg).to(a.device)
    # PyTorch's default AdamW: foreach on CUDA (each operator takes the whole parameter group),
    # per-parameter on CPU. session.watch(optimizer=...) below runs its steps in parts that fit.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # parameters + gradients + two AdamW states: 4 times the parameters' bytes
    state_bytes = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    budget = a.budget or state_bytes // 2
    tier_dir = a.tier_dir or tempfile.mkdtemp(prefix="teraio-example-")
    print(f"Llama {a.hidden}x{a.layers}: training state {state_bytes / 2**20:.1f} MiB, "
          f"budget {budget if a.budget else f'{budget / 2**20:.1f} MiB'}, file tier in {tier_dir}")

    # Tiers in order of preference for evictions: a little host memory, then files. Their
    # bandwidths are measured by the Session at the first step (stats()["tiers"]).
    session = teraio.Session(budget=budget, tiers=[teraio.HostTier(a.host_tier),
                                                   teraio.FileTier([tier_dir], a.file_tier)])
    # Names tensors in traces and diagnostics, and runs each foreach or fused optimizer step in
    # parts that fit the budget (bitwise the same result; docs/pytorch.md, "Optimizers").
    session.watch(model, optimizer)
    try:
        g = torch.Generator().manual_seed(1)
        for step in range(a.steps):
            ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g).to(a.device)
            with session.step():  # one step: forward, backward, optimizer.step(), zero_grad
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            st = session.stats()
            print(f"step {step}: loss {loss.item():.4f}  mode {st['mode']}  "
                  f"resident {st['step_peak_resident_bytes'] / 2**20:.2f} MiB at most")

        # torch.save reads memory directly: bring everything back first.
        with session.resident():
            torch.save(model.state_dict(), f"{tier_dir}/model.pt")
        print_stats(session.stats())
    finally:
        session.close()  # everything back on the device, tier files removed
        if not a.tier_dir:
            shutil.rmtree(tier_dir, ignore_errors=True)


def print_stats(st):
    print(f"teraio: mode {st['mode']}, {st['iteration']} steps, budget {st['budget_bytes']} B, "
          f"peak resident {st['peak_resident_bytes']} B")
    print(f"  bytes_offloaded {st['bytes_offloaded']}, bytes_prefetched {st['bytes_prefetched']}, "
          f"plan_moves {st['plan_moves']}, urgent_fetches {st['urgent_fetches']}, "
          f"evictions {st['evictions']}, drift_events {st['drift_events']}, "
          f"stall {st['stall_us'] / 1e3:.1f} ms")
    for t in st["tiers"]:
        print(f"  tier {t['name']} ({t['engine']}): read {t['read_gbps']:.2f} GB/s "
              f"({t['read_source']}), write {t['write_gbps']:.2f} GB/s ({t['write_source']})")


if __name__ == "__main__":
    main()
