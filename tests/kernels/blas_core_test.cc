// The OpenBLAS kernel set memwall chooses when OpenBLAS's detection falls
// back to a generic one (Note in kernels/cpu/blas_core.h): by the CPU's
// instruction sets, never over a detected (non-generic) core.
#include "kernels/cpu/blas_core.h"

#include <string>

#include "catch2/catch.hpp"

namespace memwall {
namespace kernels {
namespace cpu {
namespace {

const std::set<std::string> kAvx512 = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512cd",
                                       "avx512bw", "avx512dq", "avx512vl"};

TEST_CASE("a generic fallback gives way to the newest kernel set the CPU runs", "[blas]") {
  std::set<std::string> bf16 = kAvx512;
  bf16.insert("avx512_bf16");
  // Intel family 6 model 207 (Emerald Rapids) under OpenBLAS 0.3.21.
  CHECK(BetterBlasCore(bf16, "Prescott") == "Cooperlake");
  CHECK(BetterBlasCore(kAvx512, "Prescott") == "SkylakeX");
  CHECK(BetterBlasCore(kAvx512, "Nehalem") == "SkylakeX");
  CHECK(BetterBlasCore({"sse3", "avx", "avx2", "fma"}, "Core2") == "Haswell");
  CHECK(BetterBlasCore({"sse3", "avx"}, "Prescott") == "Sandybridge");
  // AVX-512 without all of SkylakeX's parts (no avx512bw): Haswell's.
  CHECK(BetterBlasCore({"avx", "avx2", "fma", "avx512f"}, "Prescott") == "Haswell");
  // Nothing better, or a core OpenBLAS detected: left alone.
  CHECK(BetterBlasCore({"sse3"}, "Prescott").empty());
  CHECK(BetterBlasCore(bf16, "Cooperlake").empty());
  CHECK(BetterBlasCore(kAvx512, "Haswell").empty());
  CHECK(BetterBlasCore(kAvx512, "Zen").empty());
}

TEST_CASE("the core in force and how it was chosen are named", "[blas]") {
  const std::string core = BlasCore();
  CHECK_FALSE(core.empty());
  // This process: no memwall choice (tests do not re-execute), and the
  // user's variable only if the environment has it.
  const std::string description = BlasDescription();
  CHECK(description.rfind("OpenBLAS ", 0) == 0);
  CHECK(description.find(", core " + core + " (") != std::string::npos);
  // This machine's flags are read (every x86-64 Linux reports some).
  CHECK(CpuFlags().count("sse2") == 1);
}

}  // namespace
}  // namespace cpu
}  // namespace kernels
}  // namespace memwall
