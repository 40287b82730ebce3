// y = x W^T + b (and max(0, y) with relu) for a few rows x, for no-grad float32 inference on the CPU (see
// few_rows_linear.py).
//
// With a handful of rows the product is as fast as W can be read, and the GEMM libraries, tuned for many rows,
// read it slower than the cores can (MKL's sgemm; oneDNN's packed product, slower still at one row). Here every
// output feature o is a dot product of W's row o, contiguous in W's own layout, with each input row:
//
//     y[r, o] = b[o] + sum_i x[r, i] W[o, i]
//
// Four rows of W are read together (each element of x loaded once serves four sums) and stay in L1 while every
// input row takes its turn, so W is read from memory once per call. The blocks of four output features are shared
// among the threads: both cores stream W at once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace {

// How many multiply-adds a thread should have at least before the products are split among threads (smaller
// products run on one: waking the others costs more)
constexpr int64_t kMultiplyAddsPerThread = 1 << 15;

// The output features first, first + 1, ... (`count` of them, at most four) of input row `x`
inline void block_of_outputs(const float *x, const float *w, const float *bias, bool relu, int64_t in,
                             int64_t first, int64_t count, float *y) {
  float sums[4] = {0.f, 0.f, 0.f, 0.f};
  if (count == 4) {
    const float *w0 = w + first * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t i = 0; i < in; ++i) {
      const float xi = x[i];
      s0 += w0[i] * xi;
      s1 += w1[i] * xi;
      s2 += w2[i] * xi;
      s3 += w3[i] * xi;
    }
    sums[0] = s0, sums[1] = s1, sums[2] = s2, sums[3] = s3;
  } else {
    for (int64_t k = 0; k < count; ++k) {
      const float *wk = w + (first + k) * in;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < in; ++i) s += wk[i] * x[i];
      sums[k] = s;
    }
  }
  for (int64_t k = 0; k < count; ++k) {
    const float value = sums[k] + (bias != nullptr ? bias[first + k] : 0.f);
    y[first + k] = relu ? std::max(value, 0.f) : value;
  }
}

}  // namespace

// x [rows, in], weight [out, in], bias [out] or None, all contiguous float32 CPU tensors; returns [rows, out].
torch::Tensor few_rows_linear(const torch::Tensor &x, const torch::Tensor &weight,
                              const c10::optional<torch::Tensor> &bias, bool relu) {
  for (const auto *t : {&x, &weight}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat32 && t->is_contiguous() && t->dim() == 2,
                "x and weight must be contiguous two-dimensional float32 CPU tensors");
  }
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  TORCH_CHECK(weight.size(1) == in, "weight must be [out_features, in_features] with x's in_features");
  const float *b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
                    bias->numel() == out,
                "bias must be a contiguous float32 CPU tensor of out_features elements");
    b = bias->data_ptr<float>();
  }
  auto y = torch::empty({rows, out}, x.options());
  const float *xs = x.data_ptr<float>(), *w = weight.data_ptr<float>();
  float *ys = y.data_ptr<float>();
  const int64_t blocks = (out + 3) / 4;
  const int64_t grain = std::max<int64_t>(1, kMultiplyAddsPerThread / std::max<int64_t>(1, 4 * in * rows));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = 4 * block, count = std::min<int64_t>(4, out - first);
      // (the block's four rows of W stay in L1 while each input row takes its turn)
      for (int64_t r = 0; r < rows; ++r) block_of_outputs(xs + r * in, w, b, relu, in, first, count, ys + r * out);
    }
  });
  return y;
}

// (a kernel that includes this file to call it defines LABML_TXL_INCLUDED and binds its own module)
#ifndef LABML_TXL_INCLUDED
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("few_rows_linear", &few_rows_linear, "x W^T + b (ReLU optional) for a few rows, float32, no gradients");
}
#endif
