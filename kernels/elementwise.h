// Element-wise math shared by the CPU kernels and their CUDA twins.
//
// Everything here is `__host__ __device__` inline and builds without
// floating-point contraction on both sides (-ffp-contract=off, nvcc
// --fmad=false), with IEEE division and square root, so a CPU kernel and
// its CUDA twin return the same bits for the same inputs.
#ifndef MEMWALL_KERNELS_ELEMENTWISE_H_
#define MEMWALL_KERNELS_ELEMENTWISE_H_

#include <cmath>
#include <cstdint>

#include "runtime/dtype.h"

namespace memwall {
namespace kernels {

// Adam / AdamW hyper-parameters for one step.
struct AdamParams {
  float lr = 1e-3f;            // learning rate
  float beta1 = 0.9f;          // first-moment decay
  float beta2 = 0.999f;        // second-moment decay
  float eps = 1e-8f;           // added to the denominator
  float weight_decay = 0.0f;   // L2 (Adam) or decoupled (AdamW) coefficient
  bool adamw = false;          // decoupled weight decay (Loshchilov & Hutter)
  int64_t step = 1;            // 1-based step number, for bias correction
  float grad_scale = 1.0f;     // gradients are multiplied by this first
                               // (1 / loss scale, times a clipping factor)
};

// Per-step constants derived once on the host (in double, then rounded to
// float), so every element and every backend uses the same values.
struct AdamConstants {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float grad_scale;
  float l2;             // Adam's L2 coefficient (0 for AdamW)
  float decay_factor;   // 1 - lr * weight_decay for AdamW, 1 for Adam
  float step_size;      // lr / (1 - beta1^step)
  float sqrt_bias_correction2;  // sqrt(1 - beta2^step)
};

inline AdamConstants MakeAdamConstants(const AdamParams& p) {
  const double bias_correction1 = 1.0 - std::pow(double{p.beta1}, double(p.step));
  const double bias_correction2 = 1.0 - std::pow(double{p.beta2}, double(p.step));
  AdamConstants c;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.eps = p.eps;
  c.grad_scale = p.grad_scale;
  c.l2 = p.adamw ? 0.0f : p.weight_decay;
  c.decay_factor = p.adamw ? static_cast<float>(1.0 - double{p.lr} * p.weight_decay) : 1.0f;
  c.step_size = static_cast<float>(p.lr / bias_correction1);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  return c;
}

// One Adam/AdamW update of one element, in the order PyTorch's
// single-tensor Adam uses (m and v by multiply-add, the denominator as
// sqrt(v) / sqrt(bias_correction2) + eps, then p -= step_size * m / denom).
MW_HD void AdamElement(const AdamConstants& c, float& p, float g, float& m, float& v) {
  g = g * c.grad_scale;
  if (c.l2 != 0.0f) g = g + c.l2 * p;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  p = p * c.decay_factor;
#if defined(__CUDA_ARCH__)
  const float denom = __fdiv_rn(__fsqrt_rn(v), c.sqrt_bias_correction2) + c.eps;
  p = p - c.step_size * __fdiv_rn(m, denom);
#else
  const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
  p = p - c.step_size * (m / denom);
#endif
}

// SGD with momentum and L2 weight decay, as PyTorch's SGD (dampening 0,
// no Nesterov): d = g * grad_scale + weight_decay * p; buf = momentum * buf
// + d (a zero buffer gives buf = d on the first step, as PyTorch's clone);
// p -= lr * buf. With momentum 0 there is no buffer.
struct SgdParams {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
};

MW_HD void SgdElement(const SgdParams& c, float& p, float g, float* buf) {
  g = g * c.grad_scale;
  if (c.weight_decay != 0.0f) g = g + c.weight_decay * p;
  if (buf != nullptr) {
    *buf = c.momentum * *buf + g;
    g = *buf;
  }
  p = p - c.lr * g;
}

// Block-based symmetric int8 quantization (ZeRO++'s qwZ, for the stage-3
// parameter all-gather): a block of elements travels as int8 levels q in
// [-127, 127] beside its f32 absmax a (the largest |x| of the block), and
// an element reads back as a * (q / 127). The quantization step is
// a / 127; rounding to the nearest level (half to even) puts every element
// within half a step of its value, up to the rounding of the f32 divisions
// and the product (a few parts in 10^5 of the step). The block's largest
// element, and so every element of a constant block, reads back exactly
// (q = +-127 gives a * 1); a block of zeros has a = 0 and reads back 0. A
// block holding an inf or a nan has a non-finite absmax and reads back as
// nans.
//
// The absmax is reduced on the bits of |x|: for non-negative floats the
// unsigned order of the bits is the order of the values, with inf above
// every finite value and nans above inf. The largest AbsBits of a block
// is thus its absmax, a nan if it holds one (the same nan on every backend:
// a max of integers, in any order).
MW_HD uint32_t AbsBits(float x) { return FloatBits(x) & 0x7fffffffu; }

MW_HD int8_t QuantizeInt8(float x, float absmax) {
  if (!(absmax > 0.0f) || !(absmax <= 3.402823466e+38f)) return 0;  // zeros; inf, nan
#if defined(__CUDA_ARCH__)
  float level = rintf(__fmul_rn(__fdiv_rn(x, absmax), 127.0f));
#else
  float level = std::rint((x / absmax) * 127.0f);
#endif
  level = level < -127.0f ? -127.0f : (level > 127.0f ? 127.0f : level);
  return static_cast<int8_t>(level);
}

MW_HD float DequantizeInt8(int8_t q, float absmax) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(absmax, __fdiv_rn(static_cast<float>(q), 127.0f));
#else
  return absmax * (static_cast<float>(q) / 127.0f);
#endif
}

// Load/store of one element of each storage type, computing in f32.
template <DType D>
struct Storage;

template <>
struct Storage<DType::kF32> {
  using Type = float;
  static MW_HD float Load(float x) { return x; }
  static MW_HD float Store(float x) { return x; }
  static MW_HD bool NonFinite(float x) {
    return (FloatBits(x) & 0x7f800000u) == 0x7f800000u;
  }
};

template <>
struct Storage<DType::kBF16> {
  using Type = uint16_t;
  static MW_HD float Load(uint16_t x) { return Bf16ToF32(x); }
  static MW_HD uint16_t Store(float x) { return F32ToBf16(x); }
  static MW_HD bool NonFinite(uint16_t x) { return (x & 0x7f80u) == 0x7f80u; }
};

template <>
struct Storage<DType::kF16> {
  using Type = uint16_t;
  static MW_HD float Load(uint16_t x) { return F16ToF32(x); }
  static MW_HD uint16_t Store(float x) { return F32ToF16(x); }
  static MW_HD bool NonFinite(uint16_t x) { return (x & 0x7c00u) == 0x7c00u; }
};

// Sum of squares accumulates in this many double lanes: lane i % kLanes
// takes element i, and the lanes are combined pairwise in a fixed order.
// Every ISA (and the CUDA twin's per-thread order aside) thus adds in the
// same order, so results do not depend on which CPU ran them.
constexpr int kSumOfSquaresLanes = 16;

}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_ELEMENTWISE_H_
