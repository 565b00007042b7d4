// Math of the neural-network kernels (GELU, LayerNorm, softmax,
// cross-entropy), shared by the CPU kernels and their CUDA twins.
//
// Like elementwise.h, everything is `__host__ __device__` and builds without
// contraction on both sides, with IEEE division and square root. exp and
// tanh are memwall's own (ExpF, TanhF) rather than the platform's, for two
// reasons: glibc's expf does not vectorise without -ffast-math, and CUDA's
// expf rounds differently from glibc's; with one polynomial both sides
// compute the same bits, so a CPU kernel and its twin agree exactly.
//
// Row reductions (LayerNorm statistics, softmax sums) add in kRowLanes
// float lanes: lane j takes elements j, j + kRowLanes, j + 2 * kRowLanes,
// ... in order, and the lanes are combined pairwise (width 8, 4, 2, 1). The
// CPU loops keep 16 independent accumulators (which vectorise); the CUDA
// twins give lane j to warp lane j and combine with shuffles in the same
// order. Only the cross-entropy's log (once per row) comes from the
// platform, so the cross-entropy loss (not its gradient) may differ in the
// last bit between host and device.
#ifndef MEMWALL_KERNELS_NN_MATH_H_
#define MEMWALL_KERNELS_NN_MATH_H_

#include <cstdint>

#include "runtime/dtype.h"

namespace memwall {
namespace kernels {

constexpr int kRowLanes = 16;
constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK = 0.044715f;

// e^x within 2 ulp for x in [-87.3, 88] (the test measures under 1 ulp);
// saturates outside (to e^-87.33654, about 2^-126, below and e^88 above),
// so it never returns inf or 0. Cephes' expf: x = n ln2 + r with ln2 split
// in two, a degree-6 polynomial in r, then the exponent bits. n is x / ln2
// rounded to nearest by adding and subtracting 1.5 * 2^23 (exact IEEE
// steps, with no select, which would stop GCC vectorising the loops).
MW_HD float ExpF(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * BitsFloat(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1); absolute error below 2e-7.
MW_HD float TanhF(float u) { return 1.0f - 2.0f / (ExpF(2.0f * u) + 1.0f); }

// LayerNorm's backward, one row (mean and rstd its forward statistics):
// the normalised input, the terms of the row means a = mean(dy * gamma) and
// b = mean(dy * gamma * xhat), and the input gradient
// rstd (dy gamma - a - xhat b). The row means add as kRowLanes lanes do.
MW_HD float LayerNormXhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
MW_HD float LayerNormBTerm(float dy, float gamma, float x, float mean, float rstd) {
  return dy * gamma * LayerNormXhat(x, mean, rstd);
}
MW_HD float LayerNormDx(float dy, float gamma, float x, float mean, float rstd, float a,
                        float b) {
  return rstd * (dy * gamma - a - LayerNormXhat(x, mean, rstd) * b);
}

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(c (x + k x^3))).
MW_HD float GeluElement(float x) {
  const float u = kGeluC * (x + kGeluK * x * x * x);
  return 0.5f * x * (1.0f + TanhF(u));
}

// dy * GELU'(x).
MW_HD float GeluGradElement(float x, float dy) {
  const float t = TanhF(kGeluC * (x + kGeluK * x * x * x));
  const float du = kGeluC * (1.0f + 3.0f * kGeluK * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

// Column sums (bias gradients) add rows pairwise, so the error grows with
// log(rows) rather than rows: rows are summed in order in blocks of
// kColumnBlock, and each block's sum joins a binary counter of partial sums
// (a block merges, as the right operand, with the partial holding as many
// blocks, carrying upwards); what the counter holds at the end is added
// from its largest partial down. The CPU kernel (a tile of columns at a
// time, in row order) and the CUDA twin (a column per thread, through
// PairwiseColumnSum) follow this order exactly.
constexpr int64_t kColumnBlock = 8;
constexpr int kColumnLevels = 64;

// Merges block sum `s` into the counter (`levels`, `count` blocks so far).
MW_HD void PairwiseMerge(float* levels, int64_t& count, float s) {
  int k = 0;
  for (; (count >> k) & 1; ++k) s = levels[k] + s;
  levels[k] = s;
  ++count;
}

// The counter's total: its partials from the largest down.
MW_HD float PairwiseTotal(const float* levels, int64_t count) {
  float total = 0.0f;
  bool first = true;
  for (int k = kColumnLevels - 1; k >= 0; --k) {
    if (!((count >> k) & 1)) continue;
    total = first ? levels[k] : total + levels[k];
    first = false;
  }
  return total;
}

// Column c of the row-major [rows, cols] x, summed in the order above.
MW_HD float PairwiseColumnSum(const float* x, int64_t rows, int64_t cols, int64_t c) {
  float levels[kColumnLevels];
  int64_t count = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kColumnBlock) {
    const int64_t r1 = r0 + kColumnBlock < rows ? r0 + kColumnBlock : rows;
    float s = x[r0 * cols + c];
    for (int64_t r = r0 + 1; r < r1; ++r) s += x[r * cols + c];
    PairwiseMerge(levels, count, s);
  }
  return PairwiseTotal(levels, count);
}

}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_NN_MATH_H_
