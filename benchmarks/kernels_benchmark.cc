// CPU kernel throughput per ISA (the optimizer's element-wise kernels and
// the layers' NN kernels), against the generic x86-64 build measured in the
// same run: does the run-time ISA choice pay?
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
#include "kernels/nn_math.h"

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
  std::function<void(Isa)> run;
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
  // ZeRO++ weight quantization in DeepSpeed's default block of 2048.
  constexpr size_t kQuantBlock = 2048;
  std::vector<int8_t> levels(n);
  std::vector<float> absmax((n + kQuantBlock - 1) / kQuantBlock);
  AdamParams params;
  params.adamw = true;
  params.weight_decay = 0.01f;
  const AdamConstants constants = MakeAdamConstants(params);
  double sink = 0;
  const std::vector<Case> cases = {
      {"adamw (f32 p,g,m,v)", 28,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa);
         k.adam(constants, p.data(), g.data(), DType::kF32, m.data(), v.data(), nullptr,
                DType::kF32, n);
       }},
      {"adamw + bf16 copy", 30,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa);
         k.adam(constants, p.data(), g.data(), DType::kF32, m.data(), v.data(), low.data(),
                DType::kBF16, n);
       }},
      {"cast f32->bf16", 6,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa); k.cast(p.data(), DType::kF32, low.data(), DType::kBF16, n); }},
      {"cast f32->f16", 6,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa); k.cast(p.data(), DType::kF32, low.data(), DType::kF16, n); }},
      {"cast f16->f32", 6,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa); k.cast(low.data(), DType::kF16, y.data(), DType::kF32, n); }},
      {"axpy f32", 12, [&](Isa isa) {
         const KernelTable& k = Kernels(isa); k.axpy(1e-3f, g.data(), y.data(), n); }},
      {"sum of squares f32", 4,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa); sink += k.sum_of_squares(g.data(), DType::kF32, n); }},
      {"has inf/nan f32", 4,
       [&](Isa isa) {
         const KernelTable& k = Kernels(isa); sink += k.has_inf_or_nan(g.data(), DType::kF32, n); }},
      // Read twice (absmax, then levels), levels written: 2 + 2 + 1 bytes.
      {"quantize bf16->int8", 5,
       [&](Isa isa) {
         Kernels(isa).quantize_int8(low.data(), DType::kBF16, n, kQuantBlock, levels.data(),
                                    absmax.data());
       }},
      {"dequantize int8->bf16", 3,
       [&](Isa isa) {
         Kernels(isa).dequantize_int8(levels.data(), absmax.data(), n, kQuantBlock, low.data(),
                                      DType::kBF16);
       }},
  };
  // NN kernels on GPT-2-sized rows: hidden 768, 1024-token causal attention,
  // vocabulary 50257; each case covers about n elements.
  const int64_t h = 768, seq = 1024, vocab = 50257;
  const int64_t rows = std::max<int64_t>(1, n / h), matrices = std::max<int64_t>(1, n / (seq * seq));
  const int64_t ce_rows = std::max<int64_t>(1, n / vocab);
  std::vector<float> gamma(h, 1.1f), beta(h, 0.1f), dgamma(h), dbeta(h), stats(2 * rows);
  std::vector<float> scores(matrices * seq * seq), targets(ce_rows), losses(ce_rows);
  for (size_t i = 0; i < n; ++i) g[i] = 0.001f * float(i % 1999) - 1.0f;
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = 0.01f * float(i % 977);
  for (int64_t r = 0; r < ce_rows; ++r) targets[r] = float((r * 31) % vocab);
  const std::vector<Case> nn_cases = {
      {"gelu forward", 8,
       [&](Isa isa) { NnKernels(isa).gelu_forward(g.data(), y.data(), n); }},
      {"gelu backward", 12,
       [&](Isa isa) { NnKernels(isa).gelu_backward(g.data(), p.data(), y.data(), n); }},
      {"layernorm fwd h=768", 8,
       [&](Isa isa) {
         NnKernels(isa).layer_norm_forward(g.data(), gamma.data(), beta.data(), rows, h, y.data(),
                                           stats.data());
       }},
      {"layernorm bwd h=768", 12,
       [&](Isa isa) {
         NnKernels(isa).layer_norm_backward(p.data(), g.data(), stats.data(), gamma.data(), rows,
                                            h, y.data(), dgamma.data(), dbeta.data());
       }},
      {"causal softmax s=1024", 8,
       [&](Isa isa) {
         std::vector<float> x = scores;
         NnKernels(isa).causal_softmax_forward(x.data(), matrices, seq);
       }},
      {"cross-entropy V=50257", 8,
       [&](Isa isa) {
         NnKernels(isa).cross_entropy(g.data(), targets.data(), ce_rows, vocab, 1.0f / ce_rows,
                                      y.data(), losses.data());
       }},
  };
  std::printf("kernels_benchmark: %zu elements, best of %d, one thread; this CPU selects %s\n", n,
              repeats, IsaName(SelectedIsa()));
  std::printf("%-22s %-8s %10s %10s %9s\n", "kernel", "isa", "ms", "GB/s", "vs generic");
  std::vector<Case> all = cases;
  all.insert(all.end(), nn_cases.begin(), nn_cases.end());
  for (const Case& c : all) {
    double generic_seconds = 0;
    for (Isa isa : SupportedIsas()) {
      c.run(isa);  // warm up: page in, fill caches
      const double seconds = BestSeconds(repeats, [&] { c.run(isa); });
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
