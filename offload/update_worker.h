// A rank's CPU-update thread (sharding/sharded_optimizer.h, Note
// [Overlapped update]): runs the jobs queued to it in order, one at a time,
// beside the thread that queues them, so that an offloaded group's CPU
// update runs while backward goes on.
#ifndef MEMWALL_OFFLOAD_UPDATE_WORKER_H_
#define MEMWALL_OFFLOAD_UPDATE_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace memwall {

class UpdateWorker {
 public:
  // `cores`: empty, or the cores the thread (and the OpenMP threads it
  // starts, which inherit its affinity) is bound to.
  explicit UpdateWorker(std::vector<int> cores = {});
  // Waits for the queued jobs.
  ~UpdateWorker();
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Queues `job`. Once a job has failed, later ones are dropped unrun until
  // Wait() reports the failure.
  void Enqueue(std::function<absl::Status()> job);
  // Blocks until every queued job has run (or been dropped); returns the
  // first error since the last Wait (binding the thread's cores included).
  absl::Status Wait();
  // Seconds the jobs have run since construction.
  double busy_seconds() const;

  // The cores rank `rank` binds to with `threads` threads per rank on a
  // machine of `available` cores: [rank * threads, (rank + 1) * threads)
  // modulo `available`.
  static std::vector<int> CoresFor(int rank, int threads, int available);

 private:
  void Run(std::vector<int> cores);

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<absl::Status()>> jobs_;
  bool started_ = false;  // the thread has bound its cores
  bool running_ = false;  // a job is under way
  bool stop_ = false;
  absl::Status error_;
  double busy_ = 0;
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace memwall

#endif  // MEMWALL_OFFLOAD_UPDATE_WORKER_H_
