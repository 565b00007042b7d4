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
// Each rank writes a share of the parameters, the largest first to the
// rank with the fewest bytes so far, so the files are written in parallel
// and balance by bytes (even when one flat group holds the whole model). Nothing in a file
// depends on the saving run's world size, stage or bucket sizes, so a run
// with any of those loads it directly: resharding is loading.
//
// The manifest (schema "memwall.checkpoint/2") records the step counters
// and loss scaler (sharding/sharded_optimizer.h Progress), the trainer's
// steps (the data position: memwall's batches are a function of the step,
// and its layers draw no random numbers, so there is no RNG state), the
// saving world size, stage, dtypes and optimizer, the model's description,
// every parameter with its shape and file, every file with its size and
// CRC-32, and its own CRC-32 (of its compact text without that field), so
// an edited counter is refused, not resumed. Every counter is range-checked
// on loading. Schema 1 manifests (no description, no checksum) still load.
//
// Atomicity: each file is written under a temporary name, fsync'ed and
// renamed; the manifest goes last the same way, then the directory is
// fsync'ed. A checkpoint without its manifest does not exist: a crash at
// any point leaves the previous one complete, and loading picks the newest
// complete one (or, if that one is damaged, the newest intact one). After a
// save, complete checkpoints beyond the newest `keep` are deleted, and
// incomplete ones older than the new one with them; a deletion removes the
// manifest first, so no crash leaves a complete-looking checkpoint with
// files missing. A write that fails removes its temporary file.
//
// Loading checks everything before it changes anything: the manifest's
// fields, that it describes this model (names, shapes, optimizer), every
// file's size and CRC-32 and every safetensors header. Errors name the
// file, the field and the problem; a failed load leaves the optimizer as it
// was. Host memory stays bounded while saving and loading: one flat group's
// state at a time.
#ifndef MEMWALL_ENGINE_CHECKPOINT_H_
#define MEMWALL_ENGINE_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/save_directory.h"
#include "engine/trainer.h"
#include "sharding/sharded_optimizer.h"
#include "runtime/dtype.h"

namespace memwall {

// A parameter that holds a block of one of the model's tensors
// (engine/layer.h ParameterDecl::tile_of, with full names): rows
// [row, row + shape[0]) and columns [column, column + shape[1]) of
// `whole`, of shape `whole_shape` (2-D).
struct ParameterTile {
  std::string whole;
  std::vector<int64_t> whole_shape;
  int64_t row = 0;
  int64_t column = 0;
};
// The tiles among `trainer`'s parameters, by full parameter name.
std::map<std::string, ParameterTile> TilesOf(const Trainer& trainer);

// Collective: saves `opt` (whatever model registered its parameters: the
// engine's layers or a caller's own) after `steps` training steps into
// `<dir>/step-<steps>` (creating `dir`), then keeps the newest `keep` (>= 1)
// checkpoints. Returns the checkpoint's directory. Errors name the path.
// `model` describes the model beyond its tensors' names and shapes (a
// GPT's heads, say); a load given another description is refused.
// `tiles` names the saved parameters that are tiles of one of the model's
// tensors (see ParameterTile); the manifest records them, so that export
// writes the model's own tensors.
absl::StatusOr<std::string> SaveCheckpoint(
    ShardedOptimizer& opt, int64_t steps, const std::string& dir, int keep,
    const std::string& model = "", const std::map<std::string, ParameterTile>& tiles = {});
// The same for `trainer`'s optimizer after trainer.steps() steps.
absl::StatusOr<std::string> SaveCheckpoint(Trainer& trainer, const std::string& dir, int keep);

// Whether `checkpoint` (a directory of checkpoints, or one step-*
// checkpoint in it, as --resume takes) names the directory of checkpoints
// `dir`; compared after resolving both paths.
bool IsCheckpointIn(const std::string& checkpoint, const std::string& dir);

// Whether a command may write its output file `out` (named `flag` in
// errors). A checkpoint is never overwritten, whatever `overwrite` says:
// kInvalidArgument for an `out` inside a checkpoint (below a directory
// holding manifest.json and rank-00000.safetensors, or below a step-*
// directory of a directory saved into: one holding .memwall.lock) or naming a save directory's lock file (.memwall.lock), and
// for an existing directory; kAlreadyExists for an existing file unless
// `overwrite`.
absl::Status CheckOutputFile(const std::string& flag, const std::string& out, bool overwrite);
// CheckOutputFile, then writes `text` to `out` atomically (a temporary
// name, fsync, rename): afterwards `out` is whole, or as it was.
absl::Status WriteOutputFile(const std::string& flag, const std::string& out,
                             const std::string& text, bool overwrite);

// The newest complete checkpoint under `dir` (a directory of step-*
// checkpoints), or `dir` itself if it holds a manifest. kNotFound if none.
absl::StatusOr<std::string> FindCheckpoint(const std::string& dir);

// Not collective, no model needed: checks the checkpoint at `path` (see
// FindCheckpoint) as a load would (manifest fields, file sizes and CRC-32s,
// safetensors headers, every tensor present). Returns the directory checked.
absl::StatusOr<std::string> VerifyCheckpoint(const std::string& path);

// Collective: loads the checkpoint at `path` (see FindCheckpoint) into
// `opt`, whatever world size and stage saved it; the parameters registered
// must be the saved ones by name and shape (in any grouping). When `path`
// is a directory of checkpoints and the newest complete one is damaged
// (kDataLoss on any rank: a file missing, short or failing its CRC-32),
// the next older intact one is loaded instead, and `skipped` says which
// were passed over and why. Returns the directory loaded and the training
// steps it was saved after. Errors name the checkpoint, and the rank when
// another rank failed.
struct LoadedCheckpoint {
  std::string path;
  int64_t steps = 0;
  std::string skipped;  // "skipped <dir> (damaged: <why>)", or empty
};
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(ShardedOptimizer& opt, const std::string& path,
                                                 const std::string& model = "");
// The same into `trainer`, whose steps() it sets. Returns the directory.
absl::StatusOr<std::string> LoadCheckpoint(Trainer& trainer, const std::string& path);

// Not collective: writes the master weights of the checkpoint at `path`
// (see FindCheckpoint) as one safetensors file `out` with a tensor per
// model tensor, by name, in `dtype` (f32, or bf16 rounded to nearest
// even): a parameter, or the tensor a tiled parameter's tiles make
// (ParameterTile: a tiled model exports what its untiled model does),
// reading one tensor at a time; written under a temporary name and
// renamed, so `out` is whole or absent. `out` is checked as
// CheckOutputFile("export: --out", out, overwrite) checks it (never inside
// a checkpoint, this or another). Returns the checkpoint exported.
absl::StatusOr<std::string> ExportCheckpoint(const std::string& path, const std::string& out,
                                             DType dtype, bool overwrite = false);

}  // namespace memwall

#endif  // MEMWALL_ENGINE_CHECKPOINT_H_
