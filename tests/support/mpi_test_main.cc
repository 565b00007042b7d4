// Catch2 main for multi-rank tests launched by mpirun (tests/mpi_test.sh).
// Every rank runs every test case; a case passes only if it passes on all
// ranks. Rank 0 reports to the console; other ranks write their report to a
// file that is printed only if that rank saw a failure. Rank 0 prints the
// closing count line (see case_results.h). Built with MEMWALL_TESTS_NEED_GPU
// it skips every case when no GPU is present (see gpu_gate.h).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/support/case_results.h"
#include "tests/support/mpi_world.h"
#if MEMWALL_TESTS_NEED_GPU
#include "tests/support/gpu_gate.h"
#endif

int main(int argc, char** argv) {
  memwall::MpiCommunicator& world = memwall::testing::World();
  const int rank = world.rank();
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
#if MEMWALL_TESTS_NEED_GPU
  if (!memwall::testing::GpuPresentOrReportSkipped(
          Catch::getAllTestCasesSorted(session.config()).size(), /*print=*/rank == 0,
                                                    /*gpus_needed=*/world.world_size())) return 0;
#endif
  // mpirun may hand ranks a terminal; keep logs free of colour codes.
  session.configData().useColour = Catch::UseColour::No;
  std::string report_file;
  if (rank != 0) {
    const char* dir = std::getenv("TEST_TMPDIR");
    report_file = std::string(dir ? dir : "/tmp") + "/catch-rank-" + std::to_string(rank) + ".txt";
    session.configData().outputFilename = report_file;
  }
  const int failed_assertions = session.run();

  // Combine per-case outcomes over ranks (max of the failure flags).
  std::vector<int> failures = memwall::testing::CaseFailures();
  int count = static_cast<int>(failures.size()), min_count = 0, max_count = 0;
  MPI_Allreduce(&count, &min_count, 1, MPI_INT, MPI_MIN, world.comm());
  MPI_Allreduce(&count, &max_count, 1, MPI_INT, MPI_MAX, world.comm());
  int passed = 0, failed = 0;
  if (min_count != max_count) {
    if (rank == 0) std::fprintf(stderr, "ranks ran different numbers of test cases\n");
    failed = max_count;
  } else {
    MPI_Allreduce(MPI_IN_PLACE, failures.data(), count, MPI_INT, MPI_MAX, world.comm());
    for (int f : failures) (f ? failed : passed)++;
  }
  if (rank != 0 && failed_assertions != 0) {
    std::ifstream in(report_file);
    std::cerr << "---- report of rank " << rank << " ----\n" << in.rdbuf() << std::flush;
  }
  MPI_Barrier(world.comm());
  if (rank == 0) {
    std::printf("memwall-tests: %d passed, %d failed (on %d ranks)\n", passed, failed,
                world.world_size());
    std::fflush(stdout);
  }
  return failed == 0 ? 0 : 1;
}
