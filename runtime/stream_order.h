// What the host knows about the order of work on a device's streams, for
// the caching allocator's stream-ordered reuse.
//
// Note [Stream-ordered reuse]
// Rationale: a block freed while another stream's queued work may still
// read it (a gradient bucket a reduction on the communication stream reads)
// must not be handed to work that could run before that read. PyTorch's
// record_stream asks the block's events whether they have completed when an
// allocation looks for a block, so which block an allocation gets depends on
// timing; memwall's dry run must choose the blocks the real run chooses. So
// the allocator reasons only from what the host has been told, in calls:
// - every allocation belongs to a stream: the one it names, or the device's
//   current stream (Device::StreamGuard), or host order (kHostOrder: the host
//   or a stream that runs work as it is enqueued, the default);
// - DeviceBuffer::RecordStream(s) adds another stream that uses the block;
// - freeing stamps the block with each of its streams and the clock, which
//   every Record and host synchronisation advances;
// - stream T may reuse the block once T is known to be ordered after each
//   stamp: T is that stream, or T waited (Stream::Wait) for an event
//   recorded on it after the stamp, or the host synchronised with it after
//   the stamp (host order needs the latter).
// Approach: the clock and the per-pair "T has waited for S up to mark m"
// table live here, updated by Stream::Record/Wait/Synchronize,
// Event::Synchronize and Device::Synchronize (device.h). They are facts of
// the call sequence, the same on meta, host and cuda.
// Limitations: order is transitive only through a stream the host
// synchronised (T waiting for S, which waited for U, does not tell T about
// U): conservative, so a block may wait longer than it must, never shorter.
#ifndef MEMWALL_RUNTIME_STREAM_ORDER_H_
#define MEMWALL_RUNTIME_STREAM_ORDER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace memwall {

class Stream;

// A stream of one device, numbered from 1 in creation order.
using StreamId = uint64_t;
// Work ordered by the host itself: complete when the call that enqueued it
// returns, as far as the allocator is concerned only after the host has
// synchronised with every stream that used a block.
inline constexpr StreamId kHostOrder = 0;

// An event's last Record: on which stream, at which clock mark.
struct EventMark {
  StreamId stream = kHostOrder;
  uint64_t mark = 0;  // 0: never recorded
};

// A block's last use by one stream: the clock when the block was freed.
struct StreamStamp {
  StreamId stream = kHostOrder;
  uint64_t clock = 0;
};

// One per device, shared by its device and pinned allocators and its
// streams (which hold it by shared_ptr, so a stream may outlive the device).
// Thread-safe.
class StreamOrder {
 public:
  // Registers a stream the device created; `stream` stays valid until
  // Unregister, which the stream's destructor calls once its work has
  // drained (backends drain before that).
  StreamId Register(Stream* stream);
  void Unregister(StreamId id);

  // The clock now: a freed block's stamp.
  uint64_t Now() const;
  // A Record on `stream`: advances the clock; the event's new mark.
  EventMark OnRecord(StreamId stream);
  // `waiter`'s later work runs after `event`'s recorded work.
  void OnWait(StreamId waiter, const EventMark& event);
  // The host has seen `event`'s recorded work complete.
  void OnHostWait(const EventMark& event);
  // The host has seen all work enqueued on `stream` so far complete.
  void OnStreamSynchronize(StreamId stream);
  // ... on every stream of the device.
  void OnDeviceSynchronize();

  // Whether work enqueued on `user` from now on runs after the work
  // `stamp.stream` had enqueued when the clock read `stamp.clock`.
  bool Ordered(StreamId user, const StreamStamp& stamp) const;

  // Host-synchronises every registered stream named in `streams` (each
  // counted in the device's host synchronisations). The caller must not
  // hold a lock that the streams' queued work takes (a host stream's work
  // may free buffers).
  absl::Status Drain(const std::vector<StreamId>& streams);
  // The registered streams now (for a device-wide synchronisation).
  std::vector<Stream*> Streams() const;

 private:
  uint64_t KnownLocked(StreamId user, StreamId stream) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  // Atomic: Record (on every event) and Now() (on every free) touch only it.
  std::atomic<uint64_t> clock_{0};
  StreamId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<StreamId, Stream*> streams_ ABSL_GUARDED_BY(mu_);
  // (waiter, stream) -> the highest mark of `stream` that `waiter` waited for.
  std::map<std::pair<StreamId, StreamId>, uint64_t> waited_ ABSL_GUARDED_BY(mu_);
  // stream -> the highest mark the host has seen complete on it.
  std::map<StreamId, uint64_t> host_seen_ ABSL_GUARDED_BY(mu_);
  // The clock at the last device-wide synchronisation.
  uint64_t device_seen_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_STREAM_ORDER_H_
