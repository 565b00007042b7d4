#include "offload/update_worker.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memwall {

UpdateWorker::UpdateWorker(std::vector<int> cores)
    : thread_([this, cores = std::move(cores)]() mutable { Run(std::move(cores)); }) {}

UpdateWorker::~UpdateWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::vector<int> UpdateWorker::CoresFor(int rank, int threads, int available) {
  std::vector<int> cores;
  for (int t = 0; t < threads; ++t) cores.push_back((rank * threads + t) % std::max(1, available));
  return cores;
}

void UpdateWorker::Enqueue(std::function<absl::Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
}

absl::Status UpdateWorker::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return started_ && jobs_.empty() && !running_; });
  absl::Status error = std::move(error_);
  error_ = absl::OkStatus();
  return error;
}

double UpdateWorker::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void UpdateWorker::Run(std::vector<int> cores) {
  if (!cores.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cores) CPU_SET(c, &set);
    const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (rc != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ =
          absl::InternalError(absl::StrCat("CPU update thread: cannot bind to cores ",
                                           absl::StrJoin(cores, ","), ": ", std::strerror(rc)));
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  started_ = true;  // bound (or failed to): Wait() may report it
  idle_.notify_all();
  while (true) {
    wake_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    std::function<absl::Status()> job = std::move(jobs_.front());
    jobs_.pop_front();
    if (!error_.ok()) {  // dropped: an earlier job failed
      if (jobs_.empty()) idle_.notify_all();
      continue;
    }
    running_ = true;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = job();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    running_ = false;
    busy_ += seconds;
    if (!status.ok() && error_.ok()) error_ = std::move(status);
    if (jobs_.empty()) idle_.notify_all();
  }
}

}  // namespace memwall
