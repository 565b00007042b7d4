// The largest model of a family that trains on a machine: sizes searched
// by dry runs (engine/dry_run.h), each under the most memory-frugal
// strategy the machine's budgets allow, then the largest that fits given
// the first strategy, fastest first, that fits it. What `memwall
// max-params` prints; benchmarks/max_params tabulates fixed strategies.
#ifndef MEMWALL_ENGINE_MAX_PARAMS_H_
#define MEMWALL_ENGINE_MAX_PARAMS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/config.h"
#include "engine/dry_run.h"

namespace memwall {

// One member of a model family.
struct FamilyMember {
  std::string spec;  // what --model runs it as (untiled)
  ModelFactory model;
  // Set for a family whose block operators tile (a GPT): the member in
  // `tiles` tiles, with the spec that runs it; an error for a count its
  // widths do not take.
  std::function<absl::StatusOr<std::pair<std::string, ModelFactory>>(int64_t tiles)> tiled;
};

// Members by size, 1, 2, 3, ...: a larger size has more parameters. An
// error for a size the family cannot make (the search stops below it).
using ModelFamily = std::function<absl::StatusOr<FamilyMember>(int64_t size)>;

struct MaxParamsOptions {
  ModelFamily family;
  int64_t max_size = 1024;  // the largest size tried
  // The machine and micro-batch (its `model` is ignored: the family's).
  DryRunOptions machine;
  // Precision, optimizer and micro-batch kept; the strategy is searched.
  Config base;
};

struct MaxParamsResult {
  int64_t size = 0;  // 0: not even size 1 trains
  std::string model;  // the --model that runs it (with its tiles)
  int64_t tiles = 1;
  std::string strategy;  // "stage 3, optimizer on NVMe, ..."
  Config config;
  DryRunResult plan;
  // The next size up under the most frugal strategy (most tiles): its
  // spec and parameters, and its plan's "no (...)" reason; empty when
  // the family ends there (max_size, or a size it cannot make).
  std::string next_model;
  int64_t next_parameters = 0;
  std::string next_fails_on;
  int dry_runs = 0;  // how many the search made
};

// The search: sizes doubled from 1 until one does not fit, then bisected,
// each size dry-run under the most frugal strategy (below); then the
// largest fitting size under each strategy in this order, the first that
// fits chosen (each skipped without a dry run where the model states
// alone overflow a budget):
//   stage 3, recomputation optimal;
//   + optimizer offload (host memory > 0);
//   + parameter paging;
//   + the optimizer on NVMe (NVMe > 0);
//   + the parameters and gradients on NVMe too, the block weights gathered
//     on use, in 1, 2, 4, 8 or 16 tiles (the fewest that fit) where the
//     family tiles;
//   the last with activation checkpoints in host memory too (host > 0),
//     the most frugal.
// All at overlap_comm with buckets of 5e7 elements, at the base's
// micro-batch (machine.batch if set) and gradient accumulation.
// Errors: a size-1 member the family cannot make, or a dry run that
// cannot run at all.
absl::StatusOr<MaxParamsResult> MaxParams(const MaxParamsOptions& options);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_MAX_PARAMS_H_
