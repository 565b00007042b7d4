// The self-check (`memwall demo`): one step of memwall's engine on a toy
// caller-owned model (one parameter, ZeRO stage 1, bf16 with f32 master
// weights, AdamW) across MPI ranks, checked on every rank against the update
// computed there alone, with each rank's device memory by category and its
// communication. It exercises the engine end to end (backend, allocator,
// kernels, collectives, the optimizer) without a model of layers: a first
// check of a new machine or cluster.
#ifndef MEMWALL_JOBS_SELF_CHECK_H_
#define MEMWALL_JOBS_SELF_CHECK_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace memwall {

struct SelfCheckOptions {
  Backend backend = Backend::kHost;
  // Enforced device capacity per rank, in bytes.
  int64_t capacity_bytes = 256 << 20;
  // Parameters of the toy model.
  int64_t parameters = 8 << 20;
  // meta: the world this single process plays rank 0 of (one process
  // only: meta moves no bytes between real ranks).
  int simulate_ranks = 1;
};

// One rank's books after the step.
struct SelfCheckBooks {
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};  // requested bytes
  int64_t peak_requested = 0;
  int64_t peak_reserved = 0;
  int64_t reduce_scatter_bytes = 0;  // SUM of the collective's bytes
  int64_t all_gather_bytes = 0;
  // COUNT of gathered parameters that differ from the update computed on
  // this rank alone (0 on meta: no bytes exist).
  int64_t mismatches = 0;
};

struct SelfCheckReport {
  int rank = 0;
  // The communicator's world: on meta the simulated one this process is
  // rank 0 of.
  int world_size = 1;
  int64_t shard_numel = 0;  // parameters per shard
  // The CPU kernels' instruction set ("" on meta: nothing computes).
  std::string isa;
  // Every MPI rank's books, by rank (rank 0 only; empty on the others).
  std::vector<SelfCheckBooks> ranks;
  int64_t mismatches = 0;  // over the ranks (rank 0 only)
};

// Runs on every rank of MPI_COMM_WORLD (initialising MPI). A mismatch is
// reported, not an error: the caller shows the books, then fails. Errors:
// out of memory (kResourceExhausted, with the allocator's report) when the
// capacity is too small, kUnimplemented for the cuda backend, and any
// collective or backend error.
absl::StatusOr<SelfCheckReport> RunSelfCheck(const SelfCheckOptions& options);

}  // namespace memwall

#endif  // MEMWALL_JOBS_SELF_CHECK_H_
