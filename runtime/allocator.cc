#include "runtime/allocator.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace allocator_internal {

// A contiguous piece of a segment: either handed out or free. The blocks of a
// segment form a doubly linked list in address order and tile it exactly.
struct Block {
  uintptr_t address = 0;
  size_t size = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
  // Valid while allocated.
  size_t requested = 0;
  MemoryCategory category = MemoryCategory::kOther;
  std::string owner;
  // Valid while allocated: the stream it was allocated for and the other
  // streams recorded as using it (RecordStream).
  // Inlined: every allocation and free touches them, and a block rarely
  // has more than two streams.
  StreamId stream = kHostOrder;
  absl::InlinedVector<StreamId, 2> uses;
  // Valid while free: each stream that may still use it, and the clock at
  // its free (Note [Stream-ordered reuse]); at most one stamp per stream.
  absl::InlinedVector<StreamStamp, 2> stamps;
};

struct Segment {
  uintptr_t base = 0;
  size_t size = 0;
  uint64_t serial = 0;  // reservation order
  bool small = false;
  Block* first = nullptr;
};

}  // namespace allocator_internal

absl::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameter: return "parameter";
    case MemoryCategory::kGradient: return "gradient";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kActivation: return "activation";
    case MemoryCategory::kCheckpointedActivation: return "checkpointed_activation";
    case MemoryCategory::kWorkspace: return "workspace";
    case MemoryCategory::kCommBuffer: return "comm_buffer";
    case MemoryCategory::kOther: return "other";
  }
  return "unknown";
}

namespace {

size_t RoundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

// Adds `stamp` to `stamps`, keeping the later clock per stream.
void MergeStamp(absl::InlinedVector<StreamStamp, 2>& stamps, const StreamStamp& stamp) {
  for (StreamStamp& have : stamps) {
    if (have.stream == stamp.stream) {
      have.clock = std::max(have.clock, stamp.clock);
      return;
    }
  }
  stamps.push_back(stamp);
}

}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    block_ = std::exchange(other.block_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (block_ != nullptr) allocator_->Free(block_);
  allocator_ = nullptr;
  block_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

void DeviceBuffer::RecordStream(const Stream& stream) {
  MW_CHECK(block_ != nullptr);
  allocator_->RecordUse(block_, stream.id());
}

size_t DeviceBuffer::block_size() const { return block_ ? block_->size : 0; }

MemoryCategory DeviceBuffer::category() const {
  return block_ ? block_->category : MemoryCategory::kOther;
}

const std::string& DeviceBuffer::owner() const {
  static const std::string* const kNoOwner = new std::string();
  return block_ ? block_->owner : *kNoOwner;
}

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  // Ties go by where the segment stands in reservation order, not by the
  // address the backend gave it, so every backend picks the same block.
  if (a->segment->serial != b->segment->serial) return a->segment->serial < b->segment->serial;
  return a->address - a->segment->base < b->address - b->segment->base;
}

CachingAllocator::CachingAllocator(std::string device_name, int64_t capacity,
                                   std::unique_ptr<SegmentSource> source,
                                   bool touch_bytes)
    : device_name_(std::move(device_name)),
      capacity_(capacity),
      source_(std::move(source)),
      touch_bytes_(touch_bytes) {
  stats_.capacity = capacity;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  MW_CHECK(stats_.num_allocations == 0);
  ReleaseFreeSegments();
}

void CachingAllocator::SetStreamOrder(std::shared_ptr<StreamOrder> order) {
  std::lock_guard<std::mutex> lock(mu_);
  order_ = std::move(order);
}

absl::StatusOr<DeviceBuffer> CachingAllocator::Allocate(size_t bytes,
                                                        MemoryCategory category,
                                                        absl::string_view owner,
                                                        StreamId stream) {
  std::unique_lock<std::mutex> lock(mu_);
  if (++allocate_calls_ == fail_at_call_) {
    fail_at_call_ = 0;
    return OutOfMemory(bytes, category, owner, "injected failure");
  }
  const size_t rounded = RoundUp(std::max<size_t>(bytes, 1), kMinBlockSize);
  if (rounded < bytes || rounded > static_cast<size_t>(capacity_)) {
    return OutOfMemory(bytes, category, owner, "the request alone exceeds the capacity");
  }
  const bool small = rounded <= kSmallRequestMax;
  FreeSet& pool = small ? small_free_ : large_free_;
  const size_t segment_bytes = small ? kSegmentGranularity : RoundUp(rounded, kSegmentGranularity);
  Block* block = FindFreeBlock(pool, rounded, stream);
  absl::StatusOr<Block*> fresh = block;
  if (block == nullptr) fresh = ReserveSegment(segment_bytes, small);
  if (!fresh.ok() && absl::IsResourceExhausted(fresh.status())) {
    // Free blocks that other streams may still use: once those streams are
    // drained (a decision of the call sequence, so a dry run waits where a
    // real run does) they serve anyone or go back to the backend.
    MW_ASSIGN_OR_RETURN(const bool drained, DrainPending(lock));
    if (drained) {
      block = FindFreeBlock(pool, rounded, stream);
      fresh = block != nullptr ? absl::StatusOr<Block*>(block) : ReserveSegment(segment_bytes, small);
    }
  }
  if (!fresh.ok()) {
    if (!absl::IsResourceExhausted(fresh.status())) return fresh.status();
    return OutOfMemory(bytes, category, owner, fresh.status().message());
  }
  block = *fresh;
  MaybeSplit(block, rounded);
  block->stamps.clear();
  block->allocated = true;
  block->requested = bytes;
  block->category = category;
  block->owner = std::string(owner);
  block->stream = stream;
  block->uses.clear();

  const int64_t requested = static_cast<int64_t>(bytes);
  stats_.by_category[static_cast<int>(category)].Add(requested);
  stats_.requested.Add(requested);
  stats_.allocated.Add(static_cast<int64_t>(block->size));
  ++stats_.num_allocations;
  owner_bytes_[{block->owner, category}] += requested;
  Emit(MemoryEvent::Kind::kAlloc, category, block->owner, requested,
       static_cast<int64_t>(block->size), block->address);
  void* data = touch_bytes_ ? reinterpret_cast<void*>(block->address) : nullptr;
  return DeviceBuffer(this, block, data, bytes);
}

void CachingAllocator::InjectFailure(int64_t nth) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_call_ = nth > 0 ? allocate_calls_ + nth : 0;
}

int64_t CachingAllocator::allocate_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocate_calls_;
}

CachingAllocator::Block* CachingAllocator::FindFreeBlock(FreeSet& pool, size_t rounded,
                                                         StreamId user) {
  Segment first;  // before every segment: serial 0, offset 0
  Block key;
  key.size = rounded;
  key.address = 0;
  key.segment = &first;
  for (auto it = pool.lower_bound(&key); it != pool.end(); ++it) {
    if (!Reusable(*it, user)) continue;
    Block* block = *it;
    pool.erase(it);
    return block;
  }
  return nullptr;
}

bool CachingAllocator::Reusable(const Block* block, StreamId user) const {
  for (const StreamStamp& stamp : block->stamps) {
    if (!order_->Ordered(user, stamp)) return false;
  }
  return true;
}

absl::StatusOr<bool> CachingAllocator::DrainPending(std::unique_lock<std::mutex>& lock) {
  const std::vector<StreamId> pending = PendingStreamsLocked();
  if (pending.empty()) return false;
  std::shared_ptr<StreamOrder> order = order_;
  // Unlocked: a host stream's queued work may free buffers.
  lock.unlock();
  const absl::Status drained = order->Drain(pending);
  lock.lock();
  MW_RETURN_IF_ERROR(drained);
  return true;
}

std::vector<StreamId> CachingAllocator::PendingStreamsLocked() const {
  std::vector<StreamId> streams;
  for (const FreeSet* pool : {&small_free_, &large_free_}) {
    for (const Block* block : *pool) {
      for (const StreamStamp& stamp : block->stamps) {
        if (order_->Ordered(kHostOrder, stamp)) continue;
        if (std::find(streams.begin(), streams.end(), stamp.stream) == streams.end()) {
          streams.push_back(stamp.stream);
        }
      }
    }
  }
  return streams;
}

void CachingAllocator::RecordUse(Block* block, StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  MW_CHECK(block->allocated);
  if (order_ == nullptr || stream == block->stream) return;
  if (std::find(block->uses.begin(), block->uses.end(), stream) == block->uses.end()) {
    block->uses.push_back(stream);
  }
}

absl::StatusOr<CachingAllocator::Block*> CachingAllocator::ReserveSegment(
    size_t segment_bytes, bool small) {
  const int64_t want = static_cast<int64_t>(segment_bytes);
  if (stats_.reserved.current + want > capacity_) ReleaseFreeSegments();
  if (stats_.reserved.current + want > capacity_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "reserving a %s segment would exceed the capacity of %s (%s reserved)",
        FormatBytes(want), FormatBytes(capacity_),
        FormatBytes(stats_.reserved.current)));
  }
  absl::StatusOr<uintptr_t> base = source_->Reserve(segment_bytes);
  if (!base.ok() && absl::IsResourceExhausted(base.status())) {
    // The backend itself is full (another process, or a driver reservation):
    // give back the cache and try once more.
    ReleaseFreeSegments();
    base = source_->Reserve(segment_bytes);
  }
  if (!base.ok()) return base.status();

  auto* segment = new Segment;
  segment->base = *base;
  segment->size = segment_bytes;
  segment->small = small;
  segment->serial = next_segment_serial_++;
  auto* block = new Block;
  block->address = *base;
  block->size = segment_bytes;
  block->segment = segment;
  segment->first = block;
  segments_.insert(segment);
  stats_.reserved.Add(want);
  ++stats_.num_segments;
  Emit(MemoryEvent::Kind::kSegmentReserve, MemoryCategory::kOther, "", want,
       want, segment->base);
  return block;
}

void CachingAllocator::MaybeSplit(Block* block, size_t rounded) {
  const size_t remainder = block->size - rounded;
  const size_t min_remainder =
      block->segment->small ? kMinBlockSize : kMinLargeSplitRemainder;
  if (remainder < min_remainder) return;
  auto* rest = new Block;
  rest->address = block->address + rounded;
  rest->size = remainder;
  rest->segment = block->segment;
  rest->stamps = block->stamps;  // a pending block's remainder stays pending
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = rounded;
  (block->segment->small ? small_free_ : large_free_).insert(rest);
}

void CachingAllocator::Free(Block* block) {
  std::lock_guard<std::mutex> lock(mu_);
  MW_CHECK(block->allocated);
  const int64_t requested = static_cast<int64_t>(block->requested);
  stats_.by_category[static_cast<int>(block->category)].Subtract(requested);
  stats_.requested.Subtract(requested);
  stats_.allocated.Subtract(static_cast<int64_t>(block->size));
  --stats_.num_allocations;
  auto owner_it = owner_bytes_.find({block->owner, block->category});
  MW_CHECK(owner_it != owner_bytes_.end());
  owner_it->second -= requested;
  if (owner_it->second == 0) owner_bytes_.erase(owner_it);
  Emit(MemoryEvent::Kind::kFree, block->category, block->owner, requested,
       static_cast<int64_t>(block->size), block->address);

  block->allocated = false;
  block->owner.clear();
  block->stamps.clear();
  if (order_ != nullptr) {
    const uint64_t now = order_->Now();
    if (block->stream != kHostOrder) block->stamps.push_back({block->stream, now});
    for (StreamId use : block->uses) MergeStamp(block->stamps, {use, now});
  }
  block->uses.clear();
  FreeSet& pool = block->segment->small ? small_free_ : large_free_;
  // Coalesce with free neighbours inside the segment; the merged block
  // waits for everything either part waited for.
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    pool.erase(next);
    for (const StreamStamp& stamp : next->stamps) MergeStamp(block->stamps, stamp);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.erase(prev);
    for (const StreamStamp& stamp : block->stamps) MergeStamp(prev->stamps, stamp);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.insert(block);
}

void CachingAllocator::ReleaseFreeSegments() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment* segment = *it;
    Block* block = segment->first;
    // A segment is fully free when one free block spans it, and it may go
    // back to the backend once no stream may still use it.
    if (block->allocated || block->size != segment->size || !Reusable(block, kHostOrder)) {
      ++it;
      continue;
    }
    (segment->small ? small_free_ : large_free_).erase(block);
    source_->Release(segment->base, segment->size);
    const int64_t bytes = static_cast<int64_t>(segment->size);
    stats_.reserved.Subtract(bytes);
    --stats_.num_segments;
    Emit(MemoryEvent::Kind::kSegmentRelease, MemoryCategory::kOther, "", bytes,
         bytes, segment->base);
    delete block;
    delete segment;
    it = segments_.erase(it);
  }
}

absl::Status CachingAllocator::EmptyCache() {
  std::unique_lock<std::mutex> lock(mu_);
  MW_RETURN_IF_ERROR(DrainPending(lock).status());
  ReleaseFreeSegments();
  return absl::OkStatus();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<std::pair<std::pair<std::string, MemoryCategory>, int64_t>>
CachingAllocator::OwnerBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::pair<std::string, MemoryCategory>, int64_t>> out(
      owner_bytes_.begin(), owner_bytes_.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second > b.second;
  });
  return out;
}

std::string CachingAllocator::DescribeOccupancy(int top_owners) const {
  std::lock_guard<std::mutex> lock(mu_);
  return DescribeOccupancyLocked(top_owners);
}

std::string CachingAllocator::DescribeOccupancyLocked(int top_owners) const {
  std::string out = absl::StrFormat(
      "%s has a capacity of %s: %s reserved, %s in live blocks (%s requested, "
      "%d allocations), %s reserved but free",
      device_name_, FormatBytes(capacity_), FormatBytes(stats_.reserved.current),
      FormatBytes(stats_.allocated.current), FormatBytes(stats_.requested.current),
      stats_.num_allocations,
      FormatBytes(stats_.reserved.current - stats_.allocated.current));
  std::string by_category;
  for (MemoryCategory category : kAllMemoryCategories) {
    const int64_t bytes = stats_.by_category[static_cast<int>(category)].current;
    if (bytes == 0) continue;
    absl::StrAppend(&by_category, by_category.empty() ? "" : ", ",
                    MemoryCategoryName(category), " ", FormatBytes(bytes));
  }
  absl::StrAppend(&out, ". By category: ",
                  by_category.empty() ? "nothing allocated" : by_category);
  std::vector<std::pair<std::pair<std::string, MemoryCategory>, int64_t>> owners(
      owner_bytes_.begin(), owner_bytes_.end());
  std::stable_sort(owners.begin(), owners.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (!owners.empty() && top_owners > 0) {
    absl::StrAppend(&out, ". Largest owners: ");
    const int shown = std::min<int>(top_owners, owners.size());
    for (int i = 0; i < shown; ++i) {
      const auto& [key, bytes] = owners[i];
      absl::StrAppendFormat(&out, "%s'%s' (%s) %s", i == 0 ? "" : ", ",
                            key.first.empty() ? "<no owner>" : key.first,
                            MemoryCategoryName(key.second), FormatBytes(bytes));
    }
    if (shown < static_cast<int>(owners.size())) {
      absl::StrAppendFormat(&out, " and %d more", owners.size() - shown);
    }
  }
  return out;
}

absl::Status CachingAllocator::OutOfMemory(size_t bytes, MemoryCategory category,
                                           absl::string_view owner,
                                           absl::string_view why) {
  ++stats_.num_ooms;
  Emit(MemoryEvent::Kind::kOutOfMemory, category, owner,
       static_cast<int64_t>(bytes), 0, 0);
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory on %s: cannot allocate %s (%d bytes) of %s for '%s': %s. "
      "%s",
      device_name_, FormatBytes(static_cast<int64_t>(bytes)), bytes,
      MemoryCategoryName(category), owner, why, DescribeOccupancyLocked(5)));
}

void CachingAllocator::Emit(MemoryEvent::Kind kind, MemoryCategory category,
                            absl::string_view owner, int64_t bytes,
                            int64_t block_bytes, uintptr_t address) {
  const MemoryEvent event{kind,
                          next_sequence_++,
                          category,
                          owner,
                          bytes,
                          block_bytes,
                          address,
                          stats_.requested.current,
                          stats_.reserved.current};
  for (MemoryListener* listener : listeners_) listener->OnMemoryEvent(event);
}

void CachingAllocator::AddListener(MemoryListener* listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.push_back(listener);
}

void CachingAllocator::AddListener(
    MemoryListener* listener,
    const std::function<void(const AllocatorStats&,
                             const std::map<std::pair<std::string, MemoryCategory>, int64_t>&)>&
        snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  snapshot(stats_, owner_bytes_);
  listeners_.push_back(listener);
}

void CachingAllocator::RemoveListener(MemoryListener* listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener),
                   listeners_.end());
}

}  // namespace memwall
