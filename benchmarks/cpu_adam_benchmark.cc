// CPU Adam against the memory roofline, measured in the same run.
//
//   bazel run //benchmarks:cpu_adam_benchmark [-- --repeats 5 --sizes 14,16,18,24,26]
//
// For 2^14 and 2^16 (up to 1.9 MiB of p, g, m, v and the bf16 copy: in a
// core's L2 on the machines this runs on), 2^18, 2^24 and 2^26 parameters
// (--sizes: their log2, 6 to 30) on 1 and 2 threads: the fused AdamW step
// (f32 p, g, m, v: 28 bytes per parameter; +2 with the bf16 copy), STREAM
// triad (a = b + s c; 12 bytes per element counted, 16 with the
// write-allocate of a), and the "Adam pattern": the same 4 reads and 3
// in-place writes as Adam with one add each, as a plain loop and with the
// kernel's software prefetch, the faster of the two being the honest
// roofline for an in-place optimizer step. Best of R runs. These arrays are
// staggered by a few cache lines each; from 2^18 on, the "pool" rows run
// the same two kernels on the layout an offloaded group really has: one
// pinned-pool buffer per array, allocated in HostOptimizerSlice's order
// (gradient, master, exp_avg, exp_avg_sq) from a host device's pinned pool.
// Last, for each pool size, a bf16 run's update: gradients in bf16 widened
// into an f32 buffer and then updated, against the update reading the bf16
// gradients itself.
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
#include "runtime/device.h"
#include "runtime/units.h"

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
  std::vector<size_t> sizes;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--repeats") {
      repeats = std::atoi(argv[i + 1]);
    } else if (flag == "--sizes") {
      for (const char* at = argv[i + 1]; *at != '\0';) {
        char* end;
        const long log2 = std::strtol(at, &end, 10);
        // At least one 64-element block (the prefetched pattern's unit).
        if (end == at || log2 < 6 || log2 > 30) {
          std::fprintf(stderr,
                       "cpu_adam_benchmark: --sizes: expected log2 sizes 6-30 separated by commas, "
                       "got '%s'\n",
                       argv[i + 1]);
          return 2;
        }
        sizes.push_back(size_t{1} << log2);
        at = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "cpu_adam_benchmark: unknown flag '%s'\n", flag.c_str());
      return 2;
    }
  }
  if (sizes.empty())
    sizes = {size_t{1} << 14, size_t{1} << 16, size_t{1} << 18, size_t{1} << 24, size_t{1} << 26};
  std::printf("cpu_adam_benchmark: best of %d, ISA %s\n", repeats, IsaName(SelectedIsa()));
  std::printf("%10s %9s %3s %12s %10s %10s %10s %10s %12s\n", "params", "layout", "thr",
              "Adam Mp/s", "Adam GB/s", "+bf16 GB/s", "triad GB/s", "pattern", "Adam/pattern");
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.01f;
  const AdamConstants c = MakeAdamConstants(params);
  DeviceOptions options{Backend::kHost, 0, 64 * kMiB};
  // The pool rows' four f32 arrays, then the bf16 rows' (which may reuse
  // them, or not: the pool caches freed segments).
  options.pinned_capacity_bytes =
      40 * int64_t(*std::max_element(sizes.begin(), sizes.end())) + 64 * kMiB;
  const std::unique_ptr<Device> device = CreateDevice(options).value();
  // One row: Adam, Adam with the bf16 copy, the triad (where a, b, cc are
  // given) and the pattern, on these arrays.
  auto row = [&](const char* layout, size_t n, int threads, float* p, float* g, float* m, float* v,
                 const float* b, const float* cc, float* a, uint16_t* low) {
    const int r = n <= (size_t{1} << 16)   ? repeats * 200
                  : n <= (size_t{1} << 18) ? repeats * 20
                                           : repeats;
    const double adam = Best(r, [&] {
      ParallelAdam(Kernels(), c, p, g, DType::kF32, m, v, nullptr, DType::kF32, n, threads);
    });
    const double adam_low = Best(r, [&] {
      ParallelAdam(Kernels(), c, p, g, DType::kF32, m, v, low, DType::kBF16, n, threads);
    });
    double triad = 0;  // not run on the pool rows, which have no triad arrays
    if (a != nullptr) {
      triad = Best(r, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * cc[i];
      });
    }
    // The pattern as a plain loop and as the Adam kernel runs (software
    // prefetch 512 elements ahead, 64 at a time); the roofline is the faster.
    const double plain_pattern = Best(r, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
      for (size_t i = 0; i < n; ++i) {
        const float gi = g[i];
        p[i] += gi;
        m[i] += gi;
        v[i] += gi;
      }
    });
    const double prefetched_pattern = Best(r, [&] {
      const size_t blocks = n / 64;
#pragma omp parallel for num_threads(threads) schedule(static)
      for (size_t b = 0; b < blocks; ++b) {
        const size_t begin = b * 64;
        if (begin + 512 + 64 <= n) {
          for (size_t k = 0; k < 64; k += 16) {
            __builtin_prefetch(p + begin + 512 + k, 1);
            __builtin_prefetch(g + begin + 512 + k, 0);
            __builtin_prefetch(m + begin + 512 + k, 1);
            __builtin_prefetch(v + begin + 512 + k, 1);
          }
        }
        for (size_t i = begin; i < begin + 64; ++i) {
          const float gi = g[i];
          p[i] += gi;
          m[i] += gi;
          v[i] += gi;
        }
      }
    });
    const double pattern = std::min(plain_pattern, prefetched_pattern);
    const double adam_gbs = 28.0 * n / adam / 1e9, pattern_gbs = 28.0 * n / pattern / 1e9;
    char triad_gbs[16] = "-";
    if (a != nullptr) std::snprintf(triad_gbs, sizeof(triad_gbs), "%.2f", 12.0 * n / triad / 1e9);
    std::printf("%10zu %9s %3d %12.1f %10.2f %10.2f %10s %10.2f %11.1f%%\n", n, layout, threads,
                n / adam / 1e6, adam_gbs, 30.0 * n / adam_low / 1e9, triad_gbs, pattern_gbs,
                100.0 * adam_gbs / pattern_gbs);
  };
  for (size_t n : sizes) {
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
      row("staggered", n, threads, p, g, m, v, b, cc, a, low.data());
    }
    if (n < (size_t{1} << 18)) continue;
    std::vector<DeviceBuffer> pool;
    for (const char* owner :
         {"group.grad_host", "group.master", "group.exp_avg", "group.exp_avg_sq"}) {
      pool.push_back(
          device->AllocatePinned(n * sizeof(float), MemoryCategory::kOptimizerState, owner)
              .value());
    }
    float* pp[4];
    for (int k = 0; k < 4; ++k) {
      pp[k] = static_cast<float*>(pool[k].data());
      std::fill(pp[k], pp[k] + n, k == 0 ? 1e-3f : k == 1 ? 0.5f : 0.0f);
    }
    for (int threads : {1, 2}) {
      row("pool", n, threads, pp[1], pp[0], pp[2], pp[3], nullptr, nullptr, nullptr, low.data());
    }
    // A bf16 run's group: its gradients landed in bf16. Widened first into
    // an f32 buffer (one thread), then updated (HostOptimizerSlice before
    // the update read 16-bit gradients), against the update reading them
    // as they are; both write the bf16 parameter copy.
    pool.clear();
    DeviceBuffer grad16 =
        device->AllocatePinned(n * 2, MemoryCategory::kGradient, "group.grad_host").value();
    for (const char* owner : {"group.master", "group.exp_avg", "group.exp_avg_sq"}) {
      pool.push_back(
          device->AllocatePinned(n * sizeof(float), MemoryCategory::kOptimizerState, owner)
              .value());
    }
    DeviceBuffer widened =
        device->AllocatePinned(n * 4, MemoryCategory::kWorkspace, "optimizer.host_grad_f32")
            .value();
    DeviceBuffer params =
        device->AllocatePinned(n * 2, MemoryCategory::kWorkspace, "group.host_params").value();
    Kernels().fill(grad16.data(), DType::kBF16, n, 1e-3f);
    for (int k = 0; k < 3; ++k) {
      std::fill(static_cast<float*>(pool[k].data()), static_cast<float*>(pool[k].data()) + n,
                k == 0 ? 0.5f : 0.0f);
    }
    auto* master = static_cast<float*>(pool[0].data());
    auto* exp_avg = static_cast<float*>(pool[1].data());
    auto* exp_avg_sq = static_cast<float*>(pool[2].data());
    for (int threads : {1, 2}) {
      const int r = n <= (size_t{1} << 18) ? repeats * 20 : repeats;
      const double widen_then_update = Best(r, [&] {
        Kernels().cast(grad16.data(), DType::kBF16, widened.data(), DType::kF32, n);
        ParallelAdam(Kernels(), c, master, widened.data(), DType::kF32, exp_avg, exp_avg_sq,
                     params.data(), DType::kBF16, n, threads);
      });
      const double reading_bf16 = Best(r, [&] {
        ParallelAdam(Kernels(), c, master, grad16.data(), DType::kBF16, exp_avg, exp_avg_sq,
                     params.data(), DType::kBF16, n, threads);
      });
      std::printf(
          "%10zu %9s %3d  bf16 gradients: widened, then updated %7.1f Mp/s; read by the update "
          "%7.1f Mp/s (%.2fx)\n",
          n, "pool", threads, n / widen_then_update / 1e6, n / reading_bf16 / 1e6,
          widen_then_update / reading_bf16);
    }
  }
  return 0;
}

}  // namespace
}  // namespace memwall::kernels::cpu

int main(int argc, char** argv) { return memwall::kernels::cpu::Main(argc, argv); }
