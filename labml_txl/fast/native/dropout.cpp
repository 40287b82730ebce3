// Dropout's masks drawn inside the pass that applies them, from a counter-based generator (see dropout.py).
//
// Element e of a contiguous tensor (flat index) gets the 16-bit integer u_e: piece e % 4, in memory order, of the
// 64-bit number mix(seed + (e / 4 + 1) * golden), where mix is SplitMix64's output function and golden its
// increment (2^64 / the golden ratio): the 64-bit outputs are SplitMix64's sequence from `seed`. The element is
// dropped where u_e < threshold, so with probability threshold / 2^16, and kept elements are multiplied by `scale`.
// A mask is a function of (seed, e) alone: the backward pass draws the same mask again from the seed instead of
// keeping it, and the threads (each a run of elements) give the same mask whatever their number.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
// Elements per inner block: the 64-bit numbers of a block are made in one vectorised loop, then read as 16-bit
// pieces by a second one
constexpr int64_t kBlock = 256;

// SplitMix64's output function (Steele, Lea and Flood, 2014): a bijection of 64 bits that mixes every input bit
// into every output bit
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// u_e for the elements [begin, begin + count) (begin a multiple of 4, count <= kBlock)
inline void draw(uint64_t seed, int64_t begin, int64_t count, uint16_t *u) {
  uint64_t numbers[kBlock / 4];
  const int64_t first = begin / 4, n = (count + 3) / 4;
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) numbers[c] = mix(seed + static_cast<uint64_t>(first + c + 1) * kGolden);
  std::memcpy(u, numbers, count * sizeof(uint16_t));
}

// Calls `apply(begin, count, u)` for runs of the elements [0, numel) with their u_e, in parallel
template <typename F>
void for_each_block(int64_t numel, uint64_t seed, F apply) {
  at::parallel_for(0, (numel + kBlock - 1) / kBlock, 64, [&](int64_t block_begin, int64_t block_end) {
    uint16_t u[kBlock];
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t begin = block * kBlock, count = std::min(kBlock, numel - begin);
      draw(seed, begin, count, u);
      apply(begin, count, u);
    }
  });
}

// The loops over elements take their pointers and scalars as arguments: read through the lambdas' references
// instead, a float store could alias the scale, and the loop was neither vectorised nor fast (10 times slower)

// out_i = 0 where u_i < t, else in_i * s
void drop(const uint16_t *u, const float *in, float *out, int64_t count, uint16_t t, float s) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = u[i] < t ? 0.f : in[i] * s;
}

// x_i = 0 where u_i < t, else max(x_i, 0) * s (a NaN stays NaN, as with ReLU; std::max kept the loop from being
// vectorised)
void relu_drop(const uint16_t *u, float *x, int64_t count, uint16_t t, float s) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) x[i] = (u[i] < t || x[i] < 0.f) ? 0.f : x[i] * s;
}

// out_i = g_i * s where y_i > 0, else 0
void pass_where_positive(const float *g, const float *y, float *out, int64_t count, float s) {
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) out[i] = y[i] > 0.f ? g[i] * s : 0.f;
}

void check(const torch::Tensor &x, const char *name, int64_t threshold) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
  TORCH_CHECK(threshold > 0 && threshold < 65536, "threshold must be in 1 .. 65535, got ", threshold);
}

}  // namespace

// out_e = 0 where u_e < threshold, else x_e * scale: the forward pass, and with the same seed the backward pass
torch::Tensor dropout(const torch::Tensor &x, int64_t seed, int64_t threshold, double scale) {
  check(x, "x", threshold);
  auto out = torch::empty_like(x);
  const float *in = x.data_ptr<float>();
  float *o = out.data_ptr<float>();
  const uint16_t t = static_cast<uint16_t>(threshold);
  const float s = static_cast<float>(scale);
  for_each_block(x.numel(), static_cast<uint64_t>(seed), [&](int64_t begin, int64_t count, const uint16_t *u) {
    drop(u, in + begin, o + begin, count, t, s);
  });
  return out;
}

// h_e = 0 where u_e < threshold, else max(h_e, 0) * scale, in place: ReLU and dropout of a feed-forward layer
torch::Tensor relu_dropout_(torch::Tensor h, int64_t seed, int64_t threshold, double scale) {
  check(h, "h", threshold);
  float *x = h.data_ptr<float>();
  const uint16_t t = static_cast<uint16_t>(threshold);
  const float s = static_cast<float>(scale);
  for_each_block(h.numel(), static_cast<uint64_t>(seed), [&](int64_t begin, int64_t count, const uint16_t *u) {
    relu_drop(u, x + begin, count, t, s);
  });
  return h;
}

// The gradient of relu_dropout_ from its output: grad_e * scale where out_e > 0, else 0
torch::Tensor relu_dropout_backward(const torch::Tensor &grad, const torch::Tensor &out, double scale) {
  check(grad, "grad", 1);
  check(out, "out", 1);
  TORCH_CHECK(grad.sizes() == out.sizes(), "grad and out must have the same shape");
  auto result = torch::empty_like(grad);
  const float *g = grad.data_ptr<float>(), *y = out.data_ptr<float>();
  float *r = result.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, grad.numel(), 16384, [&](int64_t begin, int64_t end) {
    pass_where_positive(g + begin, y + begin, r + begin, end - begin, s);
  });
  return result;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dropout", &dropout, "Dropout with its mask drawn from (seed, element index), float32");
  m.def("relu_dropout_", &relu_dropout_, "ReLU and dropout in place, the mask as dropout's");
  m.def("relu_dropout_backward", &relu_dropout_backward, "The gradient of relu_dropout_ from its output");
}
