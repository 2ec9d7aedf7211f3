"""The Hugging Face Trainer under teraio: TeraioCallback makes every optimizer step a Session step
and brings the offloaded tensors back before each checkpoint (docs/pytorch.md, "Hugging Face
Trainer"). A Llama built from a config, random tokens, gradient accumulation, a checkpoint every
few steps, then training resumed from the first checkpoint under a new Session.

    python examples/hf_trainer.py                      # CPU, a small model, ~15 s
    python examples/hf_trainer.py --device cuda --hidden 1024 --layers 8 --budget 2GiB
"""
import argparse
import os
import shutil
import tempfile

import torch
import transformers

import teraio
from teraio.integrations.hf import TeraioCallback


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab):
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the Llama")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--budget", help="device bytes for tracked tensors (default: half of the "
                                     "parameters, gradients and AdamW states)")
    ap.add_argument("--host-tier", default="4MiB", help="capacity of the host-memory tier")
    ap.add_argument("--file-tier", default="1GiB", help="capacity of the file tier")
    ap.add_argument("--output-dir", help="checkpoints and tier files (default: a temporary one)")
    a = ap.parse_args()
    out = a.output_dir or tempfile.mkdtemp(prefix="teraio-hf-example-")
    tier_dir = os.path.join(out, "tier")
    os.makedirs(tier_dir, exist_ok=True)

    def make_model():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=a.hidden,
                                       intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=a.seq)
        return transformers.LlamaForCausalLM(cfg)

    # parameters + gradients + two AdamW states: 4 times the parameters' bytes
    state_bytes = 4 * sum(p.numel() * p.element_size() for p in make_model().parameters())
    budget = a.budget or state_bytes // 2
    print(f"Llama {a.hidden}x{a.layers}: training state {state_bytes / 2**20:.1f} MiB, "
          f"budget {budget if a.budget else f'{budget / 2**20:.1f} MiB'}, output in {out}")

    def train(run, resume=None, first_step=0):
        # One Session per train(): opened at on_train_begin, closed at on_train_end.
        cb = TeraioCallback(budget, [teraio.HostTier(a.host_tier),
                                     teraio.FileTier([tier_dir], a.file_tier)])
        args = transformers.TrainingArguments(
            output_dir=os.path.join(out, run), use_cpu=a.device == "cpu", report_to="none",
            disable_tqdm=True, max_steps=a.steps, per_device_train_batch_size=2,
            gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1,
            save_strategy="steps", save_steps=max(1, a.steps // 2), seed=0)
        trainer = transformers.Trainer(
            model=make_model(), args=args, train_dataset=RandomTokens(64, a.seq, 1024),
            # The Trainer's default optimizer (fused AdamW) and gradient clipping: the callback
            # runs both in parts that fit the budget (docs/pytorch.md, "Hugging Face Trainer").
            callbacks=[cb])
        with cb:  # closes the Session even if train() raises from the model's code
            trainer.train(resume_from_checkpoint=resume)
        st = cb.stats()  # the Session's last stats, taken before it closed
        losses = [h["loss"] for h in trainer.state.log_history
                  if "loss" in h and h["step"] > first_step]
        print(f"{run}: losses of steps {first_step + 1}-{a.steps}: {[round(x, 4) for x in losses]}")
        print(f"{run}: teraio " + ", ".join(f"{k} {st[k]}" for k in (
            "mode", "iteration", "budget_bytes", "peak_resident_bytes", "bytes_offloaded",
            "bytes_prefetched", "plan_moves", "urgent_fetches", "evictions", "drift_events")))
        print(f"{run}: tiers " + "; ".join(
            f"{t['name']} {t['engine']} read {t['read_gbps']:.2f} write {t['write_gbps']:.2f} GB/s"
            for t in st["tiers"]))
        return trainer

    try:
        train("run")
        # Resume from the checkpoint written mid-run (while tensors were offloaded).
        # The resumed steps log the same losses as the same steps of the first run.
        half = max(1, a.steps // 2)
        train("resumed", resume=os.path.join(out, "run", f"checkpoint-{half}"), first_step=half)
        print(f"tier directory after training: {os.listdir(tier_dir)} "
              f"(the Sessions removed their files)")
    finally:
        if not a.output_dir:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
