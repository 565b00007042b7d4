// CPU kernels on every ISA this machine supports, against references
// written independently here (double-precision rounding for the casts, a
// double evaluation of Adam), and against each other bit for bit.
#include "kernels/cpu/cpu_kernels.h"

#include "kernels/cpu/parallel.h"

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/values.h"
#include "kernels/elementwise.h"
#include "runtime/dtype.h"

namespace memwall::kernels::cpu {
namespace {

using testing::RandomFloats;

const std::vector<size_t> kSizes = {0, 1, 7, 15, 16, 17, 63, 1000, 4099, 10007};

float Bits(uint32_t u) { return BitsFloat(u); }

// The value of a binary16 by its definition (not by the kernel's method).
double HalfValue(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double value;
  if (exponent == 0) {
    value = std::ldexp(double(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::numeric_limits<double>::quiet_NaN()
                     : std::numeric_limits<double>::infinity();
  } else {
    value = std::ldexp(double(1024 + mantissa), exponent - 25);
  }
  return sign ? -value : value;
}

// Rounds a finite float to a format with `mantissa_bits` stored bits and
// minimum normal exponent `min_exponent` (round to nearest, ties to even,
// gradual underflow), returning the rounded value; +-inf past `overflow`.
double RoundToFormat(float x, int mantissa_bits, int min_exponent, double overflow) {
  const double a = std::fabs(double(x));
  if (a == 0) return double(x);
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int unit_exponent = std::max(e - 1, min_exponent) - mantissa_bits;
  const double q = std::ldexp(a, -unit_exponent);  // exact
  REQUIRE(std::fegetround() == FE_TONEAREST);
  double rounded = std::ldexp(std::nearbyint(q), unit_exponent);
  if (rounded >= overflow) rounded = std::numeric_limits<double>::infinity();
  return std::signbit(x) ? -rounded : rounded;
}

double RefHalf(float x) { return RoundToFormat(x, 10, -14, 65536.0); }
double RefBf16(float x) { return RoundToFormat(x, 7, -126, std::ldexp(1.0, 128)); }

void CheckF16(float x) {
  const uint16_t h = F32ToF16(x);
  if (std::isnan(x)) {
    REQUIRE(std::isnan(HalfValue(h)));
    REQUIRE((h >> 15) == (FloatBits(x) >> 31));
    return;
  }
  const double want = RefHalf(x);
  INFO("x = " << x << " bits 0x" << std::hex << FloatBits(x) << " -> 0x" << h);
  REQUIRE(HalfValue(h) == want);
  REQUIRE(std::signbit(HalfValue(h)) == std::signbit(x));
}

void CheckBf16(float x) {
  const uint16_t b = F32ToBf16(x);
  const float back = Bf16ToF32(b);
  if (std::isnan(x)) {
    REQUIRE(std::isnan(back));
    REQUIRE(std::signbit(back) == std::signbit(x));
    return;
  }
  INFO("x = " << x << " bits 0x" << std::hex << FloatBits(x) << " -> 0x" << b);
  REQUIRE(double(back) == RefBf16(x));
  REQUIRE(std::signbit(back) == std::signbit(x));
}

TEST_CASE("f16 -> f32 is exact for all 65536 halves", "[cast]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(uint16_t(h));
    const double want = HalfValue(uint16_t(h));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(f));
    } else {
      REQUIRE(double(f) == want);
      REQUIRE(std::signbit(f) == bool(h >> 15));
      // And back again, bit for bit.
      REQUIRE(F32ToF16(f) == h);
    }
  }
}

TEST_CASE("bf16 -> f32 -> bf16 round-trips every non-nan bf16", "[cast]") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToF32(uint16_t(b));
    REQUIRE(FloatBits(f) == b << 16);
    if (!std::isnan(f)) REQUIRE(F32ToBf16(f) == b);
  }
}

TEST_CASE("f32 -> f16 and f32 -> bf16 round to nearest even: edge cases", "[cast]") {
  // Ties go to the even mantissa.
  CHECK(F32ToF16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(F32ToBf16(Bits(0x3f808000)) == 0x3f80);
  CHECK(F32ToBf16(Bits(0x3f818000)) == 0x3f82);
  CHECK(F32ToBf16(Bits(0x3f808001)) == 0x3f81);
  // Largest values and overflow.
  CHECK(F32ToF16(65504.0f) == 0x7bff);
  CHECK(F32ToF16(65519.996f) == 0x7bff);
  CHECK(F32ToF16(65520.0f) == 0x7c00);
  CHECK(F32ToF16(-1e9f) == 0xfc00);
  CHECK(F32ToBf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(F32ToBf16(Bits(0x7f7f7fff)) == 0x7f7f);
  // Subnormal halves: 2^-24 is the smallest; 2^-25 ties to 0; 3 * 2^-25
  // ties up to 2 * 2^-24.
  CHECK(F32ToF16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(F32ToF16(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(F32ToF16(3 * std::ldexp(1.0f, -25)) == 0x0002);
  CHECK(F32ToF16(-std::ldexp(1.0f, -14)) == 0x8400);
  CHECK(F32ToF16(std::ldexp(1023.0f, -24)) == 0x03ff);
  // Float subnormals survive into bf16 and vanish from f16.
  CHECK(F32ToBf16(Bits(0x00010000)) == 0x0001);
  CHECK(F32ToBf16(Bits(0x00000001)) == 0x0000);
  CHECK(F32ToF16(Bits(0x00000001)) == 0x0000);
  CHECK(F32ToF16(Bits(0x80000001)) == 0x8000);
  // Infinities, signed zeros and NaN.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(F32ToF16(inf) == 0x7c00);
  CHECK(F32ToF16(-inf) == 0xfc00);
  CHECK(F32ToBf16(-inf) == 0xff80);
  CHECK(F32ToF16(-0.0f) == 0x8000);
  CHECK(F32ToBf16(-0.0f) == 0x8000);
  CHECK(F32ToF16(std::numeric_limits<float>::quiet_NaN()) == 0x7e00);
  CHECK(F32ToF16(-std::numeric_limits<float>::quiet_NaN()) == 0xfe00);
  // A signalling NaN whose payload sits in the low bits stays a NaN.
  CHECK(F32ToBf16(Bits(0x7f800001)) == 0x7fc0);
  CHECK(F32ToBf16(Bits(0xff800001)) == 0xffc0);
}

TEST_CASE("f32 -> f16 / bf16 agree with the reference rounding on a sweep of floats",
          "[cast]") {
  // Every 4099th bit pattern (all exponents, all signs) plus random ones.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) CheckF16(Bits(uint32_t(u)));
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) CheckBf16(Bits(uint32_t(u)));
  std::mt19937 rng(42);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = rng();
    CheckF16(Bits(u));
    CheckBf16(Bits(u));
  }
  // Exhaustively around the f16 subnormal/normal boundary and the top.
  for (uint32_t u = 0x33000000; u < 0x38800000; u += 97) CheckF16(Bits(u));
  for (uint32_t u = 0x477f0000; u < 0x47800100; ++u) CheckF16(Bits(u));
}

template <typename Fn>
void ForEachIsa(Fn fn) {
  for (Isa isa : SupportedIsas()) {
    INFO("isa " << IsaName(isa));
    fn(isa, Kernels(isa));
  }
}

TEST_CASE("the widest ISA is selected and every supported one is reachable", "[isa]") {
  const std::vector<Isa> isas = SupportedIsas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == Isa::kGeneric);
  if (std::getenv("MEMWALL_CPU_ISA") == nullptr) CHECK(SelectedIsa() == isas.back());
  UNSCOPED_INFO("this CPU runs: " << IsaName(isas.back()));
}

TEST_CASE("fill and cast match the scalar conversions on every ISA", "[fill][cast]") {
  ForEachIsa([](Isa, const KernelTable& k) {
    for (size_t n : kSizes) {
      INFO("n " << n);
      std::vector<float> f32 = RandomFloats(n, 7, 1000.0f);
      if (n > 3) {
        f32[1] = std::numeric_limits<float>::infinity();
        f32[2] = std::numeric_limits<float>::quiet_NaN();
        f32[3] = 1e-40f;  // float subnormal
      }
      std::vector<uint16_t> bf16(n), f16(n);
      k.cast(f32.data(), DType::kF32, bf16.data(), DType::kBF16, n);
      k.cast(f32.data(), DType::kF32, f16.data(), DType::kF16, n);
      for (size_t i = 0; i < n; ++i) {
        REQUIRE(bf16[i] == F32ToBf16(f32[i]));
        REQUIRE(f16[i] == F32ToF16(f32[i]));
      }
      std::vector<float> back(n);
      k.cast(f16.data(), DType::kF16, back.data(), DType::kF32, n);
      for (size_t i = 0; i < n; ++i) REQUIRE(FloatBits(back[i]) == FloatBits(F16ToF32(f16[i])));
      k.cast(bf16.data(), DType::kBF16, back.data(), DType::kF32, n);
      for (size_t i = 0; i < n; ++i) REQUIRE(FloatBits(back[i]) == uint32_t(bf16[i]) << 16);
      std::vector<uint16_t> cross(n);
      k.cast(bf16.data(), DType::kBF16, cross.data(), DType::kF16, n);
      for (size_t i = 0; i < n; ++i) REQUIRE(cross[i] == F32ToF16(Bf16ToF32(bf16[i])));

      std::vector<uint16_t> filled(n + 1, 0xabcd);
      k.fill(filled.data(), DType::kBF16, n, 3.14159f);
      for (size_t i = 0; i < n; ++i) REQUIRE(filled[i] == F32ToBf16(3.14159f));
      REQUIRE(filled[n] == 0xabcd);  // nothing past n is touched
      std::vector<float> ffill(n);
      k.fill(ffill.data(), DType::kF32, n, -2.5f);
      for (float x : ffill) REQUIRE(x == -2.5f);
    }
  });
}

TEST_CASE("scale and axpy match plain loops bit for bit", "[scale][axpy]") {
  ForEachIsa([](Isa, const KernelTable& k) {
    for (size_t n : kSizes) {
      INFO("n " << n);
      const std::vector<float> x = RandomFloats(n, 1), y0 = RandomFloats(n, 2);
      std::vector<float> y = y0;
      k.axpy(0.3f, x.data(), y.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const float product = 0.3f * x[i];
        REQUIRE(FloatBits(y[i]) == FloatBits(y0[i] + product));
      }
      std::vector<float> s = x;
      k.scale(s.data(), DType::kF32, n, 1.0f / 3.0f);
      for (size_t i = 0; i < n; ++i) REQUIRE(FloatBits(s[i]) == FloatBits(x[i] * (1.0f / 3.0f)));
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = F32ToF16(x[i]);
      k.scale(h.data(), DType::kF16, n, 1024.0f);
      for (size_t i = 0; i < n; ++i) REQUIRE(h[i] == F32ToF16(F16ToF32(F32ToF16(x[i])) * 1024.0f));
    }
  });
}

TEST_CASE("accumulate adds in f32 and rounds once, for every pair of dtypes", "[accumulate]") {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  auto load = [](DType d, const std::vector<uint8_t>& buf, size_t i) {
    switch (d) {
      case DType::kF32: { float f; std::memcpy(&f, &buf[4 * i], 4); return f; }
      case DType::kBF16: { uint16_t h; std::memcpy(&h, &buf[2 * i], 2); return Bf16ToF32(h); }
      case DType::kF16: { uint16_t h; std::memcpy(&h, &buf[2 * i], 2); return F16ToF32(h); }
    }
    return 0.0f;
  };
  auto fill = [](DType d, size_t n, uint32_t seed) {
    const std::vector<float> x = RandomFloats(n, seed, 3.0f);
    std::vector<uint8_t> out(n * DTypeSize(d));
    Kernels(Isa::kGeneric).cast(x.data(), DType::kF32, out.data(), d, n);
    return out;
  };
  ForEachIsa([&](Isa, const KernelTable& k) {
    for (DType src_dtype : dtypes) {
      for (DType dst_dtype : dtypes) {
        INFO(DTypeName(src_dtype) << " into " << DTypeName(dst_dtype));
        const size_t n = 1031;
        const std::vector<uint8_t> src = fill(src_dtype, n, 41), dst0 = fill(dst_dtype, n, 42);
        std::vector<uint8_t> dst = dst0, want(dst0.size());
        k.accumulate(src.data(), src_dtype, dst.data(), dst_dtype, n);
        for (size_t i = 0; i < n; ++i) {
          const float sum = load(dst_dtype, dst0, i) + load(src_dtype, src, i);
          Kernels(Isa::kGeneric).cast(&sum, DType::kF32, &want[i * DTypeSize(dst_dtype)],
                                      dst_dtype, 1);
        }
        REQUIRE(dst == want);
      }
    }
  });
}

TEST_CASE("sum of squares is accurate and identical on every ISA", "[norm]") {
  for (size_t n : kSizes) {
    INFO("n " << n);
    const std::vector<float> x = RandomFloats(n, 3, 10.0f);
    long double exact = 0;
    for (float v : x) exact += (long double)v * v;
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = F32ToBf16(x[i]);
    long double exact_b = 0;
    for (uint16_t v : b) exact_b += (long double)Bf16ToF32(v) * Bf16ToF32(v);
    double first = -1, first_b = -1;
    ForEachIsa([&](Isa, const KernelTable& k) {
      const double got = k.sum_of_squares(x.data(), DType::kF32, n);
      // Squares of floats are exact in double; only the additions round.
      CHECK(std::fabs(got - double(exact)) <= 1e-14 * double(exact) + 1e-300);
      const double got_b = k.sum_of_squares(b.data(), DType::kBF16, n);
      CHECK(std::fabs(got_b - double(exact_b)) <= 1e-14 * double(exact_b) + 1e-300);
      if (first < 0) {
        first = got;
        first_b = got_b;
      }
      CHECK(got == first);
      CHECK(got_b == first_b);
    });
  }
}

TEST_CASE("has_inf_or_nan finds a bad value at any position", "[nonfinite]") {
  ForEachIsa([](Isa, const KernelTable& k) {
    const size_t n = 9000;  // spans three 4096-element blocks
    std::vector<float> f(n, 1.0f);
    std::vector<uint16_t> b(n, F32ToBf16(1.0f)), h(n, F32ToF16(1.0f));
    CHECK_FALSE(k.has_inf_or_nan(f.data(), DType::kF32, n));
    CHECK_FALSE(k.has_inf_or_nan(b.data(), DType::kBF16, n));
    CHECK_FALSE(k.has_inf_or_nan(h.data(), DType::kF16, n));
    CHECK_FALSE(k.has_inf_or_nan(f.data(), DType::kF32, 0));
    // The largest finite values are finite.
    f[5] = std::numeric_limits<float>::max();
    h[5] = 0x7bff;
    b[5] = 0x7f7f;
    CHECK_FALSE(k.has_inf_or_nan(f.data(), DType::kF32, n));
    CHECK_FALSE(k.has_inf_or_nan(h.data(), DType::kF16, n));
    CHECK_FALSE(k.has_inf_or_nan(b.data(), DType::kBF16, n));
    for (size_t pos : {size_t{0}, size_t{17}, size_t{4095}, size_t{4096}, n - 1}) {
      INFO("pos " << pos);
      for (float bad : {std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
        f[pos] = bad;
        b[pos] = F32ToBf16(bad);
        h[pos] = F32ToF16(bad);
        CHECK(k.has_inf_or_nan(f.data(), DType::kF32, n));
        CHECK(k.has_inf_or_nan(b.data(), DType::kBF16, n));
        CHECK(k.has_inf_or_nan(h.data(), DType::kF16, n));
        // Not seen when outside the range checked.
        CHECK_FALSE(k.has_inf_or_nan(f.data() + pos + 1, DType::kF32, n - pos - 1));
        f[pos] = 1.0f;
        b[pos] = F32ToBf16(1.0f);
        h[pos] = F32ToF16(1.0f);
      }
    }
  });
}

// Adam evaluated in double from the same inputs.
struct AdamRef {
  double p, m, v, delta;
};
AdamRef AdamDouble(const AdamParams& a, double p, double g, double m, double v) {
  g *= a.grad_scale;
  if (!a.adamw) g += double(a.weight_decay) * p;
  m = double(a.beta1) * m + (1.0 - double(a.beta1)) * g;
  v = double(a.beta2) * v + (1.0 - double(a.beta2)) * g * g;
  if (a.adamw) p *= 1.0 - double(a.lr) * a.weight_decay;
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const double delta = double(a.lr) / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + a.eps);
  return {p - delta, m, v, delta};
}

// Random Adam inputs: weights, gradients, moments (v >= 0, the square of a
// value of size `v_root`), from seeds seed .. seed + 3.
struct AdamInputs {
  std::vector<float> p, g, m, v;
};
AdamInputs RandomAdamInputs(size_t n, uint32_t seed, float v_root) {
  AdamInputs in{RandomFloats(n, seed), RandomFloats(n, seed + 1, 0.1f),
                RandomFloats(n, seed + 2, 0.01f), RandomFloats(n, seed + 3, v_root)};
  for (float& x : in.v) x = x * x;
  return in;
}

TEST_CASE("Adam and AdamW match a double evaluation and agree across ISAs bit for bit",
          "[adam]") {
  AdamParams adam;
  adam.lr = 1e-3f;
  adam.weight_decay = 0.01f;
  AdamParams adamw = adam;
  adamw.adamw = true;
  adamw.weight_decay = 0.1f;
  AdamParams scaled = adam;
  scaled.grad_scale = 1.0f / 1024.0f;
  scaled.weight_decay = 0.0f;
  for (const AdamParams& base : {adam, adamw, scaled}) {
    for (int64_t step : {1, 2, 10, 1000}) {
      AdamParams params = base;
      params.step = step;
      INFO("adamw " << params.adamw << " step " << step << " grad_scale " << params.grad_scale);
      const AdamConstants c = MakeAdamConstants(params);
      const size_t n = 4099;
      const AdamInputs in = RandomAdamInputs(n, 11, 0.001f);
      const std::vector<float>&p0 = in.p, &g = in.g, &m0 = in.m, &v0 = in.v;

      // The scalar formula, one element at a time.
      std::vector<float> sp = p0, sm = m0, sv = v0;
      for (size_t i = 0; i < n; ++i) AdamElement(c, sp[i], g[i], sm[i], sv[i]);
      // Bound: m and v within 4 ulp, p within 8 ulp, of the sum of the
      // magnitudes of the terms of their final operation (a few float
      // roundings, each at most half an ulp of an intermediate).
      for (size_t i = 0; i < n; ++i) {
        const AdamRef r = AdamDouble(params, p0[i], g[i], m0[i], v0[i]);
        REQUIRE(std::fabs(sm[i] - r.m) <= 0x1p-21 * (std::fabs(r.m) + std::fabs(m0[i]) + std::fabs(g[i] * params.grad_scale)));
        REQUIRE(std::fabs(sv[i] - r.v) <= 0x1p-21 * (std::fabs(r.v) + std::fabs(v0[i])));
        REQUIRE(std::fabs(sp[i] - r.p) <= 0x1p-20 * (std::fabs(r.p) + std::fabs(r.delta) + std::fabs(p0[i])));
      }
      ForEachIsa([&](Isa, const KernelTable& k) {
        std::vector<float> p = p0, m = m0, v = v0;
        std::vector<uint16_t> low(n);
        k.adam(c, p.data(), g.data(), DType::kF32, m.data(), v.data(), low.data(), DType::kBF16, n);
        for (size_t i = 0; i < n; ++i) {
          REQUIRE(FloatBits(p[i]) == FloatBits(sp[i]));
          REQUIRE(FloatBits(m[i]) == FloatBits(sm[i]));
          REQUIRE(FloatBits(v[i]) == FloatBits(sv[i]));
          REQUIRE(low[i] == F32ToBf16(sp[i]));
        }
        // Out of place: the same values in the outputs, the inputs kept.
        std::vector<float> po(n), mo(n), vo(n);
        std::vector<uint16_t> low_to(n);
        k.adam_to(c, p0.data(), g.data(), DType::kF32, m0.data(), v0.data(), po.data(), mo.data(),
                  vo.data(), low_to.data(), DType::kBF16, n);
        CHECK(std::memcmp(po.data(), p.data(), n * 4) == 0);
        CHECK(std::memcmp(mo.data(), m.data(), n * 4) == 0);
        CHECK(std::memcmp(vo.data(), v.data(), n * 4) == 0);
        CHECK(low_to == low);
        // Without the low-precision copy, and on a ragged length.
        p = p0, m = m0, v = v0;
        k.adam(c, p.data(), g.data(), DType::kF32, m.data(), v.data(), nullptr, DType::kF32, n - 3);
        for (size_t i = 0; i < n - 3; ++i) REQUIRE(FloatBits(p[i]) == FloatBits(sp[i]));
        for (size_t i = n - 3; i < n; ++i) REQUIRE(FloatBits(p[i]) == FloatBits(p0[i]));
      });
    }
  }
}

TEST_CASE("Adam reads 16-bit gradients as their f32 widening, bit for bit, on every ISA",
          "[adam]") {
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.1f;
  params.step = 5;
  params.grad_scale = 1.0f / 512.0f;
  const AdamConstants c = MakeAdamConstants(params);
  const size_t n = 4099;
  const AdamInputs in = RandomAdamInputs(n, 51, 0.01f);
  const std::vector<float>&p0 = in.p, &g = in.g, &m0 = in.m, &v0 = in.v;
  for (DType g_dtype : {DType::kBF16, DType::kF16}) {
    INFO("gradients " << DTypeName(g_dtype));
    // The gradients rounded to g_dtype, and their exact f32 widening.
    std::vector<uint16_t> g16(n);
    std::vector<float> widened(n);
    for (size_t i = 0; i < n; ++i) {
      g16[i] = g_dtype == DType::kBF16 ? F32ToBf16(g[i]) : F32ToF16(g[i]);
      widened[i] = g_dtype == DType::kBF16 ? Bf16ToF32(g16[i]) : F16ToF32(g16[i]);
    }
    std::vector<float> sp = p0, sm = m0, sv = v0;
    for (size_t i = 0; i < n; ++i) AdamElement(c, sp[i], widened[i], sm[i], sv[i]);
    ForEachIsa([&](Isa, const KernelTable& k) {
      std::vector<float> p = p0, m = m0, v = v0;
      std::vector<uint16_t> low(n);
      k.adam(c, p.data(), g16.data(), g_dtype, m.data(), v.data(), low.data(), DType::kBF16, n);
      CHECK(std::memcmp(p.data(), sp.data(), n * 4) == 0);
      CHECK(std::memcmp(m.data(), sm.data(), n * 4) == 0);
      CHECK(std::memcmp(v.data(), sv.data(), n * 4) == 0);
      for (size_t i = 0; i < n; ++i) REQUIRE(low[i] == F32ToBf16(sp[i]));
      std::vector<float> po(n), mo(n), vo(n);
      k.adam_to(c, p0.data(), g16.data(), g_dtype, m0.data(), v0.data(), po.data(), mo.data(),
                vo.data(), nullptr, DType::kF32, n);
      CHECK(std::memcmp(po.data(), sp.data(), n * 4) == 0);
      CHECK(std::memcmp(mo.data(), sm.data(), n * 4) == 0);
      CHECK(std::memcmp(vo.data(), sv.data(), n * 4) == 0);
    });
    // On several threads: each thread's range starts at its own gradient.
    for (int threads : {2, 3}) {
      std::vector<float> p = p0, m = m0, v = v0;
      ParallelAdam(Kernels(), c, p.data(), g16.data(), g_dtype, m.data(), v.data(), nullptr,
                   DType::kF32, n, threads);
      CHECK(std::memcmp(p.data(), sp.data(), n * 4) == 0);
      std::vector<float> po(n), mo(n), vo(n);
      ParallelAdamTo(Kernels(), c, p0.data(), g16.data(), g_dtype, m0.data(), v0.data(), po.data(),
                     mo.data(), vo.data(), nullptr, DType::kF32, n, threads);
      CHECK(std::memcmp(po.data(), sp.data(), n * 4) == 0);
    }
  }
}

TEST_CASE("SGD with momentum matches PyTorch's update rule on every ISA", "[sgd]") {
  SgdParams params;
  params.lr = 0.1f;
  params.momentum = 0.9f;
  params.weight_decay = 0.01f;
  params.grad_scale = 0.5f;
  const size_t n = 1031;
  const std::vector<float> p0 = RandomFloats(n, 21), g = RandomFloats(n, 22, 0.1f);
  ForEachIsa([&](Isa, const KernelTable& k) {
    std::vector<float> p = p0, buf(n, 0.0f);
    std::vector<uint16_t> low(n);
    // Two steps: the first makes buf = d exactly, as PyTorch's clone.
    k.sgd(params, p.data(), g.data(), DType::kF32, buf.data(), low.data(), DType::kF16, n);
    for (size_t i = 0; i < n; ++i) {
      const float d = g[i] * 0.5f + 0.01f * p0[i];
      REQUIRE(buf[i] == d);
      REQUIRE(FloatBits(p[i]) == FloatBits(p0[i] - 0.1f * d));
      REQUIRE(low[i] == F32ToF16(p[i]));
    }
    const std::vector<float> p1 = p, buf1 = buf;
    k.sgd(params, p.data(), g.data(), DType::kF32, buf.data(), nullptr, DType::kF32, n);
    for (size_t i = 0; i < n; ++i) {
      const float d = g[i] * 0.5f + 0.01f * p1[i];
      const float b = 0.9f * buf1[i] + d;
      REQUIRE(buf[i] == b);
      REQUIRE(FloatBits(p[i]) == FloatBits(p1[i] - 0.1f * b));
    }
    // Without momentum there is no buffer.
    SgdParams plain = params;
    plain.momentum = 0.0f;
    p = p0;
    k.sgd(plain, p.data(), g.data(), DType::kF32, nullptr, nullptr, DType::kF32, n);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(FloatBits(p[i]) == FloatBits(p0[i] - 0.1f * (g[i] * 0.5f + 0.01f * p0[i])));
    }
    // bf16 gradients, read as their f32 widening.
    std::vector<uint16_t> g16(n);
    for (size_t i = 0; i < n; ++i) g16[i] = F32ToBf16(g[i]);
    p = p0;
    std::fill(buf.begin(), buf.end(), 0.0f);
    k.sgd(params, p.data(), g16.data(), DType::kBF16, buf.data(), nullptr, DType::kF32, n);
    for (size_t i = 0; i < n; ++i) {
      const float d = Bf16ToF32(g16[i]) * 0.5f + 0.01f * p0[i];
      REQUIRE(buf[i] == d);
      REQUIRE(FloatBits(p[i]) == FloatBits(p0[i] - 0.1f * d));
    }
  });
}

TEST_CASE("Adam on several threads equals one thread bit for bit", "[adam][parallel]") {
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.1f;
  params.step = 3;
  const AdamConstants c = MakeAdamConstants(params);
  for (size_t n : {size_t{100}, size_t{4099}, size_t{1 << 18} + 7}) {
    INFO("n " << n);
    const AdamInputs in = RandomAdamInputs(n, 31, 0.01f);
    const std::vector<float>&p0 = in.p, &g = in.g, &m0 = in.m, &v0 = in.v;
    std::vector<float> p1 = p0, m1 = m0, v1 = v0;
    std::vector<uint16_t> low1(n);
    Kernels().adam(c, p1.data(), g.data(), DType::kF32, m1.data(), v1.data(), low1.data(),
                   DType::kBF16, n);
    for (int threads : {2, 3, 8}) {
      INFO("threads " << threads);
      std::vector<float> p = p0, m = m0, v = v0;
      std::vector<uint16_t> low(n);
      ParallelAdam(Kernels(), c, p.data(), g.data(), DType::kF32, m.data(), v.data(), low.data(),
                   DType::kBF16, n, threads);
      REQUIRE(std::memcmp(p.data(), p1.data(), n * 4) == 0);
      REQUIRE(std::memcmp(m.data(), m1.data(), n * 4) == 0);
      REQUIRE(std::memcmp(v.data(), v1.data(), n * 4) == 0);
      REQUIRE(low == low1);
      std::vector<float> po(n), mo(n), vo(n);
      std::vector<uint16_t> low_to(n);
      ParallelAdamTo(Kernels(), c, p0.data(), g.data(), DType::kF32, m0.data(), v0.data(),
                     po.data(), mo.data(), vo.data(), low_to.data(), DType::kBF16, n, threads);
      REQUIRE(std::memcmp(po.data(), p1.data(), n * 4) == 0);
      REQUIRE(std::memcmp(mo.data(), m1.data(), n * 4) == 0);
      REQUIRE(std::memcmp(vo.data(), v1.data(), n * 4) == 0);
      REQUIRE(low_to == low1);
    }
  }
}

}  // namespace
}  // namespace memwall::kernels::cpu

namespace memwall::kernels::cpu {
namespace {

// Quantizes x (f32) in blocks of `block` with `k`; returns the levels, the
// absmaxes and what they read back as (f32).
struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> absmax, back;
};

Quantized RoundTrip(const KernelTable& k, const std::vector<float>& x, size_t block) {
  const size_t n = x.size(), blocks = (n + block - 1) / block;
  Quantized r{std::vector<int8_t>(n), std::vector<float>(blocks), std::vector<float>(n)};
  k.quantize_int8(x.data(), DType::kF32, n, block, r.q.data(), r.absmax.data());
  k.dequantize_int8(r.q.data(), r.absmax.data(), n, block, r.back.data(), DType::kF32);
  return r;
}

TEST_CASE("int8 block quantization reads every element back within half a step",
          "[quantize]") {
  // Blocks whose elements span many magnitudes (a normal scaled per block
  // by 2^-120 .. 2^120), with partial last blocks. The step is the block's
  // absmax / 127; half a step, widened by the f32 roundings of the
  // division, the product and the read-back (bounded by 2^-12 of the step;
  // the derivation is in kernels/elementwise.h), bounds every error.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> exponent(-120, 120);
  ForEachIsa([&](Isa, const KernelTable& k) {
    for (size_t block : {size_t{1}, size_t{7}, size_t{64}, size_t{2048}}) {
      for (size_t n : {size_t{1}, size_t{100}, size_t{4099}}) {
        std::vector<float> x = RandomFloats(n, uint32_t(block * 31 + n));
        for (size_t b = 0; b * block < n; ++b) {
          const float scale = std::ldexp(1.0f, exponent(rng));
          for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) x[i] *= scale;
        }
        const Quantized r = RoundTrip(k, x, block);
        for (size_t i = 0; i < n; ++i) {
          INFO("block " << block << " n " << n << " element " << i << " x " << x[i]);
          double absmax = 0;
          for (size_t j = i / block * block; j < std::min(n, (i / block + 1) * block); ++j) {
            absmax = std::max(absmax, std::fabs(double(x[j])));
          }
          REQUIRE(double(r.absmax[i / block]) == absmax);
          const double step = absmax / 127;
          REQUIRE(std::fabs(double(r.back[i]) - double(x[i])) <=
                  0.5 * step * (1 + std::ldexp(1.0, -12)));
          // The level is the nearest one to x / step, but where x lies
          // within rounding of half-way between two.
          REQUIRE(std::fabs(double(r.q[i]) - double(x[i]) / step) <= 0.5 + 1e-4);
        }
      }
    }
  });
}

TEST_CASE("zero and constant blocks, and each block's largest element, read back exactly",
          "[quantize]") {
  ForEachIsa([](Isa, const KernelTable& k) {
    const std::vector<float> x = {0.0f, 0.0f, 0.0f,        // zeros
                                  0.1f, 0.1f, 0.1f,        // constant
                                  -3e38f, -3e38f, -3e38f,  // constant, near the largest float
                                  1e-40f, -2e-41f, 5e-41f,  // subnormals
                                  2.5f, -7.25f, 1.0f};     // mixed: -7.25 is the absmax
    const Quantized r = RoundTrip(k, x, 3);
    for (size_t i = 0; i < 9; ++i) REQUIRE(r.back[i] == x[i]);
    REQUIRE(r.absmax == std::vector<float>{0.0f, 0.1f, 3e38f, 1e-40f, 7.25f});
    REQUIRE(r.q[6] == -127);
    REQUIRE(r.back[9] == 1e-40f);    // the subnormal block's largest
    REQUIRE(r.back[13] == -7.25f);   // the mixed block's largest
    REQUIRE(r.q[13] == -127);
    REQUIRE(r.q[12] == 44);          // 2.5 / 7.25 * 127 = 43.79
  });
}

TEST_CASE("quantization is deterministic and identical on every ISA, for every dtype",
          "[quantize]") {
  const std::vector<float> x = RandomFloats(10007, 3, 5.0f);
  const Quantized want = RoundTrip(Kernels(Isa::kGeneric), x, 256);
  ForEachIsa([&](Isa, const KernelTable& k) {
    for (int run = 0; run < 2; ++run) {
      const Quantized got = RoundTrip(k, x, 256);
      REQUIRE(got.q == want.q);
      REQUIRE(testing::SameBits(got.absmax, want.absmax));
      REQUIRE(testing::SameBits(got.back, want.back));
    }
    // 16-bit inputs quantize as their f32 widening; a 16-bit read-back is
    // the f32 one rounded once.
    std::vector<uint16_t> bf(x.size()), back(x.size());
    std::vector<float> wide(x.size());
    for (size_t i = 0; i < x.size(); ++i) wide[i] = Bf16ToF32(bf[i] = F32ToBf16(x[i]));
    const Quantized ref = RoundTrip(k, wide, 256);
    std::vector<int8_t> q(x.size());
    std::vector<float> absmax(ref.absmax.size());
    k.quantize_int8(bf.data(), DType::kBF16, x.size(), 256, q.data(), absmax.data());
    REQUIRE(q == ref.q);
    REQUIRE(testing::SameBits(absmax, ref.absmax));
    k.dequantize_int8(q.data(), absmax.data(), x.size(), 256, back.data(), DType::kF16);
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(back[i] == F32ToF16(ref.back[i]));
  });
}

TEST_CASE("a block holding inf or nan reads back as nans; the other blocks are untouched",
          "[quantize]") {
  ForEachIsa([](Isa, const KernelTable& k) {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x = {1.0f, inf, 2.0f, nan, 3.0f, 4.0f, -1.0f, 0.5f};
    const Quantized r = RoundTrip(k, x, 2);
    REQUIRE(std::isinf(r.absmax[0]));
    REQUIRE(std::isnan(r.absmax[1]));
    for (size_t i = 0; i < 4; ++i) REQUIRE(std::isnan(r.back[i]));
    REQUIRE(r.back[5] == 4.0f);
    REQUIRE(r.back[6] == -1.0f);
    REQUIRE(std::fabs(r.back[4] - 3.0f) <= 0.5 * 4.0 / 127);
  });
}

}  // namespace
}  // namespace memwall::kernels::cpu
