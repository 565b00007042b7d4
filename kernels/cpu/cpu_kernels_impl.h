// The CPU kernel loops. Included by exactly one .cc per ISA, each compiled
// with its own -m flags, after defining MW_CPU_ISA_NAMESPACE; it defines
// `const KernelTable kTable` in that namespace. Not a public header.
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elementwise.h"

namespace memwall {
namespace kernels {
namespace cpu {
namespace MW_CPU_ISA_NAMESPACE {
namespace {

template <DType D>
using T = typename Storage<D>::Type;

template <DType D>
void FillT(void* dst, size_t n, float value) {
  auto* out = static_cast<T<D>*>(dst);
  const T<D> stored = Storage<D>::Store(value);
  for (size_t i = 0; i < n; ++i) out[i] = stored;
}

void Fill(void* dst, DType dtype, size_t n, float value) {
  switch (dtype) {
    case DType::kF32: return FillT<DType::kF32>(dst, n, value);
    case DType::kBF16: return FillT<DType::kBF16>(dst, n, value);
    case DType::kF16: return FillT<DType::kF16>(dst, n, value);
  }
}

template <DType S, DType D>
void CastT(const void* src, void* dst, size_t n) {
  const auto* in = static_cast<const T<S>*>(src);
  auto* out = static_cast<T<D>*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = Storage<D>::Store(Storage<S>::Load(in[i]));
}

template <DType S>
void CastFrom(const void* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::kF32: return CastT<S, DType::kF32>(src, dst, n);
    case DType::kBF16: return CastT<S, DType::kBF16>(src, dst, n);
    case DType::kF16: return CastT<S, DType::kF16>(src, dst, n);
  }
}

void Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, n * DTypeSize(src_dtype));
    return;
  }
  switch (src_dtype) {
    case DType::kF32: return CastFrom<DType::kF32>(src, dst, dst_dtype, n);
    case DType::kBF16: return CastFrom<DType::kBF16>(src, dst, dst_dtype, n);
    case DType::kF16: return CastFrom<DType::kF16>(src, dst, dst_dtype, n);
  }
}

template <DType S, DType D>
void AccumulateT(const void* src, void* dst, size_t n) {
  const auto* in = static_cast<const T<S>*>(src);
  auto* out = static_cast<T<D>*>(dst);
  for (size_t i = 0; i < n; ++i) {
    out[i] = Storage<D>::Store(Storage<D>::Load(out[i]) + Storage<S>::Load(in[i]));
  }
}

template <DType S>
void AccumulateFrom(const void* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::kF32: return AccumulateT<S, DType::kF32>(src, dst, n);
    case DType::kBF16: return AccumulateT<S, DType::kBF16>(src, dst, n);
    case DType::kF16: return AccumulateT<S, DType::kF16>(src, dst, n);
  }
}

void Accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  switch (src_dtype) {
    case DType::kF32: return AccumulateFrom<DType::kF32>(src, dst, dst_dtype, n);
    case DType::kBF16: return AccumulateFrom<DType::kBF16>(src, dst, dst_dtype, n);
    case DType::kF16: return AccumulateFrom<DType::kF16>(src, dst, dst_dtype, n);
  }
}

template <DType D>
void ScaleT(void* x, size_t n, float alpha) {
  auto* data = static_cast<T<D>*>(x);
  for (size_t i = 0; i < n; ++i) {
    data[i] = Storage<D>::Store(Storage<D>::Load(data[i]) * alpha);
  }
}

void Scale(void* x, DType dtype, size_t n, float alpha) {
  switch (dtype) {
    case DType::kF32: return ScaleT<DType::kF32>(x, n, alpha);
    case DType::kBF16: return ScaleT<DType::kBF16>(x, n, alpha);
    case DType::kF16: return ScaleT<DType::kF16>(x, n, alpha);
  }
}

void Axpy(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = y[i] + alpha * x[i];
}

template <DType D>
double SumOfSquaresT(const void* x, size_t n) {
  constexpr size_t kLanes = kSumOfSquaresLanes;
  const auto* in = static_cast<const T<D>*>(x);
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double value = Storage<D>::Load(in[i + j]);
      lanes[j] += value * value;
    }
  }
  for (size_t j = 0; i + j < n; ++j) {
    const double value = Storage<D>::Load(in[i + j]);
    lanes[j] += value * value;
  }
  for (size_t width = kLanes / 2; width > 0; width /= 2) {
    for (size_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

double SumOfSquares(const void* x, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32: return SumOfSquaresT<DType::kF32>(x, n);
    case DType::kBF16: return SumOfSquaresT<DType::kBF16>(x, n);
    case DType::kF16: return SumOfSquaresT<DType::kF16>(x, n);
  }
  return 0.0;
}

template <DType D>
bool HasInfOrNanT(const void* x, size_t n) {
  // Blocks keep the inner loop branch-free (vectorised) while still stopping
  // early on a non-finite value.
  constexpr size_t kBlock = 4096;
  const auto* in = static_cast<const T<D>*>(x);
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = n - start < kBlock ? n : start + kBlock;
    int found = 0;
    for (size_t i = start; i < end; ++i) found |= Storage<D>::NonFinite(in[i]);
    if (found) return true;
  }
  return false;
}

bool HasInfOrNan(const void* x, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32: return HasInfOrNanT<DType::kF32>(x, n);
    case DType::kBF16: return HasInfOrNanT<DType::kBF16>(x, n);
    case DType::kF16: return HasInfOrNanT<DType::kF16>(x, n);
  }
  return false;
}

// The update streams its arrays from memory (an offloaded group's state is
// far larger than the caches); where the hardware prefetchers alone leave
// it short of the bandwidth, each block of kAdamBlock elements first asks
// for the lines `ahead` (StreamPrefetchElements) elements on. Prefetching
// stops that far from the end rather than point past the arrays.
constexpr size_t kAdamBlock = 64;

template <int kForWrite, typename E>
inline void PrefetchBlock(const E* at, size_t ahead) {
  const char* bytes = reinterpret_cast<const char*>(at + ahead);
  for (size_t k = 0; k < kAdamBlock * sizeof(E); k += 64) __builtin_prefetch(bytes + k, kForWrite);
}

// The constants come by value: a reference could alias the arrays, which
// would force a reload per element and block vectorisation. Gradients of
// any dtype are widened to f32 (exactly) as they are read.
template <DType G, DType Low, bool kCopy>
inline void AdamRun(const AdamConstants c, float* __restrict p, const T<G>* __restrict g,
                    float* __restrict m, float* __restrict v, T<Low>* __restrict low, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamElement(c, pi, Storage<G>::Load(g[i]), mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (kCopy) low[i] = Storage<Low>::Store(pi);
  }
}

template <DType G, DType Low, bool kCopy>
void AdamT(const AdamConstants c, float* __restrict p, const void* g_in, float* __restrict m,
           float* __restrict v, void* p_low, size_t n) {
  const auto* __restrict g = static_cast<const T<G>*>(g_in);
  auto* __restrict low = static_cast<T<Low>*>(p_low);
  size_t i = 0;
  const size_t ahead = StreamPrefetchElements();
  for (; ahead > 0 && i + ahead + kAdamBlock <= n; i += kAdamBlock) {
    PrefetchBlock<1>(p + i, ahead);
    PrefetchBlock<0>(g + i, ahead);
    PrefetchBlock<1>(m + i, ahead);
    PrefetchBlock<1>(v + i, ahead);
    AdamRun<G, Low, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? low + i : nullptr, kAdamBlock);
  }
  AdamRun<G, Low, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? low + i : nullptr, n - i);
}

template <DType G>
void AdamFrom(const AdamConstants& c, float* p, const void* g, float* m, float* v, void* p_low,
              DType low_dtype, size_t n) {
  if (p_low == nullptr) return AdamT<G, DType::kF32, false>(c, p, g, m, v, nullptr, n);
  switch (low_dtype) {
    case DType::kF32:
      return AdamT<G, DType::kF32, true>(c, p, g, m, v, p_low, n);
    case DType::kBF16:
      return AdamT<G, DType::kBF16, true>(c, p, g, m, v, p_low, n);
    case DType::kF16:
      return AdamT<G, DType::kF16, true>(c, p, g, m, v, p_low, n);
  }
}

void Adam(const AdamConstants& c, float* p, const void* g, DType g_dtype, float* m, float* v,
          void* p_low, DType low_dtype, size_t n) {
  switch (g_dtype) {
    case DType::kF32:
      return AdamFrom<DType::kF32>(c, p, g, m, v, p_low, low_dtype, n);
    case DType::kBF16:
      return AdamFrom<DType::kBF16>(c, p, g, m, v, p_low, low_dtype, n);
    case DType::kF16:
      return AdamFrom<DType::kF16>(c, p, g, m, v, p_low, low_dtype, n);
  }
}

template <DType G, DType Low, bool kCopy>
inline void AdamToRun(const AdamConstants c, const float* __restrict p, const T<G>* __restrict g,
                      const float* __restrict m, const float* __restrict v, float* __restrict p_out,
                      float* __restrict m_out, float* __restrict v_out, T<Low>* __restrict low,
                      size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i], mi = m[i], vi = v[i];
    AdamElement(c, pi, Storage<G>::Load(g[i]), mi, vi);
    p_out[i] = pi;
    m_out[i] = mi;
    v_out[i] = vi;
    if (kCopy) low[i] = Storage<Low>::Store(pi);
  }
}

// Its block loop repeats AdamT's on purpose: driven through one shared
// function taking the prefetch and the block as lambdas, the bf16 update
// measured 0.81-0.89x (cpu_adam_benchmark at 2^24 and 2^26; RESULTS).
template <DType G, DType Low, bool kCopy>
void AdamToT(const AdamConstants c, const float* __restrict p, const void* g_in,
             const float* __restrict m, const float* __restrict v, float* __restrict p_out,
             float* __restrict m_out, float* __restrict v_out, void* p_low, size_t n) {
  const auto* __restrict g = static_cast<const T<G>*>(g_in);
  auto* __restrict low = static_cast<T<Low>*>(p_low);
  size_t i = 0;
  const size_t ahead = StreamPrefetchElements();
  for (; ahead > 0 && i + ahead + kAdamBlock <= n; i += kAdamBlock) {
    PrefetchBlock<0>(p + i, ahead);
    PrefetchBlock<0>(g + i, ahead);
    PrefetchBlock<0>(m + i, ahead);
    PrefetchBlock<0>(v + i, ahead);
    AdamToRun<G, Low, kCopy>(c, p + i, g + i, m + i, v + i, p_out + i, m_out + i, v_out + i,
                             kCopy ? low + i : nullptr, kAdamBlock);
  }
  AdamToRun<G, Low, kCopy>(c, p + i, g + i, m + i, v + i, p_out + i, m_out + i, v_out + i,
                           kCopy ? low + i : nullptr, n - i);
}

template <DType G>
void AdamToFrom(const AdamConstants& c, const float* p, const void* g, const float* m,
                const float* v, float* p_out, float* m_out, float* v_out, void* p_low,
                DType low_dtype, size_t n) {
  if (p_low == nullptr) {
    return AdamToT<G, DType::kF32, false>(c, p, g, m, v, p_out, m_out, v_out, nullptr, n);
  }
  switch (low_dtype) {
    case DType::kF32:
      return AdamToT<G, DType::kF32, true>(c, p, g, m, v, p_out, m_out, v_out, p_low, n);
    case DType::kBF16:
      return AdamToT<G, DType::kBF16, true>(c, p, g, m, v, p_out, m_out, v_out, p_low, n);
    case DType::kF16:
      return AdamToT<G, DType::kF16, true>(c, p, g, m, v, p_out, m_out, v_out, p_low, n);
  }
}

void AdamTo(const AdamConstants& c, const float* p, const void* g, DType g_dtype, const float* m,
            const float* v, float* p_out, float* m_out, float* v_out, void* p_low, DType low_dtype,
            size_t n) {
  switch (g_dtype) {
    case DType::kF32:
      return AdamToFrom<DType::kF32>(c, p, g, m, v, p_out, m_out, v_out, p_low, low_dtype, n);
    case DType::kBF16:
      return AdamToFrom<DType::kBF16>(c, p, g, m, v, p_out, m_out, v_out, p_low, low_dtype, n);
    case DType::kF16:
      return AdamToFrom<DType::kF16>(c, p, g, m, v, p_out, m_out, v_out, p_low, low_dtype, n);
  }
}

template <DType G, DType Low, bool kCopy, bool kMomentum>
void SgdT(const SgdParams c, float* __restrict p, const void* g_in, float* __restrict buf,
          void* p_low, size_t n) {
  const auto* __restrict g = static_cast<const T<G>*>(g_in);
  auto* __restrict low = static_cast<T<Low>*>(p_low);
  for (size_t i = 0; i < n; ++i) {
    float pi = p[i];
    SgdElement(c, pi, Storage<G>::Load(g[i]), kMomentum ? &buf[i] : nullptr);
    p[i] = pi;
    if (kCopy) low[i] = Storage<Low>::Store(pi);
  }
}

template <DType G, bool kMomentum>
void SgdDispatch(const SgdParams& c, float* p, const void* g, float* buf, void* p_low,
                 DType low_dtype, size_t n) {
  if (p_low == nullptr) return SgdT<G, DType::kF32, false, kMomentum>(c, p, g, buf, nullptr, n);
  switch (low_dtype) {
    case DType::kF32:
      return SgdT<G, DType::kF32, true, kMomentum>(c, p, g, buf, p_low, n);
    case DType::kBF16:
      return SgdT<G, DType::kBF16, true, kMomentum>(c, p, g, buf, p_low, n);
    case DType::kF16:
      return SgdT<G, DType::kF16, true, kMomentum>(c, p, g, buf, p_low, n);
  }
}

template <DType G>
void SgdFrom(const SgdParams& c, float* p, const void* g, float* buf, void* p_low, DType low_dtype,
             size_t n) {
  if (buf != nullptr) return SgdDispatch<G, true>(c, p, g, buf, p_low, low_dtype, n);
  SgdDispatch<G, false>(c, p, g, nullptr, p_low, low_dtype, n);
}

void Sgd(const SgdParams& c, float* p, const void* g, DType g_dtype, float* buf, void* p_low,
         DType low_dtype, size_t n) {
  switch (g_dtype) {
    case DType::kF32:
      return SgdFrom<DType::kF32>(c, p, g, buf, p_low, low_dtype, n);
    case DType::kBF16:
      return SgdFrom<DType::kBF16>(c, p, g, buf, p_low, low_dtype, n);
    case DType::kF16:
      return SgdFrom<DType::kF16>(c, p, g, buf, p_low, low_dtype, n);
  }
}

template <DType D>
void QuantizeInt8T(const void* x, size_t n, size_t block, int8_t* q, float* absmax) {
  const auto* in = static_cast<const T<D>*>(x);
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = n - begin < block ? n : begin + block;
    uint32_t bits = 0;
    for (size_t i = begin; i < end; ++i) {
      const uint32_t b_i = AbsBits(Storage<D>::Load(in[i]));
      bits = b_i > bits ? b_i : bits;
    }
    const float a = BitsFloat(bits);
    absmax[b] = a;
    for (size_t i = begin; i < end; ++i) q[i] = QuantizeInt8(Storage<D>::Load(in[i]), a);
  }
}

void QuantizeInt8s(const void* x, DType dtype, size_t n, size_t block, int8_t* q,
                   float* absmax) {
  switch (dtype) {
    case DType::kF32: return QuantizeInt8T<DType::kF32>(x, n, block, q, absmax);
    case DType::kBF16: return QuantizeInt8T<DType::kBF16>(x, n, block, q, absmax);
    case DType::kF16: return QuantizeInt8T<DType::kF16>(x, n, block, q, absmax);
  }
}

template <DType D>
void DequantizeInt8T(const int8_t* q, const float* absmax, size_t n, size_t block, void* out) {
  auto* dst = static_cast<T<D>*>(out);
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = n - begin < block ? n : begin + block;
    const float a = absmax[b];
    for (size_t i = begin; i < end; ++i) dst[i] = Storage<D>::Store(DequantizeInt8(q[i], a));
  }
}

void DequantizeInt8s(const int8_t* q, const float* absmax, size_t n, size_t block, void* out,
                     DType dtype) {
  switch (dtype) {
    case DType::kF32: return DequantizeInt8T<DType::kF32>(q, absmax, n, block, out);
    case DType::kBF16: return DequantizeInt8T<DType::kBF16>(q, absmax, n, block, out);
    case DType::kF16: return DequantizeInt8T<DType::kF16>(q, absmax, n, block, out);
  }
}

}  // namespace

extern const KernelTable kTable;
const KernelTable kTable = {&Fill,         &Cast,        &Scale,         &Accumulate,
                            &Axpy,         &SumOfSquares, &HasInfOrNan, &Adam,
                            &AdamTo,       &Sgd,          &QuantizeInt8s, &DequantizeInt8s};

}  // namespace MW_CPU_ISA_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
