// `memwall train`: trains a GPT on byte-level text across MPI ranks with the
// DeepSpeed-style config, printing progress (loss, tokens/s, device memory
// by category) and a summary.
#ifndef MEMWALL_CLI_TRAIN_H_
#define MEMWALL_CLI_TRAIN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/device.h"

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
  int64_t log_every = 10;
  // "text" (lines for people) or "json" (one JSON object per line, for
  // programs: events "start", "resumed", "step", "saved", "nothing_to_train",
  // "summary"; sizes in bytes, throughput in tokens/s).
  std::string log_format = "text";
  // Meta only: the world the single process plays rank 0 of.
  int simulate_ranks = 1;
  // How long a rank waits for the others in one collective before the run
  // fails (CommunicatorOptions::timeout).
  absl::Duration collective_timeout = absl::Minutes(10);
  // Where each rank writes its memory reports if it runs out of memory
  // (<oom_dir>/rank<k>/).
  std::string oom_dir = "memwall-oom";
};

// Runs on every rank of MPI_COMM_WORLD (host) or as rank 0 of a simulated
// world (meta); rank 0 prints. The memory profiler is always on: out of
// memory writes its reports and the error says where. Errors name the flag,
// file or key at fault.
absl::Status RunTrain(const TrainOptions& options);

}  // namespace memwall

#endif  // MEMWALL_CLI_TRAIN_H_
