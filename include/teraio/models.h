// The model table (data/models.json, docs/formats.md "Model table"): every model shape teraio uses,
// once, under a unique name, and which shape each consumer's --model names mean ("synth", "train",
// "bench": the same old name may mean different shapes there, e.g. llama-1b). The JSON is compiled
// in, so `teraio synth`, `teraio train` and bench/llm_bench.py read one source. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace teraio {

struct ModelEntry {
  std::string name;   // unique across the table, e.g. "llama3.1-8b"
  std::string about;  // one line for people
  std::string arch;   // "llama" or "mixtral"
  uint32_t layers = 0;
  uint32_t d_model = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint32_t ffn = 0;  // hidden size of the SwiGLU MLP (of each expert for mixtral)
  uint32_t vocab = 0;
  bool tied_embeddings = false;  // the LM head reuses the embedding matrix
  double rope_theta = 0;
  uint32_t max_seq = 0;  // positions the RoPE tables are built for (train, bench; synth ignores it)
  uint32_t experts = 0;  // mixtral only
  uint32_t experts_per_token = 0;  // mixtral only
};

// Every entry, in the file's order.
const std::vector<ModelEntry>& model_table();
// The --model names `consumer` ("synth", "train" or "bench") accepts besides the canonical names
// of their entries, in the file's order: pairs (name, canonical name).
const std::vector<std::pair<std::string, std::string>>& model_names(std::string_view consumer);
// The entry `name` means for `consumer`: one of its names, or the canonical name of an entry one
// of them means. Throws teraio::Error naming `what` (e.g. "--model") and the accepted names.
const ModelEntry& find_model(std::string_view consumer, std::string_view name,
                             std::string_view what = "--model");
// The iteration `teraio synth` traces the entry named `canonical` with by default; nullptr when the
// table gives none.
struct ModelIteration {
  uint32_t batch = 0;
  uint32_t seq = 0;
  uint32_t micro_batches = 0;
};
const ModelIteration* synth_iteration(std::string_view canonical);
// The compiled-in data/models.json, as written.
std::string_view model_table_json();

}  // namespace teraio
