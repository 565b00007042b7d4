// The directory a run saves its checkpoints into (engine/checkpoint.h):
// checked on every rank, locked, and held for the run.
#ifndef MEMWALL_ENGINE_SAVE_DIRECTORY_H_
#define MEMWALL_ENGINE_SAVE_DIRECTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "sharding/sharded_optimizer.h"

namespace memwall {

// The directory a run saves its checkpoints into, checked before the run's
// first step (so that a bad --save is found before hours of training, not
// at the first save) and held until the run ends.
class SaveDirectory {
 public:
  // Collective. Creates `dir` (and its parents) if needed; checks that
  // every rank can write there (each writes, fsyncs and removes a probe
  // file); takes an exclusive lock that rank 0 holds until this object is
  // destroyed (`<dir>/.memwall.lock`, flock), so two runs never save into
  // one directory; and, unless `resuming_from_it` (this run resumed from a
  // checkpoint in `dir`, or saved there before), refuses a directory
  // already holding complete checkpoints (step-* with a manifest): they are
  // another run's, and its pruning and a later --resume would mix the two
  // runs. Incomplete step-* directories (a crash's or a full disk's
  // leftovers) are no checkpoints and do not count. Errors name the directory (and the rank):
  // kFailedPrecondition for a directory in use or holding another run's
  // checkpoints, kPermissionDenied or kInternal for one that cannot be
  // created or written.
  // `names` are how the caller's user names the directory and the way to
  // resume from it ("--save", "--resume" on the command line).
  struct Names {
    std::string save = "--save";
    std::string resume = "--resume";
  };
  static absl::StatusOr<std::unique_ptr<SaveDirectory>> Open(ShardedOptimizer& opt,
                                                            const std::string& dir,
                                                            bool resuming_from_it,
                                                            const Names& names);
  ~SaveDirectory();
  SaveDirectory(const SaveDirectory&) = delete;
  SaveDirectory& operator=(const SaveDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  SaveDirectory(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}
  std::string path_;
  int lock_fd_;  // rank 0: the locked file; others: -1
};

}  // namespace memwall

#endif  // MEMWALL_ENGINE_SAVE_DIRECTORY_H_
