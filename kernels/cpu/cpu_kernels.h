// CPU kernels, compiled three times (generic x86-64, AVX2, AVX-512) and
// chosen at run time.
//
// Every ISA runs the same scalar code from kernels/elementwise.h, which the
// compiler vectorises; floating-point contraction is off in all three, so
// the ISAs agree bit for bit (the tests check it). Pointers are host memory;
// n counts elements. Not thread-safe against concurrent writes to the same
// buffers; otherwise reentrant.
#ifndef MEMWALL_KERNELS_CPU_CPU_KERNELS_H_
#define MEMWALL_KERNELS_CPU_CPU_KERNELS_H_

#include <cstddef>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/nn_math.h"
#include "runtime/dtype.h"

namespace memwall {
namespace kernels {
namespace cpu {

enum class Isa { kGeneric = 0, kAvx2, kAvx512 };

// "generic", "avx2", "avx512".
const char* IsaName(Isa isa);
// Whether this CPU runs `isa` (AVX2 needs FMA and F16C too; AVX-512 needs
// F, BW, VL and DQ).
bool IsaSupported(Isa isa);
// The ISAs this CPU supports, generic first.
std::vector<Isa> SupportedIsas();
// The widest supported ISA, unless the environment variable MEMWALL_CPU_ISA
// names another supported one (generic, avx2, avx512). Decided once.
Isa SelectedIsa();

// How far ahead (elements) the streamed optimizer updates prefetch each of
// their arrays in software: 512 on Intel, where the hardware prefetchers
// alone leave the update short of the bandwidth (cpu_adam_benchmark on
// Xeon: 1.13-1.29x at 2^24 and 2^26 elements), none on AMD, where they do
// not and the prefetches only cost (Zen 4, benchmarks/cpu_adam_deepspeed.py
// at 2^24: memwall/DeepSpeed 0.82x with them, 0.92x without; RESULTS,
// sixteenth session). Decided once, from CPUID's vendor.
size_t StreamPrefetchElements();

struct KernelTable {
  // dst[i] = value (rounded to dst's dtype).
  void (*fill)(void* dst, DType dtype, size_t n, float value);
  // dst[i] = src[i] converted (round to nearest even when narrowing).
  void (*cast)(const void* src, DType src_dtype, void* dst, DType dst_dtype,
               size_t n);
  // x[i] *= alpha (in f32, rounded back to x's dtype).
  void (*scale)(void* x, DType dtype, size_t n, float alpha);
  // dst[i] = dst[i] + src[i], added in f32 and rounded once to dst's dtype
  // (gradient accumulation across dtypes).
  void (*accumulate)(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
  // y[i] += alpha * x[i] (f32; a product then a sum, no fused multiply-add).
  void (*axpy)(float alpha, const float* x, float* y, size_t n);
  // Sum of x[i]^2 in double, in the fixed lane order of elementwise.h.
  double (*sum_of_squares)(const void* x, DType dtype, size_t n);
  // Whether any x[i] is +-inf or nan.
  bool (*has_inf_or_nan)(const void* x, DType dtype, size_t n);
  // One Adam/AdamW step over f32 master weights p, gradients g in g_dtype
  // (each widened to f32 as it is read, exactly: a 16-bit gradient needs no
  // f32 copy of its own), moments m and v (all n long; p, m and v updated in
  // place). If p_low is not null, also writes p rounded to low_dtype into it
  // in the same pass.
  void (*adam)(const AdamConstants& constants, float* p, const void* g, DType g_dtype, float* m,
               float* v, void* p_low, DType low_dtype, size_t n);
  // The same step out of place: reads p, m, v and writes the new values to
  // p_out, m_out, v_out (none overlapping), bit for bit what adam leaves
  // in place; for an update that must keep the current state (the
  // speculative update of sharding/host_optimizer.h).
  void (*adam_to)(const AdamConstants& constants, const float* p, const void* g, DType g_dtype,
                  const float* m, const float* v, float* p_out, float* m_out, float* v_out,
                  void* p_low, DType low_dtype, size_t n);
  // One SGD step (see SgdElement); gradients in g_dtype, widened as adam's
  // are; `momentum_buffer` is null when params.momentum is 0. p_low as for
  // adam.
  void (*sgd)(const SgdParams& params, float* p, const void* g, DType g_dtype,
              float* momentum_buffer, void* p_low, DType low_dtype, size_t n);
  // Block-based int8 quantization (elementwise.h QuantizeInt8): x's n
  // elements in blocks of `block` (the last may be shorter) to levels q
  // (n int8) and each block's absmax (ceil(n / block) floats).
  // REQUIRES: block >= 1.
  void (*quantize_int8)(const void* x, DType dtype, size_t n, size_t block, int8_t* q,
                        float* absmax);
  // The reverse: out[i] = absmax[i / block] * (q[i] / 127), rounded to
  // out's dtype.
  void (*dequantize_int8)(const int8_t* q, const float* absmax, size_t n, size_t block,
                          void* out, DType dtype);
};

// REQUIRES: IsaSupported(isa).
const KernelTable& Kernels(Isa isa);
// The table of SelectedIsa().
const KernelTable& Kernels();

// The neural-network kernels. Matrices are row-major f32; the math and the
// order of row reductions are kernels/nn_math.h's, so the ISAs agree bit for
// bit here too. Token ids and targets are f32 holding integers; callers
// check that they are in range.
struct NnKernelTable {
  // y[i] = GELU(x[i]).
  void (*gelu_forward)(const float* x, float* y, size_t n);
  // dx[i] = dy[i] * GELU'(x[i]); dx may be dy (in place).
  void (*gelu_backward)(const float* x, const float* dy, float* dx, size_t n);
  // Per row of x [rows, h]: y = (x - mean) * rstd * gamma + beta with
  // rstd = 1 / sqrt(var + kLayerNormEps); stats [rows, 2] gets (mean, rstd).
  void (*layer_norm_forward)(const float* x, const float* gamma, const float* beta,
                             int64_t rows, int64_t h, float* y, float* stats);
  // Writes dx; adds into dgamma and dbeta, rows in order.
  void (*layer_norm_backward)(const float* dy, const float* x, const float* stats,
                              const float* gamma, int64_t rows, int64_t h, float* dx,
                              float* dgamma, float* dbeta);
  // In place on `matrices` [s, s] score matrices: row i becomes the softmax
  // of its first i + 1 entries, and 0 after them (a causal mask).
  void (*causal_softmax_forward)(float* x, int64_t matrices, int64_t s);
  // In place: d (the gradient of the probabilities) becomes the gradient of
  // the scores, p * (d - sum_j d_j p_j), and 0 above the diagonal.
  void (*causal_softmax_backward)(const float* probs, float* d, int64_t matrices, int64_t s);
  // Per row r of logits [rows, vocab]: losses[r] = logsumexp(logits[r]) -
  // logits[r][targets[r]]; dlogits[r] = (softmax(logits[r]) - onehot) * scale.
  void (*cross_entropy)(const float* logits, const float* targets, int64_t rows,
                        int64_t vocab, float scale, float* dlogits, float* losses);
  // y[r][c] = b[c] for y [rows, cols].
  void (*broadcast_rows)(const float* b, int64_t rows, int64_t cols, float* y);
  // sum[c] += x[r][c], rows in order.
  void (*column_sum)(const float* x, int64_t rows, int64_t cols, float* sum);
  // A tile of the vocabulary: wte holds the rows of tokens [begin, end).
  // out[r] = wte[ids[r] - begin] + wpe[r % seq], rows of h, for the rows r
  // whose token lies in the tile; the others are left alone.
  void (*embedding_forward)(const float* ids, const float* wte, int64_t begin, int64_t end,
                            const float* wpe, int64_t rows, int64_t seq, int64_t h, float* out);
  // dwte[ids[r] - begin] += dout[r] for the rows whose token lies in
  // [begin, end); dwpe[r % seq] += dout[r] for every row unless dwpe is
  // null; rows in order.
  void (*embedding_backward)(const float* ids, const float* dout, int64_t rows, int64_t seq,
                             int64_t h, int64_t begin, int64_t end, float* dwte, float* dwpe);
};

// REQUIRES: IsaSupported(isa).
const NnKernelTable& NnKernels(Isa isa);
// The table of SelectedIsa().
const NnKernelTable& NnKernels();

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CPU_CPU_KERNELS_H_
