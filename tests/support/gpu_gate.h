// Test binaries that need a GPU report their cases as skipped when none is
// present (this machine and CI have no GPU; tools/gpu_check.sh runs them
// where one is).
#ifndef MEMWALL_TESTS_SUPPORT_GPU_GATE_H_
#define MEMWALL_TESTS_SUPPORT_GPU_GATE_H_

#include <cstddef>

namespace memwall::testing {

// Whether a session of `test_cases` cases should run: at least `gpus_needed` usable GPUs (one per
// MPI rank on this node). If not, prints "skipped: no GPU" (or how many are
// missing) and the closing count line with every registered test case
// counted as skipped. `print` is false on MPI ranks other than 0.
bool GpuPresentOrReportSkipped(size_t test_cases, bool print, int gpus_needed = 1);

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_GPU_GATE_H_
