// The category-tagged caching allocator behind every device backend.
//
// Note [Caching allocator]
// Rationale: a training step allocates and frees the same sizes over and over;
// asking the backend (cudaMalloc) each time is slow and synchronising, and a
// dry run on the meta backend must reproduce the rounding and caching a real
// GPU run pays, or its peak would be optimistic. So all three backends share
// this allocator and differ only in their SegmentSource.
// Approach: as PyTorch's CUDACachingAllocator. Requests round up to 512 bytes.
// Requests up to 1 MiB are served from 2 MiB "small" segments; larger ones
// from "large" segments sized to the request rounded up to 2 MiB. A free
// block is found best-fit (smallest size, then the earliest reserved
// segment, then the lowest offset in it: never the backend's addresses, so
// meta, host and cuda choose the same blocks and fragment alike), split when
// the remainder is worth keeping, and coalesced with free neighbours when
// freed. Segments stay reserved (cached) until EmptyCache() or until a
// request would exceed the capacity, which first releases fully free cached
// segments and retries.
// Streams: a block is reused only by work known to run after every stream
// that used it (Note [Stream-ordered reuse] in runtime/stream_order.h), so
// a buffer may be freed while a stream still reads it, without a host wait.
// Limitations: one pool for all streams (a block pending on one stream is
// skipped, not kept in a pool of its own as PyTorch does); no expandable
// segments.
#ifndef MEMWALL_RUNTIME_ALLOCATOR_H_
#define MEMWALL_RUNTIME_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/memory.h"
#include "runtime/stream_order.h"

namespace memwall {

// Where a backend's segments come from. Reserve returns the base address of
// `bytes` bytes; a backend that is out of memory returns kResourceExhausted.
// Thread-compatible: the allocator calls it under its lock.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual absl::StatusOr<uintptr_t> Reserve(size_t bytes) = 0;
  virtual void Release(uintptr_t base, size_t bytes) = 0;
};

class CachingAllocator;
class Stream;

namespace allocator_internal {
struct Block;
struct Segment;
}  // namespace allocator_internal

// Move-only owner of one allocation; frees it when destroyed or Reset().
// data() is null on the meta backend (no bytes exist) and for empty buffers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // Frees the allocation (if any); the buffer becomes empty. Work already
  // enqueued on the buffer's streams may still use it: the block is reused
  // only by work ordered after that (Note [Stream-ordered reuse]).
  void Reset();

  // Tells the allocator that `stream`, besides the one the buffer was
  // allocated on, uses the buffer (PyTorch's record_stream): freeing it
  // then keeps the block from work not ordered after `stream`'s work
  // enqueued so far. `stream` must belong to the buffer's device.
  // REQUIRES: !empty().
  void RecordStream(const Stream& stream);

  bool empty() const { return block_ == nullptr; }
  void* data() const { return data_; }
  // Requested bytes.
  size_t size() const { return size_; }
  // Bytes of the block backing it (size() rounded up).
  size_t block_size() const;
  MemoryCategory category() const;
  const std::string& owner() const;

 private:
  friend class CachingAllocator;
  using Block = allocator_internal::Block;
  DeviceBuffer(CachingAllocator* allocator, Block* block, void* data, size_t size)
      : allocator_(allocator), block_(block), data_(data), size_(size) {}

  CachingAllocator* allocator_ = nullptr;
  Block* block_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

class CachingAllocator {
 public:
  // Requests are rounded up to this many bytes (also the alignment).
  static constexpr size_t kMinBlockSize = 512;
  // Requests of at most this many bytes go to the small pool.
  static constexpr size_t kSmallRequestMax = size_t{1} << 20;
  // Segment size of the small pool; large segments are multiples of it.
  static constexpr size_t kSegmentGranularity = size_t{2} << 20;
  // A large block is split only if at least this much would remain, so large
  // segments do not splinter into unusable pieces.
  static constexpr size_t kMinLargeSplitRemainder = size_t{1} << 20;

  // `device_name` appears in error messages ("host:0"). `capacity` bounds
  // the reserved bytes. `touch_bytes` is false for the meta backend: buffers
  // then have null data pointers.
  CachingAllocator(std::string device_name, int64_t capacity,
                   std::unique_ptr<SegmentSource> source, bool touch_bytes);
  // REQUIRES: every DeviceBuffer from this allocator has been freed.
  ~CachingAllocator();

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Allocates `bytes` (0 is allowed and still takes a minimum block) tagged
  // with `category` and `owner`, for work on `stream` (kHostOrder: the host
  // or a stream that runs work as it is enqueued). The block is one that
  // `stream` is known to be ordered after (see SetStreamOrder); when only
  // blocks pending on other streams could serve it, those streams are
  // synchronised first. Returns kResourceExhausted when the capacity (or the
  // backend) cannot hold it; the message names the request and what
  // occupies the device by category and by its largest owners. Thread-safe.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, MemoryCategory category,
                                        absl::string_view owner,
                                        StreamId stream = kHostOrder);

  // The device's stream order, which stream-ordered reuse consults. Without
  // one (a bare allocator), every stream counts as host order. Set once,
  // before the first allocation.
  void SetStreamOrder(std::shared_ptr<StreamOrder> order);

  // Fault injection (tests): the `nth` Allocate call from now (1 = the
  // next) fails with kResourceExhausted ("injected failure"), as a full
  // device would, once; 0 cancels. Thread-safe.
  void InjectFailure(int64_t nth);
  // Allocate calls so far (failed ones included).
  int64_t allocate_calls() const;

  // Gives every fully free cached segment back to the backend, after
  // synchronising the streams that free blocks still wait for.
  absl::Status EmptyCache();

  AllocatorStats stats() const;
  // Live requested bytes per (owner, category), largest first.
  std::vector<std::pair<std::pair<std::string, MemoryCategory>, int64_t>>
  OwnerBytes() const;

  // A one-paragraph description of what occupies the device (used in OOM
  // messages and reports): totals, by category, and the `top_owners` largest.
  std::string DescribeOccupancy(int top_owners) const;

  // Listeners are not owned and must outlive their registration.
  void AddListener(MemoryListener* listener);
  // Registers `listener` and, atomically with it (under the allocator's
  // lock, so no event is missed or seen twice), hands `snapshot` the current
  // stats and live bytes per (owner, category). `snapshot` must not call
  // back into the allocator.
  void AddListener(
      MemoryListener* listener,
      const std::function<void(const AllocatorStats&,
                               const std::map<std::pair<std::string, MemoryCategory>, int64_t>&)>&
          snapshot);
  void RemoveListener(MemoryListener* listener);

  const std::string& device_name() const { return device_name_; }
  int64_t capacity() const { return capacity_; }

 private:
  friend class DeviceBuffer;
  using Block = allocator_internal::Block;
  using Segment = allocator_internal::Segment;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockOrder>;

  void Free(Block* block);
  void RecordUse(Block* block, StreamId stream);
  // The best-fitting free block of at least `rounded` bytes that `user` may
  // reuse, taken out of `pool`; null when there is none.
  Block* FindFreeBlock(FreeSet& pool, size_t rounded, StreamId user)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether work on `user` is ordered after every stamp of free `block`.
  bool Reusable(const Block* block, StreamId user) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The streams that free blocks still wait for, before the host may hand
  // them to anyone.
  std::vector<StreamId> PendingStreamsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronises those streams with `lock` (on mu_) released, so that their
  // queued work may free buffers; whether there were any.
  absl::StatusOr<bool> DrainPending(std::unique_lock<std::mutex>& lock);
  absl::StatusOr<Block*> ReserveSegment(size_t segment_bytes, bool small)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseFreeSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeSplit(Block* block, size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Emit(MemoryEvent::Kind kind, MemoryCategory category,
            absl::string_view owner, int64_t bytes, int64_t block_bytes,
            uintptr_t address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeOccupancyLocked(int top_owners) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OutOfMemory(size_t bytes, MemoryCategory category,
                           absl::string_view owner, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string device_name_;
  const int64_t capacity_;
  const std::unique_ptr<SegmentSource> source_;
  const bool touch_bytes_;
  std::shared_ptr<StreamOrder> order_;

  // std::mutex, which ThreadSanitizer sees (see runtime/host_device.cc).

  mutable std::mutex mu_;
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
  FreeSet small_free_ ABSL_GUARDED_BY(mu_);
  FreeSet large_free_ ABSL_GUARDED_BY(mu_);
  std::set<Segment*> segments_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, MemoryCategory>, int64_t> owner_bytes_
      ABSL_GUARDED_BY(mu_);
  std::vector<MemoryListener*> listeners_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_segment_serial_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocate_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fail_at_call_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no injected failure
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_ALLOCATOR_H_
