// CPU Adam against the memory roofline, measured in the same run.
//
//   bazel run //benchmarks:cpu_adam_benchmark [-- --repeats 5]
//
// For 2^18 (in cache), 2^24 and 2^26 parameters on 1 and 2 threads: the
// fused AdamW step (f32 p, g, m, v: 28 bytes per parameter; +2 with the bf16
// copy), STREAM triad (a = b + s c; 12 bytes per element counted, 16 with
// the write-allocate of a), and the "Adam pattern": the same 4 reads and 3
// in-place writes as Adam with one add each, the honest roofline for an
// in-place optimizer step. Best of R runs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace memwall::kernels::cpu {
namespace {

double Best(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

int Main(int argc, char** argv) {
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  std::printf("cpu_adam_benchmark: best of %d, ISA %s\n", repeats, IsaName(SelectedIsa()));
  std::printf("%10s %3s %12s %10s %10s %10s %10s %12s\n", "params", "thr", "Adam Mp/s",
              "Adam GB/s", "+bf16 GB/s", "triad GB/s", "pattern", "Adam/pattern");
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.01f;
  const AdamConstants c = MakeAdamConstants(params);
  for (size_t n : {size_t{1} << 18, size_t{1} << 24, size_t{1} << 26}) {
    // One buffer with the arrays staggered by a few cache lines each (as
    // STREAM's offsets do): power-of-two sizes placed back to back would make
    // p[i], g[i], m[i] and v[i] alias in the L1 sets and the store buffer,
    // slowing some kernels for reasons that are not memory bandwidth.
    const size_t stride = n + 1024;
    std::vector<float> arena(7 * stride + 7 * 48);
    auto array = [&](int k, float fill) {
      float* base = arena.data() + k * stride + k * 48;
      std::fill(base, base + n, fill);
      return base;
    };
    float *p = array(0, 0.5f), *g = array(1, 1e-3f), *m = array(2, 0.0f), *v = array(3, 0.0f),
          *a = array(4, 0.0f), *b = array(5, 1.0f), *cc = array(6, 2.0f);
    std::vector<uint16_t> low(n);
    for (int threads : {1, 2}) {
      const int r = n <= (size_t{1} << 18) ? repeats * 20 : repeats;
      const double adam = Best(r, [&] {
        ParallelAdam(Kernels(), c, p, g, m, v, nullptr, DType::kF32, n, threads);
      });
      const double adam_low = Best(r, [&] {
        ParallelAdam(Kernels(), c, p, g, m, v, low.data(), DType::kBF16, n, threads);
      });
      const double triad = Best(r, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * cc[i];
      });
      const double pattern = Best(r, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (size_t i = 0; i < n; ++i) {
          const float gi = g[i];
          p[i] += gi;
          m[i] += gi;
          v[i] += gi;
        }
      });
      const double adam_gbs = 28.0 * n / adam / 1e9, pattern_gbs = 28.0 * n / pattern / 1e9;
      std::printf("%10zu %3d %12.1f %10.2f %10.2f %10.2f %10.2f %11.1f%%\n", n, threads,
                  n / adam / 1e6, adam_gbs, 30.0 * n / adam_low / 1e9, 12.0 * n / triad / 1e9,
                  pattern_gbs, 100.0 * adam_gbs / pattern_gbs);
    }
  }
  return 0;
}

}  // namespace
}  // namespace memwall::kernels::cpu

int main(int argc, char** argv) { return memwall::kernels::cpu::Main(argc, argv); }
