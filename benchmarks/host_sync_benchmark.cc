// Host synchronisations per training step (runtime/device.h
// host_synchronizations: every time the host waits for the device, the
// step's serial points on a GPU), against the number of layers, for a GPT
// at ZeRO stages 0-3 in f32 and bf16, overlapped or not. Each step runs on
// the meta backend as rank 0 of 4, which counts exactly what a host run
// counts (tests/engine/dry_run_test checks it). The figure to watch is the
// per-layer slope: a stream-ordered step waits a constant number of times
// whatever the depth.
//
//   bazel run //benchmarks:host_sync_benchmark
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config.h"
#include "engine/dry_run.h"
#include "models/spec.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

// Host synchronisations of the second step (the first also initialises).
int64_t SyncsPerStep(int layers, int stage, bool bf16, bool overlap) {
  Config config;
  config.bf16 = bf16;
  config.zero.stage = stage;
  config.zero.overlap_comm = overlap;
  config.zero.reduce_bucket_size = 60000;  // about a group per block
  config.train_micro_batch_size_per_gpu = 4;
  Model model = MakeModel(absl::StrCat("gpt-tiny:layers=", layers), 4, 0, 224).value();
  auto device = CreateDevice({Backend::kMeta, 0, int64_t{1} << 40}).value();
  auto comm = SimulatedCommunicator::Create(0, 4).value();
  auto trainer = Trainer::Create(std::move(model.layers), std::move(model.loss), config, *device,
                                 *comm, 1)
                     .value();
  std::vector<Batch> batches = EmptyBatches(*device, 1, model.input, model.target).value();
  if (!trainer->TrainStep(batches).ok()) return -1;
  const int64_t before = device->host_synchronizations();
  if (!trainer->TrainStep(batches).ok()) return -1;
  return device->host_synchronizations() - before;
}

}  // namespace
}  // namespace memwall

int main() {
  using memwall::SyncsPerStep;
  const std::vector<int> depths = {2, 4, 8, 16};
  std::printf("host synchronisations per step, gpt-tiny (micro-batch 4), rank 0 of 4\n");
  std::printf("%-28s", "strategy");
  for (int layers : depths) std::printf(" %8s", ("L=" + std::to_string(layers)).c_str());
  std::printf(" %10s\n", "per layer");
  for (bool overlap : {false, true}) {
    for (bool bf16 : {false, true}) {
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string name = std::string("stage ") + std::to_string(stage) +
                                 (bf16 ? ", bf16" : ", f32") + (overlap ? ", overlap" : "");
        std::printf("%-28s", name.c_str());
        std::vector<int64_t> counts;
        for (int layers : depths) {
          counts.push_back(SyncsPerStep(layers, stage, bf16, overlap));
          std::printf(" %8lld", static_cast<long long>(counts.back()));
        }
        // Blocks are the layers here; the slope between the deepest two.
        const double slope = double(counts.back() - counts[counts.size() - 2]) /
                             (depths.back() - depths[depths.size() - 2]);
        std::printf(" %10.1f\n", slope);
      }
    }
  }
  return 0;
}
