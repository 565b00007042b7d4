#include "tests/support/mpi_world.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace memwall::testing {

MpiCommunicator& World() {
  static MpiCommunicator* world = [] {
    auto created = MpiCommunicator::Create();
    if (!created.ok()) {
      std::fprintf(stderr, "cannot start MPI: %s\n",
                   std::string(created.status().message()).c_str());
      std::abort();
    }
    return created->release();
  }();
  return *world;
}

}  // namespace memwall::testing
