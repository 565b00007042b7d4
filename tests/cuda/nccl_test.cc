// NCCL collectives on GPUs, one rank (and one GPU) per process, bootstrapped
// over MPI. Skipped unless the node has a GPU per rank.
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

struct Rank {
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<NcclCommunicator> comm;
};

Rank& Nccl() {
  static Rank* rank = [] {
    auto* r = new Rank;
    MpiCommunicator& world = testing::World();
    r->device = CreateDevice({Backend::kCuda, world.rank() % CudaDeviceCount(), 0}).value();
    r->stream = r->device->CreateStream().value();
    auto comm = NcclCommunicator::Create(world, *r->device);
    if (!comm.ok()) FAIL(comm.status().ToString());
    r->comm = std::move(comm).value();
    return r;
  }();
  return *rank;
}

template <typename T>
DeviceBuffer ToDevice(Rank& r, const std::vector<T>& host) {
  auto buffer = r.device->Allocate(host.size() * sizeof(T), MemoryCategory::kCommBuffer, "nccl").value();
  REQUIRE(r.device->CopyAsync(buffer.data(), host.data(), host.size() * sizeof(T), *r.stream).ok());
  return buffer;
}

template <typename T>
std::vector<T> ToHost(Rank& r, const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  REQUIRE(r.device->CopyAsync(host.data(), buffer.data(), n * sizeof(T), *r.stream).ok());
  REQUIRE(r.stream->Synchronize().ok());
  return host;
}

TEST_CASE("NCCL all-reduce, reduce-scatter, all-gather and broadcast are exact", "[nccl]") {
  Rank& r = Nccl();
  const int n = r.comm->world_size(), rank = r.comm->rank();
  const size_t count = 1025;
  std::vector<float> x(count * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i + rank);
  DeviceBuffer dx = ToDevice(r, x);
  REQUIRE(r.comm->AllReduce(dx.data(), dx.data(), x.size(), DType::kF32, ReduceOp::kSum, *r.stream).ok());
  std::vector<float> sum = ToHost<float>(r, dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(sum[i] == float(i * n + n * (n - 1) / 2));

  DeviceBuffer input = ToDevice(r, x);
  auto chunk = r.device->Allocate(count * 4, MemoryCategory::kCommBuffer, "chunk").value();
  REQUIRE(r.comm->ReduceScatter(input.data(), chunk.data(), count, DType::kF32, ReduceOp::kSum,
                                *r.stream).ok());
  std::vector<float> mine = ToHost<float>(r, chunk, count);
  for (size_t j = 0; j < count; ++j) REQUIRE(mine[j] == float((rank * count + j) * n + n * (n - 1) / 2));

  std::vector<uint16_t> part(count, uint16_t(rank + 1));
  DeviceBuffer dpart = ToDevice(r, part);
  auto all = r.device->Allocate(count * n * 2, MemoryCategory::kCommBuffer, "all").value();
  REQUIRE(r.comm->AllGather(dpart.data(), all.data(), count, DType::kBF16, *r.stream).ok());
  std::vector<uint16_t> gathered = ToHost<uint16_t>(r, all, count * n);
  for (int q = 0; q < n; ++q) REQUIRE(gathered[q * count] == uint16_t(q + 1));

  std::vector<float> b(77, rank == 0 ? 5.0f : -1.0f);
  DeviceBuffer db = ToDevice(r, b);
  REQUIRE(r.comm->Broadcast(db.data(), b.size(), DType::kF32, 0, *r.stream).ok());
  for (float v : ToHost<float>(r, db, b.size())) REQUIRE(v == 5.0f);
  REQUIRE(r.comm->Barrier().ok());
  CHECK(r.comm->stats(Collective::kAllReduce).bytes == int64_t(count * n * 4));
  CHECK(r.comm->stats(Collective::kReduceScatter).bytes == int64_t(count * n * 4));
  CHECK(r.comm->stats(Collective::kAllGather).bytes == int64_t(count * n * 2));
}

TEST_CASE("NCCL rejects host streams", "[nccl]") {
  Rank& r = Nccl();
  auto host = CreateDevice({Backend::kHost, 0, 1 << 24}).value();
  auto stream = host->CreateStream().value();
  float x = 1.0f;
  const absl::Status status = r.comm->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum, *stream);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Contains("needs a cuda stream"));
}

}  // namespace
}  // namespace memwall
