#include "runtime/host_device.h"

#include <cstdlib>
#include <cstring>

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

// Host work runs when it is enqueued, so a stream is always idle and an
// event is complete as soon as it is recorded.
class InOrderEvent final : public Event {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<bool> Query() override { return true; }
  void* native_handle() const override { return nullptr; }
};

class InOrderStream final : public Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status Record(Event& event) override {
    if (dynamic_cast<InOrderEvent*>(&event) == nullptr) {
      return absl::InvalidArgumentError(
          "Stream::Record: the event belongs to another backend");
    }
    return absl::OkStatus();
  }
  absl::Status Wait(const Event& event) override {
    if (dynamic_cast<const InOrderEvent*>(&event) == nullptr) {
      return absl::InvalidArgumentError(
          "Stream::Wait: the event belongs to another backend");
    }
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }
};

class HostDevice final : public Device {
 public:
  HostDevice(Backend backend, std::unique_ptr<CachingAllocator> allocator,
             std::unique_ptr<CachingAllocator> pinned_allocator)
      : Device(std::move(allocator), std::move(pinned_allocator)), backend_(backend) {}

  Backend backend() const override { return backend_; }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new InOrderStream());
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(new InOrderEvent());
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         Stream& stream) override {
    if (dynamic_cast<InOrderStream*>(&stream) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": CopyAsync on a stream of another backend"));
    }
    if (backend_ == Backend::kHost && bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

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
