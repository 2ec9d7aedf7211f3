// The Llama-architecture decoder of `teraio train` in torch::nn (docs/train.md). Written for
// clarity: the forward pass is the one Llama 3 uses (pre-norm RMSNorm, RoPE on q and k, GQA through
// scaled_dot_product_attention with enable_gqa, SwiGLU), so its operator stream is what teraio's
// Session sees in real training.
#include "model.h"

#include <cmath>

#include "teraio/error.h"
#include "teraio/models.h"

namespace teraio::train {

namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Rotates pairs (x[..., :h/2], x[..., h/2:]) by the position's angles (the "rotate half" layout of
// Hugging Face Llama). x: [batch, heads, seq, head_dim]; cos/sin: [seq, head_dim / 2].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  auto halves = x.chunk(2, -1);
  const torch::Tensor& x1 = halves[0];
  const torch::Tensor& x2 = halves[1];
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

}  // namespace

int64_t LlamaConfig::parameter_count() const {
  const int64_t hd = head_dim();
  const int64_t attn = dim * heads * hd * 2 + dim * kv_heads * hd * 2;
  const int64_t mlp = 3 * dim * ffn_dim;
  const int64_t block = attn + mlp + 2 * dim;
  return vocab * dim * (tie_embeddings ? 1 : 2) + layers * block + dim;
}

LlamaConfig llama_preset(const std::string& name) {
  const ModelEntry& m = find_model("train", name);
  TERAIO_CHECK(m.arch == "llama",
               "--model \"{}\": {} is a {} model; teraio train trains Llama ones", name, m.name,
               m.arch);
  LlamaConfig c;
  c.name = name;
  c.shape = m.name;
  c.layers = m.layers;
  c.dim = m.d_model;
  c.heads = m.heads;
  c.kv_heads = m.kv_heads;
  c.ffn_dim = m.ffn;
  c.vocab = m.vocab;
  c.tie_embeddings = m.tied_embeddings;
  c.rope_theta = m.rope_theta;
  c.max_seq = m.max_seq;
  return c;
}

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, shape] : model_names("train")) names.push_back(name);
  return names;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Normalised in fp32, as Llama does, then cast back to the activation dtype.
  torch::Tensor xf = x.to(torch::kFloat32);
  xf = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return xf.to(x.scalar_type()) * weight_;
}

AttentionImpl::AttentionImpl(const LlamaConfig& c)
    : heads_(c.heads), kv_heads_(c.kv_heads), head_dim_(c.head_dim()) {
  TERAIO_CHECK(c.dim % c.heads == 0 && c.heads % c.kv_heads == 0 && head_dim_ % 2 == 0,
               "model {}: dim {} / heads {} / kv_heads {} do not divide", c.name, c.dim, c.heads,
               c.kv_heads);
  wq_ = register_module("wq", linear(c.dim, heads_ * head_dim_));
  wk_ = register_module("wk", linear(c.dim, kv_heads_ * head_dim_));
  wv_ = register_module("wv", linear(c.dim, kv_heads_ * head_dim_));
  wo_ = register_module("wo", linear(heads_ * head_dim_, c.dim));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor q = wq_(x).view({b, t, heads_, head_dim_}).transpose(1, 2);
  torch::Tensor k = wk_(x).view({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor v = wv_(x).view({b, t, kv_heads_, head_dim_}).transpose(1, 2);
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  torch::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                     /*is_causal=*/true, /*scale=*/std::nullopt,
                                                     /*enable_gqa=*/kv_heads_ != heads_);
  return wo_(y.transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
}

FeedForwardImpl::FeedForwardImpl(const LlamaConfig& c) {
  w1_ = register_module("w1", linear(c.dim, c.ffn_dim));
  w2_ = register_module("w2", linear(c.ffn_dim, c.dim));
  w3_ = register_module("w3", linear(c.dim, c.ffn_dim));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  return w2_(torch::silu(w1_(x)) * w3_(x));
}

BlockImpl::BlockImpl(const LlamaConfig& c) {
  attention_norm_ = register_module("attention_norm", RMSNorm(c.dim, c.norm_eps));
  attention_ = register_module("attention", Attention(c));
  ffn_norm_ = register_module("ffn_norm", RMSNorm(c.dim, c.norm_eps));
  feed_forward_ = register_module("feed_forward", FeedForward(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                 const torch::Tensor& sin) {
  torch::Tensor h = x + attention_(attention_norm_(x), cos, sin);
  return h + feed_forward_(ffn_norm_(h));
}

LlamaImpl::LlamaImpl(const LlamaConfig& c) : config_(c) {
  tok_embeddings_ = register_module("tok_embeddings", torch::nn::Embedding(c.vocab, c.dim));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) layers_->push_back(Block(c));
  norm_ = register_module("norm", RMSNorm(c.dim, c.norm_eps));
  if (!c.tie_embeddings) output_ = register_module("output", linear(c.dim, c.vocab));

  // Initialisation: N(0, 0.02) for every matrix, the residual projections (wo, w2) scaled by
  // 1/sqrt(2 * layers) as in GPT-2, so that deeper presets start with unit-scale activations.
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * double(c.layers));
  for (auto& p : named_parameters()) {
    if (p.value().dim() < 2) continue;
    const bool residual =
        p.key().find(".wo.") != std::string::npos || p.key().find(".w2.") != std::string::npos;
    p.value().normal_(0.0, residual ? residual_std : 0.02);
  }

  const int64_t half = c.head_dim() / 2;
  torch::Tensor inv_freq =
      torch::pow(c.rope_theta, -torch::arange(0, half, torch::kFloat64) / double(half));
  torch::Tensor angles = torch::outer(torch::arange(c.max_seq, torch::kFloat64), inv_freq);
  rope_cos_ = register_buffer("rope_cos", angles.cos().to(torch::kFloat32));
  rope_sin_ = register_buffer("rope_sin", angles.sin().to(torch::kFloat32));
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TERAIO_CHECK(t <= config_.max_seq, "--seq {}: model {} supports at most {} positions", t,
               config_.name, config_.max_seq);
  torch::Tensor h = tok_embeddings_(tokens);
  const torch::Tensor cos = rope_cos_.narrow(0, 0, t).to(h.scalar_type());
  const torch::Tensor sin = rope_sin_.narrow(0, 0, t).to(h.scalar_type());
  for (const auto& layer : *layers_) h = layer->as<Block>()->forward(h, cos, sin);
  h = norm_(h);
  if (config_.tie_embeddings) return torch::nn::functional::linear(h, tok_embeddings_->weight);
  return output_(h);
}

torch::Tensor LlamaImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  torch::Tensor logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.view({-1, config_.vocab}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

}  // namespace teraio::train
