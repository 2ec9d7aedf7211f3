"""Issue 17's checks on the GPU (bench/h200_run.sh phase `hf`): Hugging Face models and the Trainer
under a teraio Session on CUDA, each against the same run without teraio, bitwise (deterministic
algorithms in both runs).
1. mixtral: a MixtralForCausalLM from a config (8 experts, top 2), STEPS steps in fp32 and in bf16
   autocast over fp32 weights, with a budget of half the training state (host tier, bandwidth
   measured): every loss and every parameter equal; drift events, planned steps and peak recorded.
2. trainer: transformers.Trainer with teraio.integrations.hf.TeraioCallback on CUDA, a budget below
   the training state: logged losses and final parameters equal to the same Trainer without teraio.
Each case runs with the optimizer given by --optim ("loop": AdamW(foreach=False); "default":
AdamW() as PyTorch makes it, foreach on CUDA). Writes one JSON file to argv's --out; exit 1 when a
case is not bitwise."""
import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch

import teraio

torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")


def mixtral(hidden, layers, vocab, ffn=None, heads=None, kv_heads=None):
    import transformers
    cfg = transformers.MixtralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn or hidden * 2,
                                     num_hidden_layers=layers, num_attention_heads=heads or hidden // 64,
                                     num_key_value_heads=kv_heads or hidden // 128, num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=1024)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg)


def make_opt(params, optim):
    return torch.optim.AdamW(params, lr=1e-3, foreach=False) if optim == "loop" else torch.optim.AdamW(params, lr=1e-3)


def train_mixtral(args, autocast, budget=None, tier_gib=None):
    """STEPS steps; returns (losses, params on CPU, stats or None, step seconds, peak bytes)."""
    gc.collect()  # the last run's optimizer is garbage in a reference cycle: free its device memory
    torch.cuda.empty_cache()
    model = mixtral(args.hidden, args.layers, args.vocab, args.ffn, args.heads, args.kv_heads).to(dev)
    opt = make_opt(model.parameters(), args.optim)
    session = None
    if budget is not None:
        session = teraio.Session(budget=budget, tiers=[teraio.HostTier(f"{tier_gib}GiB")])
        session.watch(model, opt)
    g = torch.Generator().manual_seed(1)
    losses, times, modes = [], [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for i in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ctx = session.step() if session is not None else torch.enable_grad()
        with ctx:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                out = model(input_ids=ids[:, :-1], labels=ids[:, 1:])
            out.loss.backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(out.loss.detach().float().cpu())
        if session is not None:
            modes.append(session.stats()["mode"])
    peak = torch.cuda.max_memory_allocated()
    stats = None
    if session is not None:
        stats = session.stats()
        stats["modes"] = modes
        session.fetch_all()
    params = [(n, p.detach().cpu()) for n, p in model.named_parameters()]
    if session is not None:
        session.close()
    del model, opt
    torch.cuda.empty_cache()
    return losses, params, stats, times, peak


def compare(ref, got):
    bad_losses = [i for i, (a, b) in enumerate(zip(ref[0], got[0])) if not torch.equal(a, b)]
    bad_params = [n for (n, p), (_, q) in zip(ref[1], got[1]) if not torch.equal(p, q)]
    return {"equal": not bad_losses and not bad_params, "losses_differ_at": bad_losses,
            "params_differ": bad_params[:5], "n_params": len(ref[1])}


def case_mixtral(args, autocast):
    ref = train_mixtral(args, autocast)
    state_bytes = 4 * sum(p.numel() * 4 for _, p in ref[1])  # fp32 params, grads, 2 AdamW states
    footprint = ref[4]
    budget = footprint // 2
    got = train_mixtral(args, autocast, budget=budget, tier_gib=max(4, 2 * state_bytes // 2**30 + 2))
    res = compare(ref, got)
    st = got[2]
    res.update(ideal_peak_bytes=footprint, budget_bytes=budget, state_bytes=state_bytes,
               teraio_peak_bytes=got[4], ideal_step_s=sorted(ref[3][2:])[len(ref[3][2:]) // 2],
               teraio_step_s=sorted(got[3][4:])[len(got[3][4:]) // 2],
               losses=[float(x) for x in ref[0]],
               stats={k: st.get(k) for k in ("mode", "modes", "drift_events", "plans_cached", "plan_moves",
                                              "urgent_fetches", "budget_violations", "kernel_timing", "recomputes",
                                              "urgent_recomputes", "lost_tensors", "skipped_moves",
                                              "profiled_kernel_us", "profiled_event_us",
                                              "predicted_iteration_us", "last_error")})
    return res


def case_trainer(args):
    import transformers
    from teraio.integrations.hf import TeraioCallback
    transformers.logging.set_verbosity_error()

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 8192, (64, 257), generator=torch.Generator().manual_seed(3))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    def run(out, budget):
        gc.collect()
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2048,
                                       num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                                       max_position_embeddings=512)
        cfg._attn_implementation = "eager"
        model = transformers.LlamaForCausalLM(cfg)
        targs = transformers.TrainingArguments(output_dir=out, report_to="none", disable_tqdm=True,
                                               per_device_train_batch_size=8, max_steps=args.trainer_steps,
                                               logging_steps=1, save_strategy="no", seed=0,
                                               learning_rate=1e-3, max_grad_norm=1.0)
        opt = make_opt(model.parameters(), args.optim) if args.optim == "loop" else None
        cbs = []
        if budget is not None:
            cbs = [TeraioCallback(budget, [teraio.HostTier("8GiB")])]
        tr = transformers.Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=cbs,
                                  optimizers=(opt, None))
        tr.train()
        losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
        params = [(n, p.detach().cpu()) for n, p in model.named_parameters()]
        del tr, model
        torch.cuda.empty_cache()
        return losses, params

    tmp = tempfile.mkdtemp(prefix="teraio-hf-")
    ref = run(os.path.join(tmp, "ref"), None)
    state = 4 * sum(p.numel() * 4 for _, p in ref[1])
    # half the training state (1.5 GiB): above all gradients at once (the gradient norm is one
    # operator over all of them) and the ~110 MiB of device memory that is not a tracked tensor
    budget = state // 2
    got = run(os.path.join(tmp, "teraio"), budget)
    bad_params = [n for (n, p), (_, q) in zip(ref[1], got[1]) if not torch.equal(p, q)]
    return {"equal": ref[0] == got[0] and not bad_params, "losses": ref[0], "teraio_losses": got[0],
            "params_differ": bad_params[:5], "state_bytes": state, "budget_bytes": budget}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--optim", default="loop", choices=("loop", "default"))
    p.add_argument("--model", default=None,
                   help="a Mixtral shape of data/models.json (e.g. mixtral-2b, 1.94 B parameters): sets "
                        "--hidden, --layers, --vocab and the FFN and head counts")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--trainer-steps", type=int, default=8)
    p.add_argument("--cases", default="mixtral-fp32,mixtral-bf16,trainer")
    args = p.parse_args()
    args.ffn = args.heads = args.kv_heads = None
    if args.model:
        table = json.load(open(os.path.join(os.path.dirname(__file__), "..", "data", "models.json")))
        shape = next((m for m in table["models"] if m["name"] == args.model), None)
        if shape is None or shape.get("arch") != "mixtral":
            p.error(f"--model {args.model}: not a Mixtral shape of data/models.json")
        args.hidden, args.layers, args.vocab = shape["d_model"], shape["layers"], shape["vocab"]
        args.ffn, args.heads, args.kv_heads = shape["ffn"], shape["heads"], shape["kv_heads"]
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "args": vars(args)}
    for case in args.cases.split(","):
        t0 = time.time()
        try:
            if case == "mixtral-fp32":
                r = case_mixtral(args, autocast=False)
            elif case == "mixtral-bf16":
                r = case_mixtral(args, autocast=True)
            elif case == "trainer":
                r = case_trainer(args)
            else:
                raise ValueError(f"unknown case {case}")
        except Exception as e:  # record and go on
            r = {"equal": False, "error": repr(e), "traceback_tail": traceback.format_exc()[-3000:]}
        r["seconds"] = round(time.time() - t0, 1)
        res[case] = r
        print(case, json.dumps(r, default=str)[:1500], flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    ok = all(res[c].get("equal") for c in args.cases.split(","))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
