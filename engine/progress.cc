#include "engine/progress.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace memwall {

PlanProgress::PlanProgress(std::FILE* out, std::string prefix, std::chrono::milliseconds quiet,
                           std::chrono::milliseconds every)
    : out_(out),
      prefix_(std::move(prefix)),
      quiet_(quiet),
      every_(every),
      start_(std::chrono::steady_clock::now()),
      thread_([this] { Run(); }) {}

PlanProgress::~PlanProgress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PlanProgress::SetTask(std::string task) {
  std::lock_guard<std::mutex> lock(mu_);
  task_ = std::move(task);
}

void PlanProgress::SetStage(std::string stage, const MemoryProfiler* profiler) {
  std::lock_guard<std::mutex> lock(mu_);
  stage_ = std::move(stage);
  profiler_ = profiler;
}

std::string PlanProgress::Line() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LineLocked();
}

int PlanProgress::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_;
}

std::string PlanProgress::LineLocked() const {
  std::string line = task_;
  if (!stage_.empty()) absl::StrAppend(&line, line.empty() ? "" : ": ", stage_);
  // Read under mu_: SetStage replaces the profiler before it goes away.
  if (profiler_ != nullptr) {
    const std::vector<std::string> phases = profiler_->open_phases();
    if (!phases.empty()) absl::StrAppend(&line, " (", absl::StrJoin(phases, " > "), ")");
  }
  return line.empty() ? "working" : line;
}

void PlanProgress::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  auto next = start_ + quiet_;
  while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(out_, "%s: %.0f s: %s\n", prefix_.c_str(), seconds, LineLocked().c_str());
    std::fflush(out_);
    ++reports_;
    next += every_;
  }
}

}  // namespace memwall
