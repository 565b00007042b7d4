// The CPU neural-network kernel loops. Included by exactly one .cc per ISA,
// after cpu_kernels_impl.h, with MW_CPU_ISA_NAMESPACE defined; it defines
// `const NnKernelTable kNnTable` in that namespace. Not a public header.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/nn_math.h"

namespace memwall {
namespace kernels {
namespace cpu {
namespace MW_CPU_ISA_NAMESPACE {
namespace {

// The sum of f(0) .. f(n - 1) in nn_math.h's lane order. Independent lane
// accumulators let the compiler vectorise without reassociating.
template <typename F>
inline float LaneSum(int64_t n, F f) {
  float lanes[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes) {
    for (int j = 0; j < kRowLanes; ++j) lanes[j] += f(i + j);
  }
  for (int j = 0; i + j < n; ++j) lanes[j] += f(i + j);
  for (int width = kRowLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

// The largest of x[0 .. n), n >= 1. A maximum is exact in any order, so the
// lanes (which vectorise) give what one running maximum would.
inline float RowMax(const float* x, int64_t n) {
  float lanes[kRowLanes];
  for (int j = 0; j < kRowLanes; ++j) lanes[j] = x[0];
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes) {
    for (int j = 0; j < kRowLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  for (int j = 0; i + j < n; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  float max = lanes[0];
  for (int j = 1; j < kRowLanes; ++j) max = lanes[j] > max ? lanes[j] : max;
  return max;
}

void GeluForward(const float* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = GeluElement(x[i]);
}

// dy and dx may be the same buffer (in place).
void GeluBackward(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] = GeluGradElement(x[i], dy[i]);
}

void LayerNormForward(const float* __restrict x, const float* __restrict gamma,
                      const float* __restrict beta, int64_t rows, int64_t h, float* __restrict y,
                      float* __restrict stats) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    const float mean = LaneSum(h, [xr](int64_t i) { return xr[i]; }) / static_cast<float>(h);
    const float var = LaneSum(h, [xr, mean](int64_t i) {
                        const float c = xr[i] - mean;
                        return c * c;
                      }) /
                      static_cast<float>(h);
    const float rstd = 1.0f / std::sqrt(var + kLayerNormEps);
    for (int64_t i = 0; i < h; ++i) yr[i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

void LayerNormBackward(const float* __restrict dy, const float* __restrict x,
                       const float* __restrict stats, const float* __restrict gamma, int64_t rows,
                       int64_t h, float* __restrict dx, float* __restrict dgamma,
                       float* __restrict dbeta) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float a = LaneSum(h, [dyr, gamma](int64_t i) { return dyr[i] * gamma[i]; }) /
                    static_cast<float>(h);
    const float b = LaneSum(h, [=](int64_t i) {
                      return LayerNormBTerm(dyr[i], gamma[i], xr[i], mean, rstd);
                    }) /
                    static_cast<float>(h);
    for (int64_t i = 0; i < h; ++i) {
      dx[r * h + i] = LayerNormDx(dyr[i], gamma[i], xr[i], mean, rstd, a, b);
      dgamma[i] += dyr[i] * LayerNormXhat(xr[i], mean, rstd);
      dbeta[i] += dyr[i];
    }
  }
}

void CausalSoftmaxForward(float* __restrict x, int64_t matrices, int64_t s) {
  for (int64_t row = 0; row < matrices * s; ++row) {
    float* xr = x + row * s;
    const int64_t n = row % s + 1;
    const float max = RowMax(xr, n);
    for (int64_t j = 0; j < n; ++j) xr[j] = ExpF(xr[j] - max);
    const float inv = 1.0f / LaneSum(n, [xr](int64_t j) { return xr[j]; });
    for (int64_t j = 0; j < n; ++j) xr[j] = xr[j] * inv;
    for (int64_t j = n; j < s; ++j) xr[j] = 0.0f;
  }
}

void CausalSoftmaxBackward(const float* __restrict probs, float* __restrict d, int64_t matrices,
                           int64_t s) {
  for (int64_t row = 0; row < matrices * s; ++row) {
    const float* pr = probs + row * s;
    float* dr = d + row * s;
    const int64_t n = row % s + 1;
    const float dot = LaneSum(n, [pr, dr](int64_t j) { return dr[j] * pr[j]; });
    for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
    for (int64_t j = n; j < s; ++j) dr[j] = 0.0f;
  }
}

void CrossEntropy(const float* __restrict logits, const float* __restrict targets, int64_t rows,
                  int64_t vocab, float scale, float* __restrict dlogits,
                  float* __restrict losses) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab;
    float* dr = dlogits + r * vocab;
    const int64_t t = static_cast<int64_t>(targets[r]);
    const float max = RowMax(lr, vocab);
    for (int64_t j = 0; j < vocab; ++j) dr[j] = ExpF(lr[j] - max);
    const float sum = LaneSum(vocab, [dr](int64_t j) { return dr[j]; });
    losses[r] = (std::log(sum) + max) - lr[t];
    const float inv = scale / sum;
    for (int64_t j = 0; j < vocab; ++j) dr[j] = dr[j] * inv;
    dr[t] = dr[t] - scale;
  }
}

void BroadcastRows(const float* __restrict b, int64_t rows, int64_t cols, float* __restrict y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = b[c];
  }
}

void ColumnSum(const float* __restrict x, int64_t rows, int64_t cols, float* __restrict sum) {
  // nn_math.h's pairwise order, a tile of columns at a time so rows are read
  // in order (PairwiseColumnSum's arithmetic, column by column).
  constexpr int64_t kTile = 16;
  for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
    const int64_t width = c0 + kTile < cols ? kTile : cols - c0;
    float levels[kTile][kColumnLevels];
    int64_t count[kTile] = {};
    for (int64_t r0 = 0; r0 < rows; r0 += kColumnBlock) {
      const int64_t r1 = r0 + kColumnBlock < rows ? r0 + kColumnBlock : rows;
      float s[kTile];
      for (int64_t j = 0; j < width; ++j) s[j] = x[r0 * cols + c0 + j];
      for (int64_t r = r0 + 1; r < r1; ++r) {
        for (int64_t j = 0; j < width; ++j) s[j] += x[r * cols + c0 + j];
      }
      for (int64_t j = 0; j < width; ++j) PairwiseMerge(levels[j], count[j], s[j]);
    }
    for (int64_t j = 0; j < width; ++j) {
      if (rows > 0) sum[c0 + j] += PairwiseTotal(levels[j], count[j]);
    }
  }
}

void EmbeddingForward(const float* __restrict ids, const float* __restrict wte, int64_t begin,
                      int64_t end, const float* __restrict wpe, int64_t rows, int64_t seq,
                      int64_t h, float* __restrict out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    if (id < begin || id >= end) continue;
    const float* t = wte + (id - begin) * h;
    const float* p = wpe + (r % seq) * h;
    for (int64_t i = 0; i < h; ++i) out[r * h + i] = t[i] + p[i];
  }
}

void EmbeddingBackward(const float* __restrict ids, const float* __restrict dout, int64_t rows,
                       int64_t seq, int64_t h, int64_t begin, int64_t end, float* __restrict dwte,
                       float* __restrict dwpe) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = static_cast<int64_t>(ids[r]);
    const float* d = dout + r * h;
    if (id >= begin && id < end) {
      float* t = dwte + (id - begin) * h;
      for (int64_t i = 0; i < h; ++i) t[i] += d[i];
    }
    if (dwpe == nullptr) continue;
    float* p = dwpe + (r % seq) * h;
    for (int64_t i = 0; i < h; ++i) p[i] += d[i];
  }
}

}  // namespace

extern const NnKernelTable kNnTable;
const NnKernelTable kNnTable = {
    &GeluForward,  &GeluBackward,     &LayerNormForward, &LayerNormBackward,
    &CausalSoftmaxForward, &CausalSoftmaxBackward, &CrossEntropy, &BroadcastRows,
    &ColumnSum,    &EmbeddingForward, &EmbeddingBackward};

}  // namespace MW_CPU_ISA_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
