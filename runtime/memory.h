// What every byte memwall allocates is for (its category and owner), the
// counters kept per category, and the events the allocator emits.
#ifndef MEMWALL_RUNTIME_MEMORY_H_
#define MEMWALL_RUNTIME_MEMORY_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace memwall {

// Model states are parameters, gradients and optimizer states; activations
// are activations and checkpointed activations; the rest is buffers.
enum class MemoryCategory : uint8_t {
  kParameter = 0,
  kGradient,
  kOptimizerState,
  kActivation,
  kCheckpointedActivation,
  kWorkspace,
  kCommBuffer,
  kOther,
};

constexpr int kNumMemoryCategories = 8;

constexpr std::array<MemoryCategory, kNumMemoryCategories> kAllMemoryCategories = {
    MemoryCategory::kParameter,  MemoryCategory::kGradient,
    MemoryCategory::kOptimizerState, MemoryCategory::kActivation,
    MemoryCategory::kCheckpointedActivation, MemoryCategory::kWorkspace,
    MemoryCategory::kCommBuffer, MemoryCategory::kOther,
};

// Stable snake_case names ("optimizer_state"); reports and JSON use them.
absl::string_view MemoryCategoryName(MemoryCategory category);

// A byte counter. `current` and `peak` are SUMs of live bytes; `allocated`
// and `freed` are cumulative SUMs, so allocated - freed == current always.
struct MemoryStat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Add(int64_t bytes) {
    current += bytes;
    allocated += bytes;
    if (current > peak) peak = current;
  }
  void Subtract(int64_t bytes) {
    current -= bytes;
    freed += bytes;
  }
};

// A snapshot of one allocator's books.
struct AllocatorStats {
  // Requested bytes (what callers asked for) by category.
  std::array<MemoryStat, kNumMemoryCategories> by_category;
  // Requested bytes over all categories. Its peak is the peak of the sum,
  // not the sum of per-category peaks.
  MemoryStat requested;
  // Bytes of the blocks handed out (requests rounded up to the block size).
  MemoryStat allocated;
  // Bytes held from the backend (segments), used or cached. reserved -
  // allocated is free memory inside segments: fragmentation and cache.
  MemoryStat reserved;
  // COUNTs of live allocations and of segments.
  int64_t num_allocations = 0;
  int64_t num_segments = 0;
  // COUNT of failed allocations (out of memory).
  int64_t num_ooms = 0;
  // The enforced device capacity in bytes.
  int64_t capacity = 0;
};

// One allocator event. `owner` is valid only during the listener call.
struct MemoryEvent {
  enum class Kind : uint8_t {
    kAlloc,             // a block was handed out
    kFree,              // a block was returned
    kSegmentReserve,    // memory was reserved from the backend
    kSegmentRelease,    // a cached segment was given back to the backend
    kOutOfMemory,       // a request failed; `bytes` is the request
  };
  Kind kind;
  uint64_t sequence;             // 0, 1, 2, ... per allocator
  MemoryCategory category;       // kOther for segment events
  absl::string_view owner;       // empty for segment events
  int64_t bytes;                 // requested bytes (segment size for segments)
  int64_t block_bytes;           // rounded block size (segment size for segments)
  uintptr_t address;             // block or segment address (fake on meta)
  int64_t requested_after;       // stats.requested.current after the event
  int64_t reserved_after;        // stats.reserved.current after the event
};

// Receives every event of the allocators it is registered with. Called with
// the allocator's lock held, in event order: it must be quick and must not
// call back into the allocator.
class MemoryListener {
 public:
  virtual ~MemoryListener() = default;
  virtual void OnMemoryEvent(const MemoryEvent& event) = 0;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_MEMORY_H_
