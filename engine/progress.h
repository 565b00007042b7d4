// Progress of planning work that may take a while (`memwall plan` of a
// huge model, the auto strategy's many dry runs): silent for a first
// interval, then a line at a steady interval saying how long it has run,
// what is under way and, inside a dry-run step, where in the step it is.
#ifndef MEMWALL_ENGINE_PROGRESS_H_
#define MEMWALL_ENGINE_PROGRESS_H_

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "profiler/memory_profiler.h"

namespace memwall {

class PlanProgress {
 public:
  // Reports on `out` (which must outlive this object) as "<prefix>: 3 s:
  // <task>: <stage> (<open profiler phases>)" lines: the first `quiet`
  // after construction, then one every `every`; nothing at all for work
  // that ends sooner. A reporting thread runs until destruction.
  PlanProgress(std::FILE* out, std::string prefix,
               std::chrono::milliseconds quiet = std::chrono::seconds(1),
               std::chrono::milliseconds every = std::chrono::seconds(1));
  ~PlanProgress();
  PlanProgress(const PlanProgress&) = delete;
  PlanProgress& operator=(const PlanProgress&) = delete;

  // The work under way ("candidate 3 of 12 (stage 2, ...)"); "" for none.
  void SetTask(std::string task);
  // The stage of it ("dry-run step"), and the profiler whose open phases
  // say where in the stage it is (null: none). The profiler is read until
  // the next SetStage, so the caller calls SetStage again (e.g. with "")
  // before destroying it.
  void SetStage(std::string stage, const MemoryProfiler* profiler = nullptr);

  // The line a report would print now, without prefix and time.
  std::string Line() const;
  // Lines printed so far.
  int reports() const;

 private:
  void Run();
  std::string LineLocked() const;

  std::FILE* const out_;
  const std::string prefix_;
  const std::chrono::milliseconds quiet_, every_;
  const std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  int reports_ = 0;
  std::string task_, stage_;
  const MemoryProfiler* profiler_ = nullptr;
  std::thread thread_;  // last: started once the rest is set
};

// Sets a progress's stage for a scope and clears it at the end (a null
// progress: nothing).
class ScopedProgressStage {
 public:
  ScopedProgressStage(PlanProgress* progress, std::string stage,
                      const MemoryProfiler* profiler = nullptr)
      : progress_(progress) {
    if (progress_ != nullptr) progress_->SetStage(std::move(stage), profiler);
  }
  ~ScopedProgressStage() {
    if (progress_ != nullptr) progress_->SetStage("");
  }
  ScopedProgressStage(const ScopedProgressStage&) = delete;
  ScopedProgressStage& operator=(const ScopedProgressStage&) = delete;

 private:
  PlanProgress* progress_;
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_PROGRESS_H_
