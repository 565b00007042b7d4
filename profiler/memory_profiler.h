// The memory profiler: listens to an allocator's events and the engine's
// phase markers, and answers "what is my peak, when does it happen, and what
// is it made of" by category, owner and phase.
//
// Note [Exact books]
// The profiler never guesses: it keeps its own running totals from the
// allocator's events, so at every event the category totals sum to the
// allocator's requested bytes and the recorded peak equals the allocator's
// requested peak to the byte (tests check both). Model state is parameters +
// gradients + optimizer states; activation is activations + checkpointed
// activations; the rest is buffers (workspace, communication, other).
//
// Memory held outside the allocator can be declared (RecordExternal): a
// framework's activations that memwall's allocator never sees, such as the
// tensors torch's autograd saves for backward (memwall.torch.profile). The
// books then sum the allocator's requested bytes and the declared ones;
// `reserved` and `allocated` stay the allocator's.
//
// Recording is bounded: the last `ring_capacity` events are kept for the
// timeline (older ones are dropped and counted), while peaks, per-phase
// peaks and per-step summaries are exact over the whole run.
//
// Activities are intervals of work beside the engine's thread, each on a
// named track: the CPU update on its thread, NVMe reads and writes on the
// disk (Note [Overlapped update] in sharding/sharded_optimizer.h). They do
// not nest and are not phases: the Chrome trace shows each track as a
// thread under the phases, so what overlaps backward is visible. The last
// `ring_capacity` activities are kept.
//
// Thread safety: OnMemoryEvent runs under the allocator's lock; phase
// markers come from the engine's thread; activities from any thread. All
// take the profiler's mutex.
#ifndef MEMWALL_PROFILER_MEMORY_PROFILER_H_
#define MEMWALL_PROFILER_MEMORY_PROFILER_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/memory.h"

namespace memwall {

using CategoryBytes = std::array<int64_t, kNumMemoryCategories>;

// parameters + gradients + optimizer states.
int64_t ModelStateBytes(const CategoryBytes& bytes);
// activations + checkpointed activations.
int64_t ActivationBytesOf(const CategoryBytes& bytes);

struct OwnerBytes {
  std::string owner;
  MemoryCategory category;
  int64_t bytes;
};

// The moment of the highest requested bytes.
struct PeakSnapshot {
  int64_t bytes = 0;               // requested bytes, all categories
  CategoryBytes by_category{};
  int64_t reserved = 0;            // allocator reserved bytes at that moment
  int64_t allocated = 0;           // bytes of the blocks handed out (requests
                                   // rounded up); reserved - allocated is
                                   // cached or fragmented memory
  uint64_t sequence = 0;           // the allocator event that reached it
  std::string phase;               // innermost phase open then ("" if none)
  std::vector<std::string> phase_path;  // every phase open then, outermost first
  std::vector<OwnerBytes> top_owners;  // largest first
};

struct PhaseRecord {
  std::string name;
  int depth = 0;
  double start_us = 0, end_us = 0;  // since the profiler started
  int64_t start_bytes = 0, end_bytes = 0;
  int64_t peak_bytes = 0;           // highest requested bytes inside
  CategoryBytes peak_by_category{};
};

// An interval of work on a track (see the top of the file).
struct ActivityRecord {
  std::string track;
  std::string name;
  double start_us = 0, end_us = 0;  // since the profiler started
  int64_t bytes = 0;                // moved (transfers), else 0
};

// One recorded event of the timeline.
struct TimelinePoint {
  double time_us = 0;
  uint64_t sequence = 0;
  CategoryBytes by_category{};
  int64_t reserved = 0;
};

class MemoryProfiler : public MemoryListener {
 public:
  // Owners kept in a peak snapshot.
  static constexpr int kTopOwners = 10;

  // Registers with `allocator` (which must outlive the profiler) and takes
  // the allocator's current books as the starting point. The reports name
  // `device_name`, or when empty the allocator's device ("host:0"): a
  // framework's memory declared through RecordExternal names its own
  // ("cpu").
  MemoryProfiler(CachingAllocator& allocator, size_t ring_capacity = 1 << 16,
                 absl::string_view device_name = {});
  ~MemoryProfiler() override;
  MemoryProfiler(const MemoryProfiler&) = delete;
  MemoryProfiler& operator=(const MemoryProfiler&) = delete;

  void OnMemoryEvent(const MemoryEvent& event) override;

  // Declares `bytes` (negative: released) of memory outside the allocator,
  // of `category` and `owner`, counted from now on as allocator bytes are:
  // in the totals, the owners, the peaks, the phases and the timeline (at
  // the sequence number of the allocator's latest event).
  void RecordExternal(MemoryCategory category, absl::string_view owner, int64_t bytes);

  // Phases nest: "step 3" > "forward" > "block2". EndPhase closes the
  // innermost; returns false (and does nothing) if none is open.
  void BeginPhase(absl::string_view name);
  bool EndPhase();

  // Records the work `name` on `track` from `start` to `end` (steady clock;
  // times before the profiler started are clamped to its start), moving
  // `bytes` if it is a transfer.
  void RecordActivity(absl::string_view track, absl::string_view name,
                      std::chrono::steady_clock::time_point start,
                      std::chrono::steady_clock::time_point end, int64_t bytes = 0);

  // Copies of what has been recorded.
  PeakSnapshot peak() const;
  CategoryBytes current() const;
  // The live bytes of every owner and category now (zeros left out),
  // largest first.
  std::vector<OwnerBytes> owners() const;
  // The highest bytes each category reached on its own (not at one moment).
  CategoryBytes category_peaks() const;
  std::vector<PhaseRecord> phases() const;  // closed phases, in closing order
  // The names of the phases open now, outermost first. Thread-safe: for a
  // watcher beside the thread that runs them (engine/progress.h).
  std::vector<std::string> open_phases() const;
  std::vector<TimelinePoint> timeline() const;
  int64_t dropped_events() const;
  // The kept activities, in recording order, and how many were dropped.
  std::vector<ActivityRecord> activities() const;
  int64_t dropped_activities() const;

  const std::string& device_name() const { return device_name_; }
  int64_t capacity() const { return capacity_; }

 private:
  double NowUs() const;
  double SinceStartUs(std::chrono::steady_clock::time_point t) const;
  // After the books changed by an event numbered `sequence`: peaks, open
  // phases and the timeline.
  void Account(uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `delta` bytes of `category` owned by `owner` to the books.
  void Book(MemoryCategory category, absl::string_view owner, int64_t delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SnapshotPeakOwners() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CachingAllocator& allocator_;
  const std::string device_name_;
  const int64_t capacity_;
  const size_t ring_capacity_;
  const std::chrono::steady_clock::time_point start_;

  // std::mutex, which ThreadSanitizer sees (see runtime/host_device.cc).

  mutable std::mutex mu_;
  CategoryBytes current_ ABSL_GUARDED_BY(mu_){};
  CategoryBytes category_peaks_ ABSL_GUARDED_BY(mu_){};
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  // Live bytes per owner and category. Nodes are never erased, so the peak
  // can keep pointers to their names and nodes.
  using OwnerNode = std::pair<const std::string, CategoryBytes>;
  absl::node_hash_map<std::string, CategoryBytes> owners_ ABSL_GUARDED_BY(mu_);
  // The peak without its owners, and the owners' bytes at the peak; the
  // snapshot's top owners are ranked when asked for. A new peak updates
  // only the owners booked since the last one (`touched_`): during a
  // forward every allocation is a new peak, and copying every owner each
  // time made a dry run quadratic in its layers.
  PeakSnapshot peak_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const std::string*, CategoryBytes> peak_owners_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<OwnerNode*> touched_ ABSL_GUARDED_BY(mu_);
  std::vector<PhaseRecord> open_ ABSL_GUARDED_BY(mu_);
  std::vector<PhaseRecord> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<TimelinePoint> ring_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<ActivityRecord> activities_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_activities_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

// Opens a phase of `profiler` for its lifetime; does nothing when the
// profiler is null (profiling off).
class ScopedPhase {
 public:
  ScopedPhase(MemoryProfiler* profiler, absl::string_view name) : profiler_(profiler) {
    if (profiler_ != nullptr) profiler_->BeginPhase(name);
  }
  ~ScopedPhase() {
    if (profiler_ != nullptr) profiler_->EndPhase();
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  MemoryProfiler* const profiler_;
};

// Records the work `name` on `track` of `profiler` over its lifetime; does
// nothing when the profiler is null.
class ScopedActivity {
 public:
  ScopedActivity(MemoryProfiler* profiler, absl::string_view track, std::string name)
      : profiler_(profiler),
        track_(track),
        name_(std::move(name)),
        start_(std::chrono::steady_clock::now()) {}
  ~ScopedActivity() {
    if (profiler_ != nullptr) {
      profiler_->RecordActivity(track_, name_, start_, std::chrono::steady_clock::now());
    }
  }
  ScopedActivity(const ScopedActivity&) = delete;
  ScopedActivity& operator=(const ScopedActivity&) = delete;

 private:
  MemoryProfiler* const profiler_;
  const absl::string_view track_;
  const std::string name_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace memwall

#endif  // MEMWALL_PROFILER_MEMORY_PROFILER_H_
