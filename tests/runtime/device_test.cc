// Backends, Tensor, streams and events, and the Status helpers.
#include "runtime/device.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "runtime/units.h"

namespace memwall {
namespace {

TEST_CASE("CreateDevice validates its options", "[device]") {
  auto no_capacity = CreateDevice({Backend::kHost, 0, 0});
  CHECK(no_capacity.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(no_capacity.status().message()),
             Catch::Contains("device capacity: the host backend needs a capacity in bytes"));
  auto negative = CreateDevice({Backend::kMeta, 0, -5});
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(negative.status().message()),
             Catch::Contains("device capacity: expected >= 0 bytes, got -5"));
  auto ordinal = CreateDevice({Backend::kHost, -1, kMiB});
  CHECK(ordinal.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(ordinal.status().message()),
             Catch::Contains("device ordinal: expected >= 0, got -1"));
}

TEST_CASE("the cuda backend reports why it cannot start without a GPU", "[device][cuda]") {
  if (CudaDeviceAvailable()) {
    auto device = CreateDevice({Backend::kCuda, 0, 0});
    REQUIRE(device.ok());
    CHECK(device.value()->name() == "cuda:0");
    // Ranks share the GPUs round-robin.
    const int gpus = CudaDeviceCount();
    CHECK(CudaOrdinalForRank(0).value() == 0);
    CHECK(CudaOrdinalForRank(gpus).value() == 0);
    CHECK(CudaOrdinalForRank(gpus + 1).value() == (gpus > 1 ? 1 : 0));
    return;
  }
  const absl::Status no_gpu = CudaOrdinalForRank(3).status();
  CHECK(no_gpu.code() == absl::StatusCode::kUnavailable);
  CHECK(no_gpu.message() == "--backend cuda: no usable GPU on this machine");
  auto device = CreateDevice({Backend::kCuda, 0, 0});
  REQUIRE_FALSE(device.ok());
  // No GPU or driver: unavailable; a build without CUDA: unimplemented.
  const absl::StatusCode code = device.status().code();
  CHECK((code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kUnimplemented));
  if (code == absl::StatusCode::kUnavailable) {
    CHECK_THAT(std::string(device.status().message()), Catch::Contains("cudaGetDeviceCount"));
  }
}

TEST_CASE("only cuda wraps a caller's native stream", "[device][stream]") {
  for (Backend backend : {Backend::kHost, Backend::kMeta}) {
    auto device = CreateDevice({backend, 0, kMiB}).value();
    int native = 0;
    auto wrapped = device->WrapStream(&native);
    CHECK(wrapped.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(wrapped.status().message() ==
          absl::StrCat(device->name(), ": WrapStream: a ", BackendName(backend),
                       " device's streams have no native handle (only cuda wraps a caller's "
                       "stream)"));
    CHECK(device->ordinal() == 0);
  }
}

TEST_CASE("backend names parse and print", "[device]") {
  CHECK(BackendName(Backend::kMeta) == "meta");
  CHECK(ParseBackend("cuda").value() == Backend::kCuda);
  auto bad = ParseBackend("tpu");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) ==
        "backend: expected one of host, meta, cuda; got 'tpu'");
}

TEST_CASE("tensors own tagged memory and validate shapes", "[tensor]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  {
    auto t = Tensor::Empty(*device, DType::kBF16, {4, 1000}, MemoryCategory::kParameter,
                           "block0.attn.qkv.weight");
    REQUIRE(t.ok());
    CHECK(t->numel() == 4000);
    CHECK(t->nbytes() == 8000);
    CHECK(t->data() != nullptr);
    CHECK(t->owner() == "block0.attn.qkv.weight");
    CHECK(t->DebugString() == "bf16[4, 1000] parameter 'block0.attn.qkv.weight' on host:0");
    CHECK(device->allocator().stats().by_category[0].current == 8000);
    Tensor moved = std::move(t).value();
    CHECK(moved.nbytes() == 8000);
  }
  CHECK(device->allocator().stats().requested.current == 0);

  auto negative = Tensor::Empty(*device, DType::kF32, {3, -2}, MemoryCategory::kActivation, "x");
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(negative.status().message()) ==
        "tensor 'x': shape[1] is -2; dimensions must be >= 0");
  auto huge = Tensor::Empty(*device, DType::kF32, {int64_t{1} << 40, int64_t{1} << 30},
                            MemoryCategory::kActivation, "huge");
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(huge.status().message()), Catch::Contains("overflows a 64-bit byte count"));
  auto too_big = Tensor::Empty(*device, DType::kF32, {1024, 1024, 8}, MemoryCategory::kActivation,
                               "too_big");
  CHECK(too_big.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("host streams run copies in order; events complete when recorded", "[stream]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto stream = device->CreateStream().value();
  auto event = device->CreateEvent().value();
  auto buffer = device->Allocate(64, MemoryCategory::kOther, "buf").value();
  const char text[] = "memwall";
  REQUIRE(device->CopyAsync(buffer.data(), text, sizeof text, *stream).ok());
  REQUIRE(stream->Record(*event).ok());
  CHECK(event->Query().value());
  REQUIRE(stream->Wait(*event).ok());
  REQUIRE(event->Synchronize().ok());
  REQUIRE(stream->Synchronize().ok());
  CHECK(std::strcmp(static_cast<const char*>(buffer.data()), "memwall") == 0);
  CHECK(stream->native_handle() == nullptr);
}

TEST_CASE("host synchronisations are counted per device, stream waits are not", "[stream][sync]") {
  for (Backend backend : {Backend::kHost, Backend::kMeta}) {
    auto device = CreateDevice({backend, 0, 4 * kMiB}).value();
    auto other = CreateDevice({backend, 1, 4 * kMiB}).value();
    auto stream = device->CreateStream().value();
    auto async = device->CreateAsyncStream().value();
    auto event = device->CreateEvent().value();
    CHECK(device->host_synchronizations() == 0);
    REQUIRE(stream->Synchronize().ok());
    REQUIRE(async->Synchronize().ok());
    REQUIRE(async->Record(*event).ok());
    REQUIRE(event->Synchronize().ok());
    REQUIRE(device->Synchronize().ok());
    CHECK(device->host_synchronizations() == 4);
    // A stream waiting for an event orders work; the host does not wait.
    REQUIRE(stream->Wait(*event).ok());
    REQUIRE(async->Wait(*event).ok());
    CHECK(device->host_synchronizations() == 4);
    CHECK(other->host_synchronizations() == 0);
  }
}

TEST_CASE("a thread's own synchronisations and launches are counted apart from other threads'",
          "[stream][sync]") {
  for (Backend backend : {Backend::kHost, Backend::kMeta}) {
    auto device = CreateDevice({backend, 0, 4 * kMiB}).value();
    auto stream = device->CreateStream().value();
    const int64_t syncs = Device::host_synchronizations_by_this_thread();
    const int64_t launches = Device::launches_by_this_thread();
    REQUIRE(stream->Synchronize().ok());
    device->CountLaunch(3);
    // Another thread's waits and launches count on the device, not here.
    std::thread other([&] {
      REQUIRE(stream->Synchronize().ok());
      REQUIRE(device->Synchronize().ok());
      device->CountLaunch(5);
      device->CountHostSynchronizations(7);
      CHECK(Device::host_synchronizations_by_this_thread() == 9);
      CHECK(Device::launches_by_this_thread() == 5);
    });
    other.join();
    device->CountHostSynchronizations(2);
    CHECK(device->host_synchronizations() == 1 + 9 + 2);
    CHECK(device->launches() == 3 + 5);
    CHECK(Device::host_synchronizations_by_this_thread() - syncs == 3);
    CHECK(Device::launches_by_this_thread() - launches == 3);
  }
}

TEST_CASE("pinned host pools are tagged, bounded and optional", "[device][pinned]") {
  auto plain = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto none = plain->AllocatePinned(64, MemoryCategory::kOptimizerState, "adam.m");
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(none.status().message()) ==
        "host:0 has no pinned host pool (create it with DeviceOptions.pinned_capacity_bytes > 0)");
  CHECK(plain->pinned_allocator() == nullptr);

  DeviceOptions options{Backend::kHost, 1, 16 * kMiB};
  options.pinned_capacity_bytes = 8 * kMiB;
  auto device = CreateDevice(options).value();
  auto stream = device->CreateStream().value();
  auto staging = device->AllocatePinned(3 * kMiB, MemoryCategory::kOptimizerState, "adam.m");
  REQUIRE(staging.ok());
  auto on_device = device->Allocate(3 * kMiB, MemoryCategory::kOptimizerState, "adam.m").value();
  std::vector<uint8_t> pattern(3 * kMiB);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = uint8_t(i * 131 + 7);
  std::memcpy(staging->data(), pattern.data(), pattern.size());
  REQUIRE(device->CopyAsync(on_device.data(), staging->data(), pattern.size(), *stream).ok());
  std::memset(staging->data(), 0, pattern.size());
  REQUIRE(device->CopyAsync(staging->data(), on_device.data(), pattern.size(), *stream).ok());
  REQUIRE(stream->Synchronize().ok());
  CHECK(std::memcmp(staging->data(), pattern.data(), pattern.size()) == 0);
  // The two pools keep separate books.
  CHECK(device->pinned_allocator()->stats().by_category[2].current == 3 * kMiB);
  CHECK(device->allocator().stats().by_category[2].current == 3 * kMiB);
  auto full = device->AllocatePinned(6 * kMiB, MemoryCategory::kOptimizerState, "adam.v");
  CHECK(full.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(full.status().message()),
             Catch::Contains("out of memory on host:1:pinned: cannot allocate 6.00 MiB"));

  DeviceOptions bad{Backend::kHost, 0, kMiB};
  bad.pinned_capacity_bytes = -1;
  CHECK(std::string(CreateDevice(bad).status().message()) ==
        "pinned capacity: expected >= 0 bytes, got -1");
}

TEST_CASE("meta's asynchronous stream reports itself asynchronous, as a real run's would",
          "[stream][async][meta]") {
  auto device = CreateDevice({Backend::kMeta, 0, 16 * kMiB}).value();
  auto comm = device->CreateAsyncStream().value();
  auto compute = device->CreateStream().value();
  CHECK(comm->asynchronous());
  CHECK_FALSE(compute->asynchronous());
  // Nothing runs on meta, so everything recorded is complete at once.
  auto event = device->CreateEvent().value();
  REQUIRE(comm->Record(*event).ok());
  CHECK(event->Query().value());
  CHECK(comm->Synchronize().ok());
}

TEST_CASE("asynchronous host streams run work in order on their own thread", "[stream][async]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto comm = device->CreateAsyncStream().value();
  auto compute = device->CreateStream().value();
  CHECK(comm->asynchronous());
  CHECK_FALSE(compute->asynchronous());
  auto gate = device->CreateEvent().value();
  auto done = device->CreateEvent().value();

  // Work held behind an event that nobody has completed yet: the worker
  // waits, the caller goes on.
  std::mutex mu;  // std::, which ThreadSanitizer sees (see runtime/host_device.cc)
  std::condition_variable released;
  bool release = false;
  std::vector<int> order;
  REQUIRE(comm->RunHost([&] {
    std::unique_lock<std::mutex> lock(mu);
    released.wait(lock, [&] { return release; });
    order.push_back(1);
    return absl::OkStatus();
  }).ok());
  for (int i = 2; i <= 100; ++i) {
    REQUIRE(comm->RunHost([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      return absl::OkStatus();
    }).ok());
  }
  REQUIRE(comm->Record(*done).ok());
  CHECK_FALSE(done->Query().value());
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(order.empty());
    release = true;
  }
  released.notify_all();
  // A synchronous stream waiting on the event blocks until the worker got
  // there; then all of the work has run, in order.
  REQUIRE(compute->Wait(*done).ok());
  CHECK(done->Query().value());
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(order.size() == 100);
    for (int i = 0; i < 100; ++i) REQUIRE(order[i] == i + 1);
  }

  // The worker waits on an event recorded on another stream.
  auto other = device->CreateAsyncStream().value();
  std::vector<char> buffer(1 << 20, 'a');
  std::vector<char> copy(1 << 20, 'z');
  REQUIRE(other->RunHost([&] {
    std::fill(buffer.begin(), buffer.end(), 'b');
    return absl::OkStatus();
  }).ok());
  REQUIRE(other->Record(*gate).ok());
  REQUIRE(comm->Wait(*gate).ok());
  REQUIRE(device->CopyAsync(copy.data(), buffer.data(), buffer.size(), *comm).ok());
  REQUIRE(comm->Synchronize().ok());
  CHECK(copy == std::vector<char>(1 << 20, 'b'));
}

TEST_CASE("asynchronous stream errors are sticky and surface at Synchronize", "[stream][async]") {
  auto device = CreateDevice({Backend::kHost, 0, 16 * kMiB}).value();
  auto stream = device->CreateAsyncStream().value();
  int ran = 0;
  REQUIRE(stream->RunHost([] { return absl::DataLossError("first failure"); }).ok());
  REQUIRE(stream->RunHost([&ran] {
    ++ran;
    return absl::InternalError("second failure");
  }).ok());
  const absl::Status status = stream->Synchronize();
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK(status.message() == "first failure");
  CHECK(ran == 1);  // later work still runs, in order
  CHECK(stream->Synchronize().code() == absl::StatusCode::kDataLoss);
  // Synchronous streams return the work's own status at once.
  auto sync = device->CreateStream().value();
  CHECK(sync->RunHost([] { return absl::AbortedError("now"); }).code() ==
        absl::StatusCode::kAborted);
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  MW_ASSIGN_OR_RETURN(int half, Half(x));
  MW_ASSIGN_OR_RETURN(*out, Half(half));
  return absl::OkStatus();
}

absl::Status Chain(int x, int* out) {
  MW_RETURN_IF_ERROR(Quarter(x, out));
  *out += 1;
  return absl::OkStatus();
}

TEST_CASE("status macros propagate the first error", "[status]") {
  int out = 0;
  CHECK(Chain(8, &out).ok());
  CHECK(out == 3);
  const absl::Status odd = Chain(6, &out);  // 6/2 = 3 is odd
  CHECK(odd.code() == absl::StatusCode::kInvalidArgument);
  CHECK(odd.message() == "odd");
  CHECK(out == 3);
}

TEST_CASE("byte quantities format in binary units", "[units]") {
  CHECK(FormatBytes(512) == "512 B");
  CHECK(FormatBytes(1536) == "1.50 KiB");
  CHECK(FormatBytes(256 * kMiB) == "256.00 MiB");
  CHECK(FormatBytes(32 * kGiB) == "32.00 GiB");
  CHECK(FormatBytes(-2048) == "-2.00 KiB");
}

TEST_CASE("byte quantities parse with binary and decimal units", "[units]") {
  CHECK(ParseBytes("32GiB", "x").value() == 32 * kGiB);
  CHECK(ParseBytes("32GB", "x").value() == 32'000'000'000);
  CHECK(ParseBytes("256 MiB", "x").value() == 256 * kMiB);
  CHECK(ParseBytes("1.5KiB", "x").value() == 1536);
  CHECK(ParseBytes("4096", "x").value() == 4096);
  CHECK(ParseBytes("10B", "x").value() == 10);
  for (const char* bad : {"", "GiB", "-1MiB", "12 parsecs", "1e30TiB", "nan"}) {
    INFO(bad);
    auto parsed = ParseBytes(bad, "--device-memory");
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(parsed.status().message()), Catch::StartsWith("--device-memory: "));
  }
  CHECK(std::string(ParseBytes("12 parsecs", "--capacity").status().message()) ==
        "--capacity: expected a byte size such as 256MiB, 32GiB or 32GB, got '12 parsecs'");
}

}  // namespace
}  // namespace memwall
