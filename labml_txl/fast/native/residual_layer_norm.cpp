// The residual connection and the layer normalisation after it, LN(x + residual), in one pass over the rows, for
// no-grad float32 inference on the CPU (see layer_norm.py).
//
// PyTorch computes it as two passes over memory: x + residual into a new tensor, then LayerNorm of it. Here each
// row of d features is summed, its mean and variance taken and normalised while it is in cache:
//
//     s = x + r,   mu = mean(s),   sigma^2 = mean((s - mu)^2),   out = (s - mu) / sqrt(sigma^2 + eps) * w + b
//
// with the two means accumulated in double.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

// out = LN(x + residual) of `rows` rows of d features (LN(x) where `residual` is null), every pointer contiguous.
void normalise_rows(const float *xs, const float *rs, const float *w, const float *b, double eps, int64_t rows,
                    int64_t d, float *os) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float *xr = xs + row * d, *rr = rs != nullptr ? rs + row * d : nullptr;
      float *o = os + row * d;
      // s = x + r, and its sum (in double: a float sum of a row far from zero loses the digits that the centred
      // values need, 10 times PyTorch's error on rows offset by 30)
      double sum = 0.;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < d; ++j) {
        const float s = rr != nullptr ? xr[j] + rr[j] : xr[j];
        o[j] = s;
        sum += s;
      }
      const double mean = sum / static_cast<double>(d);
      // sigma^2 = mean((s - mu)^2), the biased variance LayerNorm uses
      double squares = 0.;
#pragma omp simd reduction(+ : squares)
      for (int64_t j = 0; j < d; ++j) {
        const double c = o[j] - mean;
        squares += c * c;
      }
      const float mean_f = static_cast<float>(mean);
      const float rstd = static_cast<float>(1. / std::sqrt(squares / static_cast<double>(d) + eps));
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = (o[j] - mean_f) * rstd * w[j] + b[j];
    }
  });
}

// x, residual [..., d] contiguous (residual undefined: none), weight and bias [d]; returns LN(x + residual) of x's
// shape.
torch::Tensor residual_layer_norm(const torch::Tensor &x, const torch::Tensor &residual, const torch::Tensor &weight,
                                  const torch::Tensor &bias, double eps) {
  for (const auto *t : {&x, &residual, &weight, &bias}) {
    TORCH_CHECK(!t->defined() || (t->device().is_cpu() && t->scalar_type() == torch::kFloat32 && t->is_contiguous()),
                "x, residual, weight and bias must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(x.defined() && weight.defined() && bias.defined(), "x, weight and bias are required");
  TORCH_CHECK((!residual.defined() || x.sizes() == residual.sizes()) && x.dim() >= 1,
              "x and residual must have one shape");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.numel() == d && bias.numel() == d, "weight and bias must have the last axis's size");
  auto out = torch::empty_like(x);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  normalise_rows(x.data_ptr<float>(), residual.defined() ? residual.data_ptr<float>() : nullptr,
                 weight.data_ptr<float>(), bias.data_ptr<float>(), eps, rows, d, out.data_ptr<float>());
  return out;
}

// (a kernel that includes this file to call it defines LABML_TXL_INCLUDED and binds its own module)
#ifndef LABML_TXL_INCLUDED
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("residual_layer_norm", &residual_layer_norm, "LayerNorm(x + residual), float32, no gradients");
}
#endif
