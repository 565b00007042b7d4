// The device seam: one narrow interface, three backends.
//
//   host  host RAM posing as device memory, with an enforced capacity;
//         streams execute in order as work is enqueued.
//   meta  accounting only: allocations succeed or fail against the capacity
//         exactly as on a real device, but no bytes exist (data() is null)
//         and no arithmetic runs. Dry runs at any scale use it.
//   cuda  a GPU: device memory through the caching allocator, CUDA streams
//         and events, asynchronous copies with pinned host memory.
//
// Engine code is written once against Device/Stream/Event; code that is
// correct on cuda (every cross-stream dependency expressed with an Event) is
// correct on host, where streams are in order and synchronous.
#ifndef MEMWALL_RUNTIME_DEVICE_H_
#define MEMWALL_RUNTIME_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/memory.h"

namespace memwall {

enum class Backend : uint8_t { kHost, kMeta, kCuda };

// "host", "meta" or "cuda".
absl::string_view BackendName(Backend backend);
// Parses a backend name; the error names the accepted values.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);

class Device;
class Event;

// An in-order queue of device work. Not thread-safe: one thread enqueues.
// Errors of work that ran asynchronously surface at the next Synchronize()
// and every later one (they are sticky, as CUDA's are). Record, Wait and
// Synchronize also tell the device's StreamOrder what the host knows about
// the order of work, which the allocator's stream-ordered reuse reads.
class Stream {
 public:
  // Backends drain the stream's work in their destructors, before this one
  // tells the device's stream order that the stream is gone.
  virtual ~Stream();
  // Blocks until all work enqueued so far has completed. Counted in the
  // creating device's host_synchronizations().
  absl::Status Synchronize();
  // Marks the current end of this stream in `event`.
  absl::Status Record(Event& event);
  // Work enqueued after this call waits for `event`'s last Record. Waiting
  // on an event never recorded is a no-op, as in CUDA.
  absl::Status Wait(const Event& event);
  // This stream's number on its device (kHostOrder for a stream no device
  // created, which the allocator then treats as host order).
  StreamId id() const { return id_; }
  // cudaStream_t on cuda; nullptr on host and meta.
  virtual void* native_handle() const = 0;
  // Runs host work (a CPU kernel, a memcpy, an MPI call) in this stream's
  // order: at once on a synchronous stream, returning its status; on the
  // stream's own thread for an asynchronous host stream, returning OK (a
  // failure surfaces at Synchronize()). Asynchronous work must own what it
  // captures. kUnimplemented on cuda streams (their work is device work).
  virtual absl::Status RunHost(std::function<absl::Status()> work) = 0;
  // Whether enqueued work may still be running when the enqueuing call
  // returns (cuda streams and asynchronous host streams).
  virtual bool asynchronous() const = 0;

 protected:
  virtual absl::Status SynchronizeImpl() = 0;
  virtual absl::Status RecordImpl(Event& event) = 0;
  virtual absl::Status WaitImpl(const Event& event) = 0;

 private:
  friend class Device;
  std::atomic<int64_t>* host_waits_ = nullptr;  // the device's counter
  std::shared_ptr<StreamOrder> order_;          // the device's, when it made this stream
  StreamId id_ = kHostOrder;
};

// A point in a stream's work.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks until the recorded work has completed (no-op if never recorded).
  // Counted in the creating device's host_synchronizations().
  absl::Status Synchronize();
  // Whether the recorded work has completed (true if never recorded).
  virtual absl::StatusOr<bool> Query() = 0;
  // cudaEvent_t on cuda; nullptr on host and meta.
  virtual void* native_handle() const = 0;

 protected:
  virtual absl::Status SynchronizeImpl() = 0;

 private:
  friend class Device;
  friend class Stream;
  std::atomic<int64_t>* host_waits_ = nullptr;  // the device's counter
  std::shared_ptr<StreamOrder> order_;
  EventMark mark_;
};

struct DeviceOptions {
  Backend backend = Backend::kHost;
  // GPU index for cuda; used in the device name on every backend.
  int ordinal = 0;
  // The enforced capacity in bytes. Required (> 0) for host and meta; on
  // cuda, 0 means the device's free memory, and a larger value is rejected.
  int64_t capacity_bytes = 0;
  // Capacity of the device's pinned host pool in bytes (host memory is
  // finite too); 0 means the device has no pinned pool.
  int64_t pinned_capacity_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual Backend backend() const = 0;
  // The GPU's index on cuda (what CUDA and DLPack call the device); 0 on
  // host and meta.
  virtual int ordinal() const { return 0; }
  // "host:0", "meta:0", "cuda:1".
  const std::string& name() const { return allocator_->device_name(); }
  // False on meta: buffers have no bytes and kernels do nothing.
  bool holds_bytes() const { return backend() != Backend::kMeta; }

  // Allocates device memory for work on the current stream (StreamGuard);
  // see CachingAllocator::Allocate. Thread-safe.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, MemoryCategory category,
                                        absl::string_view owner) {
    return allocator_->Allocate(bytes, category, owner, current_stream());
  }
  // ... for work on `stream` (a stream of this device).
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, MemoryCategory category,
                                        absl::string_view owner, const Stream& stream) {
    return allocator_->Allocate(bytes, category, owner, stream.id());
  }

  // While the returned guard lives, allocations that name no stream are for
  // work on `stream` (the stream the caller computes on: PyTorch's current
  // stream); before and after, host order. One thread drives a device, so
  // the setting is the device's, not the thread's. Guards nest.
  class StreamGuard {
   public:
    StreamGuard(Device& device, const Stream& stream)
        : device_(device), previous_(device.current_stream_.exchange(stream.id())) {}
    ~StreamGuard() { device_.current_stream_.store(previous_); }
    StreamGuard(const StreamGuard&) = delete;
    StreamGuard& operator=(const StreamGuard&) = delete;

   private:
    Device& device_;
    const StreamId previous_;
  };
  StreamId current_stream() const { return current_stream_.load(); }
  const std::shared_ptr<StreamOrder>& stream_order() const { return order_; }
  CachingAllocator& allocator() { return *allocator_; }
  const CachingAllocator& allocator() const { return *allocator_; }

  // Allocates host memory that this device copies to and from
  // asynchronously: page-locked (cudaHostAlloc) on cuda, aligned host memory
  // on host, no bytes on meta. It comes from the pinned pool, a caching
  // allocator of its own ("<device>:pinned") with the same categories,
  // counters and OOM reports as device memory. Errors: kFailedPrecondition
  // when the device was created without a pinned pool; kResourceExhausted
  // when the pool is full. Thread-safe.
  absl::StatusOr<DeviceBuffer> AllocatePinned(size_t bytes, MemoryCategory category,
                                              absl::string_view owner);
  // The pinned pool's allocator, or null when there is none.
  CachingAllocator* pinned_allocator() { return pinned_allocator_.get(); }

  // A stream whose work runs as it is enqueued on host and meta (so
  // RunHost returns the work's status), and asynchronously on cuda.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // A stream that runs its work in order while the caller goes on: a stream
  // with its own thread on host (how host communication overlaps compute),
  // a CUDA stream on cuda; on meta nothing runs, but the stream reports
  // itself asynchronous, as the stream of a real run would.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateAsyncStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
  // A Stream over a native stream the caller owns (cudaStream_t on cuda:
  // PyTorch's current stream), so that work memwall enqueues for the caller
  // is in that stream's order with the caller's own, and memwall's other
  // streams order themselves against it with events. Destroying the
  // returned Stream drains it (as every Stream) and leaves the native
  // stream alive. Null on cuda is CUDA's legacy default stream.
  // kInvalidArgument on host and meta, whose streams have no native handle.
  virtual absl::StatusOr<std::unique_ptr<Stream>> WrapStream(void* native);

  // Copies `bytes` from `src` to `dst`, ordered on `stream`. Either pointer
  // may be device memory of this device or host memory (pinned host memory
  // makes cuda copies truly asynchronous). On meta nothing is copied.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                                 Stream& stream) = 0;
  // Blocks until all work on all of this device's streams has completed.
  absl::Status Synchronize();

  // Host synchronisations so far (COUNT): every Synchronize() of this
  // device and of the streams and events it created, including those that
  // kernels returning a value to the host make (kernels/ops.h). The host
  // waiting for the device is what a GPU step must do rarely; the count is
  // the same on every backend for the same calls, so a dry run counts a
  // real run's. (A host stream's Wait(event) blocks the host too, but on
  // cuda it does not, so it is not counted.) Thread-safe.
  int64_t host_synchronizations() const { return host_waits_.load(std::memory_order_relaxed); }
  // Counts `n` host synchronisations a dry run does not perform (work it
  // counts as repeats of work it ran once). Thread-safe.
  void CountHostSynchronizations(int64_t n);

  // Kernels dispatched to this device so far (kernels/ counts each op it
  // enqueues, on every backend, meta included: a dry run knows how many
  // launches a step makes, which the step-time model charges). Thread-safe.
  void CountLaunch(int64_t n = 1);
  int64_t launches() const { return launches_.load(std::memory_order_relaxed); }

  // The calling thread's share of the counts above, on every device it
  // used: what a piece of work made, measured from before it to after it,
  // whatever other threads (a communication thread, the CPU update
  // thread) count meanwhile. A dry run that runs one of many alike pieces
  // and counts the rest reads these.
  static int64_t host_synchronizations_by_this_thread();
  static int64_t launches_by_this_thread();

 protected:
  // `pinned_allocator` may be null (no pinned pool).
  Device(std::unique_ptr<CachingAllocator> allocator,
         std::unique_ptr<CachingAllocator> pinned_allocator);
  virtual absl::Status SynchronizeImpl() = 0;
  // Backends pass every stream and event they create through these, so
  // that their waits count in host_synchronizations() and their order is
  // known to the allocator.
  std::unique_ptr<Stream> Counted(std::unique_ptr<Stream> stream);
  std::unique_ptr<Event> Counted(std::unique_ptr<Event> event);
  // Blocks until `stream`'s work has completed, without counting a host
  // synchronisation (a backend's SynchronizeImpl waiting for its streams).
  static absl::Status DrainUncounted(Stream& stream) { return stream.SynchronizeImpl(); }

 private:
  // Declared before the allocators, which read it until they are destroyed.
  std::shared_ptr<StreamOrder> order_ = std::make_shared<StreamOrder>();
  std::atomic<StreamId> current_stream_{kHostOrder};
  // Declared last so they are destroyed after the derived class's members.
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CachingAllocator> pinned_allocator_;
  std::atomic<int64_t> launches_{0};
  std::atomic<int64_t> host_waits_{0};
};

// Creates a device. Errors: kInvalidArgument for a bad capacity or ordinal,
// kUnimplemented for cuda in a build made with --config=nocuda,
// kUnavailable for cuda when no GPU (or no driver) is present.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

// Number of usable GPUs: 0 when there is none, no driver, or this build has
// no CUDA.
int CudaDeviceCount();
// CudaDeviceCount() > 0.
bool CudaDeviceAvailable();
// The GPU rank `rank` of a job uses: rank modulo the usable GPUs (the ranks
// of a node share its GPUs round-robin). kUnavailable without a GPU.
absl::StatusOr<int> CudaOrdinalForRank(int rank);
// Bytes free on GPU `ordinal` now (kUnavailable without CUDA or a GPU).
absl::StatusOr<int64_t> CudaFreeBytes(int ordinal);

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_DEVICE_H_
