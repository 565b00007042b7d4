// Training checkpoints on real ranks (mpirun -np 1, 2, 4): a run saved
// mid-way and resumed in a fresh trainer continues bit for bit like the
// run that never stopped (every stage, f32 and bf16, optimizer offload,
// parameter paging, the NVMe tier, SGD); a checkpoint saved at one stage
// loads at another; only the newest `keep` survive; and damaged or foreign
// checkpoints are refused by name with the trainer unchanged.
#include "engine/checkpoint.h"
#include "engine/durable_file.h"

#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "nlohmann/json.hpp"
#include "models/layers.h"
#include "runtime/units.h"
#include "tests/support/mlp_task.h"
#include "tests/support/mpi_world.h"
#include "tests/support/values.h"

namespace memwall {
namespace {

namespace fs = std::filesystem;
using testing::SameBits;
using testing::World;

Batch MakeBatch(Device& device, int step) {
  return testing::MlpTaskBatch(device, World().rank(), step);
}

using Setup = testing::MlpSetup;
using Run = testing::MlpRun;

std::string TempDir(const std::string& leaf) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  // One directory for all ranks (they share the machine).
  return (fs::path(tmp ? tmp : "/tmp") / leaf).string();
}


Run Start(const Setup& s, uint64_t seed = 7) { return testing::StartMlpTask(s, World(), seed); }

std::vector<float> Step(Run& run) {
  const int step = static_cast<int>(run.trainer->steps());
  Batch b = MakeBatch(*run.device, step);
  const auto report = run.trainer->TrainStep({&b, 1});
  REQUIRE(report.ok());
  return {report->loss};
}

std::vector<float> Weights(Run& run) {
  std::vector<float> all;
  for (const auto& layer : run.trainer->layers()) {
    for (const ParameterDecl& d : layer->Parameters()) {
      int64_t n = 1;
      for (int64_t x : d.shape) n *= x;
      std::vector<float> w(n);
      REQUIRE(run.trainer->optimizer().MasterWeights(layer->name() + "." + d.name, absl::MakeSpan(w)).ok());
      all.insert(all.end(), w.begin(), w.end());
    }
  }
  return all;
}

const std::vector<Setup> kSetups = {
    {"stage 0, f32", 0, false},
    {"stage 1, f32", 1, false},
    {"stage 2, bf16", 2, true},
    {"stage 3, bf16", 3, true},
    {"stage 3, f32", 3, false},
    {"stage 2, bf16, optimizer offload 0.5", 2, true, 0.5f},
    {"stage 3, bf16, offload + paging", 3, true, 1.0f, true},
    {"stage 2, bf16, NVMe", 2, true, 1.0f, false, true},
    {"stage 1, f32, SGD with momentum", 1, false, 0, false, false, true},
};

TEST_CASE("a resumed run continues bit for bit like the run that never stopped", "[checkpoint]") {
  for (const Setup& s : kSetups) {
    INFO(s.name << ", " << World().world_size() << " ranks");
    const std::string dir = TempDir(absl::StrCat("resume-", &s - kSetups.data()));
    Run straight = Start(s);
    std::vector<float> want_losses;
    for (int k = 0; k < 5; ++k) want_losses.push_back(Step(straight)[0]);
    const std::vector<float> want = Weights(straight);

    Run first = Start(s);
    for (int k = 0; k < 2; ++k) Step(first);
    const auto saved = SaveCheckpoint(*first.trainer, dir, 2);
    REQUIRE(saved.ok());
    CHECK(*saved == dir + "/step-00000002");
    // A fresh trainer from another seed: everything must come from the file.
    Run resumed = Start(s, /*seed=*/99);
    const auto loaded = LoadCheckpoint(*resumed.trainer, dir);
    REQUIRE(loaded.ok());
    CHECK(*loaded == *saved);
    CHECK(resumed.trainer->steps() == 2);
    CHECK(resumed.trainer->optimizer().steps_applied() == 2);
    std::vector<float> losses(want_losses.begin(), want_losses.begin() + 2);
    for (int k = 2; k < 5; ++k) losses.push_back(Step(resumed)[0]);
    CHECK(SameBits(losses, want_losses));
    CHECK(SameBits(Weights(resumed), want));
  }
}

std::vector<float> States(Run& run) { return testing::AllStates(run.trainer->optimizer()); }

TEST_CASE("a checkpoint saved at one stage loads at another", "[checkpoint][reshard]") {
  // The load is lossless (every state bit for bit), and the continued run
  // tracks the run that never changed stage within the sharding
  // equivalence tests' tolerance: stage 0 all-reduces where the others
  // reduce-scatter, which MPI may sum in another order on 4 ranks.
  for (const auto& [from, to] : std::vector<std::pair<int, int>>{{3, 1}, {0, 3}, {2, 0}, {1, 2}}) {
    INFO("stage " << from << " -> " << to << ", " << World().world_size() << " ranks");
    const std::string dir = TempDir(absl::StrCat("reshard-", from, "-", to));
    const Setup a{"", from, false}, b{"", to, false};
    Run straight = Start(b);
    for (int k = 0; k < 4; ++k) Step(straight);
    Run first = Start(a);
    for (int k = 0; k < 2; ++k) Step(first);
    REQUIRE(SaveCheckpoint(*first.trainer, dir, 1).ok());
    Run second = Start(b, 5);
    REQUIRE(LoadCheckpoint(*second.trainer, dir).ok());
    CHECK(SameBits(States(second), States(first)));
    for (int k = 2; k < 4; ++k) Step(second);
    const std::vector<float> got = Weights(second), want = Weights(straight);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::fabs(got[i] - want[i]) <= 2e-4f);
  }
}

TEST_CASE("only the newest `keep` checkpoints stay; an incomplete one is never loaded",
          "[checkpoint]") {
  const std::string dir = TempDir("keep");
  Run run = Start({"", 2, true});
  for (int k = 0; k < 4; ++k) {
    Step(run);
    REQUIRE(SaveCheckpoint(*run.trainer, dir, 2).ok());
  }
  World().Barrier().IgnoreError();
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"step-00000003", "step-00000004"});
  World().Barrier().IgnoreError();  // every rank has looked
  // A later save that died before its manifest: the newest complete wins.
  if (World().rank() == 0) fs::create_directories(dir + "/step-00000009");
  World().Barrier().IgnoreError();
  CHECK(FindCheckpoint(dir).value() == dir + "/step-00000004");
  World().Barrier().IgnoreError();
}

// Damage `file` in the saved checkpoint and expect the load to fail with
// `code` and a message starting with `prefix`, leaving the trainer as it was.
void ExpectRefused(const std::string& name, const std::function<void(const std::string&)>& damage,
                   absl::StatusCode code, const std::string& contains) {
  INFO(name);
  const std::string dir = TempDir(absl::StrCat("damaged-", name));
  Run saver = Start({"", 2, true});
  Step(saver);
  const std::string at = SaveCheckpoint(*saver.trainer, dir, 1).value();
  if (World().rank() == 0) damage(at);
  World().Barrier().IgnoreError();
  Run victim = Start({"", 2, true}, 11);
  const std::vector<float> before = Weights(victim);
  const absl::Status s = LoadCheckpoint(*victim.trainer, dir).status();
  CHECK(s.code() == code);
  CHECK_THAT(std::string(s.message()), Catch::Contains(contains));
  CHECK(SameBits(Weights(victim), before));
  CHECK(victim.trainer->steps() == 0);
  World().Barrier().IgnoreError();
}

void Rewrite(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  edit(bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A damage that replaces the first `from` in a checkpoint's manifest with `to`.
std::function<void(const std::string&)> InManifest(const std::string& from, const std::string& to) {
  return [from, to](const std::string& at) {
    Rewrite(at + "/manifest.json", [&](std::string& b) {
      const size_t i = b.find(from);
      REQUIRE(i != std::string::npos);
      b.replace(i, from.size(), to);
    });
  };
}

// A manifest edit made consistent again: the field changed as `edit` says,
// and its CRC-32 (of the compact text without the checksum field, as
// engine/checkpoint.h specifies) recomputed, as a manifest written that way
// would be.
std::function<void(const std::string&)> Restamped(const std::function<void(nlohmann::json&)>& edit) {
  return [edit](const std::string& at) {
    std::ifstream in(at + "/manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    in.close();
    edit(m);
    m.erase("manifest_crc32");
    const std::string text = m.dump();
    m["manifest_crc32"] = static_cast<int64_t>(crc32(crc32(0L, Z_NULL, 0),
                                                     reinterpret_cast<const Bytef*>(text.data()),
                                                     static_cast<uInt>(text.size())));
    std::ofstream(at + "/manifest.json", std::ios::trunc) << m.dump(1);
  };
}

TEST_CASE("an edited manifest is refused, and so is any counter out of range",
          "[checkpoint][errors]") {
  // One digit of a counter changed by hand: the checksum catches it.
  ExpectRefused("edited-counter", InManifest("\"steps_applied\": 1", "\"steps_applied\": 7"),
                absl::StatusCode::kDataLoss, "(the manifest is corrupted or was edited)");
  // Consistent manifests with values no run writes.
  ExpectRefused("negative-steps", Restamped([](nlohmann::json& m) { m["trainer_steps"] = -1; }),
                absl::StatusCode::kInvalidArgument, "manifest.json: trainer_steps: expected an integer >= 0, got -1");
  ExpectRefused("negative-scale",
                Restamped([](nlohmann::json& m) { m["progress"]["loss_scale"] = -1.0; }),
                absl::StatusCode::kInvalidArgument,
                "manifest.json: progress.loss_scale: expected a finite f32 > 0, got -1.0");
  ExpectRefused("huge-scale",
                Restamped([](nlohmann::json& m) { m["progress"]["loss_scale"] = 1e300; }),
                absl::StatusCode::kInvalidArgument,
                "manifest.json: progress.loss_scale: expected a finite f32 > 0, got 1e+300");
  ExpectRefused("negative-hysteresis",
                Restamped([](nlohmann::json& m) { m["progress"]["overflows_left"] = -3; }),
                absl::StatusCode::kInvalidArgument, "manifest.json: progress.overflows_left: expected an integer 0..2147483647, got -3");
}

TEST_CASE("damaged, truncated, foreign and mismatched checkpoints are refused by name",
          "[checkpoint][errors]") {
  ExpectRefused(
      "flipped-byte",
      [](const std::string& at) {
        Rewrite(at + "/rank-00000.safetensors", [](std::string& b) { b[b.size() - 5] ^= 0x40; });
      },
      absl::StatusCode::kDataLoss, "rank-00000.safetensors: CRC-32");
  ExpectRefused(
      "truncated",
      [](const std::string& at) {
        Rewrite(at + "/rank-00000.safetensors", [](std::string& b) { b.resize(b.size() - 100); });
      },
      absl::StatusCode::kDataLoss, "(truncated or replaced)");
  ExpectRefused(
      "manifest-not-json",
      [](const std::string& at) { Rewrite(at + "/manifest.json", [](std::string& b) { b.resize(10); }); },
      absl::StatusCode::kDataLoss, "manifest.json: not JSON");
  ExpectRefused("other-version", InManifest("memwall.checkpoint/2", "memwall.checkpoint/9"),
                absl::StatusCode::kInvalidArgument,
                "manifest.json: schema: expected one of \"memwall.checkpoint/2\", "
                "\"memwall.checkpoint/1\", got \"memwall.checkpoint/9\"");
  ExpectRefused("missing-field",
                Restamped([](nlohmann::json& m) { m.erase("trainer_steps"); }),
                absl::StatusCode::kInvalidArgument, "manifest.json: trainer_steps: missing");
  ExpectRefused("another-model",
                Restamped([](nlohmann::json& m) {
                  for (nlohmann::json& p : m["parameters"]) {
                    if (p["name"] == "fc0.weight") p["name"] = "fcX.weight";
                  }
                }),
                absl::StatusCode::kInvalidArgument,
                "no parameter 'fc0.weight' (the checkpoint is of another model)");
  ExpectRefused(
      "missing-file",
      [](const std::string& at) { fs::remove(at + "/rank-00000.safetensors"); },
      absl::StatusCode::kNotFound, "rank-00000.safetensors: cannot open");
}

// A consistent manifest that says parameter `name` is a tile of `whole`
// (of `whole_shape` rows by the parameter's columns, at `row`).
std::function<void(const std::string&)> TileOf(const std::string& name, const std::string& whole,
                                                int64_t whole_rows, int64_t row) {
  return Restamped([=](nlohmann::json& m) {
    for (nlohmann::json& p : m["parameters"]) {
      if (p["name"] != name) continue;
      p["tile_of"] = {{"name", whole},
                      {"shape", {whole_rows, p["shape"][1].get<int64_t>()}},
                      {"row", row},
                      {"column", 0}};
    }
  });
}

TEST_CASE("a manifest's tiles that do not make their tensor exactly once are refused by name",
          "[checkpoint][errors][tiles]") {
  // fc0.weight is [16, 48], fc1.weight [48, 48].
  ExpectRefused("tile-outside", TileOf("fc0.weight", "w", 16, 1),
                absl::StatusCode::kInvalidArgument,
                "parameters[0].tile_of: a [16, 48] tile at row 1, column 0 does not lie inside "
                "'w' [16, 48]");
  ExpectRefused("tile-short", TileOf("fc0.weight", "w", 32, 16),
                absl::StatusCode::kInvalidArgument,
                "the tiles of 'w' (fc0.weight) hold 768 of its 1536 elements");
  ExpectRefused(
      "tiles-overlap",
      [](const std::string& at) {
        TileOf("fc0.weight", "w", 64, 0)(at);
        TileOf("fc1.weight", "w", 64, 8)(at);
      },
      absl::StatusCode::kInvalidArgument,
      "the tiles of 'w' (fc0.weight, fc1.weight) overlap ('fc0.weight' and 'fc1.weight')");
  ExpectRefused("tile-of-a-saved-tensor", TileOf("fc0.weight", "fc1.weight", 16, 0),
                absl::StatusCode::kInvalidArgument,
                "the tiles of 'fc1.weight' (fc0.weight) name a tensor that is also saved whole");
}

TEST_CASE("export writes the master weights as one safetensors file, f32 or bf16",
          "[checkpoint][export]") {
  const std::string dir = TempDir("export");
  Run run = Start({"", 3, true});
  for (int k = 0; k < 2; ++k) Step(run);
  const std::string at = SaveCheckpoint(*run.trainer, dir, 1).value();
  const std::vector<float> master = Weights(run);
  if (World().rank() == 0) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      INFO(DTypeName(dtype));
      const std::string out = absl::StrCat(dir, "/model-", DTypeName(dtype), ".safetensors");
      REQUIRE(ExportCheckpoint(dir, out, dtype).value() == at);
      std::ifstream in(out, std::ios::binary);
      uint64_t length = 0;
      in.read(reinterpret_cast<char*>(&length), 8);
      std::string text(length, '\0');
      in.read(text.data(), length);
      const nlohmann::json header = nlohmann::json::parse(text);
      CHECK(header["__metadata__"]["step"] == "2");
      const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Parameters in the model's order, each at its offsets, exact.
      size_t next = 0;
      for (const auto& layer : run.trainer->layers()) {
        for (const ParameterDecl& d : layer->Parameters()) {
          const nlohmann::json& t = header.at(layer->name() + "." + d.name);
          CHECK(t["dtype"] == (dtype == DType::kF32 ? "F32" : "BF16"));
          CHECK(t["shape"].get<std::vector<int64_t>>() == d.shape);
          const int64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
          const int64_t n = (end - begin) / static_cast<int64_t>(DTypeSize(dtype));
          for (int64_t j = 0; j < n; ++j, ++next) {
            if (dtype == DType::kF32) {
              float v;
              std::memcpy(&v, data.data() + begin + 4 * j, 4);
              REQUIRE(std::memcmp(&v, &master[next], 4) == 0);
            } else {
              uint16_t v;
              std::memcpy(&v, data.data() + begin + 2 * j, 2);
              REQUIRE(v == F32ToBf16(master[next]));
            }
          }
        }
      }
      CHECK(next == master.size());
    }
    const absl::Status bad = ExportCheckpoint(dir, dir + "/x.safetensors", DType::kF16).status();
    CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
    CHECK(bad.message() == "export: dtype f16; expected f32 or bf16");
  }
  World().Barrier().IgnoreError();
}

TEST_CASE("a save whose write fails on one rank fails everywhere and keeps the previous one",
          "[checkpoint][fault]") {
  const int world = World().world_size();
  const int bad = world > 1 ? 1 : 0;  // a rank that writes a group's data
  for (int64_t after : {int64_t{0}, int64_t{100}, int64_t{5000}}) {
    INFO("rank " << bad << "'s writes fail after " << after << " bytes, " << world << " ranks");
    const std::string dir = TempDir(absl::StrCat("write-fault-", after));
    Run run = Start({"", 2, true});
    Step(run);
    REQUIRE(SaveCheckpoint(*run.trainer, dir, 3).ok());
    const std::vector<float> saved = States(run);
    Step(run);
    if (World().rank() == bad) InjectCheckpointWriteFailure(after);
    const absl::Status failed = SaveCheckpoint(*run.trainer, dir, 3).status();
    InjectCheckpointWriteFailure(-1);
    CHECK(failed.code() == absl::StatusCode::kInternal);
    if (World().rank() == bad) {
      CHECK_THAT(std::string(failed.message()), Catch::Contains("write (injected failure)"));
    } else {
      CHECK_THAT(std::string(failed.message()),
                 Catch::Contains(absl::StrCat("rank ", bad, " could not write its file; the "
                                              "previous checkpoint stays the newest")));
    }
    // The failed one is gone, directory and all (an empty step-* would
    // block a later resume or a fresh save); the previous loads as it was
    // saved.
    World().Barrier().IgnoreError();
    CHECK_FALSE(fs::exists(dir + "/step-00000002"));
    CHECK(FindCheckpoint(dir).value() == dir + "/step-00000001");
    Run back = Start({"", 2, true}, 3);
    REQUIRE(LoadCheckpoint(*back.trainer, dir).ok());
    CHECK(SameBits(States(back), saved));
    // Retried, the save succeeds and becomes the newest.
    REQUIRE(SaveCheckpoint(*run.trainer, dir, 3).ok());
    CHECK(FindCheckpoint(dir).value() == dir + "/step-00000002");
    World().Barrier().IgnoreError();
  }
}

TEST_CASE("a manifest rank 0 cannot write fails the save on every rank, leaving nothing",
          "[checkpoint][fault]") {
  const std::string dir = TempDir("manifest-fault");
  Run run = Start({"", 2, true});
  Step(run);
  REQUIRE(SaveCheckpoint(*run.trainer, dir, 3).ok());
  // Rank 0's writes fail right after its rank file: at the manifest.
  const int64_t file = static_cast<int64_t>(
      fs::file_size(dir + "/step-00000001/rank-00000.safetensors"));
  Step(run);
  if (World().rank() == 0) InjectCheckpointWriteFailure(file);
  const absl::Status failed = SaveCheckpoint(*run.trainer, dir, 3).status();
  InjectCheckpointWriteFailure(-1);
  CHECK(failed.code() == absl::StatusCode::kInternal);
  if (World().rank() == 0) {
    CHECK_THAT(std::string(failed.message()),
               Catch::Contains("manifest.json.tmp: write (injected failure)"));
  } else {  // told, not left waiting for rank 0
    CHECK(std::string(failed.message()) ==
          absl::StrCat("checkpoint ", dir, "/step-00000002: rank 0 could not commit it (INTERNAL, "
                       "named in that rank's error)"));
  }
  World().Barrier().IgnoreError();
  CHECK_FALSE(fs::exists(dir + "/step-00000002"));
  CHECK(FindCheckpoint(dir).value() == dir + "/step-00000001");
  World().Barrier().IgnoreError();
}

TEST_CASE("a checkpoint of another optimizer is refused", "[checkpoint][errors]") {
  const std::string dir = TempDir("other-optimizer");
  Run adam = Start({"", 1, false});
  Step(adam);
  REQUIRE(SaveCheckpoint(*adam.trainer, dir, 1).ok());
  Run sgd = Start({"", 1, false, 0, false, false, true});
  const absl::Status s = LoadCheckpoint(*sgd.trainer, dir).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("field 'states' is [master, exp_avg, exp_avg_sq], this run's optimizer "
                             "keeps [master, momentum]"));
  const absl::Status none = LoadCheckpoint(*sgd.trainer, TempDir("nothing-here")).status();
  CHECK(none.code() == absl::StatusCode::kNotFound);
  World().Barrier().IgnoreError();
}

}  // namespace
}  // namespace memwall
