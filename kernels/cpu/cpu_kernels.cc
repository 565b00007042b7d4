#include "kernels/cpu/cpu_kernels.h"

#include <cpuid.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/status.h"

namespace memwall {
namespace kernels {
namespace cpu {

namespace generic { extern const KernelTable kTable; extern const NnKernelTable kNnTable; }
namespace avx2 { extern const KernelTable kTable; extern const NnKernelTable kNnTable; }
namespace avx512 { extern const KernelTable kTable; extern const NnKernelTable kNnTable; }

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

namespace {

// CPUID leaf 1, ECX bit 29 (clang before 15 lacks __builtin_cpu_supports("f16c")).
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

}  // namespace

bool IsaSupported(Isa isa) {
  // Asked once per process: every kernel dispatch asks, and CPUID traps to
  // the hypervisor on a virtual machine (it was 7-9% of a gpt-tiny step).
  static const std::array<bool, 3> supported = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq");
    return std::array<bool, 3>{true, avx2, avx512};
  }();
  const int index = static_cast<int>(isa);
  return index >= 0 && index < 3 && supported[index];
}

size_t StreamPrefetchElements() {
  static const size_t ahead = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") ? size_t{0} : size_t{512};
  }();
  return ahead;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

namespace {

Isa ChooseIsa() {
  const std::vector<Isa> supported = SupportedIsas();
  const char* forced = std::getenv("MEMWALL_CPU_ISA");
  if (forced == nullptr || *forced == '\0') return supported.back();
  for (Isa isa : supported) {
    if (std::strcmp(forced, IsaName(isa)) == 0) return isa;
  }
  // An environment variable is not an API with a Status to return; say why
  // the request is ignored and carry on with the best ISA.
  std::fprintf(stderr,
               "memwall: MEMWALL_CPU_ISA=%s is not a supported ISA on this CPU "
               "(expected generic, avx2 or avx512 where supported); using %s\n",
               forced, IsaName(supported.back()));
  return supported.back();
}

}  // namespace

Isa SelectedIsa() {
  static const Isa isa = ChooseIsa();
  return isa;
}

const KernelTable& Kernels(Isa isa) {
  MW_CHECK(IsaSupported(isa));
  switch (isa) {
    case Isa::kGeneric: return generic::kTable;
    case Isa::kAvx2: return avx2::kTable;
    case Isa::kAvx512: return avx512::kTable;
  }
  return generic::kTable;
}

const KernelTable& Kernels() { return Kernels(SelectedIsa()); }

const NnKernelTable& NnKernels(Isa isa) {
  MW_CHECK(IsaSupported(isa));
  switch (isa) {
    case Isa::kGeneric: return generic::kNnTable;
    case Isa::kAvx2: return avx2::kNnTable;
    case Isa::kAvx512: return avx512::kNnTable;
  }
  return generic::kNnTable;
}

const NnKernelTable& NnKernels() { return NnKernels(SelectedIsa()); }

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
