// Collectives over real MPI processes (run under mpirun -np 1, 2 and 4 by
// tests/mpi_test.sh): exact values, in-place forms, byte counters,
// agreement errors on every rank, and timeouts: a rank that leaves (an
// injected failure) fails the collective on every rank, none hangs.
#include "runtime/communicator.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/mpi_communicator.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

Stream& HostStream() {
  static Device* device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value().release();
  static Stream* stream = device->CreateStream().value().release();
  return *stream;
}

// Counts that are not powers of two, and 0 and 1.
const std::vector<size_t> kCounts = {0, 1, 7, 1000, 1025};

TEST_CASE("MpiWorld is this process's place in MPI_COMM_WORLD, as the communicator's", "[mpi]") {
  const MpiPlace place = MpiWorld().value();
  CHECK(place.rank == World().rank());
  CHECK(place.size == World().world_size());
  const char* started = std::getenv("OMPI_COMM_WORLD_SIZE");  // what mpirun started
  REQUIRE(started != nullptr);
  CHECK(place.size == std::stoi(started));
}

// The join itself runs under torchrun (tests/python/test_launch.py): here
// its refusals, which leave MPI's world as it is.
TEST_CASE("joining a world checks its arguments and refuses inside an MPI job", "[mpi]") {
  const absl::Status one = OpenJoinPorts(1).status();
  CHECK(one.code() == absl::StatusCode::kInvalidArgument);
  CHECK(one.message() == "OpenJoinPorts: size: expected at least 2 ranks, got 1");
  const absl::Status outside = JoinWorld(2, 2, {"port"});
  CHECK(outside.code() == absl::StatusCode::kInvalidArgument);
  CHECK(outside.message() == "JoinWorld: rank: expected 0 to 1, got 2");
  const absl::Status ports = JoinWorld(0, 3, {"port"});
  CHECK(ports.code() == absl::StatusCode::kInvalidArgument);
  CHECK(ports.message() == "JoinWorld: ports: expected 2 (one per rank after the first), got 1");
  if (World().world_size() > 1) {
    const std::string in_job = absl::StrCat("this process already runs among ",
                                            World().world_size(), " MPI ranks (launched by mpirun)");
    const absl::Status opened = OpenJoinPorts(2).status();
    CHECK(opened.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(opened.message() == "OpenJoinPorts: " + in_job);
    const absl::Status joined = JoinWorld(World().rank() % 2, 2, {"port"});
    CHECK(joined.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(joined.message() == "JoinWorld: " + in_job);
  }
  CHECK(MpiWorld().value().size == World().world_size());
}

TEST_CASE("AllReduce sums, maxes and mins f32 exactly", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  for (size_t count : kCounts) {
    INFO("count " << count);
    std::vector<float> send(count), recv(count, -1.0f);
    for (size_t i = 0; i < count; ++i) send[i] = float(r * 1000 + i);
    REQUIRE(comm.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum,
                           HostStream()).ok());
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(recv[i] == float(i * n + 1000 * n * (n - 1) / 2));
    }
    REQUIRE(comm.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kMax,
                           HostStream()).ok());
    for (size_t i = 0; i < count; ++i) REQUIRE(recv[i] == float((n - 1) * 1000 + i));
    REQUIRE(comm.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kMin,
                           HostStream()).ok());
    for (size_t i = 0; i < count; ++i) REQUIRE(recv[i] == float(i));
  }
}

TEST_CASE("AllReduce in place", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size();
  std::vector<float> data(333, float(comm.rank() + 1));
  REQUIRE(comm.AllReduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum,
                         HostStream()).ok());
  for (float x : data) REQUIRE(x == float(n * (n + 1) / 2));
}

TEST_CASE("AllReduce of bf16 and f16 widens, sums and rounds", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    INFO(DTypeName(dtype));
    auto encode = dtype == DType::kBF16 ? F32ToBf16 : F32ToF16;
    auto decode = dtype == DType::kBF16 ? Bf16ToF32 : F16ToF32;
    const size_t count = 517;
    std::vector<uint16_t> send(count), recv(count);
    // Small integers and halves are exact in both formats, as are their sums.
    for (size_t i = 0; i < count; ++i) send[i] = encode(float(i % 16) * 0.5f + r);
    REQUIRE(comm.AllReduce(send.data(), recv.data(), count, dtype, ReduceOp::kSum,
                           HostStream()).ok());
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(decode(recv[i]) == float(i % 16) * 0.5f * n + float(n * (n - 1) / 2));
    }
    REQUIRE(comm.AllReduce(send.data(), recv.data(), count, dtype, ReduceOp::kMax,
                           HostStream()).ok());
    for (size_t i = 0; i < count; ++i) REQUIRE(decode(recv[i]) == float(i % 16) * 0.5f + (n - 1));
  }
  // A sum that is not representable rounds to nearest even, as NCCL does.
  // Only ranks 0 and 1 contribute (the rest add zeros), so every reduction
  // order performs the same single rounding: 256 + 1 = 257 ties down to 256
  // and 258 + 1 = 259 ties up to 260 in bf16 (8 significant bits).
  if (n > 1) {
    for (const auto& [big, want] : {std::pair<float, float>{256.0f, 256.0f}, {258.0f, 260.0f}}) {
      std::vector<uint16_t> one = {F32ToBf16(r == 0 ? big : (r == 1 ? 1.0f : 0.0f))}, out(1);
      REQUIRE(comm.AllReduce(one.data(), out.data(), 1, DType::kBF16, ReduceOp::kSum,
                             HostStream()).ok());
      CHECK(Bf16ToF32(out[0]) == want);
    }
  }
}

TEST_CASE("ReduceScatter gives each rank its reduced chunk", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  for (size_t chunk : kCounts) {
    INFO("chunk " << chunk);
    std::vector<float> send(chunk * n), recv(chunk, -1.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = float(i + r);
    REQUIRE(comm.ReduceScatter(send.data(), recv.data(), chunk, DType::kF32, ReduceOp::kSum,
                               HostStream()).ok());
    for (size_t j = 0; j < chunk; ++j) {
      const size_t i = r * chunk + j;
      REQUIRE(recv[j] == float(i * n + n * (n - 1) / 2));
    }
  }
  // In place: the result lands in this rank's own chunk of the input.
  const size_t chunk = 129;
  std::vector<float> data(chunk * n);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  float* own = data.data() + r * chunk;
  REQUIRE(comm.ReduceScatter(data.data(), own, chunk, DType::kF32, ReduceOp::kSum,
                             HostStream()).ok());
  for (size_t j = 0; j < chunk; ++j) REQUIRE(own[j] == float((r * chunk + j) * n));
}

TEST_CASE("AllGather concatenates every rank's part in rank order", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  for (size_t part : kCounts) {
    INFO("part " << part);
    std::vector<uint16_t> send(part), recv(part * n, 0xffff);
    for (size_t i = 0; i < part; ++i) send[i] = uint16_t(r * 100 + i);
    REQUIRE(comm.AllGather(send.data(), recv.data(), part, DType::kBF16, HostStream()).ok());
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < part; ++i) REQUIRE(recv[q * part + i] == uint16_t(q * 100 + i));
    }
  }
  // In place: this rank's part already sits at its offset.
  const size_t part = 1001;
  std::vector<float> data(part * n, -1.0f);
  for (size_t i = 0; i < part; ++i) data[r * part + i] = float(r) + 0.25f * i;
  REQUIRE(comm.AllGather(data.data() + r * part, data.data(), part, DType::kF32,
                         HostStream()).ok());
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < part; ++i) REQUIRE(data[q * part + i] == float(q) + 0.25f * i);
  }
}

TEST_CASE("Broadcast copies the root's buffer to all ranks", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  for (int root : {0, n - 1}) {
    std::vector<float> data(777);
    for (size_t i = 0; i < data.size(); ++i) data[i] = float(r == root ? i * 3 : -1.0);
    REQUIRE(comm.Broadcast(data.data(), data.size(), DType::kF32, root, HostStream()).ok());
    for (size_t i = 0; i < data.size(); ++i) REQUIRE(data[i] == float(i * 3));
  }
  REQUIRE(comm.Barrier().ok());
}

TEST_CASE("AllToAll sends each rank's r-th part to rank r", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> send(3 * n), recv(3 * n, -1.0f);
  for (int q = 0; q < n; ++q) {
    for (int i = 0; i < 3; ++i) send[3 * q + i] = float(r * 100 + q * 10 + i);
  }
  REQUIRE(comm.SetRanksPerNode(2).ok());
  const CollectiveStats before = comm.stats(Collective::kAllToAll);
  REQUIRE(comm.AllToAll(send.data(), recv.data(), 3, DType::kF32, HostStream()).ok());
  for (int q = 0; q < n; ++q) {
    for (int i = 0; i < 3; ++i) CHECK(recv[3 * q + i] == float(q * 100 + r * 10 + i));
  }
  // Nodes of 2 (one on fewer ranks): each rank keeps its own part, sends
  // one inside its node and the rest across.
  const CollectiveStats d = comm.stats(Collective::kAllToAll) - before;
  const int64_t bytes = 3 * 4 * n, per_node = std::min(n, 2);
  CHECK(d.bytes == bytes);
  CHECK(d.intra_node_bytes == (per_node - 1) * bytes);
  CHECK(d.inter_node_bytes == (n - per_node) * bytes);
  const absl::Status same = comm.AllToAll(send.data(), send.data(), 3, DType::kF32, HostStream());
  CHECK(same.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(same.message()) ==
        "AllToAll on rank " + std::to_string(r) + " of " + std::to_string(n) +
            ": send and recv are the same buffer (not in place)");
  REQUIRE(comm.SetRanksPerNode(n).ok());
}

TEST_CASE("byte counters sum the logical buffer of each call", "[mpi]") {
  MpiCommunicator& comm = World();
  const int64_t n = comm.world_size();
  comm.ResetStats();
  std::vector<float> a(1000 * n), b(1000 * n);
  REQUIRE(comm.AllReduce(a.data(), b.data(), 1000, DType::kF32, ReduceOp::kSum, HostStream()).ok());
  REQUIRE(comm.AllReduce(a.data(), b.data(), 10, DType::kBF16, ReduceOp::kSum, HostStream()).ok());
  REQUIRE(comm.ReduceScatter(a.data(), b.data(), 250, DType::kF32, ReduceOp::kSum, HostStream()).ok());
  REQUIRE(comm.AllGather(a.data(), b.data(), 250, DType::kF16, HostStream()).ok());
  REQUIRE(comm.Broadcast(a.data(), 3, DType::kF32, 0, HostStream()).ok());
  REQUIRE(comm.Barrier().ok());
  CHECK(comm.stats(Collective::kAllReduce).calls == 2);
  CHECK(comm.stats(Collective::kAllReduce).bytes == 4000 + 20);
  CHECK(comm.stats(Collective::kReduceScatter).calls == 1);
  CHECK(comm.stats(Collective::kReduceScatter).bytes == 250 * n * 4);
  CHECK(comm.stats(Collective::kAllGather).bytes == 250 * n * 2);
  CHECK(comm.stats(Collective::kBroadcast).bytes == 12);
  CHECK(comm.stats(Collective::kBarrier).calls == 1);
  CHECK(comm.stats(Collective::kBarrier).bytes == 0);
  CHECK(comm.total_bytes() == 4020 + 250 * n * 6 + 12);
}

TEST_CASE("link bytes count each call's traffic inside and across nodes", "[mpi]") {
  MpiCommunicator& comm = World();
  const int64_t n = comm.world_size();
  // mpirun starts every rank on this machine: one node.
  CHECK(comm.nodes() == 1);
  // Posing as nodes of 2 ranks: 4 ranks are 2 nodes, 1 or 2 ranks one.
  REQUIRE(comm.SetRanksPerNode(2).ok());
  const int64_t g = (n + 1) / 2;
  CHECK(comm.nodes() == g);
  comm.ResetStats();
  std::vector<float> a(1000 * n), b(1000 * n);
  REQUIRE(comm.AllReduce(a.data(), b.data(), 1000, DType::kF32, ReduceOp::kSum, HostStream()).ok());
  REQUIRE(comm.ReduceScatter(a.data(), b.data(), 250, DType::kF32, ReduceOp::kSum, HostStream()).ok());
  REQUIRE(comm.AllGather(a.data(), b.data(), 250, DType::kBF16, HostStream()).ok());
  REQUIRE(comm.Broadcast(a.data(), 3, DType::kF32, n - 1, HostStream()).ok());
  REQUIRE(comm.Barrier().ok());
  // An all-reduce of 4000 bytes moves each byte twice (reduce-scatter,
  // all-gather); across nodes once per node but the first, inside once
  // per rank but the nodes' first.
  CHECK(comm.stats(Collective::kAllReduce).inter_node_bytes == 2 * (g - 1) * 4000);
  CHECK(comm.stats(Collective::kAllReduce).intra_node_bytes == 2 * (n - g) * 4000);
  CHECK(comm.stats(Collective::kReduceScatter).inter_node_bytes == (g - 1) * 1000 * n);
  CHECK(comm.stats(Collective::kReduceScatter).intra_node_bytes == (n - g) * 1000 * n);
  CHECK(comm.stats(Collective::kAllGather).inter_node_bytes == (g - 1) * 500 * n);
  CHECK(comm.stats(Collective::kAllGather).intra_node_bytes == (n - g) * 500 * n);
  CHECK(comm.stats(Collective::kBroadcast).inter_node_bytes == (g - 1) * 12);
  CHECK(comm.stats(Collective::kBroadcast).intra_node_bytes == (n - g) * 12);
  CHECK(comm.stats(Collective::kBarrier).intra_node_bytes == 0);
  const LinkBytes total = comm.total_link_bytes();
  CHECK(total.inter_node == (g - 1) * (8000 + 1500 * n + 12));
  CHECK(total.intra_node == (n - g) * (8000 + 1500 * n + 12));
  // Inside plus across is what a ring moves: (ranks - 1) x the buffer.
  CHECK(total.inter_node + total.intra_node == (n - 1) * (8000 + 1500 * n + 12));
  const absl::Status bad = comm.SetRanksPerNode(0);
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.message()) == "ranks per node: expected >= 1, got 0");
  REQUIRE(comm.SetRanksPerNode(static_cast<int>(n)).ok());
  CHECK(comm.nodes() == 1);
  comm.ResetStats();
}

TEST_CASE("splits make groups of ranks with their own collectives, nodes and counters",
          "[mpi][split]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  REQUIRE(comm.SetRanksPerNode(2).ok());
  auto node = comm.SplitNode();
  REQUIRE(node.ok());
  CHECK((*node)->world_size() == std::min(n, 2));
  CHECK((*node)->rank() == r % 2);
  CHECK((*node)->nodes() == 1);
  CHECK((*node)->kind() == "mpi");
  // Across the posed nodes: the ranks with this one's place in its node.
  auto across = comm.SplitStrided(2 > n ? n : 2);
  REQUIRE(across.ok());
  const int stride = std::min(n, 2);
  CHECK((*across)->world_size() == n / stride);
  CHECK((*across)->rank() == r / stride);
  CHECK((*across)->nodes() == n / stride);
  // Each group sums its own ranks.
  float mine = float(r + 1);
  REQUIRE((*node)->AllReduce(&mine, &mine, 1, DType::kF32, ReduceOp::kSum, HostStream()).ok());
  const int first = r / 2 * 2;
  CHECK(mine == float(first + 1 + (first + 1 < n ? first + 2 : 0)));
  std::vector<float> gathered(n / stride);
  float own = float(r);
  const CollectiveStats world_before = comm.stats(Collective::kAllGather);
  REQUIRE((*across)->AllGather(&own, gathered.data(), 1, DType::kF32, HostStream()).ok());
  // The world counts its groups' calls too: this rank's call and bytes,
  // and the link bytes of all `stride` groups.
  const CollectiveStats world_delta = comm.stats(Collective::kAllGather) - world_before;
  CHECK(world_delta.calls == 1);
  CHECK(world_delta.bytes == 4 * (n / stride));
  CHECK(world_delta.inter_node_bytes == stride * (n / stride - 1) * 4 * (n / stride));
  for (int i = 0; i < n / stride; ++i) CHECK(gathered[i] == float(r % stride + i * stride));
  // Their counters are their own; the link bytes follow their nodes.
  CHECK((*node)->stats(Collective::kAllReduce).calls == 1);
  CHECK((*node)->total_link_bytes().inter_node == 0);
  CHECK((*across)->total_link_bytes().inter_node == (n / stride - 1) * 4 * (n / stride));
  CHECK((*across)->total_link_bytes().intra_node == 0);
  auto blocks = comm.SplitBlocks(n);
  REQUIRE(blocks.ok());
  CHECK((*blocks)->world_size() == n);
  CHECK((*blocks)->nodes() == (n + 1) / 2);
  if (n == 4) {
    const absl::Status bad = comm.SplitBlocks(3).status();
    CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad.message()) == "group size: expected a divisor of the 4 ranks, got 3");
  }
  REQUIRE(comm.SetRanksPerNode(n).ok());
}

TEST_CASE("MEMWALL_RANKS_PER_NODE poses the ranks as nodes of that many", "[mpi]") {
  const int n = World().world_size();
  REQUIRE(setenv("MEMWALL_RANKS_PER_NODE", "1", 1) == 0);
  auto each_a_node = MpiCommunicator::Create();
  REQUIRE(each_a_node.ok());
  CHECK((*each_a_node)->nodes() == n);
  REQUIRE(setenv("MEMWALL_RANKS_PER_NODE", "two", 1) == 0);
  auto bad = MpiCommunicator::Create();
  REQUIRE(unsetenv("MEMWALL_RANKS_PER_NODE") == 0);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) ==
        "MEMWALL_RANKS_PER_NODE: expected an integer >= 1, got 'two'");
  auto detected = MpiCommunicator::Create();
  REQUIRE(detected.ok());
  CHECK((*detected)->nodes() == 1);
}

TEST_CASE("ranks that disagree on the count all get the same clear error", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  comm.ResetStats();
  std::vector<float> buffer(64);
  const size_t count = r == 0 ? 10 : 12;
  const absl::Status status =
      comm.AllReduce(buffer.data(), buffer.data(), count, DType::kF32, ReduceOp::kSum,
                     HostStream());
  if (n == 1) {
    CHECK(status.ok());
    return;
  }
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "AllReduce on rank " + std::to_string(r) + " of " + std::to_string(n) +
            ": ranks disagree on the element count (from 10 to 12; this rank passed " +
            std::to_string(count) + ")");
  // A failed call is not counted, and the communicator still works.
  CHECK(comm.stats(Collective::kAllReduce).calls == 0);
  REQUIRE(comm.AllReduce(buffer.data(), buffer.data(), 4, DType::kF32, ReduceOp::kSum,
                         HostStream()).ok());
}

TEST_CASE("ranks that call different collectives, dtypes or roots get errors", "[mpi]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  std::vector<float> buffer(64 * n);
  if (n > 1) {
    absl::Status status =
        r == 0 ? comm.AllReduce(buffer.data(), buffer.data(), 8, DType::kF32, ReduceOp::kSum,
                                HostStream())
               : comm.AllGather(buffer.data(), buffer.data() + 8 * r, 8, DType::kF32,
                                HostStream());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("ranks called different collectives at the same point"));

    status = comm.AllReduce(buffer.data(), buffer.data(), 8, r == 0 ? DType::kF32 : DType::kBF16,
                            ReduceOp::kSum, HostStream());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Contains("ranks disagree on the dtype"));

    status = comm.Broadcast(buffer.data(), 8, DType::kF32, r == 0 ? 0 : 1, HostStream());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Contains("ranks disagree on the root (from 0 to 1"));
  }
  // A root out of range on one rank fails that rank with the reason and the
  // others with a pointer to it, without a hang.
  const int root = r == n - 1 ? n : 0;
  const absl::Status status = comm.Broadcast(buffer.data(), 8, DType::kF32, root, HostStream());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  if (r == n - 1) {
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("root " + std::to_string(n) + " is not a rank (expected 0.." +
                               std::to_string(n - 1) + ")"));
  } else {
    CHECK_THAT(std::string(status.message()),
               Catch::Contains("another rank rejected its arguments to this call"));
  }
  // Null buffers with a non-zero count are rejected the same way.
  const absl::Status null_status = comm.AllReduce(
      r == 0 ? nullptr : buffer.data(), buffer.data(), 8, DType::kF32, ReduceOp::kSum,
      HostStream());
  CHECK(null_status.code() == absl::StatusCode::kInvalidArgument);
  if (r == 0) CHECK_THAT(std::string(null_status.message()), Catch::Contains("a buffer is null but count is 8"));
}

TEST_CASE("collectives on an asynchronous stream run in order off the calling thread",
          "[mpi][async]") {
  MpiCommunicator& comm = World();
  const int n = comm.world_size(), r = comm.rank();
  static Device* device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value().release();
  auto stream = device->CreateAsyncStream().value();
  comm.ResetStats();
  const size_t count = 4099;
  std::vector<float> a(count * n), b(count), c(count * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i + r);
  // A chain: reduce-scatter, then gather the reduced chunks back.
  REQUIRE(comm.ReduceScatter(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, *stream).ok());
  REQUIRE(comm.AllGather(b.data(), c.data(), count, DType::kF32, *stream).ok());
  REQUIRE(stream->Synchronize().ok());
  for (size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == float(i * n + n * (n - 1) / 2));
  CHECK(comm.stats(Collective::kReduceScatter).calls == 1);
  CHECK(comm.stats(Collective::kAllGather).bytes == int64_t(count * n * 4));
  if (n > 1) {
    // A disagreement is reported when the stream is synchronised.
    const size_t bad = r == 0 ? 5 : 6;
    REQUIRE(comm.AllReduce(a.data(), a.data(), bad, DType::kF32, ReduceOp::kSum, *stream).ok());
    const absl::Status status = stream->Synchronize();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(status.message()), Catch::Contains("ranks disagree on the element count"));
  }
}

// A communicator of its own (the failures below break it), waiting at most
// `timeout` for the other ranks.
std::unique_ptr<MpiCommunicator> Fresh(absl::Duration timeout, bool check_agreement = true) {
  CommunicatorOptions options;
  options.timeout = timeout;
  options.check_agreement = check_agreement;
  return MpiCommunicator::Create(options).value();
}

// Calls `collective` on `comm` with buffers for its world.
absl::Status Call(Collective collective, MpiCommunicator& comm, Stream& stream) {
  const int n = comm.world_size(), r = comm.rank();
  static std::vector<float>* buffer = new std::vector<float>(256 * 4);
  float* b = buffer->data();
  switch (collective) {
    case Collective::kAllReduce:
      return comm.AllReduce(b, b, 200, DType::kF32, ReduceOp::kSum, stream);
    case Collective::kReduceScatter:
      return comm.ReduceScatter(b, b + 200 * r, 200, DType::kF32, ReduceOp::kSum, stream);
    case Collective::kAllGather:
      return comm.AllGather(b + 200 * r, b, 200, DType::kF32, stream);
    case Collective::kBroadcast:
      return comm.Broadcast(b, 200, DType::kF32, n - 1, stream);
    case Collective::kBarrier:
      return comm.Barrier();
    case Collective::kAllToAll:
      return comm.AllToAll(b, b + 400, 100, DType::kF32, stream);
  }
  return absl::InternalError("unknown collective");
}

TEST_CASE("a rank that leaves a collective fails it on every rank within the timeout",
          "[mpi][timeout]") {
  const int n = World().world_size(), r = World().rank();
  const absl::Duration timeout = absl::Milliseconds(300);
  for (bool agreement : {true, false}) {
    for (int c = 0; c < kNumCollectives; ++c) {
      const Collective collective = static_cast<Collective>(c);
      INFO(CollectiveName(collective) << (agreement ? ", with" : ", without")
                                      << " the agreement check, " << n << " ranks");
      std::unique_ptr<MpiCommunicator> comm = Fresh(timeout, agreement);
      // Two good calls, then the last rank's third fails.
      REQUIRE(Call(collective, *comm, HostStream()).ok());
      REQUIRE(Call(collective, *comm, HostStream()).ok());
      REQUIRE(comm->calls() == 2);
      if (r == n - 1) comm->InjectFailure(3);
      const auto start = std::chrono::steady_clock::now();
      const absl::Status status = Call(collective, *comm, HostStream());
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string where = std::string(CollectiveName(collective)) + " on rank " +
                                std::to_string(r) + " of " + std::to_string(n);
      if (r == n - 1) {
        REQUIRE(status.code() == absl::StatusCode::kUnavailable);
        CHECK(std::string(status.message()) ==
              where + ": injected failure of collective call 3; this rank left without joining "
                      "the others; the communicator is unusable now: end the job and resume "
                      "from the last checkpoint");
      } else {
        // The others waited the whole timeout, then gave up.
        REQUIRE(status.code() == absl::StatusCode::kDeadlineExceeded);
        const std::string call =
            agreement && collective != Collective::kBarrier
                ? "MPI_Iallreduce (agreement check)"
                : collective == Collective::kAllReduce     ? "AllReduce (MPI_Iallreduce)"
                : collective == Collective::kReduceScatter ? "ReduceScatter (MPI_Ireduce_scatter_block)"
                : collective == Collective::kAllGather     ? "AllGather (MPI_Iallgather)"
                : collective == Collective::kBroadcast     ? "Broadcast (MPI_Ibcast)"
                : collective == Collective::kAllToAll      ? "AllToAll (MPI_Ialltoall)"
                                                           : "Barrier (MPI_Ibarrier)";
        // Each call posts its agreement round and its transfer (a barrier
        // has no agreement round): the last rank posted two calls' worth,
        // this rank one more, and its count is read from the board.
        const int per_call = agreement && collective != Collective::kBarrier ? 2 : 1;
        CHECK(std::string(status.message()) ==
              call + " on rank " + std::to_string(r) + " of " + std::to_string(n) +
                  ": not every rank joined within 300ms (a rank failed, is stuck or stopped "
                  "calling collectives); never arrived: rank " + std::to_string(n - 1) +
                  ", which had posted " + std::to_string(2 * per_call) +
                  " of this communicator's MPI collectives to this rank's " +
                  std::to_string(2 * per_call + 1) +
                  "; the communicator is unusable now: end the job and resume from the last "
                  "checkpoint");
        CHECK(waited >= 0.3);
      }
      CHECK(comm->health().code() == status.code());
      // Broken for good: every later call fails at once with the first error,
      // on the asynchronous stream too, and the control exchange as well.
      const absl::Status again = Call(Collective::kAllGather, *comm, HostStream());
      CHECK(again.code() == status.code());
      CHECK_THAT(std::string(again.message()),
                 Catch::StartsWith("AllGather on rank " + std::to_string(r) + " of " +
                                   std::to_string(n) + ": the communicator failed earlier ("));
      int64_t value = 1;
      const absl::Status control = comm->AllReduceHost(&value, 1, MPI_INT64_T, MPI_SUM, "a value");
      CHECK(control.code() == status.code());
      CHECK_THAT(std::string(control.message()),
                 Catch::StartsWith("a value on rank " + std::to_string(r) +
                                   " of " + std::to_string(n) + ": the communicator failed earlier"));
      static Device* device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value().release();
      auto async = device->CreateAsyncStream().value();
      REQUIRE(Call(Collective::kAllReduce, *comm, *async).ok());
      CHECK(async->Synchronize().code() == status.code());
      CHECK(comm->stats(collective).calls == 2);
      CHECK(comm->calls() == 5);
    }
  }
  // The world's own communicator was never involved: the ranks still meet.
  REQUIRE(World().Barrier().ok());
}

TEST_CASE("a timeout in a group names the ranks that never arrived by group and world rank",
          "[mpi][timeout]") {
  const int n = World().world_size(), r = World().rank();
  if (n != 4) return;
  std::unique_ptr<MpiCommunicator> world = Fresh(absl::Milliseconds(300));
  // Groups {0, 2} and {1, 3}: the second's rank 1 (world rank 3) leaves its
  // first collective; world rank 1 waits for it, the other group is done.
  std::unique_ptr<Communicator> group = world->SplitStrided(2).value();
  float value = 1;
  if (r == 3) group->InjectFailure(1);
  const absl::Status status =
      group->AllReduce(&value, &value, 1, DType::kF32, ReduceOp::kSum, HostStream());
  if (r == 0 || r == 2) {
    REQUIRE(status.ok());
    CHECK(value == 2);
  } else if (r == 3) {
    CHECK(status.code() == absl::StatusCode::kUnavailable);
  } else {
    REQUIRE(status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(status.message()) ==
          "MPI_Iallreduce (agreement check) on rank 0 of 2: not every rank joined within 300ms "
          "(a rank failed, is stuck or stopped calling collectives); never arrived: rank 1 "
          "(world rank 3), which had posted 0 of this communicator's MPI collectives to this "
          "rank's 1; the communicator is unusable now: end the job and resume from the last "
          "checkpoint");
  }
  REQUIRE(World().Barrier().ok());
}

TEST_CASE("a rank stopped inside a collective is named as stalled there", "[mpi][timeout]") {
  const int n = World().world_size(), r = World().rank();
  if (n < 2) return;
  int pid = static_cast<int>(getpid());
  std::vector<int> pids(n);
  REQUIRE(MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, World().comm()) ==
          MPI_SUCCESS);
  // No agreement round: the transfer is the first thing posted. 4 MiB moves
  // in fragments that need every rank polling, so the others cannot finish
  // it without the stopped rank.
  const bool stopped = r == n - 1;
  std::unique_ptr<MpiCommunicator> comm =
      Fresh(stopped ? absl::Seconds(10) : absl::Seconds(1), /*check_agreement=*/false);
  // MPI may keep using a timed-out collective's buffer: never freed.
  std::vector<float>& values = *new std::vector<float>(1 << 20, 1.0f);
  // The others meet without the stopped rank.
  MPI_Comm others = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_split(World().comm(), stopped ? MPI_UNDEFINED : 0, r, &others) ==
          MPI_SUCCESS);
  constexpr int kPostingTag = 7;
  if (stopped) {
    // Tells rank 0 it posts the all-reduce now; rank 0 stops this process
    // inside its wait and lets it go on once the others have timed out.
    // Its own outcome depends on when it resumes: not checked.
    static int posting = 1;
    MPI_Request told = MPI_REQUEST_NULL;
    REQUIRE(MPI_Isend(&posting, 1, MPI_INT, 0, kPostingTag, World().comm(), &told) ==
            MPI_SUCCESS);
    comm->AllReduce(values.data(), values.data(), values.size(), DType::kF32, ReduceOp::kSum,
                    HostStream())
        .IgnoreError();
    REQUIRE(MPI_Wait(&told, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  } else {
    if (r == 0) {
      int posting = 0;
      REQUIRE(MPI_Recv(&posting, 1, MPI_INT, n - 1, kPostingTag, World().comm(),
                       MPI_STATUS_IGNORE) == MPI_SUCCESS);
      // It posts right after its message: a second to get there.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      REQUIRE(kill(pids[n - 1], SIGSTOP) == 0);
    }
    REQUIRE(MPI_Barrier(others) == MPI_SUCCESS);  // after the stop
    const absl::Status status = comm->AllReduce(values.data(), values.data(), values.size(),
                                                DType::kF32, ReduceOp::kSum, HostStream());
    // Resumed once every other rank has its error (one still watching it
    // would see it poll again).
    MPI_Barrier(others);
    if (r == 0) REQUIRE(kill(pids[n - 1], SIGCONT) == 0);
    MPI_Comm_free(&others);
    REQUIRE(status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(status.message()) ==
          "AllReduce (MPI_Iallreduce) on rank " + std::to_string(r) + " of " +
              std::to_string(n) +
              ": not every rank joined within 1s (a rank failed, is stuck or stopped calling "
              "collectives); stalled inside it: rank " + std::to_string(n - 1) +
              " (posted it, then stopped polling: a stopped process, or stuck in MPI); the "
              "communicator is unusable now: end the job and resume from the last checkpoint");
  }
  REQUIRE(World().Barrier().ok());
}

TEST_CASE("a rank that arrives late but within the timeout is waited for", "[mpi][timeout]") {
  const int n = World().world_size(), r = World().rank();
  std::unique_ptr<MpiCommunicator> comm = Fresh(absl::Seconds(60));
  std::vector<float> buffer(16, float(r + 1));
  if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  REQUIRE(comm->AllReduce(buffer.data(), buffer.data(), 16, DType::kF32, ReduceOp::kSum,
                          HostStream()).ok());
  CHECK(buffer[15] == float(n * (n + 1) / 2));
  int64_t values[2] = {r, -r};
  REQUIRE(comm->AllReduceHost(values, 2, MPI_INT64_T, MPI_MAX, "extremes").ok());
  CHECK(values[0] == n - 1);
  CHECK(values[1] == 0);
  CHECK(comm->health().ok());
  // Disagreements are errors of the call, not of the communicator.
  const absl::Status status = comm->AllReduce(buffer.data(), buffer.data(), r == 0 ? 3 : 4,
                                              DType::kF32, ReduceOp::kSum, HostStream());
  CHECK(status.code() == (n == 1 ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument));
  CHECK(comm->health().ok());
  CHECK(comm->Barrier().ok());
}

TEST_CASE("the rank that arrives last to the collectives is named, and what it cost",
          "[mpi][arrivals]") {
  // The last rank sleeps 30 ms before each of 12 collectives: of the 11
  // compared (each round shares the one before), it arrives last to (all,
  // on an idle machine) nearly all, on every rank alike, and the others
  // waited about 30 ms each time, nearly all of it for it.
  const int n = World().world_size(), r = World().rank();
  std::unique_ptr<MpiCommunicator> comm = Fresh(absl::Seconds(60));
  CHECK(comm->arrivals().last == std::vector<int64_t>(n, 0));
  std::vector<float> buffer(16, 1.0f);
  for (int call = 0; call < 12; ++call) {
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    REQUIRE(comm->AllReduce(buffer.data(), buffer.data(), 16, DType::kF32, ReduceOp::kMax,
                            HostStream()).ok());
  }
  const Arrivals& a = comm->arrivals();
  REQUIRE(a.last.size() == size_t(n));
  CHECK(std::accumulate(a.last.begin(), a.last.end(), int64_t{0}) == 11);
  const double waited = std::accumulate(a.cost.begin(), a.cost.end(), 0.0);
  if (n > 1) {
    CHECK(a.last[n - 1] >= 9);
    CHECK(waited >= 11 * 0.025);
    CHECK(waited <= 11 * 0.5);
    CHECK(a.cost[n - 1] >= 0.75 * waited);
  }
  // Every rank counted the same.
  int64_t mine[2] = {a.last.back(), -a.last.back()};
  REQUIRE(comm->AllReduceHost(mine, 2, MPI_INT64_T, MPI_MAX, "arrivals").ok());
  CHECK(mine[0] == -mine[1]);
}

TEST_CASE("the simulated communicator validates and counts without bytes", "[simulated]") {
  auto bad = SimulatedCommunicator::Create(4, 4);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) == "rank: expected 0..3 for a world of 4, got 4");
  CHECK(std::string(SimulatedCommunicator::Create(0, 0).status().message()) ==
        "world size: expected >= 1, got 0");

  auto comm = SimulatedCommunicator::Create(3, 64).value();
  CHECK(comm->kind() == "simulated");
  // 1.5e9 parameters in bf16: far more than this machine could move.
  const size_t shard = 1'500'000'000 / 64;
  REQUIRE(comm->ReduceScatter(nullptr, nullptr, shard, DType::kBF16, ReduceOp::kSum,
                              HostStream()).ok());
  REQUIRE(comm->AllGather(nullptr, nullptr, shard, DType::kBF16, HostStream()).ok());
  CHECK(comm->stats(Collective::kReduceScatter).bytes == int64_t(shard) * 64 * 2);
  CHECK(comm->total_bytes() == int64_t(shard) * 64 * 2 * 2);
  // One node unless told: 63 ranks receive each byte inside it.
  CHECK(comm->nodes() == 1);
  CHECK(comm->total_link_bytes().intra_node == int64_t(shard) * 64 * 2 * 2 * 63);
  CHECK(comm->total_link_bytes().inter_node == 0);
  // Its groups play the group's rank: rank 3 of 64 in blocks of 8 is
  // rank 3 of the first block; strided by 8 (one per block), rank 0 of 8.
  REQUIRE(comm->SetRanksPerNode(8).ok());
  auto block = comm->SplitBlocks(8).value();
  CHECK(block->kind() == "simulated");
  CHECK(block->rank() == 3);
  CHECK(block->world_size() == 8);
  CHECK(block->nodes() == 1);
  auto strided = comm->SplitStrided(8).value();
  CHECK(strided->rank() == 0);
  CHECK(strided->world_size() == 8);
  CHECK(strided->nodes() == 8);
  // 8 nodes of 8: a reduce-scatter's buffer crosses into 7 of them.
  REQUIRE(comm->SetRanksPerNode(8).ok());
  comm->ResetStats();
  REQUIRE(comm->ReduceScatter(nullptr, nullptr, shard, DType::kBF16, ReduceOp::kSum,
                              HostStream()).ok());
  CHECK(comm->stats(Collective::kReduceScatter).inter_node_bytes == int64_t(shard) * 64 * 2 * 7);
  CHECK(comm->stats(Collective::kReduceScatter).intra_node_bytes == int64_t(shard) * 64 * 2 * 56);
  const absl::Status status = comm->Broadcast(nullptr, 8, DType::kF32, 64, HostStream());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()), Catch::Contains("root 64 is not a rank (expected 0..63)"));
}

}  // namespace
}  // namespace memwall
