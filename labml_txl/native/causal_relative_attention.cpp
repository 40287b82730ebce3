// Causal relative attention of Transformer-XL for no-grad float32 inference on the CPU, in one pass per block of
// queries (see attention.py for what it computes and when it runs).
//
// For query i of a segment of Q queries behind a memory of M = K - Q keys, the visible keys are the W keys up to
// its own position, j = max(0, M + i - W + 1) .. M + i (W >= K: every key up to it, the decoder's causal mask;
// W = mem_len: same_length's), the relative-table entry of key j is s = j + (Q - 1 - i) (distances K - 1 .. 0), and
//
//     A[i, j] = (q_i + a)^T k_j + (q_i + b)^T r_s + c_s,     out_i = sum_j softmax_j(scale * A[i, j]) v_j
//
// with a the content bias (u), b the position bias (v) and c a per-entry bias (attention type 1's b_s), each
// optional. A block of queries i0 .. i0 + n - 1 of one (batch, head) sees the keys J0 .. J1 - 1 (J0 the first key
// of its first query, J1 = M + i0 + n) and needs the table entries from s0 = J0 + Q - i0 - n on, as many: two
// products of n x (J1 - J0), the weights of each row in one pass, and one product with the values. Keys outside
// the block's window are never touched; those outside a row's own window get weight zero.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <optional>
#include <vector>

#include <ATen/native/CPUBlas.h>

// brgemm for the products where PyTorch has it for float32, unless this build asks for sgemm (to test that path)
#if defined(CPUBLAS_BRGEMM_F32F32F32) && !defined(LABML_TXL_KERNEL_SGEMM)
#define USE_BRGEMM
#else
// BLAS's single-precision product, LP64 (`int` sizes): PyTorch's CPU library exports it (MKL in x86 builds,
// OpenBLAS in others). Column-major, as BLAS is.
extern "C" void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                       const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                       const float *beta, float *c, const int *ldc);
#endif

namespace {

// Row-major C[m, n] = A[m, l] B[l, n]. PyTorch's `brgemm` (oneDNN's small-matrix kernels, which its own CPU flash
// attention calls) where this PyTorch has it for float32: 20% to 30% faster than MKL's sgemm at these shapes
// (32 x 256 x 64 and the like, one thread); else BLAS's sgemm (column-major C^T = B^T A^T).
// With `accumulate`, C += A B.
void product(int64_t m, int64_t n, int64_t l, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
             int64_t ldc, bool accumulate = false) {
#ifdef USE_BRGEMM
  at::native::cpublas::brgemm(m, n, l, lda, ldb, ldc, accumulate, a, b, c, false);
#else
  const char plain = 'N';
  const float one = 1.f, beta = accumulate ? 1.f : 0.f;
  const int m_ = m, n_ = n, l_ = l, lda_ = lda, ldb_ = ldb, ldc_ = ldc;
  sgemm_(&plain, &plain, &n_, &m_, &l_, &one, b, &ldb_, a, &lda_, &beta, c, &ldc_);
#endif
}

// Hands the product kernels' per-thread state back at the end of a thread's share of work
void release_products() {
#ifdef USE_BRGEMM
  at::native::cpublas::brgemm_release(false);
#endif
}

// out[d, j] = rows[j, d] for `count` rows of D (a [count, D] block with row stride `row_stride` into the columns
// 0 .. count - 1 of a [D, out_row] block), 16 rows at a time so that each write is a run of 16 (one row at a time,
// writes strided, took about twice as long)
void transpose_rows(const float *rows, int64_t row_stride, int64_t count, int64_t D, int64_t out_row, float *out) {
  for (int64_t j0 = 0; j0 < count; j0 += 16) {
    const int64_t j1 = std::min(count, j0 + 16);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = j0; j < j1; ++j) out[d * out_row + j] = rows[j * row_stride + d];
  }
}

// exp(x) for x <= 0 in plain arithmetic the compiler vectorises (within 1.4 ulp of exp in double, checked over
// [-87, 0]): x = n ln 2 + f with n = round(x / ln 2), |f| <= ln(2) / 2, e^f by Cephes' degree-7 polynomial, and 2^n
// written into the exponent bits. (std::floor and std::memcpy kept GCC from vectorising the loop; the rounding is
// the add-and-subtract of 1.5 * 2^23, exact for |x / ln 2| < 2^22.)
inline float exp_nonpositive(float x) {
  x = x > -87.0f ? x : -87.0f;  // e^-87 ~ 1.6e-38, still a normal float; a softmax weight that small counts as 0
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // f = x - n ln 2, with ln 2 split in two so that n ln 2 is exact enough
  float f = x - n * 0.693359375f;
  f = f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  // e^f = 1 + f + f^2 p(f)
  const float ef = p * f * f + f + 1.0f;
  // 2^n as a float: exponent bits n + 127
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return ef * __builtin_bit_cast(float, bits);
}

// out[r, :] = rows[r, :] + bias for n rows of D
void add_bias_to_rows(const float *rows, int64_t row_stride, const float *bias, int64_t n, int64_t D, float *out) {
  for (int64_t r = 0; r < n; ++r) {
    const float *row = rows + r * row_stride;
    float *o = out + r * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] = row[d] + bias[d];
  }
}

// Strides of a [B, H, rows, D] tensor whose last axis is contiguous
struct Heads {
  const float *data;
  int64_t batch, head, row;
  explicit Heads(const torch::Tensor &t)
      : data(t.defined() ? t.data_ptr<float>() : nullptr), batch(t.defined() ? t.stride(0) : 0),
        head(t.defined() ? t.stride(1) : 0), row(t.defined() ? t.stride(2) : 0) {}
  const float *at(int64_t b, int64_t h) const { return data + b * batch + h * head; }
};

// Keys or values [B, H, K, D] given in two parts, the memory's (rows 0 .. M - 1, possibly none) and the segment's:
// the concatenation is never made
struct TwoParts {
  Heads memory, segment;
  int64_t memory_rows;
  // Rows [begin, end) of (b, h) as runs within one part: calls `run(first row pointer, row stride, count, offset)`
  template <typename F>
  void runs(int64_t b, int64_t h, int64_t begin, int64_t end, F run) const {
    if (begin < memory_rows) {
      const int64_t stop = std::min(end, memory_rows);
      run(memory.at(b, h) + begin * memory.row, memory.row, stop - begin, 0);
    }
    if (end > memory_rows) {
      const int64_t start = std::max(begin, memory_rows);
      run(segment.at(b, h) + (start - memory_rows) * segment.row, segment.row, end - start, start - begin);
    }
  }
};

void check_float32_rows(const torch::Tensor &t, const char *name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " axes, got ", t.dim());
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) == 1, name, "'s last axis must be contiguous");
}

}  // namespace

// q [B, H, Q, D]; the keys and values [B, H, K, D] as the memory's part k_memory, v_memory [B, H, M', D] (or
// none) followed by the segment's k, v; table [H, R, D] (entries s = 0 .. R - 1 hold distances K - 1 - s, R >= K),
// content_bias and position_bias [H, D] or none, entry_bias [H, R] or none; every last axis contiguous. Each query
// sees the `window` keys up to its own position (or all of them before it, if fewer).
// Returns [Q, B, H, D] (the heads' outputs in the layout that concatenates them with a view).
torch::Tensor causal_relative_attention(const torch::Tensor &q, const std::optional<torch::Tensor> &k_memory_or_none,
                                        const std::optional<torch::Tensor> &v_memory_or_none,
                                        const torch::Tensor &k, const torch::Tensor &v, const torch::Tensor &table,
                                        const std::optional<torch::Tensor> &content_bias_or_none,
                                        const std::optional<torch::Tensor> &position_bias_or_none,
                                        const std::optional<torch::Tensor> &entry_bias_or_none, double scale,
                                        int64_t window, int64_t block) {
  const torch::Tensor none;
  const torch::Tensor &k_memory = k_memory_or_none ? *k_memory_or_none : none;
  const torch::Tensor &v_memory = v_memory_or_none ? *v_memory_or_none : none;
  const torch::Tensor &content_bias = content_bias_or_none ? *content_bias_or_none : none;
  const torch::Tensor &position_bias = position_bias_or_none ? *position_bias_or_none : none;
  const torch::Tensor &entry_bias = entry_bias_or_none ? *entry_bias_or_none : none;
  check_float32_rows(q, "q", 4);
  check_float32_rows(k, "k", 4);
  check_float32_rows(v, "v", 4);
  check_float32_rows(table, "table", 3);
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(1) == H && k.size(3) == D,
              "k and v must be [B, H, len, D] for q [B, H, Q, D]");
  TORCH_CHECK(k_memory.defined() == v_memory.defined(), "k_memory and v_memory go together");
  int64_t memory_rows = 0;
  if (k_memory.defined()) {
    check_float32_rows(k_memory, "k_memory", 4);
    check_float32_rows(v_memory, "v_memory", 4);
    TORCH_CHECK(k_memory.sizes() == v_memory.sizes() && k_memory.size(0) == B && k_memory.size(1) == H &&
                    k_memory.size(3) == D,
                "k_memory and v_memory must be [B, H, len, D] for q [B, H, Q, D]");
    memory_rows = k_memory.size(2);
  }
  const int64_t K = memory_rows + k.size(2);
  TORCH_CHECK(K >= Q, "there must be at least as many keys as queries (K >= Q)");
  TORCH_CHECK(table.size(0) == H && table.size(1) >= K && table.size(2) == D, "table must be [H, R >= K, D]");
  TORCH_CHECK(block > 0 && window > 0, "block and window must be positive");
  // BLAS takes int sizes and strides
  TORCH_CHECK(std::max({K, q.stride(2), k.stride(2), v.stride(2), memory_rows ? k_memory.stride(2) : 0,
                        memory_rows ? v_memory.stride(2) : 0, table.stride(1), B * H * D}) < INT_MAX,
              "sizes and row strides must fit BLAS's int");
  const bool has_content = content_bias.defined(), has_position = position_bias.defined();
  const bool has_entry = entry_bias.defined();
  for (const auto *bias : {&content_bias, &position_bias}) {
    if (bias->defined()) {
      TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == H * D,
                  "content and position biases must be contiguous float32 [H, D]");
    }
  }
  if (has_entry) {
    TORCH_CHECK(entry_bias.scalar_type() == torch::kFloat32 && entry_bias.dim() == 2 && entry_bias.size(0) == H &&
                    entry_bias.size(1) >= K && (entry_bias.stride(1) == 1 || entry_bias.size(1) == 1),
                "entry_bias must be float32 [H, R >= K] with a contiguous last axis");
  }
  auto out = torch::empty({Q, B, H, D}, q.options());
  if (Q == 0 || B == 0 || H == 0) return out;

  const Heads qs(q);
  const TwoParts keys{Heads(k_memory), Heads(k), memory_rows}, values{Heads(v_memory), Heads(v), memory_rows};
  const float *table_data = table.data_ptr<float>();
  const int64_t table_head = table.stride(0), table_row = table.stride(1);
  const float *content = has_content ? content_bias.data_ptr<float>() : nullptr;
  const float *position = has_position ? position_bias.data_ptr<float>() : nullptr;
  const float *entry = has_entry ? entry_bias.data_ptr<float>() : nullptr;
  const int64_t entry_head = has_entry ? entry_bias.stride(0) : 0;
  float *out_data = out.data_ptr<float>();
  const int64_t out_row = B * H * D, M = K - Q, blocks = (Q + block - 1) / block;
  const float scale_f = static_cast<float>(scale);

  // The table transposed, [H, D, K] (entries 0 .. K - 1): the second factor of the position products
  std::vector<float> table_t(H * D * K);
  at::parallel_for(0, H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h)
      transpose_rows(table_data + h * table_head, table_row, K, D, K, table_t.data() + h * D * K);
  });

  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    // Per thread: the keys of one (batch, head) transposed [D, K], the block's scores and position terms [n, L],
    // its queries plus each bias [n, D], 1 / row sums
    std::vector<float> keys_t(D * K), scores(block * K), positions(block * K), q_content(block * D),
        q_position(block * D), inverse_sums(block);
    int64_t keys_t_of = -1;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (H * blocks), h = (item / blocks) % H, i0 = (item % blocks) * block;
      const int64_t n = std::min(block, Q - i0);
      // The keys of query i: [first(i), M + i]; of the block: [J0, J1), width L
      auto first = [&](int64_t i) { return std::max<int64_t>(0, M + i - window + 1); };
      const int64_t J0 = first(i0), J1 = M + i0 + n, L = J1 - J0;
      const float *qh = qs.at(b, h) + i0 * qs.row;
      // Consecutive items are the blocks of one (batch, head): its keys are transposed once for them, the
      // memory's and the segment's into one [D, K]
      if (keys_t_of != b * H + h) {
        keys.runs(b, h, 0, K, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
          transpose_rows(rows, row_stride, count, D, K, keys_t.data() + offset);
        });
        keys_t_of = b * H + h;
      }

      // Queries q_i + a and q_i + b, or q_i itself where a bias is absent
      const float *qa = qh, *qb = qh;
      int64_t lda = qs.row, ldb = qs.row;
      if (has_content) {
        add_bias_to_rows(qh, qs.row, content + h * D, n, D, q_content.data());
        qa = q_content.data(), lda = D;
      }
      if (has_position) {
        add_bias_to_rows(qh, qs.row, position + h * D, n, D, q_position.data());
        qb = q_position.data(), ldb = D;
      }
      // (a) + (c): S[r, t] = (q_i + a)^T k_{J0 + t}
      product(n, L, D, qa, lda, keys_t.data() + J0, K, scores.data(), L);
      // (b) + (d): P[r, t] = (q_i + b)^T r_{s0 + t}, from the entry s0 of the block's last query and first key
      const int64_t s0 = J0 + Q - i0 - n;
      product(n, L, D, qb, ldb, table_t.data() + h * D * K + s0, K, positions.data(), L);

      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = i0 + r;
        // This row's keys, as columns of the block: [begin, end)
        const int64_t begin = first(i) - J0, end = M + i + 1 - J0;
        float *s = scores.data() + r * L;
        // Key j = J0 + t has entry j + Q - 1 - i = s0 + t + (n - 1 - r): row r of P shifted left by n - 1 - r
        const float *p = positions.data() + r * L + (n - 1 - r);
        const float *c = has_entry ? entry + h * entry_head + s0 + (n - 1 - r) : nullptr;
        // scale * A[i, j] and its maximum over the visible keys
        float row_max = -3.0e38f;
        if (c) {
#pragma omp simd reduction(max : row_max)
          for (int64_t t = begin; t < end; ++t) {
            const float x = (s[t] + (p[t] + c[t])) * scale_f;
            s[t] = x;
            row_max = std::max(row_max, x);
          }
        } else {
#pragma omp simd reduction(max : row_max)
          for (int64_t t = begin; t < end; ++t) {
            const float x = (s[t] + p[t]) * scale_f;
            s[t] = x;
            row_max = std::max(row_max, x);
          }
        }
        // e^{x_t - max} and their sum; the keys outside this row's window weigh 0
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = begin; t < end; ++t) {
          const float e = exp_nonpositive(s[t] - row_max);
          s[t] = e;
          sum += e;
        }
        inverse_sums[r] = 1.f / sum;
        std::fill(s, s + begin, 0.f);
        std::fill(s + end, s + L, 0.f);
      }
      // out_i = sum_j w_ij v_j with w_ij = e_ij / sum_j e_ij: the product of the unnormalised e, then each row of
      // D outputs divided (a pass over n x D rather than n x L)
      float *out_block = out_data + (i0 * B + b) * H * D + h * D;
      // (over the memory's values and then the segment's, adding to what the first product wrote)
      values.runs(b, h, J0, J1, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
        product(n, D, count, scores.data() + offset, L, rows, row_stride, out_block, out_row, offset > 0);
      });
      for (int64_t r = 0; r < n; ++r) {
        float *o = out_block + r * out_row;
        const float inverse = inverse_sums[r];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] *= inverse;
      }
    }
    release_products();
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_relative_attention", &causal_relative_attention,
        "Causal relative attention of Transformer-XL, float32, no gradients");
}
