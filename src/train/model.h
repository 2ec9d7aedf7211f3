// The Llama-architecture decoder that `teraio train` trains (docs/train.md): token embeddings,
// pre-norm blocks of RMSNorm, grouped-query attention with rotary position embeddings (RoPE)
// through scaled_dot_product_attention, and a SwiGLU MLP; a final RMSNorm and the output head.
// Presets (data/models.json) give the CPU-sized default and the Llama 3.2-1B / 3.2-3B / 3.1-8B
// shapes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace teraio::train {

struct LlamaConfig {
  std::string name;   // as asked for (--model), e.g. "llama-8b"
  std::string shape;  // the model table's name of the shape (data/models.json), e.g. "llama3.1-8b"
  int64_t layers = 0;
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t ffn_dim = 0;
  int64_t vocab = 0;
  bool tie_embeddings = false;
  double rope_theta = 500000.0;
  double norm_eps = 1e-5;
  int64_t max_seq = 0;  // RoPE tables are built for this many positions

  int64_t head_dim() const { return dim / heads; }
  // Parameters of the model, counted from the shapes.
  int64_t parameter_count() const;
};

// The model table's shape (teraio/models.h, data/models.json) that train's name (tiny, llama-1b,
// llama-3b, llama-8b) or the shape's own name (train-tiny, llama3.2-1b, llama3.2-3b, llama3.1-8b)
// means; throws teraio::Error naming the known ones.
LlamaConfig llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c);
  // x: [batch, seq, dim]; cos/sin: [seq, head_dim / 2].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  int64_t heads_, kv_heads_, head_dim_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // w2(silu(w1 x) * w3 x)

 private:
  torch::nn::Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  RMSNorm attention_norm_{nullptr}, ffn_norm_{nullptr};
  Attention attention_{nullptr};
  FeedForward feed_forward_{nullptr};
};
TORCH_MODULE(Block);

class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& c);
  // tokens: [batch, seq] int64 -> logits [batch, seq, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean next-token cross-entropy in fp32 (logits are upcast, so bf16 models get an fp32 loss).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);
  const LlamaConfig& config() const { return config_; }

 private:
  LlamaConfig config_;
  torch::nn::Embedding tok_embeddings_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RMSNorm norm_{nullptr};
  torch::nn::Linear output_{nullptr};  // absent when the embeddings are tied
  torch::Tensor rope_cos_, rope_sin_;  // buffers [max_seq, head_dim / 2], fp32 until .to(dtype)
};
TORCH_MODULE(Llama);

}  // namespace teraio::train
