#include "profiler/memory_profiler.h"

#include <algorithm>

namespace memwall {

int64_t ModelStateBytes(const CategoryBytes& b) {
  return b[int(MemoryCategory::kParameter)] + b[int(MemoryCategory::kGradient)] +
         b[int(MemoryCategory::kOptimizerState)];
}

int64_t ActivationBytesOf(const CategoryBytes& b) {
  return b[int(MemoryCategory::kActivation)] + b[int(MemoryCategory::kCheckpointedActivation)];
}

MemoryProfiler::MemoryProfiler(CachingAllocator& allocator, size_t ring_capacity,
                               absl::string_view device_name)
    : allocator_(allocator),
      device_name_(device_name.empty() ? allocator.device_name() : std::string(device_name)),
      capacity_(allocator.capacity()),
      ring_capacity_(std::max<size_t>(ring_capacity, 1)),
      start_(std::chrono::steady_clock::now()) {
  // Start from the allocator's books (what was allocated before us), taken
  // atomically with the registration.
  allocator_.AddListener(this, [this](const AllocatorStats& s, const auto& owners) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int c = 0; c < kNumMemoryCategories; ++c) current_[c] = s.by_category[c].current;
    category_peaks_ = current_;
    total_ = s.requested.current;
    reserved_ = s.reserved.current;
    allocated_ = s.allocated.current;
    for (const auto& [key, bytes] : owners) owners_[key.first][int(key.second)] = bytes;
    for (OwnerNode& node : owners_) touched_.insert(&node);
    SnapshotPeakOwners();
    peak_.bytes = total_;
    peak_.by_category = current_;
    peak_.reserved = reserved_;
    peak_.allocated = allocated_;
  });
}

MemoryProfiler::~MemoryProfiler() { allocator_.RemoveListener(this); }

double MemoryProfiler::NowUs() const { return SinceStartUs(std::chrono::steady_clock::now()); }

double MemoryProfiler::SinceStartUs(std::chrono::steady_clock::time_point t) const {
  return std::max(0.0, std::chrono::duration<double, std::micro>(t - start_).count());
}

void MemoryProfiler::Book(MemoryCategory category, absl::string_view owner, int64_t delta) {
  current_[int(category)] += delta;
  category_peaks_[int(category)] = std::max(category_peaks_[int(category)], current_[int(category)]);
  total_ += delta;
  auto it = owners_.find(owner);
  if (it == owners_.end()) it = owners_.try_emplace(std::string(owner)).first;
  it->second[int(category)] += delta;
  touched_.insert(&*it);
}

void MemoryProfiler::OnMemoryEvent(const MemoryEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (e.kind) {
    case MemoryEvent::Kind::kAlloc:
    case MemoryEvent::Kind::kFree: {
      const bool alloc = e.kind == MemoryEvent::Kind::kAlloc;
      allocated_ += alloc ? e.block_bytes : -e.block_bytes;
      Book(e.category, e.owner, alloc ? e.bytes : -e.bytes);
      break;
    }
    case MemoryEvent::Kind::kSegmentReserve:
    case MemoryEvent::Kind::kSegmentRelease:
      break;
    case MemoryEvent::Kind::kOutOfMemory:
      return;
  }
  reserved_ = e.reserved_after;
  last_sequence_ = e.sequence;
  Account(e.sequence);
}

void MemoryProfiler::RecordExternal(MemoryCategory category, absl::string_view owner,
                                    int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  Book(category, owner, bytes);
  Account(last_sequence_);
}

void MemoryProfiler::Account(uint64_t sequence) {
  if (total_ > peak_.bytes) {
    peak_.bytes = total_;
    peak_.by_category = current_;
    peak_.reserved = reserved_;
    peak_.allocated = allocated_;
    peak_.sequence = sequence;
    peak_.phase = open_.empty() ? "" : open_.back().name;
    peak_.phase_path.clear();
    for (const PhaseRecord& p : open_) peak_.phase_path.push_back(p.name);
    SnapshotPeakOwners();
  }
  for (PhaseRecord& p : open_) {
    if (total_ > p.peak_bytes) {
      p.peak_bytes = total_;
      p.peak_by_category = current_;
    }
  }
  ring_.push_back({NowUs(), sequence, current_, reserved_});
  if (ring_.size() > ring_capacity_) {
    ring_.pop_front();
    ++dropped_;
  }
}

void MemoryProfiler::BeginPhase(absl::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  PhaseRecord p;
  p.name = std::string(name);
  p.depth = static_cast<int>(open_.size());
  p.start_us = NowUs();
  p.start_bytes = p.peak_bytes = total_;
  p.peak_by_category = current_;
  open_.push_back(std::move(p));
}

bool MemoryProfiler::EndPhase() {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_.empty()) return false;
  PhaseRecord p = std::move(open_.back());
  open_.pop_back();
  p.end_us = NowUs();
  p.end_bytes = total_;
  closed_.push_back(std::move(p));
  return true;
}

void MemoryProfiler::RecordActivity(absl::string_view track, absl::string_view name,
                                    std::chrono::steady_clock::time_point start,
                                    std::chrono::steady_clock::time_point end, int64_t bytes) {
  ActivityRecord a{std::string(track), std::string(name), SinceStartUs(start), SinceStartUs(end),
                   bytes};
  std::lock_guard<std::mutex> lock(mu_);
  activities_.push_back(std::move(a));
  if (activities_.size() > ring_capacity_) {
    activities_.pop_front();
    ++dropped_activities_;
  }
}

std::vector<std::string> MemoryProfiler::open_phases() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(open_.size());
  for (const PhaseRecord& p : open_) names.push_back(p.name);
  return names;
}

std::vector<OwnerBytes> MemoryProfiler::owners() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OwnerBytes> out;
  for (const auto& [owner, bytes] : owners_) {
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      if (bytes[c] != 0) out.push_back({owner, static_cast<MemoryCategory>(c), bytes[c]});
    }
  }
  std::sort(out.begin(), out.end(), [](const OwnerBytes& a, const OwnerBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.owner < b.owner;
  });
  return out;
}

CategoryBytes MemoryProfiler::category_peaks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return category_peaks_;
}

void MemoryProfiler::SnapshotPeakOwners() {
  for (OwnerNode* node : touched_) peak_owners_[&node->first] = node->second;
  touched_.clear();
}

PeakSnapshot MemoryProfiler::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  PeakSnapshot out = peak_;
  std::vector<OwnerBytes> owners;
  for (const auto& [owner, bytes] : peak_owners_) {
    for (MemoryCategory c : kAllMemoryCategories) {
      if (bytes[int(c)] != 0) owners.push_back({*owner, c, bytes[int(c)]});
    }
  }
  const size_t keep = std::min<size_t>(kTopOwners, owners.size());
  std::partial_sort(owners.begin(), owners.begin() + keep, owners.end(),
                    [](const OwnerBytes& a, const OwnerBytes& b) {
                      return a.bytes != b.bytes ? a.bytes > b.bytes : a.owner < b.owner;
                    });
  owners.resize(keep);
  out.top_owners = std::move(owners);
  return out;
}

CategoryBytes MemoryProfiler::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

std::vector<PhaseRecord> MemoryProfiler::phases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::vector<TimelinePoint> MemoryProfiler::timeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ring_.begin(), ring_.end()};
}

int64_t MemoryProfiler::dropped_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::vector<ActivityRecord> MemoryProfiler::activities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {activities_.begin(), activities_.end()};
}

int64_t MemoryProfiler::dropped_activities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_activities_;
}

}  // namespace memwall
