// How checkpoints lie on disk, and how the ranks agree while they save
// and load them: shared by the checkpoint proper (checkpoint.cc) and the
// directory a run saves into (save_directory.cc).
//
// A directory of checkpoints holds step-<8 digits> directories, each a
// checkpoint once its manifest (manifest.json) exists: the manifest is
// written last and removed first, so a step directory without one is a
// crash's or a full disk's leftover, never a checkpoint.
#ifndef MEMWALL_ENGINE_CHECKPOINT_LAYOUT_H_
#define MEMWALL_ENGINE_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

inline constexpr char kManifest[] = "manifest.json";
// The lock a saving run holds in its directory (SaveDirectory).
inline constexpr char kLockFile[] = ".memwall.lock";

// `dir`/step-<steps, 8 digits>.
std::string StepDir(const std::string& dir, int64_t step);

// A step-* directory: its step, path, and whether it holds a manifest.
struct StepDirectory {
  int64_t step;
  std::string path;
  bool complete;
};
// The step-* directories under `dir`, oldest first (none if unreadable).
std::vector<StepDirectory> StepDirs(const std::string& dir);

// Collective: every rank's `mine` (the same count on each), rank after
// rank, through `opt`'s communicator and device.
absl::StatusOr<std::vector<int64_t>> AllGatherInts(ShardedOptimizer& opt,
                                                   const std::vector<int64_t>& mine);
// Collective: `mine` on rank 0 (its part of a step only it does), shared:
// every rank returns rank 0's failure (its own message there, elsewhere
// "checkpoint <path>: rank 0 could not <what> (<code>, ...)"), so no rank
// waits in a later collective for a rank 0 that returned.
absl::Status RankZeroStatus(ShardedOptimizer& opt, const absl::Status& mine,
                            const std::string& path, const char* what);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_CHECKPOINT_LAYOUT_H_
