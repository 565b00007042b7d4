// Test inputs and comparisons shared by the kernel, CUDA and engine tests.
#ifndef MEMWALL_TESTS_SUPPORT_VALUES_H_
#define MEMWALL_TESTS_SUPPORT_VALUES_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace memwall::testing {

// n normal values of standard deviation `scale`, the same for a seed.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

// Equal sizes and identical bits (so -0 differs from 0 and NaNs compare).
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_VALUES_H_
