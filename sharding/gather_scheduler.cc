#include "sharding/gather_scheduler.h"

#include <cstddef>
#include <utility>

namespace memwall {

void GatherScheduler::OnGather(int g) {
  const size_t at = record_.size();
  if (at >= trace_.size() || trace_[at] != g) left_trace_ = true;
  record_.push_back(g);
  previous_ = last_;
  last_ = g;
}

std::vector<int> GatherScheduler::Upcoming() const {
  std::vector<int> next;
  if (following()) {
    next.assign(trace_.begin() + record_.size(), trace_.end());
    return next;
  }
  if (last_ < 0) return next;
  // Backward revisits the group forward ended on, so a repeat means backward.
  const int direction = last_ > previous_ ? 1 : -1;
  for (int g = last_ + direction; g >= 0 && g < num_groups_; g += direction) next.push_back(g);
  return next;
}

void GatherScheduler::EndStep() {
  if (!record_.empty()) trace_ = std::move(record_);
  record_.clear();
  left_trace_ = false;
  last_ = previous_ = -1;
}

void GatherScheduler::AbortStep() {
  record_.clear();
  left_trace_ = false;
  last_ = previous_ = -1;
}

}  // namespace memwall
