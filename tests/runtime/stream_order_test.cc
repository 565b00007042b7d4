// Stream-ordered reuse (Note [Stream-ordered reuse], runtime/stream_order.h):
// a block freed while another stream may still use it goes only to work
// known to run after that use; the decisions follow the call sequence, so
// host and meta make the same ones.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// Large requests: one block per 4 MiB segment, so a freed block is never
// merged with a neighbour and "the same block" means the same address.
constexpr size_t kBlock = 4 * kMiB;

struct Rig {
  explicit Rig(Backend backend, int64_t capacity = 64 * kMiB)
      : device(CreateDevice({backend, 0, capacity}).value()),
        caller(device->CreateStream().value()),
        comm(device->CreateAsyncStream().value()),
        event(device->CreateEvent().value()) {}
  DeviceBuffer Take(const Stream& on) {
    return device->Allocate(kBlock, MemoryCategory::kOther, "block", on).value();
  }
  DeviceBuffer TakeHostOrder() {
    return device->Allocate(kBlock, MemoryCategory::kOther, "block").value();
  }
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> caller, comm;
  std::unique_ptr<Event> event;
};

TEST_CASE("a block another stream reads is reused once the allocating stream waited for it",
          "[stream_order]") {
  Rig rig(Backend::kHost);
  DeviceBuffer read_by_comm = rig.Take(*rig.caller);
  void* const first = read_by_comm.data();
  // An event recorded before the free says nothing about what came after.
  REQUIRE(rig.comm->Record(*rig.event).ok());
  read_by_comm.RecordStream(*rig.comm);
  read_by_comm.Reset();
  REQUIRE(rig.caller->Wait(*rig.event).ok());
  DeviceBuffer second = rig.Take(*rig.caller);
  CHECK(second.data() != first);
  CHECK(rig.device->allocator().stats().reserved.current == 2 * kBlock);
  // Ordered after the reduction's work: the block comes back.
  REQUIRE(rig.comm->Record(*rig.event).ok());
  REQUIRE(rig.caller->Wait(*rig.event).ok());
  DeviceBuffer third = rig.Take(*rig.caller);
  CHECK(third.data() == first);
  CHECK(rig.device->allocator().stats().reserved.current == 2 * kBlock);
  CHECK(rig.device->host_synchronizations() == 0);
}

TEST_CASE("a stream reuses its own blocks at once; another stream only after waiting",
          "[stream_order]") {
  Rig rig(Backend::kHost);
  DeviceBuffer own = rig.Take(*rig.comm);
  void* const first = own.data();
  own.Reset();
  DeviceBuffer again = rig.Take(*rig.comm);
  CHECK(again.data() == first);
  again.Reset();
  // The caller's stream is not ordered after the communication stream's
  // use, nor is host order.
  CHECK(rig.Take(*rig.caller).data() != first);
  CHECK(rig.TakeHostOrder().data() != first);
  REQUIRE(rig.comm->Record(*rig.event).ok());
  REQUIRE(rig.caller->Wait(*rig.event).ok());
  // Waited for by the caller's stream, not by the host.
  CHECK(rig.TakeHostOrder().data() != first);
  CHECK(rig.Take(*rig.caller).data() == first);
}

TEST_CASE("host order reuses a block after the host synchronised with its streams",
          "[stream_order]") {
  for (int how = 0; how < 3; ++how) {
    Rig rig(Backend::kHost);
    DeviceBuffer buffer = rig.Take(*rig.caller);
    void* const first = buffer.data();
    buffer.RecordStream(*rig.comm);
    buffer.Reset();
    CHECK(rig.TakeHostOrder().data() != first);
    if (how == 0) {
      // The caller's stream is seen through; the communication stream not yet.
      REQUIRE(rig.caller->Synchronize().ok());
      CHECK(rig.TakeHostOrder().data() != first);
      REQUIRE(rig.comm->Synchronize().ok());
    } else if (how == 1) {
      REQUIRE(rig.comm->Record(*rig.event).ok());
      REQUIRE(rig.caller->Synchronize().ok());
      REQUIRE(rig.event->Synchronize().ok());
    } else {
      REQUIRE(rig.device->Synchronize().ok());
    }
    CHECK(rig.TakeHostOrder().data() == first);
  }
}

TEST_CASE("a stream the host synchronised passes on what it waited for", "[stream_order]") {
  Rig rig(Backend::kHost);
  DeviceBuffer buffer = rig.Take(*rig.caller);
  void* const first = buffer.data();
  buffer.RecordStream(*rig.comm);
  buffer.Reset();
  // comm's work is done once the caller's stream, which waited for it, is.
  REQUIRE(rig.comm->Record(*rig.event).ok());
  REQUIRE(rig.caller->Wait(*rig.event).ok());
  REQUIRE(rig.caller->Synchronize().ok());
  CHECK(rig.TakeHostOrder().data() == first);
}

TEST_CASE("the device's current stream owns what is allocated without a stream",
          "[stream_order]") {
  Rig rig(Backend::kHost);
  CHECK(rig.device->current_stream() == kHostOrder);
  void* first = nullptr;
  {
    Device::StreamGuard guard(*rig.device, *rig.caller);
    CHECK(rig.device->current_stream() == rig.caller->id());
    DeviceBuffer activation = rig.TakeHostOrder();
    first = activation.data();
  }
  CHECK(rig.device->current_stream() == kHostOrder);
  // The communication stream may write it only after the caller's work.
  CHECK(rig.Take(*rig.comm).data() != first);
  REQUIRE(rig.caller->Record(*rig.event).ok());
  REQUIRE(rig.comm->Wait(*rig.event).ok());
  CHECK(rig.Take(*rig.comm).data() == first);
}

TEST_CASE("out of memory, the allocator waits for the streams pending blocks wait for",
          "[stream_order]") {
  Rig rig(Backend::kHost, 2 * kBlock);
  DeviceBuffer kept = rig.Take(*rig.caller);
  DeviceBuffer pending = rig.Take(*rig.caller);
  void* const first = pending.data();
  pending.RecordStream(*rig.comm);
  pending.Reset();
  const int64_t waits = rig.device->host_synchronizations();
  // No room for a third segment: host order waits for both streams the
  // block was stamped with (the caller's, that allocated it, and comm),
  // then takes it.
  DeviceBuffer reused = rig.TakeHostOrder();
  CHECK(reused.data() == first);
  CHECK(rig.device->host_synchronizations() == waits + 2);
  CHECK(rig.device->allocator().stats().num_ooms == 0);
}

TEST_CASE("EmptyCache waits for pending blocks' streams, then releases their segments",
          "[stream_order]") {
  Rig rig(Backend::kHost);
  DeviceBuffer buffer = rig.Take(*rig.caller);
  buffer.RecordStream(*rig.comm);
  buffer.Reset();
  REQUIRE(rig.device->allocator().EmptyCache().ok());
  CHECK(rig.device->allocator().stats().reserved.current == 0);
  // Both streams the block was stamped with were synchronised.
  CHECK(rig.device->host_synchronizations() == 2);
}

TEST_CASE("a buffer freed while a host stream still reads it keeps its bytes until the read",
          "[stream_order][async]") {
  // Not timing: the reader blocks until the main thread has allocated and
  // overwritten whatever block it got.
  Rig rig(Backend::kHost);
  DeviceBuffer source = rig.Take(*rig.caller);
  std::memset(source.data(), 0xAB, kBlock);
  std::mutex mu;
  std::condition_variable go;
  bool released = false;
  std::atomic<bool> intact{false};
  const auto* bytes = static_cast<const unsigned char*>(source.data());
  REQUIRE(rig.comm->RunHost([&, bytes] {
    std::unique_lock<std::mutex> lock(mu);
    go.wait(lock, [&] { return released; });
    bool same = true;
    for (size_t i = 0; i < kBlock; ++i) same = same && bytes[i] == 0xAB;
    intact = same;
    return absl::OkStatus();
  }).ok());
  source.RecordStream(*rig.comm);
  source.Reset();
  DeviceBuffer next = rig.Take(*rig.caller);
  std::memset(next.data(), 0x00, kBlock);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  go.notify_all();
  REQUIRE(rig.comm->Synchronize().ok());
  CHECK(intact.load());
}

// Records what the allocator did, in terms both backends share.
class Trace final : public MemoryListener {
 public:
  void OnMemoryEvent(const MemoryEvent& event) override {
    events.push_back({static_cast<int>(event.kind), event.reserved_after});
  }
  std::vector<std::pair<int, int64_t>> events;
};

TEST_CASE("host and meta make the same stream-ordered choices", "[stream_order][meta]") {
  const auto script = [](Backend backend) {
    Rig rig(backend, 5 * kBlock);
    Trace trace;
    rig.device->allocator().AddListener(&trace);
    std::vector<DeviceBuffer> live;
    for (int round = 0; round < 4; ++round) {
      DeviceBuffer bucket = rig.Take(*rig.caller);
      DeviceBuffer temp = rig.Take(*rig.comm);
      bucket.RecordStream(*rig.comm);
      bucket.Reset();
      temp.Reset();
      REQUIRE(rig.comm->Record(*rig.event).ok());
      if (round % 2 == 1) REQUIRE(rig.caller->Wait(*rig.event).ok());
      live.push_back(rig.TakeHostOrder());
    }
    rig.device->allocator().RemoveListener(&trace);
    trace.events.push_back({-1, rig.device->host_synchronizations()});
    return trace.events;
  };
  const auto host = script(Backend::kHost);
  CHECK(host == script(Backend::kMeta));
  // The fifth segment would exceed the capacity: the allocator waited.
  CHECK(host.back().second > 0);
}

TEST_CASE("Device::Synchronize waits for asynchronous host streams", "[stream_order][async]") {
  Rig rig(Backend::kHost);
  std::atomic<bool> done{false};
  REQUIRE(rig.comm->RunHost([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    done = true;
    return absl::OkStatus();
  }).ok());
  REQUIRE(rig.device->Synchronize().ok());
  CHECK(done.load());
  CHECK(rig.device->host_synchronizations() == 1);
}

}  // namespace
}  // namespace memwall
