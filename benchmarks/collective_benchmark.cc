// What memwall's collectives cost over the MPI calls they make: per call,
// the median time of each collective through MpiCommunicator (non-blocking
// MPI polled against the timeout, with and without the agreement check,
// and waiting with MPI_Wait when the timeout is infinite) beside the
// blocking MPI collective on the same ranks, measured in the same run.
//
//   tools/mpirun.sh N bazel-bin/benchmarks/collective_benchmark [--repeats 200]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "collective_benchmark: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

// The median over `repeats` of one call's time in microseconds, the slowest
// rank's per repeat (the ranks meet at a barrier before each call).
double MedianMicros(MPI_Comm comm, int repeats, const std::function<void()>& call) {
  std::vector<double> times;
  for (int i = 0; i < repeats + 3; ++i) {
    MPI_Barrier(comm);
    const auto start = std::chrono::steady_clock::now();
    call();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                    .count();
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (i >= 3) times.push_back(us);  // three warm-up calls
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int Main(int argc, char** argv) {
  int repeats = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
  }
  CommunicatorOptions timed, unchecked, forever;
  unchecked.check_agreement = false;
  forever.timeout = absl::InfiniteDuration();
  auto with = MpiCommunicator::Create(timed).value();
  auto without = MpiCommunicator::Create(unchecked).value();
  auto waiting = MpiCommunicator::Create(forever).value();
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const int n = with->world_size(), r = with->rank();
  auto device = CreateDevice({Backend::kHost, r, 4 * kGiB}).value();
  auto stream = device->CreateStream().value();
  if (r == 0) {
    std::printf("collective_benchmark: %d ranks, median of %d calls (us, slowest rank), f32\n", n,
                repeats);
    std::printf("%-13s %10s %12s %12s %12s %12s %8s %8s\n", "collective", "bytes",
                "MPI blocking", "memwall", "no agreement", "no timeout", "memwall/", "no agr./");
    std::printf("%-13s %10s %12s %12s %12s %12s %8s %8s\n", "", "", "(baseline)", "(default)", "",
                "(MPI_Wait)", "baseline", "baseline");
  }
  for (const char* name : {"AllReduce", "ReduceScatter", "AllGather"}) {
    for (int64_t bytes : {int64_t{64}, int64_t{4} << 10, int64_t{256} << 10, int64_t{16} << 20}) {
      const size_t count = bytes / 4;  // elements of the whole logical buffer
      std::vector<float> a(count * n, 1.0f), b(count * n, 0.0f);
      const std::string op = name;
      auto mine = [&](MpiCommunicator& comm) {
        return [&] {
          if (op == "AllReduce") {
            Check(comm.AllReduce(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, *stream));
          } else if (op == "ReduceScatter") {
            Check(comm.ReduceScatter(a.data(), b.data(), count / n, DType::kF32, ReduceOp::kSum,
                                     *stream));
          } else {
            Check(comm.AllGather(a.data(), b.data(), count / n, DType::kF32, *stream));
          }
        };
      };
      auto blocking = [&] {
        const int c = static_cast<int>(count), per = static_cast<int>(count / n);
        if (op == "AllReduce") {
          MPI_Allreduce(a.data(), b.data(), c, MPI_FLOAT, MPI_SUM, raw);
        } else if (op == "ReduceScatter") {
          MPI_Reduce_scatter_block(a.data(), b.data(), per, MPI_FLOAT, MPI_SUM, raw);
        } else {
          MPI_Allgather(a.data(), per, MPI_FLOAT, b.data(), per, MPI_FLOAT, raw);
        }
      };
      const double base = MedianMicros(raw, repeats, blocking);
      const double checked = MedianMicros(raw, repeats, mine(*with));
      const double bare = MedianMicros(raw, repeats, mine(*without));
      const double wait = MedianMicros(raw, repeats, mine(*waiting));
      if (r == 0) {
        std::printf("%-13s %10s %12.1f %12.1f %12.1f %12.1f %7.2fx %7.2fx\n", name,
                    FormatBytes(bytes).c_str(), base, checked, bare, wait, checked / base,
                    bare / base);
      }
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}

}  // namespace
}  // namespace memwall

int main(int argc, char** argv) { return memwall::Main(argc, argv); }
