#include "runtime/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

class CudaSegmentSource final : public SegmentSource {
 public:
  explicit CudaSegmentSource(int ordinal) : ordinal_(ordinal) {}
  absl::StatusOr<uintptr_t> Reserve(size_t bytes) override {
    MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    void* base = nullptr;
    MW_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes));
    return reinterpret_cast<uintptr_t>(base);
  }
  void Release(uintptr_t base, size_t) override {
    // The allocator only releases segments with no live blocks; the caller
    // synchronised any stream that used them before freeing the blocks.
    (void)cudaSetDevice(ordinal_);
    (void)cudaFree(reinterpret_cast<void*>(base));
  }

 private:
  const int ordinal_;
};

// Page-locked host memory, portable across devices, so copies from it are
// true DMA and overlap kernels.
class CudaPinnedSegmentSource final : public SegmentSource {
 public:
  absl::StatusOr<uintptr_t> Reserve(size_t bytes) override {
    void* base = nullptr;
    MW_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&base, bytes, cudaHostAllocPortable));
    return reinterpret_cast<uintptr_t>(base);
  }
  void Release(uintptr_t base, size_t) override {
    (void)cudaFreeHost(reinterpret_cast<void*>(base));
  }
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  absl::Status SynchronizeImpl() override {
    return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }
  absl::StatusOr<bool> Query() override {
    const cudaError_t code = cudaEventQuery(event_);
    if (code == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    MW_RETURN_IF_ERROR(CudaStatus(code, "cudaEventQuery"));
    return true;
  }
  void* native_handle() const override { return event_; }

 private:
  cudaEvent_t event_;
};

class CudaStream final : public Stream {
 public:
  // `owned`: destroyed with this object (a stream memwall created); not
  // owned: the caller's (Device::WrapStream).
  CudaStream(cudaStream_t stream, bool owned) : stream_(stream), owned_(owned) {}
  // Drained first: the allocator then treats blocks this stream used as
  // free for everyone (Note [Stream-ordered reuse]).
  ~CudaStream() override {
    (void)cudaStreamSynchronize(stream_);
    if (owned_) (void)cudaStreamDestroy(stream_);
  }
  absl::Status SynchronizeImpl() override {
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  absl::Status RecordImpl(Event& event) override {
    if (dynamic_cast<CudaEvent*>(&event) == nullptr) {
      return absl::InvalidArgumentError(
          "Stream::Record: the event belongs to another backend");
    }
    return CudaStatus(
        cudaEventRecord(static_cast<cudaEvent_t>(event.native_handle()), stream_),
        "cudaEventRecord");
  }
  absl::Status WaitImpl(const Event& event) override {
    if (dynamic_cast<const CudaEvent*>(&event) == nullptr) {
      return absl::InvalidArgumentError(
          "Stream::Wait: the event belongs to another backend");
    }
    return CudaStatus(
        cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event.native_handle()), 0),
        "cudaStreamWaitEvent");
  }
  void* native_handle() const override { return stream_; }
  absl::Status RunHost(std::function<absl::Status()>) override {
    return absl::UnimplementedError(
        "Stream::RunHost: a cuda stream runs device work; host work goes on a host stream");
  }
  bool asynchronous() const override { return true; }

 private:
  cudaStream_t stream_;
  const bool owned_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::unique_ptr<CachingAllocator> allocator,
             std::unique_ptr<CachingAllocator> pinned_allocator)
      : Device(std::move(allocator), std::move(pinned_allocator)), ordinal_(ordinal) {}

  Backend backend() const override { return Backend::kCuda; }
  int ordinal() const override { return ordinal_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaStream_t stream = nullptr;
    MW_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return Counted(std::unique_ptr<Stream>(new CudaStream(stream, /*owned=*/true)));
  }
  absl::StatusOr<std::unique_ptr<Stream>> WrapStream(void* native) override {
    // Null is CUDA's legacy default stream (PyTorch's default): memwall's
    // own streams are non-blocking, so only events order them against it.
    MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return Counted(std::unique_ptr<Stream>(
        new CudaStream(static_cast<cudaStream_t>(native), /*owned=*/false)));
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateAsyncStream() override { return CreateStream(); }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t event = nullptr;
    MW_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return Counted(std::unique_ptr<Event>(new CudaEvent(event)));
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         Stream& stream) override {
    if (dynamic_cast<CudaStream*>(&stream) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": CopyAsync on a stream of another backend"));
    }
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                      static_cast<cudaStream_t>(stream.native_handle())),
                      "cudaMemcpyAsync");
  }
  absl::Status SynchronizeImpl() override {
    MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

 private:
  const int ordinal_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<int64_t> CudaFreeBytes(int ordinal) {
  if (ordinal < 0 || ordinal >= CudaDeviceCount()) {
    return absl::UnavailableError(absl::StrCat("cuda:", ordinal, ": no such GPU"));
  }
  MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  MW_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options) {
  MW_CHECK(options.backend == Backend::kCuda);
  int count = 0;
  MW_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options.ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ordinal: expected < ", count, " (GPUs present), got ", options.ordinal));
  }
  MW_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  MW_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  int64_t capacity = options.capacity_bytes;
  if (capacity == 0) capacity = static_cast<int64_t>(free_bytes);
  if (capacity > static_cast<int64_t>(free_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device capacity: cuda:", options.ordinal, " has ",
        FormatBytes(static_cast<int64_t>(free_bytes)), " free (of ",
        FormatBytes(static_cast<int64_t>(total_bytes)), "); asked for ",
        FormatBytes(capacity)));
  }
  auto allocator = std::make_unique<CachingAllocator>(
      absl::StrCat("cuda:", options.ordinal), capacity,
      std::make_unique<CudaSegmentSource>(options.ordinal), /*touch_bytes=*/true);
  std::unique_ptr<CachingAllocator> pinned;
  if (options.pinned_capacity_bytes > 0) {
    pinned = std::make_unique<CachingAllocator>(
        absl::StrCat("cuda:", options.ordinal, ":pinned"), options.pinned_capacity_bytes,
        std::make_unique<CudaPinnedSegmentSource>(), /*touch_bytes=*/true);
  }
  return std::unique_ptr<Device>(
      new CudaDevice(options.ordinal, std::move(allocator), std::move(pinned)));
}

}  // namespace memwall
