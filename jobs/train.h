// The training job (`memwall train`): a GPT trained on byte-level text across
// MPI ranks with the DeepSpeed-style config, resumed from and saved to
// training checkpoints. It reports what happens to a TrainObserver (on rank
// 0) and prints nothing: the command renders the events as text or JSON.
#ifndef MEMWALL_JOBS_TRAIN_H_
#define MEMWALL_JOBS_TRAIN_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "sharding/options.h"

namespace memwall {

struct TrainOptions {
  // A GPT preset, optionally with overrides: "gpt2-124m:layers=2".
  std::string model = "gpt-tiny";
  // A config file; empty means configs/gpt-tiny-zero2.json's contents.
  std::string config_path;
  Backend backend = Backend::kHost;
  int64_t capacity_bytes = int64_t{1} << 30;
  // The pinned host pool (offloaded optimizer states and activations); 0:
  // what PinnedBytes (engine/engine.h) derives from the config.
  int64_t pinned_bytes = 0;
  // The step the run trains up to (a resumed run continues from the
  // checkpoint's step to this one); 0 with save_dir saves the initial
  // weights.
  int64_t steps = 100;
  // Training checkpoints (engine/checkpoint.h): saved into `save_dir`
  // every `save_every` steps (0: only at the end) and at the end, keeping
  // the newest `keep_checkpoints`; `resume_dir` loads the newest complete
  // checkpoint under it first (at any world size and stage).
  std::string save_dir;
  int64_t save_every = 0;
  int keep_checkpoints = 3;
  std::string resume_dir;
  // A text file; empty means the built-in synthetic corpus.
  std::string data_path;
  uint64_t seed = 1;
  // Steps reported (TrainObserver::Stepped): every this many, the first
  // and the last.
  int64_t log_every = 10;
  // Meta only: the world the single process plays rank 0 of.
  int simulate_ranks = 1;
  // How long a rank waits for the others in one collective before the run
  // fails (CommunicatorOptions::timeout).
  absl::Duration collective_timeout = absl::Minutes(10);
  // Where each rank writes its memory reports if it runs out of memory
  // (<oom_dir>/rank<k>/).
  std::string oom_dir = "memwall-oom";
  // Tests only (no flag): rank `slow_rank` sleeps `slow_step` before each
  // step, a straggler on purpose for the summary to name. -1: none.
  int slow_rank = -1;
  absl::Duration slow_step;
};

// The run, once the engine is built.
struct TrainStart {
  int64_t parameters = 0, trainable_parameters = 0;
  ZeroConfig zero;  // the config's, its stage resolved
  int ranks = 1;             // the data-parallel world (simulated on meta)
  int64_t device_bytes = 0;  // per rank (with cuda and none given: what was free)
  std::string data;          // the file, or "built-in synthetic corpus"
  int64_t data_bytes = 0;
  int64_t micro_batch = 0, seq = 0, tokens_per_step = 0;
  int gradient_accumulation_steps = 1;
  std::string blas;           // the host backend's GEMMs; "" on the others
  std::string auto_strategy;  // what "stage": "auto" chose; "" otherwise
  std::string recomputation;  // the plan in one line; "" without one
  // The config's DeepSpeed settings memwall has no counterpart for
  // (Config::not_applied).
  std::vector<std::string> not_applied;
  // Optimizer offload (0 threads: none): the CPU update's threads, and,
  // with offload_optimizer.overlap_step, the flat groups backward hands it
  // (a model of one group overlaps nothing) and the first group's share
  // of the elements (reduced last, so updated after backward).
  int cpu_update_threads = 0;
  bool overlap_step = false;
  int groups = 0;
  int64_t numel = 0, first_group_numel = 0;
};

// A reported step.
struct TrainStep {
  int64_t step = 0;           // 1-based: the steps taken so far
  std::optional<float> loss;  // the ranks' mean; none on meta
  float lr = 0;               // the learning rate the step trained with
  bool lr_scheduled = false;  // the config has a scheduler
  double tokens_per_second = 0;
  bool applied = true;  // false: skipped for inf/nan gradients
  // The largest over the ranks of each category's peak (requested bytes),
  // and of the total's.
  std::array<int64_t, kNumMemoryCategories> peak_by_category{};
  int64_t peak = 0;
};

// The rank the others waited for longest over the run's collectives (the
// bucket effect; runtime/communicator.h Arrivals).
struct Straggler {
  int rank = 0;
  double cost_seconds = 0;    // the others' wait for it, arriving last
  double waited_seconds = 0;  // the others' wait for whichever rank was last
  int64_t last = 0;           // collectives it arrived last to
  int64_t calls = 0;          // collectives compared
};

struct TrainSummary {
  int64_t steps = 0, skipped = 0;
  double tokens_per_second = 0;
  std::optional<float> first_loss, last_loss;  // none on meta
  double ln_vocab = 0;                         // a uniform guess's loss
  std::optional<Straggler> straggler;          // none on one rank or on meta
  // The collectives' link bytes inside and across nodes per step (the
  // whole job's, runtime/communicator.h; the mean over the run's steps),
  // and the nodes the ranks run on.
  LinkBytes traffic_per_step;
  int nodes = 1;
};

// What the job reports, in order: Started; Resumed when it loaded a
// checkpoint; NothingToTrain when already at `steps`; Stepped (per
// log_every) and Saved as they happen; Finished after at least one step.
// Called on rank 0 only, from the job's thread.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void Started(const TrainStart& start) = 0;
  // `skipped`: the newer checkpoints passed over as damaged ("" if none).
  virtual void Resumed(const std::string& path, int64_t step, const std::string& skipped) = 0;
  virtual void NothingToTrain(int64_t step) = 0;
  virtual void Stepped(const TrainStep& step) = 0;
  virtual void Saved(const std::string& path) = 0;
  virtual void Finished(const TrainSummary& summary) = 0;
};

// Runs on every rank of MPI_COMM_WORLD (host, cuda) or as rank 0 of a
// simulated world (meta); rank 0 reports to `observer`. The memory
// profiler is always on: out of memory writes its reports and the error
// says where. Errors name the option (as its flag), file or key at fault.
absl::Status RunTrain(const TrainOptions& options, TrainObserver& observer);

}  // namespace memwall

#endif  // MEMWALL_JOBS_TRAIN_H_
