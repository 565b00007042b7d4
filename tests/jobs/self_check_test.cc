// The self-check job on real MPI ranks (mpirun -np 1, 2, 4): the update
// agrees with the one each rank computes alone, rank 0 holds every rank's
// books (the others none), and the books are ZeRO-1's accounting (Rajbhandari
// et al.: 2 bytes per parameter of bf16 weights and of gradients on every
// rank, 12 bytes per parameter of f32 master weights and Adam moments split
// over the ranks), on shards padded to 128 elements.
#include "jobs/self_check.h"

#include "catch2/catch.hpp"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

TEST_CASE("the self-check's books on every rank", "[self_check]") {
  const int ranks = testing::World().world_size();
  SelfCheckOptions options;
  options.parameters = 100003;
  options.capacity_bytes = 64 * kMiB;
  const absl::StatusOr<SelfCheckReport> report = RunSelfCheck(options);
  REQUIRE(report.ok());
  CHECK(report->world_size == ranks);
  const int64_t per_rank = (100003 + ranks - 1) / ranks;
  const int64_t shard = (per_rank + 127) / 128 * 128;  // rounded up to 128 elements
  CHECK(report->shard_numel == shard);
  CHECK_FALSE(report->isa.empty());
  if (report->rank != 0) {
    CHECK(report->ranks.empty());
    return;
  }
  CHECK(report->mismatches == 0);
  REQUIRE(report->ranks.size() == static_cast<size_t>(ranks));
  const int64_t padded = shard * ranks;
  for (const SelfCheckBooks& b : report->ranks) {
    CHECK(b.peak_by_category[int(MemoryCategory::kParameter)] == padded * 2);
    CHECK(b.peak_by_category[int(MemoryCategory::kGradient)] == padded * 2);
    CHECK(b.peak_by_category[int(MemoryCategory::kOptimizerState)] == shard * 3 * 4);
    CHECK(b.peak_by_category[int(MemoryCategory::kActivation)] == 0);
    CHECK(b.mismatches == 0);
    // The reduce-scatter's input is the f32 gradient, whole.
    CHECK(b.reduce_scatter_bytes == padded * 4);
  }
}

TEST_CASE("the self-check refuses the cuda backend by name", "[self_check]") {
  SelfCheckOptions options;
  options.backend = Backend::kCuda;
  const absl::Status status = RunSelfCheck(options).status();
  CHECK(status.code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith("demo: the cuda backend is not wired into the demo"));
}

}  // namespace
}  // namespace memwall
