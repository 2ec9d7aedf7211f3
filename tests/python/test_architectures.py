"""Training stays bitwise on Hugging Face architectures other than Llama: tiny random-init models
built from a config (GPT-2 and BERT with their default dropout on, OPT, GPT-NeoX, Falcon, Phi-3,
Qwen2, Gemma, Mistral, Mixtral, the T5 encoder-decoder), each with a Session at half its footprint (3/5 in autocast).
A slow link given by hand (0.01 GB/s) makes the plan recompute what it can, so the recorder's
rules (random numbers, in-place writes, views, nested operators) meet each architecture's own
operators; "amp" runs bf16 autocast over fp32 weights with PyTorch's SDPA attention (the nested
math kernel on the CPU), "deep" adds deep recompute chains and writebacks."""
import pytest
import torch

import teraio
from conftest import assert_bitwise, train

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 128
T = transformers
DECODERS = {
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel, dict(n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    "bert": (T.BertConfig, T.BertForMaskedLM, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   intermediate_size=128, max_position_embeddings=64)),
    "opt": (T.OPTConfig, T.OPTForCausalLM, dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                num_attention_heads=4, word_embed_proj_dim=64,
                                                max_position_embeddings=64)),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM, dict(hidden_size=64, intermediate_size=128,
                                                             num_hidden_layers=2, num_attention_heads=4,
                                                             max_position_embeddings=64)),
    "falcon": (T.FalconConfig, T.FalconForCausalLM, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2)),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, dict(hidden_size=64, intermediate_size=128,
                                                            num_hidden_layers=2, num_attention_heads=4,
                                                            num_key_value_heads=2)),
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM, dict(hidden_size=64, intermediate_size=128,
                                                            num_hidden_layers=2, num_attention_heads=4,
                                                            num_key_value_heads=2, num_local_experts=4,
                                                            num_experts_per_tok=2)),
}


class Wrapped(torch.nn.Module):
    """forward(ids) -> fp32 logits of the wrapped HF model (in bf16 autocast when `amp`)."""

    def __init__(self, model, amp, seq2seq=False):
        super().__init__()
        self.model, self.amp, self.seq2seq = model, amp, seq2seq

    def forward(self, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
            if self.seq2seq:  # the decoder reads the labels shifted right
                return self.model(input_ids=ids, labels=ids).logits.float()
            return self.model(input_ids=ids).logits.float()


def maker(arch, amp):
    def make():
        if arch == "t5":
            cfg = T.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                             decoder_start_token_id=0)
            model_cls = T.T5ForConditionalGeneration
        else:
            cfg_cls, model_cls, kw = DECODERS[arch]
            cfg = cfg_cls(vocab_size=VOCAB, **kw)
        cfg._attn_implementation = "sdpa" if amp else "eager"
        model = model_cls(cfg)
        model.train()  # GPT-2, BERT, OPT and T5 keep their default dropout
        return Wrapped(model, amp, seq2seq=arch == "t5")
    return make


def ids_batch(g):
    ids = torch.randint(0, VOCAB, (4, 32), generator=g)
    return ids, ids


@pytest.mark.parametrize("variant", ["fp32", "amp", "deep"])
@pytest.mark.parametrize("arch", [*DECODERS, "t5"])
def test_an_architecture_trains_bitwise_below_its_footprint(arch, variant, monkeypatch):
    deep = variant == "deep"
    monkeypatch.setenv("TERAIO_DEEP_RECOMPUTE", "1" if deep else "0")
    monkeypatch.setenv("TERAIO_WRITEBACKS", "1" if deep else "0")
    make = maker(arch, amp=variant == "amp")
    torch.manual_seed(0)
    footprint = 4 * sum(p.numel() * p.element_size() for p in make().parameters())  # + grads, AdamW
    ref = train(make, ids_batch, 5)
    # SDPA's math kernel holds the attention's temporaries at once: BERT's alone needs more than half
    budget = footprint * 3 // 5 if variant == "amp" else footprint // 2
    with teraio.Session(budget=f"{budget}B", min_tensor_bytes=1024,
                        tiers=[teraio.HostTier("256MiB", read_gbps=0.01, write_gbps=0.01)]) as s:
        got = train(make, ids_batch, 5, session=s)
        st = s.stats()
        s.fetch_all()
    assert_bitwise(ref, got)
    assert st["mode"] == "planned" and st["plan_moves"] > 0, st
    assert st["lost_tensors"] == 0 and st["budget_violations"] == 0, st
    assert st["step_peak_resident_bytes"] <= st["budget_bytes"], st
