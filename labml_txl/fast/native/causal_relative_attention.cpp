// Causal relative attention of Transformer-XL in float32 on the CPU, forward in one pass per block of queries, and
// the backward pass of training (see attention.py for what it computes and when it runs).
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
//
// Training keeps the weights w = softmax_j(scale * A[i, j]) of the forward pass, [B, H, Q, K] (of each block only
// the columns J0 .. J1 - 1 are written and read), and the backward pass walks the same blocks: with dO the output's
// gradient,
//
//     dw_ij = dO_i^T v_j,   G_ij = scale * w_ij (dw_ij - sum_j' w_ij' dw_ij')   (the gradient of scale * A),
//     d(q_i + a) = sum_j G_ij k_j,   dk_j = sum_i G_ij (q_i + a),   dv_j = sum_i w_ij dO_i,
//     d(q_i + b) = sum_s G'_is r_s,  dr_s = sum_i G'_is (q_i + b),  dc_s = sum_i G'_is
//
// where G' is G shifted back to table entries (G'_is = G_ij for s = j + Q - 1 - i). dr and dc sum over the batch as
// well: each (batch, head) writes its own part, summed by the caller.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <dlfcn.h>
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

// FBGEMM's vectorised transposition of a float matrix, where this PyTorch carries it (x86 builds do), looked up once
// by name in PyTorch's CPU library so that a build without it still loads; none when this build asks for its own
// (to test that path)
using Transpose = void (*)(int64_t rows, int64_t cols, const float *in, int64_t in_row, float *out, int64_t out_row);

Transpose find_fbgemm_transpose() {
#ifdef LABML_TXL_KERNEL_OWN_TRANSPOSE
  return nullptr;
#else
  void *library = dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY);
  // fbgemm::transpose_simd<float>(int64_t, int64_t, const float *, int64_t, float *, int64_t)
  void *function = library ? dlsym(library, "_ZN6fbgemm14transpose_simdIfEEvllPKT_lPS1_l") : nullptr;
  return reinterpret_cast<Transpose>(function);
#endif
}

const Transpose fbgemm_transpose = find_fbgemm_transpose();

// out[d, j] = rows[j, d] for `count` rows of D (a [count, D] block with row stride `row_stride` into the columns
// 0 .. count - 1 of a [D, out_row] block). FBGEMM's where there is one (8% of the attention's forward pass on the
// benchmark's layer, against 13% for the loop below); else 16 rows at a time, so that each write is a run of 16 (one
// row at a time, writes strided, took about twice as long)
void transpose_rows(const float *rows, int64_t row_stride, int64_t count, int64_t D, int64_t out_row, float *out) {
  if (fbgemm_transpose != nullptr) {
    fbgemm_transpose(count, D, rows, row_stride, out, out_row);
    return;
  }
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

// The loops over a row take their pointers and scalars as arguments: read through a lambda's references instead, a
// float store may alias a captured float (the scale), and such a loop was not vectorised (10 times slower, measured
// on dropout's)

// s_t = scale * (s_t + p_t (+ c_t)) for t in [begin, end), c none or the per-entry bias; returns their maximum
float scaled_scores(float *s, const float *p, const float *c, int64_t begin, int64_t end, float scale) {
  float row_max = -3.0e38f;
  if (c) {
#pragma omp simd reduction(max : row_max)
    for (int64_t t = begin; t < end; ++t) {
      const float x = (s[t] + (p[t] + c[t])) * scale;
      s[t] = x;
      row_max = std::max(row_max, x);
    }
  } else {
#pragma omp simd reduction(max : row_max)
    for (int64_t t = begin; t < end; ++t) {
      const float x = (s[t] + p[t]) * scale;
      s[t] = x;
      row_max = std::max(row_max, x);
    }
  }
  return row_max;
}

// s_t = e^{s_t - max} for t in [begin, end); returns their sum
float exponentials(float *s, int64_t begin, int64_t end, float max) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = begin; t < end; ++t) {
    const float e = exp_nonpositive(s[t] - max);
    s[t] = e;
    sum += e;
  }
  return sum;
}

// x_t *= factor for t in [0, n)
void multiply(float *x, int64_t n, float factor) {
#pragma omp simd
  for (int64_t t = 0; t < n; ++t) x[t] *= factor;
}

// The softmax's backward pass for one row: g_t = scale * w_t (dw_t - sum_t' w_t' dw_t') for t in [begin, end)
void softmax_gradient(const float *w, const float *dw, float *g, int64_t begin, int64_t end, float scale) {
  float dot = 0.f;
#pragma omp simd reduction(+ : dot)
  for (int64_t t = begin; t < end; ++t) dot += w[t] * dw[t];
#pragma omp simd
  for (int64_t t = begin; t < end; ++t) g[t] = scale * w[t] * (dw[t] - dot);
}

// out_d = a_d + b_d for d in [0, n)
void add(const float *a, const float *b, float *out, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) out[d] = a[d] + b[d];
}

// sum_d a_d b_d for d in [0, n)
float dot(const float *a, const float *b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// y_d += factor * x_d for d in [0, n)
void add_scaled(const float *x, float factor, float *y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += factor * x[d];
}

// out[r, :] = rows[r, :] + bias for n rows of D
void add_bias_to_rows(const float *rows, int64_t row_stride, const float *bias, int64_t n, int64_t D, float *out) {
  for (int64_t r = 0; r < n; ++r) add(rows + r * row_stride, bias, out + r * D, D);
}

// sum[c] += rows[r, c] over n contiguous rows of `width`
void add_rows(const float *rows, int64_t n, int64_t width, float *sum) {
  for (int64_t r = 0; r < n; ++r) add(sum, rows + r * width, sum, width);
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

// The inputs of one attention, checked: q [B, H, Q, D]; the keys and values [B, H, K, D] as the memory's part
// k_memory, v_memory [B, H, M', D] (or none) followed by the segment's k, v; table [H, R, D] (entries s = 0 .. R - 1
// hold distances K - 1 - s, R >= K), content_bias and position_bias [H, D] or none, entry_bias [H, R] or none;
// every last axis contiguous. Each query sees the `window` keys up to its own position (or all before it, if fewer).
struct Attention {
  int64_t B, H, Q, D, K, M;
  Heads q;
  TwoParts keys, values;
  const float *table;
  int64_t table_head, table_row, table_entries;
  const float *content, *position, *entry;
  int64_t entry_head;
  float scale;
  int64_t window;

  // The first key query i sees (its last is M + i)
  int64_t first(int64_t i) const { return std::max<int64_t>(0, M + i - window + 1); }

  // Queries i0 .. i0 + n - 1 plus `bias` (or the queries themselves where it is absent) for head h: a pointer to n
  // rows and their row stride, written to `buffer` [n, D] when a bias is added
  std::pair<const float *, int64_t> with_bias(int64_t b, int64_t h, int64_t i0, int64_t n, const float *bias,
                                              float *buffer) const {
    const float *rows = q.at(b, h) + i0 * q.row;
    if (bias == nullptr) return {rows, q.row};
    add_bias_to_rows(rows, q.row, bias + h * D, n, D, buffer);
    return {buffer, D};
  }

  // The table of head h transposed, [D, K] (entries 0 .. K - 1): the second factor of the position products
  void transposed_table(int64_t h, float *out) const {
    transpose_rows(table + h * table_head, table_row, K, D, K, out);
  }
};

Attention checked_attention(const torch::Tensor &q, const torch::Tensor &k_memory, const torch::Tensor &v_memory,
                            const torch::Tensor &k, const torch::Tensor &v, const torch::Tensor &table,
                            const torch::Tensor &content_bias, const torch::Tensor &position_bias,
                            const torch::Tensor &entry_bias, double scale, int64_t window, int64_t block) {
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
  for (const auto *bias : {&content_bias, &position_bias}) {
    if (bias->defined()) {
      TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == H * D,
                  "content and position biases must be contiguous float32 [H, D]");
    }
  }
  if (entry_bias.defined()) {
    TORCH_CHECK(entry_bias.scalar_type() == torch::kFloat32 && entry_bias.dim() == 2 && entry_bias.size(0) == H &&
                    entry_bias.size(1) >= K && (entry_bias.stride(1) == 1 || entry_bias.size(1) == 1),
                "entry_bias must be float32 [H, R >= K] with a contiguous last axis");
  }
  auto data = [](const torch::Tensor &t) { return t.defined() ? t.data_ptr<float>() : nullptr; };
  return Attention{B, H, Q, D, K, K - Q, Heads(q),
                   TwoParts{Heads(k_memory), Heads(k), memory_rows}, TwoParts{Heads(v_memory), Heads(v), memory_rows},
                   table.data_ptr<float>(), table.stride(0), table.stride(1), table.size(1),
                   data(content_bias), data(position_bias), data(entry_bias),
                   entry_bias.defined() ? entry_bias.stride(0) : 0, static_cast<float>(scale), window};
}

const torch::Tensor &or_none(const std::optional<torch::Tensor> &t) {
  static const torch::Tensor none;
  return t ? *t : none;
}

// The inference pass of a single query (Q = 1: a one-token step of generation) into `out` [1, B, H, D]: the scores
// and the output as products of the one query with the rows where they are, [L, D] each (keys, table entries,
// values), with no transposed copy of the keys or the table and no product kernel set up for one row
void attend_one_query(const Attention &a, float *out_data) {
  const int64_t H = a.H, D = a.D, M = a.M;
  // The query's keys [J0, J1) and its table entries from s0 = J0 on (key j has entry j + Q - 1 - i = j)
  const int64_t J0 = a.first(0), J1 = M + 1, L = J1 - J0;
  at::parallel_for(0, a.B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(L), q_content(D), q_position(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      // q + a and q + b
      const float *qa = a.with_bias(b, h, 0, 1, a.content, q_content.data()).first;
      const float *qb = a.with_bias(b, h, 0, 1, a.position, q_position.data()).first;
      // (a) + (c) and (b) + (d) with the per-entry bias: A_j = (q + a)^T k_j + (q + b)^T r_j + c_j
      const float *table = a.table + h * a.table_head;
      const float *entry = a.entry ? a.entry + h * a.entry_head : nullptr;
      a.keys.runs(b, h, J0, J1, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
        for (int64_t t = 0; t < count; ++t) {
          const int64_t j = J0 + offset + t;
          const float position = dot(qb, table + j * a.table_row, D);
          scores[offset + t] = dot(qa, rows + t * row_stride, D) + (entry ? position + entry[j] : position);
        }
      });
      // scale * A_j, e^{scale * A_j - max} and their sum
      float row_max = -3.0e38f;
      for (int64_t t = 0; t < L; ++t) {
        scores[t] *= a.scale;
        row_max = std::max(row_max, scores[t]);
      }
      const float inverse = 1.f / exponentials(scores.data(), 0, L, row_max);
      // out = sum_j w_j v_j
      float *out = out_data + (b * H + h) * D;
      std::fill(out, out + D, 0.f);
      a.values.runs(b, h, J0, J1, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
        for (int64_t t = 0; t < count; ++t) add_scaled(rows + t * row_stride, scores[offset + t] * inverse, out, D);
      });
    }
  });
}

// The forward pass into `out` [Q, B, H, D] (the heads' outputs in the layout that concatenates them with a view);
// with `weights` [B, H, Q, K], also the softmax weights of each block's columns there (for the backward pass)
void attend(const Attention &a, int64_t block, float *out_data, float *weights) {
  const int64_t B = a.B, H = a.H, Q = a.Q, D = a.D, K = a.K, M = a.M, blocks = (Q + block - 1) / block;
  const int64_t out_row = B * H * D;
  const float scale = a.scale;

  std::vector<float> table_t(H * D * K);
  at::parallel_for(0, H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) a.transposed_table(h, table_t.data() + h * D * K);
  });

  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    // Per thread: the keys of one (batch, head) transposed [D, K], the block's scores (without `weights`) and
    // position terms [n, L], its queries plus each bias [n, D], 1 / row sums
    std::vector<float> keys_t(D * K), scores(weights ? 0 : block * K), positions(block * K), q_content(block * D),
        q_position(block * D), inverse_sums(block);
    int64_t keys_t_of = -1;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (H * blocks), h = (item / blocks) % H, i0 = (item % blocks) * block;
      const int64_t n = std::min(block, Q - i0);
      // The keys of the block: [J0, J1), width L
      const int64_t J0 = a.first(i0), J1 = M + i0 + n, L = J1 - J0;
      // Consecutive items are the blocks of one (batch, head): its keys are transposed once for them, the
      // memory's and the segment's into one [D, K]
      if (keys_t_of != b * H + h) {
        a.keys.runs(b, h, 0, K, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
          transpose_rows(rows, row_stride, count, D, K, keys_t.data() + offset);
        });
        keys_t_of = b * H + h;
      }
      // Queries q_i + a and q_i + b
      const auto [qa, lda] = a.with_bias(b, h, i0, n, a.content, q_content.data());
      const auto [qb, ldb] = a.with_bias(b, h, i0, n, a.position, q_position.data());
      // The block's scores, then weights: in `weights` (row stride K) when training keeps them
      float *block_scores = weights ? weights + ((b * H + h) * Q + i0) * K + J0 : scores.data();
      const int64_t lds = weights ? K : L;
      // (a) + (c): S[r, t] = (q_i + a)^T k_{J0 + t}
      product(n, L, D, qa, lda, keys_t.data() + J0, K, block_scores, lds);
      // (b) + (d): P[r, t] = (q_i + b)^T r_{s0 + t}, from the entry s0 of the block's last query and first key
      const int64_t s0 = J0 + Q - i0 - n;
      product(n, L, D, qb, ldb, table_t.data() + h * D * K + s0, K, positions.data(), L);

      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = i0 + r;
        // This row's keys, as columns of the block: [begin, end)
        const int64_t begin = a.first(i) - J0, end = M + i + 1 - J0;
        float *s = block_scores + r * lds;
        // Key j = J0 + t has entry j + Q - 1 - i = s0 + t + (n - 1 - r): row r of P shifted left by n - 1 - r
        const float *p = positions.data() + r * L + (n - 1 - r);
        const float *c = a.entry ? a.entry + h * a.entry_head + s0 + (n - 1 - r) : nullptr;
        // scale * A[i, j] and its maximum over the visible keys; then e^{x_t - max} and their sum
        const float row_max = scaled_scores(s, p, c, begin, end, scale);
        const float sum = exponentials(s, begin, end, row_max);
        const float inverse = 1.f / sum;
        if (weights) {
          // The weights themselves, kept for the backward pass
          multiply(s + begin, end - begin, inverse);
        } else {
          inverse_sums[r] = inverse;
        }
        std::fill(s, s + begin, 0.f);
        std::fill(s + end, s + L, 0.f);
      }
      // out_i = sum_j w_ij v_j; without `weights`, w_ij = e_ij / sum_j e_ij: the product of the unnormalised e, then
      // each row of D outputs divided (a pass over n x D rather than n x L)
      float *out_block = out_data + (i0 * B + b) * H * D + h * D;
      // (over the memory's values and then the segment's, adding to what the first product wrote)
      a.values.runs(b, h, J0, J1, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
        product(n, D, count, block_scores + offset, lds, rows, row_stride, out_block, out_row, offset > 0);
      });
      if (!weights) {
        for (int64_t r = 0; r < n; ++r) multiply(out_block + r * out_row, D, inverse_sums[r]);
      }
    }
    release_products();
  });
}

}  // namespace

// No-grad inference: returns [Q, B, H, D] (the heads' outputs in the layout that concatenates them with a view).
torch::Tensor causal_relative_attention(const torch::Tensor &q, const std::optional<torch::Tensor> &k_memory,
                                        const std::optional<torch::Tensor> &v_memory, const torch::Tensor &k,
                                        const torch::Tensor &v, const torch::Tensor &table,
                                        const std::optional<torch::Tensor> &content_bias,
                                        const std::optional<torch::Tensor> &position_bias,
                                        const std::optional<torch::Tensor> &entry_bias, double scale, int64_t window,
                                        int64_t block) {
  const Attention a = checked_attention(q, or_none(k_memory), or_none(v_memory), k, v, table, or_none(content_bias),
                                        or_none(position_bias), or_none(entry_bias), scale, window, block);
  auto out = torch::empty({a.Q, a.B, a.H, a.D}, q.options());
  if (a.Q == 1 && a.B > 0 && a.H > 0) {
    attend_one_query(a, out.data_ptr<float>());
  } else if (a.Q > 0 && a.B > 0 && a.H > 0) {
    attend(a, block, out.data_ptr<float>(), nullptr);
  }
  return out;
}

// The forward pass of training, the keys and values in one part [B, H, K, D]: returns the output [Q, B, H, D] and
// the weights [B, H, Q, K] that `causal_relative_attention_backward` takes.
std::vector<torch::Tensor> causal_relative_attention_forward(const torch::Tensor &q, const torch::Tensor &k,
                                                             const torch::Tensor &v, const torch::Tensor &table,
                                                             const std::optional<torch::Tensor> &content_bias,
                                                             const std::optional<torch::Tensor> &position_bias,
                                                             const std::optional<torch::Tensor> &entry_bias,
                                                             double scale, int64_t window, int64_t block) {
  const torch::Tensor none;
  const Attention a = checked_attention(q, none, none, k, v, table, or_none(content_bias), or_none(position_bias),
                                        or_none(entry_bias), scale, window, block);
  auto out = torch::empty({a.Q, a.B, a.H, a.D}, q.options());
  auto weights = torch::empty({a.B, a.H, a.Q, a.K}, q.options());
  if (a.Q > 0 && a.B > 0 && a.H > 0) attend(a, block, out.data_ptr<float>(), weights.data_ptr<float>());
  return {out, weights};
}

// The backward pass: the inputs of `causal_relative_attention_forward` (the entry bias only as whether there was
// one), its weights and the output's gradient grad_out [Q, B, H, D] (last axis contiguous). Returns the gradients
// of q as [Q, B, H, D], of k and v [B, H, K, D], and per batch (to be summed over it) of the table [B, H, R, D], the
// content and position biases [B, H, D] and the entry bias [B, H, R] (undefined for a bias not given).
std::vector<torch::Tensor> causal_relative_attention_backward(
    const torch::Tensor &grad_out, const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
    const torch::Tensor &table, const std::optional<torch::Tensor> &content_bias,
    const std::optional<torch::Tensor> &position_bias, bool has_entry_bias, const torch::Tensor &weights,
    double scale, int64_t window, int64_t block) {
  const torch::Tensor none;
  const Attention a = checked_attention(q, none, none, k, v, table, or_none(content_bias), or_none(position_bias),
                                        none, scale, window, block);
  const int64_t B = a.B, H = a.H, Q = a.Q, D = a.D, K = a.K, M = a.M, R = a.table_entries;
  check_float32_rows(grad_out, "grad_out", 4);
  TORCH_CHECK(grad_out.size(0) == Q && grad_out.size(1) == B && grad_out.size(2) == H && grad_out.size(3) == D &&
                  grad_out.stride(1) == H * D && grad_out.stride(2) == D && grad_out.stride(0) == B * H * D,
              "grad_out must be contiguous [Q, B, H, D]");
  TORCH_CHECK(weights.scalar_type() == torch::kFloat32 && weights.is_contiguous() && weights.dim() == 4 &&
                  weights.size(0) == B && weights.size(1) == H && weights.size(2) == Q && weights.size(3) == K,
              "weights must be the contiguous float32 [B, H, Q, K] of the forward pass");
  const auto options = q.options();
  auto grad_q = torch::empty({Q, B, H, D}, options);
  auto grad_k = torch::zeros({B, H, K, D}, options), grad_v = torch::zeros({B, H, K, D}, options);
  auto grad_table = torch::zeros({B, H, R, D}, options);
  torch::Tensor grad_content, grad_position, grad_entry;
  if (a.content) grad_content = torch::zeros({B, H, D}, options);
  if (a.position) grad_position = torch::zeros({B, H, D}, options);
  if (has_entry_bias) grad_entry = torch::zeros({B, H, R}, options);
  if (Q == 0 || B == 0 || H == 0) return {grad_q, grad_k, grad_v, grad_table, grad_content, grad_position, grad_entry};

  const float *go = grad_out.data_ptr<float>(), *w_all = weights.data_ptr<float>();
  float *gq = grad_q.data_ptr<float>(), *gk = grad_k.data_ptr<float>(), *gv = grad_v.data_ptr<float>();
  float *gt = grad_table.data_ptr<float>();
  const int64_t go_row = B * H * D, blocks = (Q + block - 1) / block;

  // One (batch, head) per item, its blocks in order: the gradients of its keys, values and table entries are sums
  // over its blocks, written by one thread
  at::parallel_for(0, B * H, 1, [&](int64_t item_begin, int64_t item_end) {
    // Per thread: the values transposed [D, K]; per block dw, G and G' [n, L] and their transposes [L, n]
    // (and w's), the queries plus each bias and their gradients [n, D]
    std::vector<float> values_t(D * K), grad_w(block * K), grad_s(block * K), grad_p(block * K),
        grad_s_t(block * K), weights_t(block * K), grad_p_t(block * K), q_content(block * D), q_position(block * D),
        grad_qa(block * D), grad_qb(block * D);
    for (int64_t item = item_begin; item < item_end; ++item) {
      const int64_t b = item / H, h = item % H;
      a.values.runs(b, h, 0, K, [&](const float *rows, int64_t row_stride, int64_t count, int64_t offset) {
        transpose_rows(rows, row_stride, count, D, K, values_t.data() + offset);
      });
      const float *keys = a.keys.segment.at(b, h), *values = a.values.segment.at(b, h);
      const int64_t key_row = a.keys.segment.row, value_row = a.values.segment.row;
      float *gk_h = gk + item * K * D, *gv_h = gv + item * K * D, *gt_h = gt + item * R * D;
      for (int64_t i0 = 0; i0 < Q; i0 += block) {
        const int64_t n = std::min(block, Q - i0);
        const int64_t J0 = a.first(i0), J1 = M + i0 + n, L = J1 - J0, s0 = J0 + Q - i0 - n;
        const float *w = w_all + (item * Q + i0) * K + J0;
        const float *dO = go + i0 * go_row + (b * H + h) * D;
        // dw = dO V^T over the block's keys, [n, L]
        product(n, L, D, dO, go_row, values_t.data() + J0, K, grad_w.data(), L);
        std::fill(grad_p.begin(), grad_p.begin() + n * L, 0.f);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t i = i0 + r, begin = a.first(i) - J0, end = M + i + 1 - J0;
          const float *wr = w + r * K, *dwr = grad_w.data() + r * L;
          float *g = grad_s.data() + r * L;
          // G_ij = scale * w_ij (dw_ij - sum_j' w_ij' dw_ij'); zero outside the row's keys
          std::fill(g, g + begin, 0.f);
          softmax_gradient(wr, dwr, g, begin, end, a.scale);
          std::fill(g + end, g + L, 0.f);
          // G' = G shifted back to table entries: key column t of row r is entry column t + (n - 1 - r)
          std::copy(g + begin, g + end, grad_p.data() + r * L + (n - 1 - r) + begin);
        }
        const auto [qa, lda] = a.with_bias(b, h, i0, n, a.content, q_content.data());
        const auto [qb, ldb] = a.with_bias(b, h, i0, n, a.position, q_position.data());
        // d(q + a) = G K and d(q + b) = G' R over the block's keys and table entries, [n, D]
        product(n, D, L, grad_s.data(), L, keys + J0 * key_row, key_row, grad_qa.data(), D);
        product(n, D, L, grad_p.data(), L, a.table + h * a.table_head + s0 * a.table_row, a.table_row,
                grad_qb.data(), D);
        for (int64_t r = 0; r < n; ++r)
          add(grad_qa.data() + r * D, grad_qb.data() + r * D, gq + (i0 + r) * go_row + (b * H + h) * D, D);
        if (a.content) add_rows(grad_qa.data(), n, D, grad_content.data_ptr<float>() + item * D);
        if (a.position) add_rows(grad_qb.data(), n, D, grad_position.data_ptr<float>() + item * D);
        if (has_entry_bias) add_rows(grad_p.data(), n, L, grad_entry.data_ptr<float>() + item * R + s0);
        // dK += G^T (Q + a), dV += w^T dO, dR += G'^T (Q + b), [L, D] each
        transpose_rows(grad_s.data(), L, n, L, n, grad_s_t.data());
        transpose_rows(w, K, n, L, n, weights_t.data());
        transpose_rows(grad_p.data(), L, n, L, n, grad_p_t.data());
        product(L, D, n, grad_s_t.data(), n, qa, lda, gk_h + J0 * D, D, true);
        product(L, D, n, weights_t.data(), n, dO, go_row, gv_h + J0 * D, D, true);
        product(L, D, n, grad_p_t.data(), n, qb, ldb, gt_h + s0 * D, D, true);
      }
    }
    release_products();
  });
  return {grad_q, grad_k, grad_v, grad_table, grad_content, grad_position, grad_entry};
}

// (a kernel that includes this file to call it defines LABML_TXL_INCLUDED and binds its own module)
#ifndef LABML_TXL_INCLUDED
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("causal_relative_attention", &causal_relative_attention,
        "Causal relative attention of Transformer-XL, float32, no gradients");
  m.def("causal_relative_attention_forward", &causal_relative_attention_forward,
        "Causal relative attention of Transformer-XL, float32: the output and the weights the backward pass takes");
  m.def("causal_relative_attention_backward", &causal_relative_attention_backward,
        "The backward pass of causal_relative_attention_forward");
}
#endif
