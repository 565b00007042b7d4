// ParameterGatherer on real MPI ranks (mpirun -np 1, 2, 4): stage 3's
// all-gathers of flat groups' shards, the prefetches within their bounds,
// and what a step's end drops.
//
// Rank r's shard of group g holds g * 10000 + r * 1000 + j (exact in f32),
// so a gathered buffer must be every rank's shard in rank order.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/units.h"
#include "sharding/flat_layout.h"
#include "sharding/parameter_gatherer.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

constexpr int kGroups = 4;
constexpr int64_t kShard = 256;  // elements per rank per group

float Value(int g, int r, int64_t j) { return static_cast<float>(g * 10000 + r * 1000 + j); }

struct Fixture {
  int world = World().world_size(), rank = World().rank();
  ShardingOptions options;
  FlatLayout layout;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> caller, comm;
  std::vector<DeviceBuffer> shards;
  std::unique_ptr<ParameterGatherer> gatherer;
  int order_calls = 0;

  // `bucket`, `live`: the prefetch bounds in elements; `paged`: the shards
  // in the pinned pool (offload_param).
  std::unique_ptr<Communicator> secondary;

  Fixture(int64_t bucket, int64_t live, bool paged = false, bool quantized = false,
          int hpz = 1) {
    if (hpz > 1) secondary = World().SplitBlocks(hpz).value();
    options.zero.stage = 3;
    options.zero.quantized_weights = quantized;
    options.zero.quantization_block_size = 64;
    options.zero.stage3_prefetch_bucket_size = bucket;
    options.zero.stage3_max_live_parameters = live;
    options.zero.offload_param = paged;
    std::vector<ParameterSpec> specs;
    for (int g = 0; g < kGroups; ++g) {
      specs.push_back({"layer" + std::to_string(g) + ".w", {kShard * world}, "unit" + std::to_string(g)});
    }
    layout = BuildFlatLayout(specs, world, 1 << 20, 128).value();
    REQUIRE(layout.groups.size() == kGroups);
    device = CreateDevice({Backend::kHost, 0, 64 * kMiB, 64 * kMiB}).value();
    caller = device->CreateStream().value();
    comm = device->CreateAsyncStream().value();
    for (int g = 0; g < kGroups; ++g) {
      const size_t bytes = kShard * 4;
      shards.push_back(paged ? device->AllocatePinned(bytes, MemoryCategory::kParameter, "shard").value()
                             : device->Allocate(bytes, MemoryCategory::kParameter, "shard").value());
      auto* values = static_cast<float*>(shards.back().data());
      for (int64_t j = 0; j < kShard; ++j) values[j] = Value(g, rank, j);
    }
    gatherer = std::make_unique<ParameterGatherer>(
        options, layout, *device, World(), secondary.get(), *caller, *comm, nullptr,
        [this](int g) { return ParameterGatherer::Shard{shards[g].data(), -1}; },
        [this] {
          ++order_calls;
          return absl::OkStatus();
        });
  }
  ~Fixture() { (void)comm->Synchronize(); }

  // All-gathers run so far (they count as they run, on the communication
  // stream's thread: waited for first).
  int64_t Gathers() {
    REQUIRE(comm->Synchronize().ok());
    return World().stats(Collective::kAllGather).calls;
  }
  // Parameter bytes the device holds: the shards and every gathered buffer.
  int64_t Held() const {
    return device->allocator().stats().by_category[static_cast<int>(MemoryCategory::kParameter)]
        .current;
  }
};

void CheckGathered(const Fixture& f, int g) {
  const DeviceBuffer* full = f.gatherer->held(g);
  REQUIRE(full != nullptr);
  const auto* values = static_cast<const float*>(full->data());
  for (int r = 0; r < f.world; ++r) {
    for (int64_t j = 0; j < kShard; ++j) {
      INFO("group " << g << " rank " << r << " element " << j);
      REQUIRE(values[r * kShard + j] == Value(g, r, j));
    }
  }
}

TEST_CASE("a gather puts every rank's shard in rank order; release frees it") {
  Fixture f(/*bucket=*/0, /*live=*/0);  // nothing gathered ahead
  const int64_t shards = f.Held(), gathers = f.Gathers();
  REQUIRE(f.gatherer->Gather(2).ok());
  CHECK(f.Gathers() - gathers == 1);
  CHECK(f.order_calls == 1);
  CheckGathered(f, 2);
  CHECK(f.Held() - shards == kShard * f.world * 4);
  absl::Status twice = f.gatherer->Gather(2);
  CHECK(twice.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(twice.message() == "GatherParameters: group 2 is already gathered");
  f.gatherer->Release(2);
  CHECK(f.gatherer->held(2) == nullptr);
  CHECK(f.Held() == shards);
}

TEST_CASE("paged shards come from the pinned pool into their place and gather in place") {
  Fixture f(/*bucket=*/0, /*live=*/0, /*paged=*/true);
  REQUIRE(f.gatherer->Gather(1).ok());
  CheckGathered(f, 1);
}

TEST_CASE("the groups expected next are gathered ahead within the bucket and the live bound") {
  const int world = World().world_size();
  const int64_t group = kShard * world;
  // Two groups fit the bucket, but only three may be live at once.
  Fixture f(/*bucket=*/2 * group, /*live=*/3 * group);
  const int64_t shards = f.Held(), gathers = f.Gathers();
  REQUIRE(f.gatherer->Gather(0).ok());
  // Group 0 and, ahead, groups 1 and 2 (direction of travel).
  CHECK(f.Gathers() - gathers == 3);
  CHECK(f.gatherer->held(1) == nullptr);  // a prefetch is not the caller's yet
  CHECK(f.Held() - shards == 3 * group * 4);
  REQUIRE(f.gatherer->Gather(1).ok());  // takes over its prefetch
  CHECK(f.Gathers() - gathers == 3);    // nothing more: 0, 1 and 2 are live
  CheckGathered(f, 1);
  f.gatherer->Release(0);
  f.gatherer->Release(1);
  // Group 2 is still a prefetch: the step's end drops it.
  CHECK(f.Held() - shards == group * 4);
  f.gatherer->EndStep();
  CHECK(f.Held() == shards);
  CHECK(f.gatherer->held(2) == nullptr);
}

TEST_CASE("a read of the parameters gathers only what is not gathered, and an abort drops all") {
  Fixture f(/*bucket=*/0, /*live=*/0);
  const int64_t shards = f.Held();
  REQUIRE(f.gatherer->Gather(3).ok());
  DeviceBuffer scratch;
  auto held = f.gatherer->GatherForRead(3, scratch);
  REQUIRE(held.ok());
  CHECK(scratch.empty());
  CHECK(*held == f.gatherer->held(3));
  held = f.gatherer->GatherForRead(0, scratch);
  REQUIRE(held.ok());
  CHECK(*held == &scratch);
  REQUIRE(f.comm->Synchronize().ok());
  CHECK(static_cast<const float*>((*held)->data())[0] == Value(0, 0, 0));
  scratch.Reset();
  f.gatherer->AbortStep();
  CHECK(f.gatherer->held(3) == nullptr);
  CHECK(f.Held() == shards);
}

TEST_CASE("qwZ gathers int8 levels and block scales, and every rank dequantizes every shard") {
  Fixture f(/*bucket=*/0, /*live=*/0, /*paged=*/false, /*quantized=*/true);
  const int64_t shards = f.Held();
  World().ResetStats();
  REQUIRE(f.gatherer->Gather(1).ok());
  REQUIRE(f.comm->Synchronize().ok());
  // Each rank's 256 levels (64 words) and 4 block scales, not 256 floats.
  CHECK(World().stats(Collective::kAllGather).bytes == f.world * (64 + 4) * 4);
  const auto* values = static_cast<const float*>(f.gatherer->held(1)->data());
  for (int r = 0; r < f.world; ++r) {
    for (int64_t b = 0; b < kShard / 64; ++b) {
      float absmax = 0;
      for (int64_t j = b * 64; j < (b + 1) * 64; ++j) absmax = std::max(absmax, Value(1, r, j));
      for (int64_t j = b * 64; j < (b + 1) * 64; ++j) {
        // Symmetric int8: the nearest of 255 levels, absmax * q / 127.
        const float x = Value(1, r, j);
        const float level = std::rint((x / absmax) * 127.0f);
        INFO("rank " << r << " element " << j);
        REQUIRE(values[r * kShard + j] == absmax * (level / 127.0f));
        REQUIRE(std::abs(values[r * kShard + j] - x) <= 0.5f * absmax / 127.0f * 1.0001f);
      }
    }
  }
  // The packed levels are freed once dequantized: the gathered buffer is
  // what stays.
  CHECK(f.Held() - shards == kShard * f.world * 4);
  // A read for a checkpoint is exact, whatever is held.
  DeviceBuffer scratch;
  auto read = f.gatherer->GatherForRead(1, scratch);
  REQUIRE(read.ok());
  CHECK(*read == &scratch);
  REQUIRE(f.comm->Synchronize().ok());
  for (int r = 0; r < f.world; ++r) {
    for (int64_t j = 0; j < kShard; ++j) {
      REQUIRE(static_cast<const float*>(scratch.data())[r * kShard + j] == Value(1, r, j));
    }
  }
  scratch.Reset();
  f.gatherer->Release(1);
  CHECK(f.Held() == shards);
}

TEST_CASE("hpZ: later gathers in a step come from the secondary partition inside the block") {
  // Blocks of 2 ranks (of 1 on one rank).
  const int block = World().world_size() % 2 == 0 ? 2 : 1;
  Fixture f(/*bucket=*/0, /*live=*/0, /*paged=*/false, /*quantized=*/false, block);
  if (block == 1) return;  // no secondary partition on one rank
  const int64_t shards = f.Held();
  const CollectiveStats world_before = World().stats(Collective::kAllGather);
  REQUIRE(f.gatherer->Gather(2).ok());
  CheckGathered(f, 2);
  // The secondary partition: this rank's half of the group stays.
  const int64_t slice = kShard * f.world / 2;
  CHECK(f.Held() - shards == kShard * f.world * 4 + slice * 4);
  f.gatherer->Release(2);
  CHECK(f.Held() - shards == slice * 4);
  REQUIRE(f.comm->Synchronize().ok());
  const CollectiveStats first = World().stats(Collective::kAllGather) - world_before;
  REQUIRE(f.gatherer->Gather(2).ok());
  CheckGathered(f, 2);
  REQUIRE(f.comm->Synchronize().ok());
  // Gathered again inside the block: its 2 ranks' halves, counted in the
  // world's stats too (the block's own counters hold that one call).
  CHECK(f.secondary->stats(Collective::kAllGather).calls == 1);
  CHECK(f.secondary->stats(Collective::kAllGather).bytes == kShard * f.world * 4);
  const CollectiveStats second = World().stats(Collective::kAllGather) - world_before - first;
  CHECK(first.calls == 1);
  CHECK(second.calls == 1);
  CHECK(second.bytes == kShard * f.world * 4);
  f.gatherer->Release(2);
  // A write of the parameters, or the step's end, drops it.
  f.gatherer->ParametersChanged(2);
  CHECK(f.Held() == shards);
  REQUIRE(f.gatherer->Gather(2).ok());
  f.gatherer->Release(2);
  CHECK(f.secondary->stats(Collective::kAllGather).calls == 1);  // from the shards again
  f.gatherer->EndStep();
  CHECK(f.Held() == shards);
}

}  // namespace
}  // namespace memwall
