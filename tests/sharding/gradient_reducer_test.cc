// GradientReducer on real MPI ranks (mpirun -np 1, 2, 4) and, for the dry
// run's counting, on meta with a simulated world.
//
// Every rank's gradients are small integers (times a power of two), so each
// sum is exact in every dtype and order: the reduced shard must equal the
// sum computed here in double, element for element. The piece counts are
// the collective calls the communicator counted.
#include <cmath>
#include <cstdint>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"
#include "sharding/gradient_reducer.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

// Rank r's gradient element i of the full buffer.
float Grad(int64_t i, int r) { return static_cast<float>((i * 7 + r * 3) % 23 - 11) * 0.25f; }

double Sum(int64_t i, int world) {
  double sum = 0;
  for (int r = 0; r < world; ++r) sum += Grad(i, r);
  return sum;
}

FlatGroup Group(int64_t shard, int world) {
  FlatGroup flat;
  flat.name = "layer";
  flat.numel = shard * world;
  flat.padded_numel = shard * world;
  flat.shard_numel = shard;
  return flat;
}

ShardingOptions Options(int stage, DType param, int64_t bucket) {
  ShardingOptions o;
  o.zero.stage = stage;
  o.bf16 = param == DType::kBF16;
  o.fp16 = param == DType::kF16;
  o.reduce_dtype = DType::kF32;
  o.zero.reduce_bucket_size = bucket;
  return o;
}

// The full buffer of rank `r` in `dtype`, in a device buffer.
DeviceBuffer FullGradients(Device& device, const FlatGroup& flat, DType dtype, int r) {
  DeviceBuffer full =
      device.Allocate(flat.padded_numel * DTypeSize(dtype), MemoryCategory::kGradient, "full")
          .value();
  for (int64_t i = 0; i < flat.padded_numel; ++i) {
    const float g = Grad(i, r);
    if (dtype == DType::kF32) {
      static_cast<float*>(full.data())[i] = g;
    } else {
      static_cast<uint16_t*>(full.data())[i] = dtype == DType::kBF16 ? F32ToBf16(g) : F32ToF16(g);
    }
  }
  return full;
}

float Read(const DeviceBuffer& buffer, DType dtype, int64_t i) {
  if (dtype == DType::kF32) return static_cast<const float*>(buffer.data())[i];
  const uint16_t bits = static_cast<const uint16_t*>(buffer.data())[i];
  return dtype == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

struct Host {
  std::unique_ptr<Device> device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  std::unique_ptr<Stream> caller = device->CreateStream().value();
  std::unique_ptr<Stream> comm = device->CreateStream().value();
};

TEST_CASE("reduce-scatter in pieces of the bucket size sums every rank's gradients into the shard",
          "[reduce_scatter]") {
  MpiCommunicator& world = World();
  const int w = world.world_size(), rank = world.rank();
  const DType dtype = GENERATE(DType::kF32, DType::kBF16);
  Host host;
  const FlatGroup flat = Group(1000, w);
  // 300 shard elements a piece: 300, 300, 300 and 100.
  const ShardingOptions options = Options(2, dtype, 300 * w);
  auto reducer =
      GradientReducer::Create(options, *host.device, world, *host.caller, *host.comm).value();
  const GradientReducer::Pieces pieces = reducer->PiecesOf(flat);
  CHECK(pieces.piece == 300);
  // Packed unless one f32 rank: the pieces of a rank's shard are not
  // contiguous across ranks, and bf16 is widened to the f32 reduction.
  CHECK(pieces.pack == (dtype != DType::kF32 || w > 1));

  GradientReducer::Buffers buffers;
  REQUIRE(reducer->SizeBuffers(flat, buffers).ok());
  CHECK(buffers.out.size() == 300 * 4);
  CHECK(buffers.packed.size() == (pieces.pack ? 300 * 4 * w : 0));
  CHECK(buffers.wide.empty());

  DeviceBuffer full = FullGradients(*host.device, flat, dtype, rank);
  DeviceBuffer shard =
      host.device->Allocate(1000 * DTypeSize(dtype), MemoryCategory::kGradient, "shard").value();
  for (int64_t j = 0; j < 1000; ++j) {
    if (dtype == DType::kF32) static_cast<float*>(shard.data())[j] = 0.5f;
    else static_cast<uint16_t*>(shard.data())[j] = F32ToBf16(0.5f);
  }
  const int64_t calls = world.stats(Collective::kReduceScatter).calls;
  REQUIRE(reducer->ReduceScatter(flat, full.data(), shard.data(), /*accumulate=*/true,
                                 /*final=*/true, buffers)
              .ok());
  REQUIRE(host.comm->Synchronize().ok());
  CHECK(world.stats(Collective::kReduceScatter).calls - calls == 4);
  for (int64_t j = 0; j < 1000; ++j) {
    const double expected = 0.5 + Sum(flat.shard_begin(rank) + j, w);
    INFO("element " << j);
    REQUIRE(Read(shard, dtype, j) == static_cast<float>(expected));
  }
  // Not accumulating: the shard is the sum alone.
  REQUIRE(reducer->ReduceScatter(flat, full.data(), shard.data(), /*accumulate=*/false,
                                 /*final=*/true, buffers)
              .ok());
  REQUIRE(host.comm->Synchronize().ok());
  for (int64_t j = 0; j < 1000; ++j) {
    REQUIRE(Read(shard, dtype, j) == static_cast<float>(Sum(flat.shard_begin(rank) + j, w)));
  }
}

TEST_CASE("stage 0 all-reduces in place, widened piece by piece in one bucket-sized buffer",
          "[all_reduce]") {
  MpiCommunicator& world = World();
  const int w = world.world_size(), rank = world.rank();
  Host host;
  const FlatGroup flat = Group(500, w);
  const ShardingOptions options = Options(0, DType::kBF16, 700);
  auto reducer =
      GradientReducer::Create(options, *host.device, world, *host.caller, *host.comm).value();
  GradientReducer::Buffers buffers;
  REQUIRE(reducer->SizeBuffers(flat, buffers).ok());
  // min(bucket, the group) f32 elements; nothing packed.
  CHECK(buffers.wide.size() == std::min<int64_t>(700, 500 * w) * 4);
  CHECK(buffers.packed.empty());
  CHECK(buffers.out.empty());

  DeviceBuffer full = FullGradients(*host.device, flat, DType::kBF16, rank);
  const int64_t calls = world.stats(Collective::kAllReduce).calls;
  REQUIRE(reducer->AllReduce(flat, full.data(), buffers).ok());
  REQUIRE(host.comm->Synchronize().ok());
  CHECK(world.stats(Collective::kAllReduce).calls - calls == (500 * w + 699) / 700);
  for (int64_t i = 0; i < flat.padded_numel; ++i) {
    INFO("element " << i);
    REQUIRE(Read(full, DType::kBF16, i) == static_cast<float>(Sum(i, w)));
  }
}

TEST_CASE("hybrid sharding: reduce-scatter inside a block, then the final shard summed with "
          "its replicas in the other blocks", "[hybrid]") {
  MpiCommunicator& world = World();
  const int w = world.world_size(), rank = world.rank();
  const int size = w >= 2 ? 2 : 1;  // blocks of 2 ranks: 2 replicas on 4 ranks
  const DType dtype = GENERATE(DType::kF32, DType::kBF16);
  Host host;
  auto block = world.SplitBlocks(size).value();
  auto replicas = world.SplitStrided(size).value();
  const FlatGroup flat = Group(1000, size);
  // Reduce-scatter pieces of 300 shard elements; the replicas' all-reduce
  // widens bf16 in pieces of the bucket.
  const ShardingOptions options = Options(2, dtype, 300 * size);
  auto reducer = GradientReducer::Create(options, *host.device, *block, *host.caller, *host.comm,
                                         replicas.get())
                     .value();
  GradientReducer::Buffers buffers;
  REQUIRE(reducer->SizeBuffers(flat, buffers).ok());
  CHECK(buffers.wide.size() == (dtype == DType::kF32 ? 0 : std::min(300 * size, 1000) * 4));
  DeviceBuffer full = FullGradients(*host.device, flat, dtype, rank);
  DeviceBuffer shard =
      host.device->Allocate(1000 * DTypeSize(dtype), MemoryCategory::kGradient, "shard").value();
  const CollectiveStats rs = world.stats(Collective::kReduceScatter);
  const CollectiveStats ar = world.stats(Collective::kAllReduce);
  // Not final: the block's sum alone, nothing across blocks.
  REQUIRE(reducer->ReduceScatter(flat, full.data(), shard.data(), /*accumulate=*/false,
                                 /*final=*/false, buffers)
              .ok());
  REQUIRE(host.comm->Synchronize().ok());
  const int first = rank / size * size;  // the block's first world rank
  for (int64_t j = 0; j < 1000; ++j) {
    double block_sum = 0;
    for (int r = first; r < first + size; ++r) {
      block_sum += Grad(flat.shard_begin(block->rank()) + j, r);
    }
    INFO("element " << j);
    REQUIRE(Read(shard, dtype, j) == static_cast<float>(block_sum));
  }
  CHECK(world.stats(Collective::kAllReduce).calls == ar.calls);
  // Final: every rank's sum, on every replica of the shard.
  REQUIRE(reducer->ReduceScatter(flat, full.data(), shard.data(), /*accumulate=*/false,
                                 /*final=*/true, buffers)
              .ok());
  REQUIRE(host.comm->Synchronize().ok());
  for (int64_t j = 0; j < 1000; ++j) {
    INFO("element " << j);
    REQUIRE(Read(shard, dtype, j) ==
            static_cast<float>(Sum(flat.shard_begin(block->rank()) + j, w)));
  }
  // The block's collectives and the replicas' count in the world's stats:
  // 2 x 4 reduce-scatter pieces; one all-reduce of the f32 shard, or
  // widened pieces of bf16 (of 600 elements on blocks of 2, 300 on 1).
  CHECK(world.stats(Collective::kReduceScatter).calls - rs.calls == 8);
  CHECK(world.stats(Collective::kAllReduce).calls - ar.calls ==
        (dtype == DType::kF32 ? 1 : size == 2 ? 2 : 4));
  CHECK(world.stats(Collective::kAllReduce).bytes - ar.bytes == 1000 * 4);
}

TEST_CASE("on meta the pieces after the first are counted as a real run makes them",
          "[meta]") {
  // 4096 simulated ranks, 10 pieces of 37 shard elements (and one of 6):
  // the calls, bytes and the consume calls' skipped range are those of
  // running every piece.
  auto device = CreateDevice({Backend::kMeta, 0, 64 * kMiB}).value();
  auto caller = device->CreateStream().value();
  auto comm_stream = device->CreateStream().value();
  auto comm = SimulatedCommunicator::Create(0, 4096).value();
  const FlatGroup flat = Group(376, 4096);
  const ShardingOptions options = Options(3, DType::kBF16, 37 * 4096);
  auto reducer = GradientReducer::Create(options, *device, *comm, *caller, *comm_stream).value();
  GradientReducer::Buffers buffers;
  REQUIRE(reducer->SizeBuffers(flat, buffers).ok());
  int consumed = 0;
  int64_t covered = 0, skipped_begin = -1;
  REQUIRE(reducer
              ->ReduceScatterPieces(
                  flat, nullptr, buffers,
                  [&](int64_t, int64_t count, const void*) {
                    ++consumed;
                    covered += count;
                    return absl::OkStatus();
                  },
                  /*replicate=*/false, /*earlier=*/nullptr, /*repeatable=*/true,
                  [&](int64_t begin, int64_t count) {
                    skipped_begin = begin;
                    covered += count;
                    return absl::OkStatus();
                  })
              .ok());
  const CollectiveStats stats = comm->stats(Collective::kReduceScatter);
  CHECK(stats.calls == 11);
  // Each call's logical bytes: its whole f32 input, world x count elements.
  CHECK(stats.bytes == (10 * 37 + 6) * 4096 * 4);
  CHECK(consumed == 2);  // the first full piece and the last, short one
  CHECK(skipped_begin == 37);
  CHECK(covered == 376);
}

}  // namespace
}  // namespace memwall
