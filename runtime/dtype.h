// Element types memwall stores, and the scalar conversions between them.
//
// The conversions are `__host__ __device__` inline functions so the CPU
// kernels and their CUDA twins run the same arithmetic; the CPU tests thus
// check the rounding the GPU performs. All of them round to nearest, ties to
// even, and keep subnormals (no flush to zero).
#ifndef MEMWALL_RUNTIME_DTYPE_H_
#define MEMWALL_RUNTIME_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MW_HD __host__ __device__ __forceinline__
#else
#define MW_HD inline
#endif

namespace memwall {

enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
};

constexpr int kNumDTypes = 3;

// Bytes per element.
constexpr size_t DTypeSize(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

// "f32", "bf16" or "f16".
const char* DTypeName(DType dtype);

// `base` advanced by `element` elements of `dtype`; null stays null (a
// meta device's buffers hold no bytes).
inline void* ElementOffset(void* base, int64_t element, DType dtype) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + element * DTypeSize(dtype);
}
inline const void* ElementOffset(const void* base, int64_t element, DType dtype) {
  return ElementOffset(const_cast<void*>(base), element, dtype);
}

MW_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MW_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// f32 -> bf16 bits. NaN stays NaN (quietened, sign kept); overflow past the
// largest bf16 rounds to infinity as IEEE rounding requires.
MW_HD uint16_t F32ToBf16(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

MW_HD float Bf16ToF32(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

// f32 -> IEEE binary16 bits. NaN becomes the canonical quiet NaN 0x7e00 with
// the sign kept; values at or past 65520 become infinity; subnormal halves
// are produced exactly (the float addition below rounds them, and no
// flush-to-zero mode is in force on either CPU or GPU builds).
MW_HD uint16_t F32ToF16(float x) {
  constexpr uint32_t kF32Infinity = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: past max half
  constexpr uint32_t kSmallestNormal = 113u << 23;        // 2^-14
  // 0.5 in the exponent of the smallest subnormal half: adding it aligns the
  // mantissa so the float adder performs the rounding.
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = FloatBits(x);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint32_t out;
  if (f >= kF16Overflow) {
    out = f > kF32Infinity ? 0x7e00u : 0x7c00u;
  } else if (f < kSmallestNormal) {
    out = FloatBits(BitsFloat(f) + BitsFloat(kDenormMagic)) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    f += mantissa_odd;
    out = f >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

// IEEE binary16 bits -> f32 (exact).
MW_HD float F16ToF32(uint16_t h) {
  constexpr uint32_t kShiftedExponent = 0x7c00u << 13;
  constexpr uint32_t kMagic = 113u << 23;
  uint32_t out = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exponent = kShiftedExponent & out;
  out += static_cast<uint32_t>(127 - 15) << 23;
  if (exponent == kShiftedExponent) {
    out += static_cast<uint32_t>(128 - 16) << 23;  // inf or nan
  } else if (exponent == 0) {
    out += 1u << 23;  // zero or subnormal: renormalise through the FPU
    out = FloatBits(BitsFloat(out) - BitsFloat(kMagic));
  }
  return BitsFloat(out | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_DTYPE_H_
