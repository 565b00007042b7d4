// Training checkpoints (model state, not activation checkpointing): save,
// resume on any number of ranks and any ZeRO stage, and export of the
// consolidated model.
//
// A checkpoint is a directory `<dir>/step-<8 digits>` holding one file per
// saving rank, `rank-<5 digits>.safetensors`, and `manifest.json`, written
// last. Each rank file is a safetensors file (an 8-byte little-endian
// header length, a JSON header {"<tensor>": {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}}, then the raw little-endian data) holding
// the f32 optimizer state of whole parameters, by name: "<param>/master"
// (the master weights; the parameters in f32 runs), "<param>/exp_avg" and
// "<param>/exp_avg_sq" (Adam) or "<param>/momentum" (SGD with momentum).
// Rank r writes the parameters of flat groups g with g % world == r, so the
// files are written in parallel and the bytes balance. Nothing in a file
// depends on the saving run's world size, stage or bucket sizes, so a run
// with any of those loads it directly: resharding is loading.
//
// The manifest (schema "memwall.checkpoint/1") records the step counters
// and loss scaler (sharding/sharded_optimizer.h Progress), the trainer's
// steps (the data position: memwall's batches are a function of the step,
// and its layers draw no random numbers, so there is no RNG state), the
// saving world size, stage, dtypes and optimizer, every parameter with its
// shape and file, and every file with its size and CRC-32.
//
// Atomicity: each file is written under a temporary name, fsync'ed and
// renamed; the manifest goes last the same way, then the directory is
// fsync'ed. A checkpoint without its manifest does not exist: a crash at
// any point leaves the previous one complete, and loading picks the newest
// complete one. After a save, complete checkpoints beyond the newest `keep`
// are deleted, and incomplete ones older than the new one with them.
//
// Loading checks everything before it changes anything: the manifest's
// fields, that it describes this model (names, shapes, optimizer), every
// file's size and CRC-32 and every safetensors header. Errors name the
// file, the field and the problem; a failed load leaves the optimizer as it
// was. Host memory stays bounded while saving and loading: one flat group's
// state at a time.
#ifndef MEMWALL_ENGINE_CHECKPOINT_H_
#define MEMWALL_ENGINE_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "sharding/sharded_optimizer.h"
#include "runtime/dtype.h"

namespace memwall {

// Collective: saves `opt` (whatever model registered its parameters: the
// engine's layers or a caller's own) after `steps` training steps into
// `<dir>/step-<steps>` (creating `dir`), then keeps the newest `keep` (>= 1)
// checkpoints. Returns the checkpoint's directory. Errors name the path.
absl::StatusOr<std::string> SaveCheckpoint(ShardedOptimizer& opt, int64_t steps,
                                           const std::string& dir, int keep);
// The same for `trainer`'s optimizer after trainer.steps() steps.
absl::StatusOr<std::string> SaveCheckpoint(Trainer& trainer, const std::string& dir, int keep);

// Fault injection (tests): in this process, checkpoint file writes fail
// (EIO) once `after_bytes` more bytes have been written; -1 cancels.
void InjectCheckpointWriteFailure(int64_t after_bytes);

// The newest complete checkpoint under `dir` (a directory of step-*
// checkpoints), or `dir` itself if it holds a manifest. kNotFound if none.
absl::StatusOr<std::string> FindCheckpoint(const std::string& dir);

// Not collective, no model needed: checks the checkpoint at `path` (see
// FindCheckpoint) as a load would (manifest fields, file sizes and CRC-32s,
// safetensors headers, every tensor present). Returns the directory checked.
absl::StatusOr<std::string> VerifyCheckpoint(const std::string& path);

// Collective: loads the checkpoint at `path` (see FindCheckpoint) into
// `opt`, whatever world size and stage saved it; the parameters registered
// must be the saved ones by name and shape (in any grouping). Returns the
// directory loaded and the training steps it was saved after.
struct LoadedCheckpoint {
  std::string path;
  int64_t steps = 0;
};
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(ShardedOptimizer& opt, const std::string& path);
// The same into `trainer`, whose steps() it sets. Returns the directory.
absl::StatusOr<std::string> LoadCheckpoint(Trainer& trainer, const std::string& path);

// Not collective: writes the master weights of the checkpoint at `path`
// (see FindCheckpoint) as one safetensors file `out` with a tensor per
// parameter, by name, in `dtype` (f32, or bf16 rounded to nearest even),
// reading one parameter at a time; written under a temporary name and
// renamed, so `out` is whole or absent. Returns the checkpoint exported.
absl::StatusOr<std::string> ExportCheckpoint(const std::string& path, const std::string& out,
                                             DType dtype);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_CHECKPOINT_H_
