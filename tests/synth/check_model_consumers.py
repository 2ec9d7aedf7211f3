"""The three consumers of the model table (data/models.json, docs/formats.md "Model table") agree
with it: `teraio synth --list`, `teraio-train --list-models` (when built: the PyTorch build) and
bench/llm_bench.py's MODELS show each of their names as the shape the table gives, and each of those
shapes is the one the consumer used before the table (recorded benchmarks stay comparable).
Usage: check_model_consumers.py BIN_DIR SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys

bin_dir, src = sys.argv[1], sys.argv[2]
table = json.load(open(os.path.join(src, "data", "models.json")))
entries = {m["name"]: m for m in table["models"]}
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got}, want {want}")


# 1. teraio synth: name, table name, layers, d_model, heads, kv heads, ffn, vocab.
out = subprocess.run([os.path.join(bin_dir, "teraio"), "synth", "--list"], capture_output=True, text=True,
                     check=True).stdout
synth = {}
for line in out.splitlines():
    m = re.match(r"(\S+)\s+(\S+)\s+layers\s+(\d+)\s+d\s+(\d+)\s+heads\s+(\d+)/(\d+)\s+ffn\s+(\d+)\s+vocab\s+(\d+)", line)
    if not m:
        failures.append(f"teraio synth --list: unreadable line {line!r}")
        continue
    synth[m.group(1)] = (m.group(2), *map(int, m.groups()[2:]))
# synth's own names, then every other Llama-architecture entry under its table name
synth_names = dict(table["names"]["synth"])
for m in table["models"]:
    if m["arch"] == "llama" and m["name"] not in synth_names.values():
        synth_names[m["name"]] = m["name"]
check("teraio synth --list names", list(synth), list(synth_names))
for name, shape in synth_names.items():
    e = entries[shape]
    check(f"synth {name}", synth.get(name),
          (shape, e["layers"], e["d_model"], e["heads"], e["kv_heads"], e["ffn"], e["vocab"]))

# 2. teraio-train (the PyTorch build only).
train = os.path.join(bin_dir, "teraio-train")
if os.path.exists(train):
    lines = subprocess.run([train, "--list-models"], capture_output=True, text=True, check=True).stdout
    got = {d["name"]: d for d in map(json.loads, lines.splitlines())}
    check("teraio-train --list-models names", list(got), list(table["names"]["train"]))
    for name, shape in table["names"]["train"].items():
        e = entries[shape]
        want = dict(name=name, shape=shape, layers=e["layers"], dim=e["d_model"], heads=e["heads"],
                    kv_heads=e["kv_heads"], ffn_dim=e["ffn"], vocab=e["vocab"], tied=e["tied_embeddings"],
                    rope_theta=e["rope_theta"], max_seq=e["max_seq"])
        check(f"train {name}", {k: v for k, v in got.get(name, {}).items() if k != "parameters"}, want)
    # The presets before the table: layers, dim, heads, kv heads, ffn, vocab, tied, rope theta, max seq.
    old = {"tiny": (4, 128, 4, 2, 384, 264, False, 10000, 1024),
           "llama-1b": (16, 2048, 32, 8, 8192, 128256, True, 500000, 8192),
           "llama-3b": (28, 3072, 24, 8, 8192, 128256, True, 500000, 8192),
           "llama-8b": (32, 4096, 32, 8, 14336, 128256, False, 500000, 8192)}
    for name, o in old.items():
        d = got.get(name, {})
        check(f"train {name} as before", tuple(d.get(k) for k in ("layers", "dim", "heads", "kv_heads", "ffn_dim",
                                                                   "vocab", "tied", "rope_theta", "max_seq")), o)
    check("train llama-1b parameters (Llama 3.2 1B)", got.get("llama-1b", {}).get("parameters"), 1235814400)
else:
    print(f"teraio-train not built in {bin_dir}: train not checked (the PyTorch build checks it)")

# 3. bench/llm_bench.py (stdlib-only at import): its MODELS as before the table, every field.
sys.path.insert(0, os.path.join(src, "bench"))
import llm_bench  # noqa: E402

old_bench = {
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=688, vocab_size=4096, max_position_embeddings=2048),
    "llama-small": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                        intermediate_size=2816, vocab_size=32000, max_position_embeddings=4096),
    "llama-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=8192, vocab_size=32000, max_position_embeddings=4096),
    "llama-3b": dict(hidden_size=3072, num_hidden_layers=26, num_attention_heads=24, num_key_value_heads=8,
                     intermediate_size=8192, vocab_size=32000, max_position_embeddings=4096),
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                     rope_theta=500000.0),
    "mixtral-2b": dict(arch="mixtral", hidden_size=2048, num_hidden_layers=12, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=2816, num_local_experts=8,
                       num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=4096),
}
check("llm_bench names", llm_bench.BENCH_NAMES, list(table["names"]["bench"]))
for name, want in old_bench.items():
    check(f"llm_bench {name} as before", llm_bench.MODELS.get(name), want)
    shape = table["names"]["bench"][name]
    check(f"llm_bench {shape} (the table's name)", llm_bench.MODELS.get(shape), want)
    e = entries[shape]
    check(f"llm_bench {name} vs the table",
          tuple(want[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                  "intermediate_size", "vocab_size", "max_position_embeddings")),
          (e["d_model"], e["layers"], e["heads"], e["kv_heads"], e["ffn"], e["vocab"], e["max_seq"]))

for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print("teraio synth, teraio-train and bench/llm_bench.py read the model table's shapes, unchanged")
