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
  // One Adam/AdamW step over f32 master weights p, gradients g, moments m
  // and v (all n long, updated in place). If p_low is not null, also writes
  // p rounded to low_dtype into it in the same pass.
  void (*adam)(const AdamConstants& constants, float* p, const float* g,
               float* m, float* v, void* p_low, DType low_dtype, size_t n);
  // One SGD step (see SgdElement); `momentum_buffer` is null when
  // params.momentum is 0. p_low as for adam.
  void (*sgd)(const SgdParams& params, float* p, const float* g, float* momentum_buffer,
              void* p_low, DType low_dtype, size_t n);
};

// REQUIRES: IsaSupported(isa).
const KernelTable& Kernels(Isa isa);
// The table of SelectedIsa().
const KernelTable& Kernels();

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CPU_CPU_KERNELS_H_
