// `memwall demo`: the self-check's report (jobs/self_check.h) for people.
#ifndef MEMWALL_CLI_DEMO_H_
#define MEMWALL_CLI_DEMO_H_

#include "absl/status/status.h"
#include "jobs/self_check.h"

namespace memwall {

// Runs the self-check; rank 0 prints what was checked and each rank's peak
// memory by category and communication. A mismatch is kInternal after the
// report.
absl::Status RunDemo(const SelfCheckOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_DEMO_H_
