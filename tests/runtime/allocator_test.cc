// The caching allocator's books: capacity, rounding, caching, coalescing,
// exact per-category counters under random traffic, OOM reports, events.
#include "runtime/allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr int64_t kSegment = CachingAllocator::kSegmentGranularity;

std::unique_ptr<Device> MakeDevice(Backend backend, int64_t capacity) {
  auto device = CreateDevice({backend, 0, capacity});
  REQUIRE(device.ok());
  return std::move(device).value();
}

int Idx(MemoryCategory c) { return static_cast<int>(c); }

class Recorder : public MemoryListener {
 public:
  void OnMemoryEvent(const MemoryEvent& e) override {
    events.push_back(e);
    owners.emplace_back(e.owner);
  }
  std::vector<MemoryEvent> events;
  std::vector<std::string> owners;
};

TEST_CASE("small requests round to 512 bytes inside a 2 MiB segment", "[allocator]") {
  auto device = MakeDevice(Backend::kHost, 64 * kMiB);
  auto buffer = device->Allocate(1000, MemoryCategory::kActivation, "act");
  REQUIRE(buffer.ok());
  CHECK(buffer->size() == 1000);
  CHECK(buffer->block_size() == 1024);
  CHECK(buffer->data() != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(buffer->data()) % 512 == 0);
  AllocatorStats s = device->allocator().stats();
  CHECK(s.requested.current == 1000);
  CHECK(s.allocated.current == 1024);
  CHECK(s.reserved.current == kSegment);
  CHECK(s.num_segments == 1);
  CHECK(s.by_category[Idx(MemoryCategory::kActivation)].current == 1000);

  // Freed memory stays cached and the same block is reused.
  void* first = buffer->data();
  buffer->Reset();
  s = device->allocator().stats();
  CHECK(s.allocated.current == 0);
  CHECK(s.reserved.current == kSegment);
  auto again = device->allocator().Allocate(900, MemoryCategory::kWorkspace, "ws");
  REQUIRE(again.ok());
  CHECK(again->data() == first);
  CHECK(device->allocator().stats().num_segments == 1);
}

TEST_CASE("zero-byte requests still take a minimum block", "[allocator]") {
  auto device = MakeDevice(Backend::kHost, 8 * kMiB);
  auto a = device->Allocate(0, MemoryCategory::kOther, "empty");
  REQUIRE(a.ok());
  CHECK(a->size() == 0);
  CHECK(a->block_size() == 512);
  CHECK(device->allocator().stats().requested.current == 0);
  CHECK(device->allocator().stats().allocated.current == 512);
}

TEST_CASE("large requests get their own segment, split only for >= 1 MiB remainders",
          "[allocator]") {
  auto device = MakeDevice(Backend::kMeta, 1 * kGiB);
  // 3 MiB -> a 4 MiB segment; the 1 MiB remainder is split off and cached.
  auto a = device->Allocate(3 * kMiB, MemoryCategory::kParameter, "w");
  REQUIRE(a.ok());
  CHECK(a->block_size() == size_t(3 * kMiB));
  // 5 MiB + 1 -> 5 MiB + 512 in a 6 MiB segment; the remainder (1 MiB - 512)
  // is too small to split, so the block is the whole segment.
  auto b = device->Allocate(5 * kMiB + 1, MemoryCategory::kParameter, "w2");
  REQUIRE(b.ok());
  CHECK(b->block_size() == size_t(6 * kMiB));
  const AllocatorStats s = device->allocator().stats();
  CHECK(s.reserved.current == 10 * kMiB);
  CHECK(s.allocated.current == 9 * kMiB);
  CHECK(s.requested.current == 8 * kMiB + 1);
  CHECK(s.num_segments == 2);
  // Meta buffers hold no bytes.
  CHECK(a->data() == nullptr);
}

TEST_CASE("freed neighbours coalesce and serve a larger request", "[allocator]") {
  auto device = MakeDevice(Backend::kHost, 8 * kMiB);
  auto a = device->Allocate(4096, MemoryCategory::kActivation, "a");
  auto b = device->Allocate(4096, MemoryCategory::kActivation, "b");
  auto c = device->Allocate(4096, MemoryCategory::kActivation, "c");
  REQUIRE((a.ok() && b.ok() && c.ok()));
  const uintptr_t base = reinterpret_cast<uintptr_t>(a->data());
  CHECK(reinterpret_cast<uintptr_t>(b->data()) == base + 4096);
  CHECK(reinterpret_cast<uintptr_t>(c->data()) == base + 8192);
  a->Reset();
  b->Reset();
  // 8 KiB fits exactly where a and b were, ahead of the larger tail block.
  auto d = device->Allocate(8192, MemoryCategory::kActivation, "d");
  REQUIRE(d.ok());
  CHECK(reinterpret_cast<uintptr_t>(d->data()) == base);
  CHECK(device->allocator().stats().num_segments == 1);
}

TEST_CASE("capacity is enforced on reserved bytes and the OOM report names what is there",
          "[allocator]") {
  auto device = MakeDevice(Backend::kHost, 8 * kMiB);
  auto w1 = device->Allocate(3 * kMiB, MemoryCategory::kParameter, "w1");
  auto g1 = device->Allocate(3 * kMiB, MemoryCategory::kGradient, "w1.grad");
  REQUIRE((w1.ok() && g1.ok()));
  CHECK(device->allocator().stats().reserved.current == 8 * kMiB);
  // A small request needs a fresh 2 MiB segment: 10 MiB > 8 MiB.
  auto more = device->Allocate(1, MemoryCategory::kActivation, "block0.mlp");
  REQUIRE_FALSE(more.ok());
  CHECK(more.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(more.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("out of memory on host:0: cannot allocate 1 B (1 bytes) "
                                      "of activation for 'block0.mlp'"));
  CHECK_THAT(message, Catch::Contains("reserving a 2.00 MiB segment would exceed the capacity "
                                      "of 8.00 MiB (8.00 MiB reserved)"));
  CHECK_THAT(message, Catch::Contains("By category: parameter 3.00 MiB, gradient 3.00 MiB"));
  CHECK_THAT(message, Catch::Contains("Largest owners: 'w1' (parameter) 3.00 MiB, "
                                      "'w1.grad' (gradient) 3.00 MiB"));
  CHECK_THAT(message, Catch::Contains("2.00 MiB reserved but free"));
  const AllocatorStats s = device->allocator().stats();
  CHECK(s.num_ooms == 1);
  // Nothing changed.
  CHECK(s.requested.current == 6 * kMiB);
  CHECK(s.num_allocations == 2);
}

TEST_CASE("requests larger than the whole device fail without reserving", "[allocator]") {
  auto device = MakeDevice(Backend::kMeta, 32 * kGiB);
  for (size_t bytes : {size_t(33) * kGiB, SIZE_MAX, SIZE_MAX - 100}) {
    auto buffer = device->Allocate(bytes, MemoryCategory::kActivation, "huge");
    REQUIRE(buffer.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(buffer.status().message()),
               Catch::Contains("the request alone exceeds the capacity"));
  }
  CHECK(device->allocator().stats().reserved.peak == 0);
  CHECK(device->allocator().stats().num_ooms == 3);
}

TEST_CASE("cached free segments are released when the capacity needs them", "[allocator]") {
  auto device = MakeDevice(Backend::kHost, 4 * kMiB);
  Recorder recorder;
  device->allocator().AddListener(&recorder);
  {
    auto big = device->Allocate(3 * kMiB, MemoryCategory::kParameter, "big");
    REQUIRE(big.ok());
  }
  CHECK(device->allocator().stats().reserved.current == 4 * kMiB);
  auto small = device->Allocate(100, MemoryCategory::kOther, "small");
  REQUIRE(small.ok());
  CHECK(device->allocator().stats().reserved.current == 2 * kMiB);
  device->allocator().RemoveListener(&recorder);
  std::vector<MemoryEvent::Kind> kinds;
  for (const MemoryEvent& e : recorder.events) kinds.push_back(e.kind);
  CHECK(kinds == std::vector<MemoryEvent::Kind>{
                     MemoryEvent::Kind::kSegmentReserve, MemoryEvent::Kind::kAlloc,
                     MemoryEvent::Kind::kFree, MemoryEvent::Kind::kSegmentRelease,
                     MemoryEvent::Kind::kSegmentReserve, MemoryEvent::Kind::kAlloc});
}

TEST_CASE("listeners see every event in order with running totals", "[allocator]") {
  auto device = MakeDevice(Backend::kMeta, 1 * kGiB);
  Recorder recorder;
  device->allocator().AddListener(&recorder);
  {
    auto p = device->Allocate(1 * kMiB, MemoryCategory::kParameter, "layer0.weight");
    auto a = device->Allocate(2000, MemoryCategory::kActivation, "layer0");
    REQUIRE((p.ok() && a.ok()));
  }
  auto oom = device->Allocate(2 * kGiB, MemoryCategory::kOptimizerState, "adam.m");
  CHECK(oom.status().code() == absl::StatusCode::kResourceExhausted);
  device->allocator().RemoveListener(&recorder);

  REQUIRE(recorder.events.size() == 6);
  for (size_t i = 0; i < recorder.events.size(); ++i) {
    CHECK(recorder.events[i].sequence == recorder.events[0].sequence + i);
  }
  const auto& e = recorder.events;
  CHECK(e[0].kind == MemoryEvent::Kind::kSegmentReserve);
  CHECK(e[0].bytes == kSegment);
  CHECK(e[1].kind == MemoryEvent::Kind::kAlloc);
  CHECK(recorder.owners[1] == "layer0.weight");
  CHECK(e[1].category == MemoryCategory::kParameter);
  CHECK(e[1].bytes == kMiB);
  CHECK(e[1].requested_after == kMiB);
  CHECK(e[2].kind == MemoryEvent::Kind::kAlloc);
  CHECK(e[2].bytes == 2000);
  CHECK(e[2].block_bytes == 2048);
  CHECK(e[2].requested_after == kMiB + 2000);
  // Destruction order: a, then p.
  CHECK(e[3].kind == MemoryEvent::Kind::kFree);
  CHECK(recorder.owners[3] == "layer0");
  CHECK(e[3].requested_after == kMiB);
  CHECK(e[4].kind == MemoryEvent::Kind::kFree);
  CHECK(e[4].requested_after == 0);
  // Larger than the device: it fails at once, keeping the cached segment.
  CHECK(e[5].kind == MemoryEvent::Kind::kOutOfMemory);
  CHECK(e[5].bytes == 2 * kGiB);
  CHECK(e[5].reserved_after == kSegment);
  CHECK(recorder.owners[5] == "adam.m");
}

// Random alloc/free traffic; a reference model tracks what the books must
// say, to the byte, after every operation.
void RunRandomTraffic(Backend backend, int64_t capacity, int64_t max_request,
                      uint32_t seed) {
  auto device = MakeDevice(backend, capacity);
  CachingAllocator& allocator = device->allocator();
  std::mt19937_64 rng(seed);
  struct Live {
    DeviceBuffer buffer;
    MemoryCategory category;
    std::string owner;
  };
  std::vector<Live> live;
  std::array<MemoryStat, kNumMemoryCategories> expected{};
  MemoryStat expected_total;
  std::map<std::pair<std::string, MemoryCategory>, int64_t> expected_owners;
  int64_t ooms = 0;

  for (int op = 0; op < 20000; ++op) {
    const bool allocate = live.empty() || rng() % 100 < 55;
    if (allocate) {
      // Mostly small, sometimes large requests.
      const int64_t bytes = rng() % 4 == 0 ? static_cast<int64_t>(rng() % max_request)
                                           : static_cast<int64_t>(rng() % 70000);
      const auto category = kAllMemoryCategories[rng() % kNumMemoryCategories];
      const std::string owner = "layer" + std::to_string(rng() % 13);
      auto buffer = allocator.Allocate(bytes, category, owner);
      if (!buffer.ok()) {
        REQUIRE(buffer.status().code() == absl::StatusCode::kResourceExhausted);
        ++ooms;
        continue;
      }
      const size_t rounded = (std::max<int64_t>(bytes, 1) + 511) / 512 * 512;
      REQUIRE(buffer->block_size() >= rounded);
      const size_t split_limit = rounded <= CachingAllocator::kSmallRequestMax
                                     ? 512
                                     : CachingAllocator::kMinLargeSplitRemainder;
      REQUIRE(buffer->block_size() - rounded < split_limit);
      expected[Idx(category)].Add(bytes);
      expected_total.Add(bytes);
      expected_owners[{owner, category}] += bytes;
      live.push_back({std::move(buffer).value(), category, owner});
    } else {
      const size_t victim = rng() % live.size();
      const int64_t bytes = static_cast<int64_t>(live[victim].buffer.size());
      expected[Idx(live[victim].category)].Subtract(bytes);
      expected_total.Subtract(bytes);
      auto it = expected_owners.find({live[victim].owner, live[victim].category});
      it->second -= bytes;
      if (it->second == 0) expected_owners.erase(it);
      std::swap(live[victim], live.back());
      live.pop_back();
    }
    const AllocatorStats s = allocator.stats();
    int64_t live_blocks = 0;
    for (const Live& l : live) live_blocks += static_cast<int64_t>(l.buffer.block_size());
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      REQUIRE(s.by_category[c].current == expected[c].current);
      REQUIRE(s.by_category[c].peak == expected[c].peak);
      REQUIRE(s.by_category[c].allocated == expected[c].allocated);
      REQUIRE(s.by_category[c].freed == expected[c].freed);
    }
    REQUIRE(s.requested.current == expected_total.current);
    REQUIRE(s.requested.peak == expected_total.peak);
    REQUIRE(s.allocated.current == live_blocks);
    REQUIRE(s.num_allocations == static_cast<int64_t>(live.size()));
    REQUIRE(s.reserved.current >= s.allocated.current);
    REQUIRE(s.reserved.current <= capacity);
    REQUIRE(s.reserved.current % kSegment == 0);
    REQUIRE(s.num_ooms == ooms);
  }
  auto owners = allocator.OwnerBytes();
  REQUIRE(owners.size() == expected_owners.size());
  for (const auto& [key, bytes] : owners) REQUIRE(expected_owners.at(key) == bytes);

  live.clear();
  AllocatorStats s = allocator.stats();
  CHECK(s.requested.current == 0);
  CHECK(s.allocated.current == 0);
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    CHECK(s.by_category[c].allocated == s.by_category[c].freed);
  }
  REQUIRE(allocator.EmptyCache().ok());
  s = allocator.stats();
  CHECK(s.reserved.current == 0);
  CHECK(s.num_segments == 0);
  CHECK(s.reserved.allocated == s.reserved.freed);
}

TEST_CASE("random traffic on host balances the books to the byte", "[allocator]") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    RunRandomTraffic(Backend::kHost, 48 * kMiB, 5 * kMiB, seed);
  }
}

TEST_CASE("random traffic on meta with large requests balances the books", "[allocator]") {
  for (uint32_t seed : {7u, 8u}) {
    INFO("seed " << seed);
    RunRandomTraffic(Backend::kMeta, 4 * kGiB, 600 * kMiB, seed);
  }
}

TEST_CASE("meta simulates a 32 GiB device holding far more than this machine",
          "[allocator][meta]") {
  auto device = MakeDevice(Backend::kMeta, 32 * kGiB);
  // 7e9 bf16 parameters (14 GB) fit; their fp32 Adam states on top do not.
  const int64_t params = 7'000'000'000;
  auto weights = device->Allocate(params * 2, MemoryCategory::kParameter, "model");
  REQUIRE(weights.ok());
  CHECK(weights->data() == nullptr);
  auto master = device->Allocate(params * 4, MemoryCategory::kOptimizerState, "master");
  REQUIRE_FALSE(master.ok());
  CHECK(master.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(master.status().message()),
             Catch::Contains("out of memory on meta:0: cannot allocate 26.08 GiB"));
  CHECK(device->allocator().stats().requested.peak == params * 2);
}

// Hands out segment addresses upwards or downwards: backends place
// segments where they like (cudaMalloc, malloc), and the allocator's
// choices must not depend on it.
class OrderedSource final : public SegmentSource {
 public:
  explicit OrderedSource(bool downwards) : downwards_(downwards) {}
  absl::StatusOr<uintptr_t> Reserve(size_t bytes) override {
    const uintptr_t base = downwards_ ? (uintptr_t{1} << 44) - next_ - bytes : next_ + 4096;
    next_ += bytes + 4096;
    return base;
  }
  void Release(uintptr_t, size_t) override {}

 private:
  const bool downwards_;
  uintptr_t next_ = 0;
};

TEST_CASE("block choices do not depend on where the backend puts segments", "[allocator]") {
  // The same random traffic on two allocators whose segments come in
  // opposite address orders fragments alike: equal reserved peaks and
  // segment counts, request after request.
  CachingAllocator up("up", 512 * kMiB, std::make_unique<OrderedSource>(false), false);
  CachingAllocator down("down", 512 * kMiB, std::make_unique<OrderedSource>(true), false);
  std::mt19937 rng(11);
  std::vector<DeviceBuffer> a, b;
  for (int i = 0; i < 3000; ++i) {
    if (a.size() > 40 || (!a.empty() && rng() % 2 == 0)) {
      const size_t k = rng() % a.size();
      a.erase(a.begin() + k);
      b.erase(b.begin() + k);
      continue;
    }
    // A few sizes, so that equal-size free blocks in different segments
    // compete (the tie the order decides).
    const size_t sizes[] = {300 * 1024, 700 * 1024, 3 * kMiB, 5 * kMiB, 7 * kMiB, 12 * kMiB};
    const size_t bytes = sizes[rng() % 6];
    a.push_back(up.Allocate(bytes, MemoryCategory::kActivation, "x").value());
    b.push_back(down.Allocate(bytes, MemoryCategory::kActivation, "x").value());
    REQUIRE(up.stats().reserved.current == down.stats().reserved.current);
    REQUIRE(up.stats().num_segments == down.stats().num_segments);
  }
  CHECK(up.stats().reserved.peak == down.stats().reserved.peak);
  CHECK(up.stats().reserved.peak > 0);
}

}  // namespace
}  // namespace memwall
