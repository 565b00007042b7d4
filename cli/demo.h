// `memwall demo`: one step of memwall's engine on a toy caller-owned model
// (one parameter, ZeRO stage 1, bf16 with f32 master weights, AdamW) across
// MPI ranks, checked on every rank against the update computed there
// alone, with the device memory printed by category. It exercises the
// engine end to end (backend, allocator, kernels, collectives, the
// optimizer) without a model of layers: a first check of a new machine or
// cluster.
#ifndef MEMWALL_CLI_DEMO_H_
#define MEMWALL_CLI_DEMO_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/device.h"

namespace memwall {

struct DemoOptions {
  Backend backend = Backend::kHost;
  // Enforced device capacity per rank, in bytes.
  int64_t capacity_bytes = 256 << 20;
  // Parameters of the toy model.
  int64_t parameters = 8 << 20;
  // meta: the world this single process plays rank 0 of (one process
  // only: meta moves no bytes between real ranks).
  int simulate_ranks = 1;
};

// Runs the demo on every rank of MPI_COMM_WORLD (initialising MPI); rank 0
// prints the report. Errors: out of memory (kResourceExhausted, with the
// allocator's report) when the capacity is too small, and any collective
// or backend error.
absl::Status RunDemo(const DemoOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_DEMO_H_
