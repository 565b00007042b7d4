// Category attribution of a real ZeRO stage-3 step on real ranks (mpirun
// -np 1, 2, 4): at the peak, parameter bytes are this rank's shards plus
// exactly the groups gathered for the layer running then, and the
// optimizer states are the rank's shards.
#include <set>

#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "profiler/memory_profiler.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

TEST_CASE("stage 3: parameters at the peak are the shard plus the live gathered groups",
          "[profiler][zero]") {
  MpiCommunicator& world = testing::World();
  const int64_t n = world.world_size();
  auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  MemoryProfiler profiler(device->allocator());
  const GptConfig c = {/*vocab=*/256, /*seq=*/32, /*hidden=*/64, /*heads=*/4, /*layers=*/3};
  ShardingOptions options;
  options.zero.stage = 3;
  options.zero.reduce_bucket_size = 20000;  // one group per layer
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                 options, *device, world, 1).value();
  trainer->set_profiler(&profiler);
  Batch b;
  b.input = Tensor::Empty(*device, DType::kF32, {2, c.seq}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(*device, DType::kF32, {2 * c.seq}, MemoryCategory::kOther, "data").value();
  for (int64_t i = 0; i < b.input.numel(); ++i) {
    b.input.data_as<float>()[i] = float((i * 5 + world.rank()) % 256);
    b.target.data_as<float>()[i] = float((i * 3) % 256);
  }
  REQUIRE(trainer->TrainStep({&b, 1}).ok());
  const PeakSnapshot peak = profiler.peak();
  std::string path;
  for (const std::string& p : peak.phase_path) path += p + " > ";
  INFO("peak in " << path);
  const FlatLayout& layout = trainer->optimizer().layout();
  ShardedOptimizer& opt = trainer->optimizer();
  // The groups each layer reads, and the first layer reading each group.
  const auto& layers = trainer->layers();
  std::vector<std::set<int>> reads(layers.size());
  std::vector<int> first_user(layout.groups.size(), static_cast<int>(layers.size()));
  int at = -1;
  bool backward = false;
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const ParameterDecl& d : layers[l]->Parameters()) {
      reads[l].insert(opt.GroupOf(layers[l]->name() + "." + d.name).value());
    }
    for (const std::string& shared : layers[l]->SharedParameters()) {
      reads[l].insert(opt.GroupOf(shared).value());
    }
    for (int g : reads[l]) first_user[g] = std::min(first_user[g], static_cast<int>(l));
    for (const std::string& p : peak.phase_path) {
      if (p == layers[l]->name()) at = static_cast<int>(l);
      if (p == "backward") backward = true;
    }
  }
  REQUIRE(at >= 0);
  // Forward gathers what the running layer reads; backward keeps every group
  // it has entered until the first layer reading it is done.
  std::set<int> groups = reads[at];
  if (backward) {
    for (size_t k = at; k < layers.size(); ++k) {
      for (int g : reads[k]) {
        if (first_user[g] <= at) groups.insert(g);
      }
    }
  }
  int64_t gathered = 0;
  for (int g : groups) gathered += 4 * layout.groups[g].padded_numel;
  const int64_t shards = 4 * layout.padded_numel / n;
  CHECK(peak.by_category[int(MemoryCategory::kParameter)] == shards + gathered);
  // f32 AdamW: two moments per element of the rank's shards.
  CHECK(peak.by_category[int(MemoryCategory::kOptimizerState)] == 8 * layout.padded_numel / n);
}

}  // namespace
}  // namespace memwall
