#include "runtime/host_device.h"

#include <cstdlib>
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// Host segments are page aligned so that kernels may use aligned vector
// loads and so they could be page-locked for DMA later.
constexpr size_t kHostSegmentAlignment = 4096;

class HostSegmentSource final : public SegmentSource {
 public:
  absl::StatusOr<uintptr_t> Reserve(size_t bytes) override {
    void* base = std::aligned_alloc(kHostSegmentAlignment, bytes);
    if (base == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("aligned_alloc of ", bytes, " bytes failed"));
    }
    return reinterpret_cast<uintptr_t>(base);
  }
  void Release(uintptr_t base, size_t) override {
    std::free(reinterpret_cast<void*>(base));
  }
};

// Hands out addresses that are never dereferenced: the meta backend keeps
// the allocator's books (rounding, caching, fragmentation) without bytes.
class MetaSegmentSource final : public SegmentSource {
 public:
  absl::StatusOr<uintptr_t> Reserve(size_t bytes) override {
    const uintptr_t base = next_;
    next_ += bytes;
    return base;
  }
  void Release(uintptr_t, size_t) override {}

 private:
  // Far from any real mapping, so a stray dereference faults.
  uintptr_t next_ = uintptr_t{1} << 48;
};

// Host events count generations: Record() on a stream asks for one more,
// and the stream completes it when its work up to that point has run. An
// event is complete when every generation asked for has completed. The
// counters live in a shared state that a worker stream's queued record or
// wait holds on to, so an event may be destroyed with work still queued
// against it, as a CUDA event may.
//
// The host backend's threads synchronise with std::mutex, not absl::Mutex:
// ThreadSanitizer understands pthread mutexes but not Debian's prebuilt,
// uninstrumented Abseil, under which every guarded access reads as a race.
struct Generations {
  // Asks for one more generation; returns its number.
  uint64_t Ask() {
    std::lock_guard<std::mutex> lock(mu);
    return ++recorded;
  }
  void Complete(uint64_t generation) {
    std::lock_guard<std::mutex> lock(mu);
    completed = std::max(completed, generation);
    done.notify_all();
  }
  // Blocks until `generation` has completed.
  void Await(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return completed >= generation; });
  }
  uint64_t Recorded() {
    std::lock_guard<std::mutex> lock(mu);
    return recorded;
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mu);
    return completed >= recorded;
  }

  std::mutex mu;
  std::condition_variable done;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;
};

class HostEvent final : public Event {
 public:
  absl::Status SynchronizeImpl() override {
    state_->Await(state_->Recorded());
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Query() override { return state_->Done(); }
  void* native_handle() const override { return nullptr; }
  const std::shared_ptr<Generations>& state() const { return state_; }

 private:
  const std::shared_ptr<Generations> state_ = std::make_shared<Generations>();
};

HostEvent* AsHostEvent(const Event& event) {
  return dynamic_cast<HostEvent*>(const_cast<Event*>(&event));
}

absl::Status ForeignEvent(absl::string_view call) {
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": the event belongs to another backend"));
}

// Work runs when it is enqueued, so the stream is always idle. On meta,
// where nothing runs, the stream standing for an asynchronous one reports
// itself asynchronous, so that its users take the decisions a real run
// takes (prefetching, buffers kept while a collective is in flight) and
// the dry run allocates what the real run does.
class InOrderStream final : public Stream {
 public:
  explicit InOrderStream(bool reports_asynchronous = false)
      : reports_asynchronous_(reports_asynchronous) {}
  absl::Status SynchronizeImpl() override { return absl::OkStatus(); }
  absl::Status RecordImpl(Event& event) override {
    HostEvent* host = AsHostEvent(event);
    if (host == nullptr) return ForeignEvent("Stream::Record");
    host->state()->Complete(host->state()->Ask());
    return absl::OkStatus();
  }
  absl::Status WaitImpl(const Event& event) override {
    // Later work runs at once, so the wait happens now (a stream-ordered
    // wait, not counted as the caller's host synchronisation).
    HostEvent* host = AsHostEvent(event);
    if (host == nullptr) return ForeignEvent("Stream::Wait");
    host->state()->Await(host->state()->Recorded());
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }
  absl::Status RunHost(std::function<absl::Status()> work) override { return work(); }
  bool asynchronous() const override { return reports_asynchronous_; }

 private:
  const bool reports_asynchronous_;
};

// A host stream with a thread of its own that runs the stream's work in
// enqueue order. The first failure is kept and returned by Synchronize().
class WorkerStream final : public Stream {
 public:
  WorkerStream() : thread_([this] { Loop(); }) {}
  ~WorkerStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_one();
    thread_.join();
  }

  absl::Status SynchronizeImpl() override {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return IdleLocked(); });
    return first_error_;
  }
  absl::Status RecordImpl(Event& event) override {
    HostEvent* host = AsHostEvent(event);
    if (host == nullptr) return ForeignEvent("Stream::Record");
    std::shared_ptr<Generations> state = host->state();
    const uint64_t generation = state->Ask();
    return RunHost([state, generation] {
      state->Complete(generation);
      return absl::OkStatus();
    });
  }
  absl::Status WaitImpl(const Event& event) override {
    HostEvent* host = AsHostEvent(event);
    if (host == nullptr) return ForeignEvent("Stream::Wait");
    std::shared_ptr<Generations> state = host->state();
    const uint64_t generation = state->Recorded();
    return RunHost([state, generation] {
      state->Await(generation);
      return absl::OkStatus();
    });
  }
  void* native_handle() const override { return nullptr; }
  absl::Status RunHost(std::function<absl::Status()> work) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    work_.notify_one();
    return absl::OkStatus();
  }
  bool asynchronous() const override { return true; }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !running_;
  }
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [this] { return HasWorkOrStopping(); });
      if (queue_.empty()) return;  // stopping, and all work done
      std::function<absl::Status()> work = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      absl::Status status = work();
      lock.lock();
      running_ = false;
      if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
      if (queue_.empty()) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;  // the worker waits for work or stopping
  std::condition_variable idle_;  // Synchronize() waits for an empty queue
  std::deque<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class HostDevice final : public Device {
 public:
  HostDevice(Backend backend, std::unique_ptr<CachingAllocator> allocator,
             std::unique_ptr<CachingAllocator> pinned_allocator)
      : Device(std::move(allocator), std::move(pinned_allocator)), backend_(backend) {}

  Backend backend() const override { return backend_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return Counted(std::unique_ptr<Stream>(new InOrderStream()));
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateAsyncStream() override {
    if (backend_ == Backend::kMeta) {
      return Counted(std::unique_ptr<Stream>(new InOrderStream(/*reports_asynchronous=*/true)));
    }
    return Counted(std::unique_ptr<Stream>(new WorkerStream()));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return Counted(std::unique_ptr<Event>(new HostEvent()));
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         Stream& stream) override {
    if (stream.native_handle() != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": CopyAsync on a stream of another backend"));
    }
    if (backend_ != Backend::kHost || bytes == 0) return absl::OkStatus();
    return stream.RunHost([dst, src, bytes] {
      std::memmove(dst, src, bytes);
      return absl::OkStatus();
    });
  }
  absl::Status SynchronizeImpl() override {
    // Every stream, the worker-thread ones included (they are the ones with
    // work in flight).
    for (Stream* stream : stream_order()->Streams()) {
      MW_RETURN_IF_ERROR(DrainUncounted(*stream));
    }
    return absl::OkStatus();
  }

 private:
  const Backend backend_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateHostOrMetaDevice(
    const DeviceOptions& options) {
  MW_CHECK(options.backend == Backend::kHost || options.backend == Backend::kMeta);
  const bool host = options.backend == Backend::kHost;
  auto make_source = [host]() -> std::unique_ptr<SegmentSource> {
    if (host) return std::make_unique<HostSegmentSource>();
    return std::make_unique<MetaSegmentSource>();
  };
  const std::string name = absl::StrCat(BackendName(options.backend), ":", options.ordinal);
  auto allocator = std::make_unique<CachingAllocator>(name, options.capacity_bytes,
                                                      make_source(), /*touch_bytes=*/host);
  // On host, "pinned" memory is ordinary host memory: copies are memcpy.
  std::unique_ptr<CachingAllocator> pinned;
  if (options.pinned_capacity_bytes > 0) {
    pinned = std::make_unique<CachingAllocator>(absl::StrCat(name, ":pinned"),
                                                options.pinned_capacity_bytes, make_source(),
                                                /*touch_bytes=*/host);
  }
  return std::unique_ptr<Device>(
      new HostDevice(options.backend, std::move(allocator), std::move(pinned)));
}

}  // namespace memwall
