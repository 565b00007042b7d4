// The CPU-update thread: jobs run in order on a thread of their own, the
// first error stops the rest until reported, and ranks get disjoint cores.
#include "offload/update_worker.h"

#include <pthread.h>
#include <sched.h>

#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

TEST_CASE("jobs run in order, off the caller's thread", "[update_worker]") {
  UpdateWorker worker;
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 5; ++i) {
    worker.Enqueue([&order, &ran_on, i] {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
      return absl::OkStatus();
    });
  }
  REQUIRE(worker.Wait().ok());
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(ran_on != std::this_thread::get_id());
  CHECK(worker.busy_seconds() >= 0);
}

TEST_CASE("after a failed job the rest are dropped until Wait reports it", "[update_worker]") {
  UpdateWorker worker;
  int ran = 0;
  worker.Enqueue([&] { return ++ran, absl::OkStatus(); });
  worker.Enqueue([&] { return ++ran, absl::DataLossError("job 2 failed"); });
  worker.Enqueue([&] { return ++ran, absl::OkStatus(); });
  const absl::Status status = worker.Wait();
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK(status.message() == "job 2 failed");
  CHECK(ran == 2);
  // Reported once; the worker runs jobs again.
  worker.Enqueue([&] { return ++ran, absl::OkStatus(); });
  CHECK(worker.Wait().ok());
  CHECK(ran == 3);
}

TEST_CASE("ranks bind to disjoint cores, wrapping around the machine", "[update_worker]") {
  CHECK(UpdateWorker::CoresFor(0, 2, 8) == std::vector<int>{0, 1});
  CHECK(UpdateWorker::CoresFor(3, 2, 8) == std::vector<int>{6, 7});
  CHECK(UpdateWorker::CoresFor(5, 2, 8) == std::vector<int>{2, 3});
  CHECK(UpdateWorker::CoresFor(1, 3, 4) == std::vector<int>{3, 0, 1});

  // The thread runs on the cores it was given.
  UpdateWorker bound({0});
  cpu_set_t set;
  int count = -1;
  bool on_zero = false;
  bound.Enqueue([&] {
    CPU_ZERO(&set);
    pthread_getaffinity_np(pthread_self(), sizeof set, &set);
    count = CPU_COUNT(&set);
    on_zero = CPU_ISSET(0, &set);
    return absl::OkStatus();
  });
  REQUIRE(bound.Wait().ok());
  CHECK(count == 1);
  CHECK(on_zero);

  // A core the machine does not have is an error, named.
  UpdateWorker nowhere({CPU_SETSIZE - 1});
  const absl::Status status = nowhere.Wait();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(status.message() == "CPU update thread: cannot bind to cores 1023: Invalid argument");
}

}  // namespace
}  // namespace memwall
