// The MPI communicator shared by a multi-rank test binary's test cases.
#ifndef MEMWALL_TESTS_SUPPORT_MPI_WORLD_H_
#define MEMWALL_TESTS_SUPPORT_MPI_WORLD_H_

#include "runtime/mpi_communicator.h"

namespace memwall::testing {

// Created on first use (initialising MPI); aborts if MPI cannot start.
MpiCommunicator& World();

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_MPI_WORLD_H_
