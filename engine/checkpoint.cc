#include "engine/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/checkpoint_layout.h"
#include "engine/durable_file.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"
#include "runtime/json_reader.h"
#include "runtime/status.h"

namespace memwall {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Schema 2 adds the manifest's own CRC-32 and the model description;
// schema 1 manifests (no checksum) still load, their fields range-checked.
constexpr char kSchema[] = "memwall.checkpoint/2";
constexpr char kSchemaWithoutChecksum[] = "memwall.checkpoint/1";

// The CRC-32 of a manifest's compact text without its checksum field (the
// keys are sorted, so the text is canonical).
int64_t ManifestCrc(json manifest) {
  manifest.erase("manifest_crc32");
  const std::string text = manifest.dump();
  return static_cast<int64_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(text.data()),
                                    static_cast<uInt>(text.size())));
}

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 1;
};

// The model's parameters in registration order (the optimizer's indices).
std::vector<Param> ParamsOf(const ShardedOptimizer& opt) {
  std::vector<Param> params;
  for (const ParameterSpec& spec : opt.parameters()) {
    params.push_back({spec.name, spec.shape, NumElements(spec.shape)});
  }
  return params;
}

// Which rank writes each parameter: the largest first, each to the rank
// with the fewest bytes so far (ties: the lower rank), so the files, written
// in parallel, balance by bytes even when a few groups (or one) hold the
// model. Deterministic: every rank computes the same owners.
std::vector<int> FileOwners(const std::vector<Param>& params, int world) {
  std::vector<int> order(params.size());
  for (size_t p = 0; p < params.size(); ++p) order[p] = static_cast<int>(p);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return params[a].numel > params[b].numel; });
  std::vector<int64_t> bytes(world, 0);
  std::vector<int> owner(params.size());
  for (int p : order) {
    const int r = static_cast<int>(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    owner[p] = r;
    bytes[r] += params[p].numel;
  }
  return owner;
}

std::string RankFile(int rank) { return absl::StrFormat("rank-%05d.safetensors", rank); }

// Deletes a checkpoint so that no moment leaves a complete-looking one
// with files missing: the manifest goes first (and that is made durable),
// then the rest.
absl::Status RemoveCheckpoint(const std::string& path) {
  std::error_code ec;
  fs::remove(fs::path(path) / kManifest, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint ", path, ": remove manifest: ", ec.message()));
  MW_RETURN_IF_ERROR(SyncPath(path, /*directory=*/true));
  fs::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint ", path, ": remove: ", ec.message()));
  return absl::OkStatus();
}

// A meta device has no values to save or load: a dry run starts from any
// weights, and a real run (host or cuda) resumes.
absl::Status RequireValues(ShardedOptimizer& opt, const std::string& path, const char* what) {
  if (opt.device().holds_bytes()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", path, ": cannot ", what, " on ", opt.device().name(),
      ", which holds no values (a dry run needs no checkpoint; resume with --backend host or cuda)"));
}

}  // namespace

std::map<std::string, ParameterTile> TilesOf(const Trainer& trainer) {
  std::map<std::string, ParameterTile> tiles;
  for (const auto& layer : trainer.layers()) {
    for (const ParameterDecl& decl : layer->Parameters()) {
      if (decl.tile_of.empty()) continue;
      tiles[absl::StrCat(layer->name(), ".", decl.name)] = {
          absl::StrCat(layer->name(), ".", decl.tile_of), decl.whole_shape, decl.row, decl.column};
    }
  }
  return tiles;
}

absl::StatusOr<std::string> SaveCheckpoint(Trainer& trainer, const std::string& dir, int keep) {
  return SaveCheckpoint(trainer.optimizer(), trainer.steps(), dir, keep, "", TilesOf(trainer));
}

namespace {

// The manifest of a checkpoint of `opt` at `steps` whose rank files
// (`files`: landed, bytes, CRC-32 per rank) hold parameter p in
// RankFile(owner[p]).
json Manifest(ShardedOptimizer& opt, int64_t steps, const std::string& model,
              const std::map<std::string, ParameterTile>& tiles, const std::vector<Param>& params,
              const std::vector<int>& owner, const std::vector<int64_t>& files) {
  const ShardedOptimizer::Progress progress = opt.progress();
  const ShardingOptions& config = opt.config();
  const FlatLayout& layout = opt.layout();
  const int world = opt.communicator().world_size();
  json manifest = {
      {"schema", kSchema},
      {"step", steps},
      {"trainer_steps", steps},
      {"progress",
       {{"steps_applied", progress.steps_applied},
        {"steps_skipped", progress.steps_skipped},
        {"loss_scale", progress.loss_scale},
        {"clean_steps", progress.clean_steps},
        {"overflows_left", progress.overflows_left}}},
      {"world_size", world},
      {"zero_stage", config.zero.stage},
      {"param_dtype", DTypeName(config.param_dtype())},
      {"optimizer", config.optimizer.type == OptimizerType::kAdam ? "adam" : "sgd"},
      {"states", opt.state_names()},
      {"model", model},
  };
  json list = json::array();
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    for (int p : layout.groups[g].parameters) {
      json entry = {{"name", params[p].name},
                    {"shape", params[p].shape},
                    {"file", RankFile(owner[p])}};
      if (const auto tile = tiles.find(params[p].name); tile != tiles.end()) {
        entry["tile_of"] = {{"name", tile->second.whole},
                            {"shape", tile->second.whole_shape},
                            {"row", tile->second.row},
                            {"column", tile->second.column}};
      }
      list.push_back(std::move(entry));
    }
  }
  manifest["parameters"] = list;
  json file_list = json::array();
  for (int r = 0; r < world; ++r) {
    file_list.push_back({{"name", RankFile(r)}, {"bytes", files[3 * r + 1]},
                         {"crc32", files[3 * r + 2]}});
  }
  manifest["files"] = file_list;
  manifest["manifest_crc32"] = ManifestCrc(manifest);
  return manifest;
}

// Keeps the newest `keep` complete checkpoints in `dir` (`out`, just
// written, among them) and drops incomplete ones older than `steps`.
absl::Status Prune(const std::string& dir, const std::string& out, int64_t steps, int keep) {
  std::vector<StepDirectory> found = StepDirs(dir);
  int complete = 0;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    if (it->path == out) {
      ++complete;
      continue;
    }
    const bool drop = it->complete ? ++complete > keep : it->step < steps;
    if (drop) MW_RETURN_IF_ERROR(RemoveCheckpoint(it->path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(ShardedOptimizer& opt, int64_t steps,
                                           const std::string& dir, int keep,
                                           const std::string& model,
                                           const std::map<std::string, ParameterTile>& tiles) {
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("checkpoint keep: expected >= 1, got ", keep));
  MW_RETURN_IF_ERROR(RequireValues(opt, dir, "save one"));
  Communicator& comm = opt.communicator();
  const int rank = comm.rank(), world = comm.world_size();
  const FlatLayout& layout = opt.layout();
  const std::vector<Param> params = ParamsOf(opt);
  const std::vector<std::string> states = opt.state_names();
  const std::string out = StepDir(dir, steps);
  std::error_code ec;
  // A save that fails removes the step directory it made (or found
  // incomplete: a crash's leftover), so that no empty step-* is left to
  // block a later --resume or a fresh save; a complete checkpoint found
  // there (this step saved before) is never removed.
  const bool was_complete = fs::exists(fs::path(out) / kManifest, ec);
  const auto discard = [&](absl::Status failed) {
    if (rank == 0 && !was_complete) fs::remove_all(out, ec);
    return failed;
  };
  absl::Status created;
  if (rank == 0) {
    fs::create_directories(out, ec);
    if (ec) {
      created = discard(
          absl::InternalError(absl::StrCat("checkpoint ", out, ": create: ", ec.message())));
    }
  }
  MW_RETURN_IF_ERROR(RankZeroStatus(opt, created, out, "create it"));

  // This rank's file: its parameters, group by group, state by state.
  const std::vector<int> owner = FileOwners(params, world);
  std::vector<SafetensorsWriter::Tensor> tensors;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    for (const std::string& state : states) {
      for (int p : layout.groups[g].parameters) {
        if (owner[p] != rank) continue;
        tensors.push_back({absl::StrCat(params[p].name, "/", state), params[p].shape});
      }
    }
  }
  const std::string path = (fs::path(out) / RankFile(rank)).string();
  absl::StatusOr<SafetensorsWriter> file = SafetensorsWriter::Open(path, tensors);
  absl::Status written = file.status();
  // Every rank joins every group's gathers, whoever writes the group.
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const FlatGroup& flat = layout.groups[g];
    std::vector<float> full(flat.padded_numel);
    for (size_t s = 0; s < states.size(); ++s) {
      MW_RETURN_IF_ERROR(opt.GatherState(static_cast<int>(g), static_cast<int>(s),
                                         absl::MakeSpan(full)));
      if (!written.ok()) continue;
      for (int p : flat.parameters) {
        if (owner[p] != rank) continue;
        const ParameterPlacement& place = layout.placements[p];
        written = file->Append(full.data() + place.offset, place.numel);
        if (!written.ok()) break;
      }
    }
  }
  if (written.ok()) written = file->Commit();
  // Every rank learns whether every file landed, and its size and CRC.
  MW_ASSIGN_OR_RETURN(const std::vector<int64_t> files,
                      AllGatherInts(opt, {written.ok() ? 1 : 0, written.ok() ? file->bytes() : 0,
                                          written.ok() ? static_cast<int64_t>(file->crc()) : 0}));
  for (int r = 0; r < world; ++r) {
    if (files[3 * r] != 0) continue;
    // Every rank drops its file (a failed one's temporary file goes with
    // its writer) before rank 0 removes the directory: a file unlinked
    // while remove_all walks the directory would stop it half-way.
    file = absl::CancelledError("discarded");
    MW_RETURN_IF_ERROR(AllGatherInts(opt, {0}).status());
    return discard(written.ok() ? absl::InternalError(absl::StrCat(
                                      "checkpoint ", out, ": rank ", r,
                                      " could not write its file; the previous checkpoint "
                                      "stays the newest"))
                                : written);
  }
  // Rank 0 commits (the manifest) and prunes; every rank learns whether
  // that worked, so none waits for a rank that returned.
  absl::Status committed;
  if (rank == 0) {
    const json manifest = Manifest(opt, steps, model, tiles, params, owner, files);
    committed = SyncPath(out, /*directory=*/true);  // the rank files' renames
    if (committed.ok()) {
      committed = WriteFileAtomically((fs::path(out) / kManifest).string(), manifest.dump(1));
    }
    if (committed.ok()) committed = SyncPath(out, /*directory=*/true);
    committed = committed.ok() ? Prune(dir, out, steps, keep) : discard(committed);
  }
  MW_RETURN_IF_ERROR(RankZeroStatus(opt, committed, out, "commit it"));
  return out;
}

bool IsCheckpointIn(const std::string& checkpoint, const std::string& dir) {
  if (checkpoint.empty()) return false;
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(checkpoint, ec);
  const fs::path d = fs::weakly_canonical(dir, ec);
  return c == d || c.parent_path() == d;
}

absl::Status CheckOutputFile(const std::string& flag, const std::string& out, bool overwrite) {
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(out, ec);
  if (target.filename() == kLockFile) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", out, ": is the lock of a directory of checkpoints; write it elsewhere"));
  }
  for (fs::path up = target.parent_path(); !up.empty(); up = up.parent_path()) {
    const bool step = absl::StartsWith(up.filename().string(), "step-") &&
                      fs::exists(up.parent_path() / kLockFile, ec);
    // A checkpoint is a manifest beside rank 0's file (rank 0 writes the
    // largest parameter): a lone manifest.json is some other program's.
    const bool checkpoint =
        fs::exists(up / kManifest, ec) && fs::exists(up / RankFile(0), ec);
    if (step || checkpoint) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", out, ": is inside the checkpoint ",
                                                     up.string(), "; write it elsewhere"));
    }
    if (up == up.root_path()) break;
  }
  if (fs::is_directory(target, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", out, ": is a directory; expected a file name"));
  }
  if (fs::exists(target, ec) && !overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(flag, " ", out, ": exists; pass --force to replace it"));
  }
  return absl::OkStatus();
}

absl::Status WriteOutputFile(const std::string& flag, const std::string& out,
                             const std::string& text, bool overwrite) {
  MW_RETURN_IF_ERROR(CheckOutputFile(flag, out, overwrite));
  const absl::Status written = WriteFileAtomically(out, text);
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat(flag, " ", out, ": cannot write it (",
                                                     written.message(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindCheckpoint(const std::string& dir) {
  if (fs::exists(fs::path(dir) / kManifest)) return dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir, ": no such directory"));
  }
  const std::vector<StepDirectory> found = StepDirs(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    if (it->complete) return it->path;
  }
  return absl::NotFoundError(
      absl::StrCat("checkpoint ", dir, ": no complete checkpoint (a step-* directory with ", kManifest, ")"));
}

namespace {

struct Loaded {
  std::string model;  // the saving run's model description; empty: not recorded
  ShardedOptimizer::Progress progress;
  int64_t trainer_steps = 0;
  std::vector<std::string> states;
  // The saved parameters, in the manifest's order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters;
  // Those that are tiles of a model tensor (the manifest's "tile_of"),
  // which together cover each such tensor exactly once.
  std::map<std::string, ParameterTile> tiles;
  std::map<std::string, SafetensorsEntry> tensors;
  std::string manifest;
};

// Each tensor `loaded`'s tiles make is covered exactly once: its tiles
// agree on its shape, do not overlap and hold all its elements, and it is
// not also a parameter of its own.
absl::Status CheckTileCover(const Loaded& loaded, const std::string& manifest_path) {
  std::map<std::string, std::vector<std::string>> by_whole;
  for (const auto& [name, tile] : loaded.tiles) by_whole[tile.whole].push_back(name);
  std::map<std::string, std::vector<int64_t>> shapes(loaded.parameters.begin(),
                                                      loaded.parameters.end());
  for (const auto& [whole, names] : by_whole) {
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", manifest_path, ": the tiles of '",
                                                     whole, "' (", absl::StrJoin(names, ", "),
                                                     ") ", why));
    };
    if (shapes.count(whole) != 0) return bad("name a tensor that is also saved whole");
    const std::vector<int64_t>& w = loaded.tiles.at(names[0]).whole_shape;
    int64_t covered = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const ParameterTile& a = loaded.tiles.at(names[i]);
      const std::vector<int64_t>& sa = shapes.at(names[i]);
      if (a.whole_shape != w) return bad("disagree on its shape");
      covered += sa[0] * sa[1];
      for (size_t j = 0; j < i; ++j) {
        const ParameterTile& b = loaded.tiles.at(names[j]);
        const std::vector<int64_t>& sb = shapes.at(names[j]);
        if (a.row < b.row + sb[0] && b.row < a.row + sa[0] && a.column < b.column + sb[1] &&
            b.column < a.column + sa[1] && sa[0] * sa[1] > 0 && sb[0] * sb[1] > 0) {
          return bad(absl::StrCat("overlap ('", names[j], "' and '", names[i], "')"));
        }
      }
    }
    if (covered != w[0] * w[1]) {
      return bad(absl::StrCat("hold ", covered, " of its ", w[0] * w[1], " elements"));
    }
  }
  return absl::OkStatus();
}

// Everything in the checkpoint at `at`, checked: the manifest's fields,
// every file's size and CRC-32, every header, every tensor present.
absl::StatusOr<Loaded> ReadVerified(const std::string& at) {
  const std::string manifest_path = (fs::path(at) / kManifest).string();
  std::ifstream in(manifest_path);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint ", manifest_path, ": cannot open"));
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint ", manifest_path, ": not JSON: ", e.what()));
  }
  MW_ASSIGN_OR_RETURN(JsonReader manifest,
                      JsonReader::Open(m, "", absl::StrCat("checkpoint ", manifest_path, ": "),
                                       "manifest"));
  MW_RETURN_IF_ERROR(manifest.Require({"schema"}));
  std::string schema;
  MW_RETURN_IF_ERROR(manifest.Choice("schema", {kSchema, kSchemaWithoutChecksum}, schema));
  Loaded loaded;
  loaded.manifest = manifest_path;
  if (schema == kSchema) {
    MW_RETURN_IF_ERROR(manifest.Require({"manifest_crc32", "model"}));
    int64_t crc = 0;
    MW_RETURN_IF_ERROR(manifest.Int("manifest_crc32", 0, UINT32_MAX, crc));
    if (crc != ManifestCrc(m)) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", manifest_path, ": CRC-32 ", ManifestCrc(m), ", its field 'manifest_crc32' says ",
          crc, " (the manifest is corrupted or was edited)"));
    }
    MW_RETURN_IF_ERROR(manifest.String("model", /*non_empty=*/false, loaded.model));
  }
  // Values no run writes are refused rather than carried on.
  MW_RETURN_IF_ERROR(manifest.Require({"trainer_steps", "progress", "states", "parameters", "files"}));
  MW_RETURN_IF_ERROR(manifest.Int("trainer_steps", 0, INT64_MAX, loaded.trainer_steps));
  MW_ASSIGN_OR_RETURN(JsonReader progress, manifest.Object("progress"));
  MW_RETURN_IF_ERROR(progress.Require(
      {"steps_applied", "steps_skipped", "loss_scale", "clean_steps", "overflows_left"}));
  MW_RETURN_IF_ERROR(progress.Int("steps_applied", 0, INT64_MAX, loaded.progress.steps_applied));
  MW_RETURN_IF_ERROR(progress.Int("steps_skipped", 0, INT64_MAX, loaded.progress.steps_skipped));
  MW_RETURN_IF_ERROR(progress.Float("loss_scale", 0, std::numeric_limits<float>::max(),
                                    /*min_exclusive=*/true, "a finite f32 > 0",
                                    loaded.progress.loss_scale));
  MW_RETURN_IF_ERROR(progress.Int32("clean_steps", 0, INT_MAX, loaded.progress.clean_steps));
  MW_RETURN_IF_ERROR(progress.Int32("overflows_left", 0, INT_MAX, loaded.progress.overflows_left));
  MW_RETURN_IF_ERROR(manifest.Strings("states", loaded.states));
  if (loaded.states.empty() || loaded.states[0] != "master") {
    return manifest.Error("states", "a list starting with \"master\"", m["states"]);
  }
  MW_ASSIGN_OR_RETURN(const json* parameters, manifest.List("parameters"));
  MW_ASSIGN_OR_RETURN(const json* files, manifest.List("files"));
  for (size_t i = 0; i < parameters->size(); ++i) {
    MW_ASSIGN_OR_RETURN(JsonReader entry, JsonReader::Open((*parameters)[i],
                                                           absl::StrCat("parameters[", i, "]"),
                                                           manifest.prefix()));
    MW_RETURN_IF_ERROR(entry.Require({"name", "shape"}));
    std::string name;
    std::vector<int64_t> shape;
    MW_RETURN_IF_ERROR(entry.String("name", /*non_empty=*/true, name));
    MW_RETURN_IF_ERROR(entry.Ints("shape", 0, INT64_MAX, shape));
    loaded.parameters.emplace_back(name, shape);
    if (entry.Find("tile_of") != nullptr) {
      MW_ASSIGN_OR_RETURN(JsonReader of, entry.Object("tile_of"));
      MW_RETURN_IF_ERROR(of.Require({"name", "shape", "row", "column"}));
      ParameterTile tile;
      MW_RETURN_IF_ERROR(of.String("name", /*non_empty=*/true, tile.whole));
      MW_RETURN_IF_ERROR(of.Ints("shape", 0, INT64_MAX, tile.whole_shape));
      MW_RETURN_IF_ERROR(of.Int("row", 0, INT64_MAX, tile.row));
      MW_RETURN_IF_ERROR(of.Int("column", 0, INT64_MAX, tile.column));
      const std::vector<int64_t>& w = tile.whole_shape;
      if (shape.size() != 2 || w.size() != 2 ||
          (w[1] > 0 && w[0] > std::numeric_limits<int64_t>::max() / w[1]) ||
          tile.row > w[0] - shape[0] || tile.column > w[1] - shape[1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            manifest.prefix(), entry.Path("tile_of"), ": a [", absl::StrJoin(shape, ", "),
            "] tile at row ", tile.row, ", column ", tile.column, " does not lie inside '",
            tile.whole, "' [", absl::StrJoin(w, ", "), "]"));
      }
      loaded.tiles[name] = std::move(tile);
    }
  }
  MW_RETURN_IF_ERROR(CheckTileCover(loaded, manifest_path));
  // Every file whole (size and CRC-32), every header sound.
  for (size_t i = 0; i < files->size(); ++i) {
    MW_ASSIGN_OR_RETURN(JsonReader entry, JsonReader::Open((*files)[i],
                                                           absl::StrCat("files[", i, "]"),
                                                           manifest.prefix()));
    MW_RETURN_IF_ERROR(entry.Require({"name", "bytes", "crc32"}));
    std::string name;
    int64_t bytes = 0, crc = 0;
    MW_RETURN_IF_ERROR(entry.String("name", /*non_empty=*/true, name));
    MW_RETURN_IF_ERROR(entry.Int("bytes", 8, INT64_MAX, bytes));  // at least a header length
    MW_RETURN_IF_ERROR(entry.Int("crc32", 0, UINT32_MAX, crc));
    if (name.find('/') != std::string::npos) {
      return entry.Error("name", "a file name in the checkpoint's directory", (*files)[i]["name"]);
    }
    const std::string path = (fs::path(at) / name).string();
    MW_ASSIGN_OR_RETURN(const uLong actual, FileCrc(path, bytes));
    if (static_cast<int64_t>(actual) != crc) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, ": CRC-32 ", actual,
                                              ", the manifest says ", crc, " (the file is corrupted)"));
    }
    MW_ASSIGN_OR_RETURN(const auto tensors, ReadSafetensorsHeader(path, bytes));
    for (const auto& [tensor, entry] : tensors) loaded.tensors[tensor] = entry;
  }
  return loaded;
}

// Every state of every parameter the manifest lists is in the files.
absl::Status CheckTensors(const Loaded& loaded, const std::string& at) {
  for (const auto& [name, shape] : loaded.parameters) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    for (const std::string& state : loaded.states) {
      auto it = loaded.tensors.find(absl::StrCat(name, "/", state));
      if (it == loaded.tensors.end() || it->second.numel != numel) {
        return absl::DataLossError(absl::StrCat("checkpoint ", at, ": tensor '", name, "/", state,
                                                "' is missing from the files or has the wrong size"));
      }
    }
  }
  return absl::OkStatus();
}

// The checkpoint at `at` read and checked against `opt`'s parameters and
// optimizer, before anything changes.
absl::StatusOr<Loaded> Validate(const ShardedOptimizer& opt, const std::string& at,
                                const std::string& description) {
  MW_ASSIGN_OR_RETURN(Loaded loaded, ReadVerified(at));
  const std::vector<std::string> states = opt.state_names();
  if (loaded.states != states) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", loaded.manifest, ": field 'states' is [", absl::StrJoin(loaded.states, ", "),
        "], this run's optimizer keeps [", absl::StrJoin(states, ", "), "]"));
  }
  std::map<std::string, std::vector<int64_t>> model, saved(loaded.parameters.begin(), loaded.parameters.end());
  for (const Param& param : ParamsOf(opt)) model[param.name] = param.shape;
  for (const auto& [name, shape] : model) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", loaded.manifest, ": no parameter '", name,
                                                     "' (the checkpoint is of another model)"));
    }
    if (it->second != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", loaded.manifest, ": parameter '", name, "' has shape [",
          absl::StrJoin(it->second, ", "), "], the model's is [", absl::StrJoin(shape, ", "), "]"));
    }
  }
  for (const auto& [name, shape] : saved) {
    if (!model.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", loaded.manifest, ": parameter '", name,
                                                     "' is not in the model (the checkpoint is of another model)"));
    }
  }
  // Hyperparameters that change no tensor shape (a GPT's heads) show only
  // in the description.
  if (!description.empty() && !loaded.model.empty() && description != loaded.model) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", loaded.manifest,
                                                   ": saved from model '", loaded.model,
                                                   "', this run's model is '", description, "'"));
  }
  MW_RETURN_IF_ERROR(CheckTensors(loaded, at));
  return loaded;
}

}  // namespace

absl::StatusOr<std::string> LoadCheckpoint(Trainer& trainer, const std::string& path) {
  MW_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded, LoadCheckpoint(trainer.optimizer(), path, ""));
  trainer.set_steps(loaded.steps);
  return loaded.path;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(ShardedOptimizer& opt, const std::string& path,
                                                 const std::string& model) {
  MW_RETURN_IF_ERROR(RequireValues(opt, path, "load it"));
  MW_ASSIGN_OR_RETURN(const std::string newest, FindCheckpoint(path));
  // Candidates, newest first: `path` itself, or every complete checkpoint
  // under it. A damaged one (kDataLoss on any rank) gives way to the next
  // older; any other refusal (another model, a bad manifest field) stops.
  std::vector<std::string> candidates = {newest};
  if (newest != path) {
    candidates.clear();
    const std::vector<StepDirectory> found = StepDirs(path);
    for (auto it = found.rbegin(); it != found.rend(); ++it) {
      if (it->complete) candidates.push_back(it->path);
    }
  }
  LoadedCheckpoint result;
  absl::StatusOr<Loaded> loaded = absl::NotFoundError("no checkpoint");
  for (const std::string& at : candidates) {
    loaded = Validate(opt, at, model);
    // No rank changes anything unless every rank's check passed.
    const int64_t code = static_cast<int64_t>(loaded.status().code());
    MW_ASSIGN_OR_RETURN(const std::vector<int64_t> codes, AllGatherInts(opt, {code}));
    int failed = -1;
    bool damaged_only = true;
    for (size_t r = 0; r < codes.size(); ++r) {
      if (codes[r] == static_cast<int64_t>(absl::StatusCode::kOk)) continue;
      if (failed < 0) failed = static_cast<int>(r);
      damaged_only = damaged_only && codes[r] == static_cast<int64_t>(absl::StatusCode::kDataLoss);
    }
    if (failed < 0) {
      result.path = at;
      break;
    }
    const absl::StatusCode failure = static_cast<absl::StatusCode>(codes[failed]);
    const std::string why = loaded.ok()
                                ? absl::StrCat("rank ", failed, " could not read it (",
                                               absl::StatusCodeToString(failure),
                                               ", named in that rank's error)")
                                : std::string(loaded.status().message());
    if (!damaged_only || &at == &candidates.back()) {
      const std::string also = result.skipped.empty() ? "" : absl::StrCat("; ", result.skipped);
      if (!loaded.ok()) return absl::Status(loaded.status().code(), absl::StrCat(why, also));
      return absl::Status(failure, absl::StrCat("checkpoint ", at, ": ", why, also));
    }
    absl::StrAppend(&result.skipped, result.skipped.empty() ? "" : "; ", "skipped ", at,
                    " (damaged: ", why, ")");
  }
  const std::string at = result.path;
  const FlatLayout& layout = opt.layout();
  const std::vector<Param> params = ParamsOf(opt);
  const std::vector<std::string> states = opt.state_names();
  std::map<std::string, std::ifstream> files;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const FlatGroup& flat = layout.groups[g];
    for (size_t s = 0; s < states.size(); ++s) {
      std::vector<float> full(flat.padded_numel, 0.0f);
      for (int p : flat.parameters) {
        const SafetensorsEntry& t = loaded->tensors.at(absl::StrCat(params[p].name, "/", states[s]));
        std::ifstream& in = files[t.file];
        if (!in.is_open()) in.open(t.file, std::ios::binary);
        in.seekg(t.offset);
        if (!in.read(reinterpret_cast<char*>(full.data() + layout.placements[p].offset), 4 * t.numel)) {
          return absl::DataLossError(absl::StrCat("checkpoint ", t.file, ": read of '", params[p].name,
                                                  "/", states[s], "' failed"));
        }
      }
      MW_RETURN_IF_ERROR(opt.SetState(static_cast<int>(g), static_cast<int>(s), full));
    }
  }
  opt.set_progress(loaded->progress);
  result.steps = loaded->trainer_steps;
  return result;
}

absl::StatusOr<std::string> VerifyCheckpoint(const std::string& path) {
  MW_ASSIGN_OR_RETURN(const std::string at, FindCheckpoint(path));
  MW_ASSIGN_OR_RETURN(const Loaded loaded, ReadVerified(at));
  MW_RETURN_IF_ERROR(CheckTensors(loaded, at));
  return at;
}

absl::StatusOr<std::string> ExportCheckpoint(const std::string& path, const std::string& out,
                                             DType dtype, bool overwrite) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("export: dtype ", DTypeName(dtype),
                                                   "; expected f32 or bf16"));
  }
  MW_ASSIGN_OR_RETURN(const std::string at, VerifyCheckpoint(path));
  MW_RETURN_IF_ERROR(CheckOutputFile("export: --out", out, overwrite));
  MW_ASSIGN_OR_RETURN(const Loaded loaded, ReadVerified(at));
  // The model's tensors, in the manifest's order: a saved parameter, or a
  // tensor its tiles make (in place of its first tile).
  struct Exported {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<std::string> tiles;  // empty: the parameter `name` itself
  };
  std::vector<Exported> tensors;
  std::map<std::string, size_t> whole_index;
  const std::map<std::string, std::vector<int64_t>> saved_shapes(loaded.parameters.begin(),
                                                                 loaded.parameters.end());
  for (const auto& [name, shape] : loaded.parameters) {
    const auto tile = loaded.tiles.find(name);
    if (tile == loaded.tiles.end()) {
      tensors.push_back({name, shape, {}});
      continue;
    }
    const auto [it, first] = whole_index.emplace(tile->second.whole, tensors.size());
    if (first) tensors.push_back({tile->second.whole, tile->second.whole_shape, {}});
    tensors[it->second].tiles.push_back(name);
  }
  std::vector<SafetensorsWriter::Tensor> declared;
  for (const Exported& t : tensors) declared.push_back({t.name, t.shape});
  SafetensorsWriter::Options file_options;
  file_options.dtype = dtype;
  file_options.metadata = {{"format", "pt"},
                           {"memwall_checkpoint", at},
                           {"memwall_model", loaded.model},
                           {"step", std::to_string(loaded.trainer_steps)}};
  file_options.align = true;
  MW_ASSIGN_OR_RETURN(SafetensorsWriter file, SafetensorsWriter::Open(out, declared, file_options));
  absl::Status written;
  // One tensor in memory at a time (a tiled one assembled from its tiles).
  std::map<std::string, std::ifstream> files;
  const auto read = [&](const std::string& name, float* to) -> absl::Status {
    const SafetensorsEntry& t = loaded.tensors.at(name + "/master");
    std::ifstream& in = files[t.file];
    if (!in.is_open()) in.open(t.file, std::ios::binary);
    in.seekg(t.offset);
    if (!in.read(reinterpret_cast<char*>(to), 4 * t.numel)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", t.file, ": read of '", name, "' failed"));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < tensors.size() && written.ok(); ++i) {
    const Exported& t = tensors[i];
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    std::vector<float> values(numel);
    if (t.tiles.empty()) {
      written = read(t.name, values.data());
    }
    for (size_t k = 0; k < t.tiles.size() && written.ok(); ++k) {
      const ParameterTile& tile = loaded.tiles.at(t.tiles[k]);
      const std::vector<int64_t>& shape = saved_shapes.at(t.tiles[k]);
      std::vector<float> block(shape[0] * shape[1]);
      written = read(t.tiles[k], block.data());
      for (int64_t r = 0; r < shape[0] && written.ok(); ++r) {
        std::copy_n(block.begin() + r * shape[1], shape[1],
                    values.begin() + (tile.row + r) * t.shape[1] + tile.column);
      }
    }
    if (!written.ok()) break;
    written = file.Append(values.data(), numel);
  }
  if (written.ok()) written = file.Commit();
  MW_RETURN_IF_ERROR(written);
  return at;
}

}  // namespace memwall
