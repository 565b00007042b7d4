// CPU kernel throughput per ISA, against the generic x86-64 build measured
// in the same run: does the run-time ISA choice pay?
//
//   bazel run //benchmarks:kernels_benchmark [-- --elements 16777216 --repeats 5]
//
// Prints, per kernel and ISA, the best-of-N time, the bytes streamed per
// second (counting each array read and written once) and the speed-up over
// generic. Single-threaded.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elementwise.h"

namespace memwall::kernels::cpu {
namespace {

double BestSeconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

struct Case {
  std::string name;
  double bytes_per_element;
  std::function<void(const KernelTable&)> run;
};

int Main(int argc, char** argv) {
  size_t n = size_t{1} << 24;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--elements") n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: kernels_benchmark [--elements N] [--repeats R]\n");
      return 2;
    }
  }
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f), y(n, 1.0f);
  std::vector<uint16_t> low(n);
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.01f;
  const AdamConstants constants = MakeAdamConstants(params);
  double sink = 0;
  const std::vector<Case> cases = {
      {"adamw (f32 p,g,m,v)", 28,
       [&](const KernelTable& k) {
         k.adam(constants, p.data(), g.data(), m.data(), v.data(), nullptr, DType::kF32, n);
       }},
      {"adamw + bf16 copy", 30,
       [&](const KernelTable& k) {
         k.adam(constants, p.data(), g.data(), m.data(), v.data(), low.data(), DType::kBF16, n);
       }},
      {"cast f32->bf16", 6,
       [&](const KernelTable& k) { k.cast(p.data(), DType::kF32, low.data(), DType::kBF16, n); }},
      {"cast f32->f16", 6,
       [&](const KernelTable& k) { k.cast(p.data(), DType::kF32, low.data(), DType::kF16, n); }},
      {"cast f16->f32", 6,
       [&](const KernelTable& k) { k.cast(low.data(), DType::kF16, y.data(), DType::kF32, n); }},
      {"axpy f32", 12, [&](const KernelTable& k) { k.axpy(1e-3f, g.data(), y.data(), n); }},
      {"sum of squares f32", 4,
       [&](const KernelTable& k) { sink += k.sum_of_squares(g.data(), DType::kF32, n); }},
      {"has inf/nan f32", 4,
       [&](const KernelTable& k) { sink += k.has_inf_or_nan(g.data(), DType::kF32, n); }},
  };
  std::printf("kernels_benchmark: %zu elements, best of %d, one thread; this CPU selects %s\n", n,
              repeats, IsaName(SelectedIsa()));
  std::printf("%-22s %-8s %10s %10s %9s\n", "kernel", "isa", "ms", "GB/s", "vs generic");
  for (const Case& c : cases) {
    double generic_seconds = 0;
    for (Isa isa : SupportedIsas()) {
      const KernelTable& k = Kernels(isa);
      c.run(k);  // warm up: page in, fill caches
      const double seconds = BestSeconds(repeats, [&] { c.run(k); });
      if (isa == Isa::kGeneric) generic_seconds = seconds;
      std::printf("%-22s %-8s %10.3f %10.2f %8.2fx\n", c.name.c_str(), IsaName(isa), seconds * 1e3,
                  c.bytes_per_element * n / seconds / 1e9, generic_seconds / seconds);
    }
  }
  return sink == -1.0 ? 1 : 0;  // keeps the reductions from being optimised away
}

}  // namespace
}  // namespace memwall::kernels::cpu

int main(int argc, char** argv) { return memwall::kernels::cpu::Main(argc, argv); }
