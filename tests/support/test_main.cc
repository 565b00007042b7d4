// Catch2 main for single-process tests: runs the session, then prints the
// closing count line (see case_results.h). Built with MEMWALL_TESTS_NEED_GPU
// it skips every case when no GPU is present (see gpu_gate.h).
#define CATCH_CONFIG_RUNNER
#include <cstdio>

#include "catch2/catch.hpp"
#include "tests/support/case_results.h"
#if MEMWALL_TESTS_NEED_GPU
#include "tests/support/gpu_gate.h"
#endif

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
#if MEMWALL_TESTS_NEED_GPU
  if (!memwall::testing::GpuPresentOrReportSkipped(
          Catch::getAllTestCasesSorted(session.config()).size(), /*print=*/true)) return 0;
#endif
  const int failed_assertions = session.run();
  int passed = 0, failed = 0;
  for (int f : memwall::testing::CaseFailures()) (f ? failed : passed)++;
  std::printf("memwall-tests: %d passed, %d failed\n", passed, failed);
  return failed_assertions == 0 && failed == 0 ? 0 : 1;
}
