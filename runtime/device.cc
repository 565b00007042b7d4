#include "runtime/device.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/host_device.h"
#include "runtime/status.h"
#include "runtime/units.h"

#if MEMWALL_HAS_CUDA
#include "runtime/cuda/cuda_device.h"
#endif

namespace memwall {

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kHost: return "host";
    case Backend::kMeta: return "meta";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "host") return Backend::kHost;
  if (name == "meta") return Backend::kMeta;
  if (name == "cuda") return Backend::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("backend: expected one of host, meta, cuda; got '", name, "'"));
}

namespace {

// The calling thread's counts (Device::*_by_this_thread).
thread_local int64_t thread_host_waits = 0;
thread_local int64_t thread_launches = 0;

void CountWait(std::atomic<int64_t>* device_waits, int64_t n) {
  if (device_waits == nullptr) return;
  device_waits->fetch_add(n, std::memory_order_relaxed);
  thread_host_waits += n;
}

}  // namespace

Stream::~Stream() {
  if (order_ != nullptr) order_->Unregister(id_);
}

absl::Status Stream::Synchronize() {
  CountWait(host_waits_, 1);
  MW_RETURN_IF_ERROR(SynchronizeImpl());
  if (order_ != nullptr) order_->OnStreamSynchronize(id_);
  return absl::OkStatus();
}

absl::Status Stream::Record(Event& event) {
  MW_RETURN_IF_ERROR(RecordImpl(event));
  if (order_ != nullptr) event.mark_ = order_->OnRecord(id_);
  return absl::OkStatus();
}

absl::Status Stream::Wait(const Event& event) {
  MW_RETURN_IF_ERROR(WaitImpl(event));
  if (order_ != nullptr) order_->OnWait(id_, event.mark_);
  return absl::OkStatus();
}

absl::Status Event::Synchronize() {
  CountWait(host_waits_, 1);
  MW_RETURN_IF_ERROR(SynchronizeImpl());
  if (order_ != nullptr) order_->OnHostWait(mark_);
  return absl::OkStatus();
}

Device::Device(std::unique_ptr<CachingAllocator> allocator,
               std::unique_ptr<CachingAllocator> pinned_allocator)
    : allocator_(std::move(allocator)), pinned_allocator_(std::move(pinned_allocator)) {
  allocator_->SetStreamOrder(order_);
  if (pinned_allocator_ != nullptr) pinned_allocator_->SetStreamOrder(order_);
}

std::unique_ptr<Stream> Device::Counted(std::unique_ptr<Stream> stream) {
  stream->host_waits_ = &host_waits_;
  stream->order_ = order_;
  stream->id_ = order_->Register(stream.get());
  return stream;
}

std::unique_ptr<Event> Device::Counted(std::unique_ptr<Event> event) {
  event->host_waits_ = &host_waits_;
  event->order_ = order_;
  return event;
}

absl::StatusOr<std::unique_ptr<Stream>> Device::WrapStream(void* native) {
  (void)native;
  return absl::InvalidArgumentError(absl::StrCat(
      name(), ": WrapStream: a ", BackendName(backend()),
      " device's streams have no native handle (only cuda wraps a caller's stream)"));
}

absl::Status Device::Synchronize() {
  CountWait(&host_waits_, 1);
  MW_RETURN_IF_ERROR(SynchronizeImpl());
  order_->OnDeviceSynchronize();
  return absl::OkStatus();
}

void Device::CountHostSynchronizations(int64_t n) { CountWait(&host_waits_, n); }

void Device::CountLaunch(int64_t n) {
  launches_.fetch_add(n, std::memory_order_relaxed);
  thread_launches += n;
}

int64_t Device::host_synchronizations_by_this_thread() { return thread_host_waits; }
int64_t Device::launches_by_this_thread() { return thread_launches; }

absl::StatusOr<DeviceBuffer> Device::AllocatePinned(size_t bytes, MemoryCategory category,
                                                     absl::string_view owner) {
  if (pinned_allocator_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), " has no pinned host pool (create it with DeviceOptions.pinned_capacity_bytes > 0)"));
  }
  // Host order: the host itself reads and writes pinned memory (the CPU
  // optimizer), so its blocks are not the current stream's.
  return pinned_allocator_->Allocate(bytes, category, owner);
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  if (options.ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ordinal: expected >= 0, got ", options.ordinal));
  }
  if (options.pinned_capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned capacity: expected >= 0 bytes, got ", options.pinned_capacity_bytes));
  }
  if (options.capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device capacity: expected >= 0 bytes, got ", options.capacity_bytes));
  }
  switch (options.backend) {
    case Backend::kHost:
    case Backend::kMeta:
      if (options.capacity_bytes == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device capacity: the ", BackendName(options.backend),
            " backend needs a capacity in bytes (e.g. ", 256 * kMiB,
            " for 256 MiB)"));
      }
      return CreateHostOrMetaDevice(options);
    case Backend::kCuda:
#if MEMWALL_HAS_CUDA
      return CreateCudaDevice(options);
#else
      return absl::UnimplementedError(
          "the cuda backend is not in this build (it was built with "
          "--config=nocuda)");
#endif
  }
  return absl::InvalidArgumentError("unknown backend");
}

#if !MEMWALL_HAS_CUDA
int CudaDeviceCount() { return 0; }

absl::StatusOr<int64_t> CudaFreeBytes(int ordinal) {
  return absl::UnavailableError(absl::StrCat(
      "cuda:", ordinal, ": this build has no CUDA (it was built with --config=nocuda)"));
}
#endif

bool CudaDeviceAvailable() { return CudaDeviceCount() > 0; }

absl::StatusOr<int> CudaOrdinalForRank(int rank) {
  const int gpus = CudaDeviceCount();
  if (gpus < 1) return absl::UnavailableError("--backend cuda: no usable GPU on this machine");
  return rank % gpus;
}

}  // namespace memwall
