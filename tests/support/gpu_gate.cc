#include "tests/support/gpu_gate.h"

#include <cstdio>

#include "runtime/device.h"

namespace memwall::testing {

bool GpuPresentOrReportSkipped(size_t cases, bool print, int gpus_needed) {
  const int gpus = CudaDeviceCount();
  if (gpus >= gpus_needed) return true;
  if (print) {
    if (gpus == 0) {
      std::printf("skipped: no GPU (%zu test cases need one; run tools/gpu_check.sh on a GPU machine)\n",
                  cases);
    } else {
      std::printf("skipped: %d GPUs present, %d needed (%zu test cases)\n", gpus, gpus_needed,
                  cases);
    }
    std::printf("memwall-tests: 0 passed, 0 failed, %zu skipped\n", cases);
  }
  return false;
}

}  // namespace memwall::testing
