// `memwall demo`: one sharded optimizer step on tagged memory across MPI
// ranks, checked against a single-process update, with the device memory
// printed by category. It exercises the runtime end to end (backends,
// allocator, kernels, collectives) without a model.
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
  // Parameters of the toy model (rounded up to a multiple of the ranks).
  int64_t parameters = 8 << 20;
};

// Runs the demo on every rank of MPI_COMM_WORLD (initialising MPI); rank 0
// prints the report. Errors: out of memory (kResourceExhausted, with the
// allocator's report) when the capacity is too small, and any collective
// or backend error.
absl::Status RunDemo(const DemoOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_DEMO_H_
