// One Transformer-XL decoder layer for a few rows, for no-grad float32 inference on the CPU: generation's one-token
// steps (see decoder_layer.py and xl/fused_step.py for what it computes and when it runs).
//
// It is the other kernels called one after another, with nothing between them that Python would run:
//
//     [q; k; v] = [W_q; W_k; W_v] x                                  (few_rows_linear.cpp)
//     a = Attn(q, [k_memory; k], [v_memory; v])                       (causal_relative_attention.cpp)
//     h = LN_1(x + W_o a)                                              (residual_layer_norm.cpp)
//     out = LN_2(h + W_2 max(0, W_1 h + b_1) + b_2)
//
// after the residual (post-LN); with pre-LN the projections read LN_1(x), the feed-forward LN_2(h), and h and out
// are plain sums.
#define LABML_TXL_INCLUDED
#include "few_rows_linear.cpp"
#include "residual_layer_norm.cpp"
#include "causal_relative_attention.cpp"

namespace {

// `t` with a contiguous last axis, as the attention kernel reads it (a copy only where it is not)
torch::Tensor last_axis_contiguous(const torch::Tensor &t) {
  return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous();
}

std::optional<torch::Tensor> last_axis_contiguous(const std::optional<torch::Tensor> &t) {
  if (!t) return t;
  return last_axis_contiguous(*t);
}

}  // namespace

// x [rows, d] (rows = qlen * bsz, in the order of [qlen, bsz]); the weights as nn.Linear holds them; the layer norms'
// parameters; the attention's inputs as causal_relative_attention takes them (the memory's keys and values
// [bsz, heads, mlen, d_head] or none, any strides). Returns the output [rows, d] and the projections
// [rows, 3 * heads * d_head], whose keys and values the caller keeps for the next step.
std::vector<torch::Tensor> decoder_layer(
    const torch::Tensor &x, int64_t qlen, int64_t heads, bool pre_lnorm, const torch::Tensor &qkv_weight,
    const torch::Tensor &o_weight, const torch::Tensor &w1, const torch::Tensor &b1, const torch::Tensor &w2,
    const torch::Tensor &b2, const torch::Tensor &norm1_weight, const torch::Tensor &norm1_bias, double norm1_eps,
    const torch::Tensor &norm2_weight, const torch::Tensor &norm2_bias, double norm2_eps,
    const std::optional<torch::Tensor> &k_memory, const std::optional<torch::Tensor> &v_memory,
    const torch::Tensor &table, const std::optional<torch::Tensor> &content_bias,
    const std::optional<torch::Tensor> &position_bias, const std::optional<torch::Tensor> &entry_bias, double scale,
    int64_t window, int64_t block) {
  TORCH_CHECK(x.dim() == 2 && qlen > 0 && x.size(0) % qlen == 0, "x must be [qlen * bsz, d_model]");
  const int64_t rows = x.size(0), bsz = rows / qlen, inner = o_weight.size(1);
  TORCH_CHECK(heads > 0 && inner % heads == 0 && qkv_weight.size(0) == 3 * inner,
              "qkv_weight must be [3 * heads * d_head, d_model] and o_weight [d_model, heads * d_head]");
  const torch::Tensor none;
  // [W_q; W_k; W_v] x (of LN_1(x) with pre-LN), seen as [3, bsz, heads, qlen, d_head]
  const auto qkv = few_rows_linear(pre_lnorm ? residual_layer_norm(x, none, norm1_weight, norm1_bias, norm1_eps) : x,
                                   qkv_weight, c10::nullopt, false);
  const auto q_k_v = qkv.view({qlen, bsz, 3, heads, inner / heads}).permute({2, 1, 3, 0, 4});
  // The heads' outputs [qlen, bsz, heads, d_head]: the rows of x, the heads concatenated
  const auto attention = causal_relative_attention(
      q_k_v[0], last_axis_contiguous(k_memory), last_axis_contiguous(v_memory), q_k_v[1], q_k_v[2],
      last_axis_contiguous(table), content_bias, position_bias, last_axis_contiguous(entry_bias), scale, window,
      block);
  const auto attention_out = few_rows_linear(attention.view({rows, inner}), o_weight, c10::nullopt, false);
  // h = LN_1(x + W_o a), or x + W_o a
  const auto h = pre_lnorm ? x + attention_out
                           : residual_layer_norm(attention_out, x, norm1_weight, norm1_bias, norm1_eps);
  // W_2 max(0, W_1 h + b_1) + b_2, of LN_2(h) with pre-LN
  const auto hidden = few_rows_linear(
      pre_lnorm ? residual_layer_norm(h, none, norm2_weight, norm2_bias, norm2_eps) : h, w1, b1, true);
  const auto ff_out = few_rows_linear(hidden, w2, b2, false);
  const auto out = pre_lnorm ? h + ff_out : residual_layer_norm(ff_out, h, norm2_weight, norm2_bias, norm2_eps);
  return {out, qkv};
}

// The layers one after another, each taking the last one's output: layer l's tensors are `tensors[l]` (qkv_weight,
// o_weight, w1, b1, w2, b2, norm1_weight, norm1_bias, norm2_weight, norm2_bias, k_memory, v_memory, table,
// content_bias, position_bias, entry_bias: the last six optional) and its numbers `numbers[l]` (heads, pre_lnorm,
// norm1_eps, norm2_eps, scale, window), as `decoder_layer` takes them. Returns every layer's output, then every
// layer's projections. (One call for the stack: between two layers no Python runs, and the threads that share the
// products stay awake.)
std::vector<torch::Tensor> decoder_layers(const torch::Tensor &x, int64_t qlen,
                                          const std::vector<std::vector<std::optional<torch::Tensor>>> &tensors,
                                          const std::vector<std::vector<double>> &numbers, int64_t block) {
  TORCH_CHECK(tensors.size() == numbers.size(), "tensors and numbers must have an entry per layer");
  std::vector<torch::Tensor> outputs, projections;
  torch::Tensor input = x;
  for (size_t l = 0; l < tensors.size(); ++l) {
    const auto &t = tensors[l];
    const auto &n = numbers[l];
    TORCH_CHECK(t.size() == 16 && n.size() == 6, "each layer takes 16 tensors and 6 numbers");
    for (int i = 0; i < 10; ++i) TORCH_CHECK(t[i].has_value(), "the weights and norms of every layer are required");
    TORCH_CHECK(t[12].has_value(), "every layer's table is required");
    auto result = decoder_layer(input, qlen, static_cast<int64_t>(n[0]), n[1] != 0., *t[0], *t[1], *t[2], *t[3],
                                *t[4], *t[5], *t[6], *t[7], n[2], *t[8], *t[9], n[3], t[10], t[11], *t[12], t[13],
                                t[14], t[15], n[4], static_cast<int64_t>(n[5]), block);
    input = result[0];
    outputs.push_back(result[0]);
    projections.push_back(result[1]);
  }
  outputs.insert(outputs.end(), projections.begin(), projections.end());
  return outputs;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decoder_layers", &decoder_layers, "Transformer-XL decoder layers one after another, for a few rows");
}
