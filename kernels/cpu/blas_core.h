// Which OpenBLAS kernel set ("core") a process runs its matrix products
// with, and choosing a better one where OpenBLAS's own detection falls
// back to a generic kernel.
//
// Note [OpenBLAS on CPUs it does not know]
// Rationale: Debian 12's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels
// by the CPU's family and model. On a processor newer than its table
// (Intel family 6 model 207, say) it falls back to its generic SSE3 kernel
// (Prescott), and the host backend's GEMMs run about 5x slower, with no
// hint to the user. The instruction sets the CPU reports (/proc/cpuinfo)
// say which of OpenBLAS's kernel sets runs there.
// Approach: OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded,
// before main(). So the command, first thing in main(), asks OpenBLAS which
// core it chose; when that is a generic fallback and the CPU supports a
// better one, it sets OPENBLAS_CORETYPE and re-executes itself once. A
// process that cannot re-execute (the Python extension, loaded into an
// interpreter) sets it and runs OpenBLAS's own dynamic-arch start-up
// again (gotoblas_dynamic_quit, gotoblas_dynamic_init: what OpenBLAS ran
// when it loaded, which reads the variable), at import, before its first
// matrix product; the kernel table is all that start-up chooses (its
// buffers are sized for every core of the build), so the process then runs
// as if started with the variable. A value the user set is never
// overridden. The core in force is printed in `memwall train`'s header.
// Limitations: an OpenBLAS without those two functions (not a DYNAMIC_ARCH
// build) cannot switch in place: Python warns, naming the setting. Only
// x86-64 kernel sets are chosen.
#ifndef MEMWALL_KERNELS_CPU_BLAS_CORE_H_
#define MEMWALL_KERNELS_CPU_BLAS_CORE_H_

#include <set>
#include <string>

namespace memwall {
namespace kernels {
namespace cpu {

// The core OpenBLAS runs in this process ("Cooperlake", "Prescott", ...).
std::string BlasCore();

// What `memwall train` prints: "OpenBLAS 0.3.21, core Cooperlake (its own
// detection)", "... (OPENBLAS_CORETYPE set by the user)" or "... (chosen by
// memwall from the CPU's avx512f, ...: OpenBLAS's detection gave Prescott)".
std::string BlasDescription();

// Pure: the core to run on a CPU with instruction-set `flags` (as
// /proc/cpuinfo names them) when OpenBLAS chose `detected`; empty when
// `detected` is not one of OpenBLAS's generic fallbacks or the CPU has
// nothing better.
std::string BetterBlasCore(const std::set<std::string>& flags, const std::string& detected);

// The instruction-set flags of this machine's first CPU (/proc/cpuinfo),
// empty where unreadable.
std::set<std::string> CpuFlags();

// First thing in main(): when OPENBLAS_CORETYPE is unset and
// BetterBlasCore finds a core, sets it (and MEMWALL_BLAS_CORE_FROM with
// what OpenBLAS had detected) and re-executes this binary with `argv`.
// Returns when it did not re-execute (nothing to change, or the exec
// failed: the run goes on with the generic kernel). Tests set
// MEMWALL_BLAS_PRETEND_DETECTED to a core name to take it as OpenBLAS's
// detection (a CPU it does not know, on one it does).
void ChooseBlasCore(char** argv);

// ChooseBlasCore for a process that cannot re-execute: switches this
// process's OpenBLAS to the better core in place (Note above), setting the
// same two variables so that child processes inherit the choice. Call it
// before the first matrix product and before any other thread uses
// OpenBLAS. Returns the core now in force when it switched; empty when
// nothing needed changing or this OpenBLAS cannot switch in place (then
// nothing was changed).
std::string ChooseBlasCoreInProcess();

}  // namespace cpu
}  // namespace kernels
}  // namespace memwall

#endif  // MEMWALL_KERNELS_CPU_BLAS_CORE_H_
