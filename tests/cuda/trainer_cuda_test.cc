// gpt-tiny trained on cuda (cuBLAS, the CUDA NN kernels, NCCL) tracks the
// same run on host (OpenBLAS, the CPU kernels, MPI) on every ZeRO stage.
// The GEMMs add in different orders, so losses agree to a tolerance, not
// bit for bit. Tiled blocks on cuda train bit for bit as the untiled
// operator computed in the same column blocks (the same cuBLAS calls on the
// same values). Needs one GPU per rank: skipped without.
#include <cmath>
#include <cstring>
#include <vector>

#include "catch2/catch.hpp"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "runtime/communicator.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/tensor.h"
#include "runtime/units.h"
#include "tests/support/gpt_run.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

std::vector<float> Losses(Device& device, Communicator& comm, int stage, int steps) {
  const GptConfig c = GptPreset("gpt-tiny").value();
  ShardingOptions options;
  options.zero.stage = stage;
  options.optimizer.lr = 3e-3f;
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                 options, device, comm, 7)
                     .value();
  std::vector<float> losses;
  const int64_t sequences = 4;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> input(sequences * c.seq), target(sequences * c.seq);
    for (int64_t i = 0; i < sequences * c.seq; ++i) {
      const int64_t t = (comm.rank() * sequences * c.seq + i) * 7 + step * 3;
      input[i] = float(t % c.vocab);
      target[i] = float((t + 5) % c.vocab);
    }
    Batch b;
    b.input = Tensor::FromHost(device, input, {sequences, c.seq}, MemoryCategory::kOther, "data")
                  .value();
    b.target = Tensor::FromHost(device, target, {sequences * c.seq}, MemoryCategory::kOther,
                                "data")
                   .value();
    auto report = trainer->TrainStep({&b, 1});
    REQUIRE(report.ok());
    losses.push_back(report->loss);
  }
  return losses;
}

TEST_CASE("gpt-tiny on cuda tracks gpt-tiny on host on every stage", "[cuda][trainer]") {
  MpiCommunicator& world = testing::World();
  auto gpu = CreateDevice({Backend::kCuda, world.rank() % CudaDeviceCount(), 0}).value();
  auto nccl = NcclCommunicator::Create(world, *gpu).value();
  auto host = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const std::vector<float> on_host = Losses(*host, world, stage, 20);
    const std::vector<float> on_gpu = Losses(*gpu, *nccl, stage, 20);
    for (size_t i = 0; i < on_host.size(); ++i) {
      INFO("step " << i);
      CHECK(on_gpu[i] == Approx(on_host[i]).epsilon(1e-4));
    }
    CHECK(on_gpu.back() < on_gpu.front());
  }
}

TEST_CASE("tiled gpt-tiny on cuda trains bit for bit as the untiled operator",
          "[cuda][trainer][tiles]") {
  MpiCommunicator& world = testing::World();
  auto gpu = CreateDevice({Backend::kCuda, world.rank() % CudaDeviceCount(), 0}).value();
  auto nccl = NcclCommunicator::Create(world, *gpu).value();
  const GptConfig c = GptPreset("gpt-tiny").value();
  for (int64_t tiles : {2, 4}) {
    for (bool bf16 : {false, true}) {
      for (int stage : {0, 3}) {
        INFO(tiles << " tiles, " << (bf16 ? "bf16" : "f32") << ", stage " << stage);
        std::vector<float> losses[2], trained[2];
        // 0: the untiled weight computed in column blocks, 1: tile parameters
        // (at stage 3 each gathered, computed and released in turn).
        for (int tiled = 0; tiled < 2; ++tiled) {
          ShardingOptions o;
          o.zero.stage = stage;
          o.zero.reduce_bucket_size = 60000;
          o.zero.stage3_gather_on_use = stage == 3;
          o.optimizer.lr = 1e-2f;
          o.bf16 = bf16;
          GptConfig config = c;
          config.tiles = tiles;
          config.vocab_tiles = tiles + 1;  // 3 or 5 uneven tiles of the 256 tokens
          config.tile_parameters = tiled == 1;
          auto trainer = Trainer::Create(MakeGpt(config).value(),
                                         std::make_unique<CrossEntropyLoss>(), o, *gpu, *nccl, 3)
                             .value();
          for (int k = 0; k < 4; ++k) {
            Batch b = testing::GptBatch(*gpu, config, world.rank(), k);
            auto report = trainer->TrainStep({&b, 1});
            REQUIRE(report.ok());
            losses[tiled].push_back(report->loss);
          }
          trained[tiled] = testing::WholeWeights(*trainer, config);
        }
        CHECK(losses[1] == losses[0]);
        REQUIRE(trained[1].size() == trained[0].size());
        CHECK(std::memcmp(trained[1].data(), trained[0].data(), trained[0].size() * 4) == 0);
        CHECK(losses[1].back() < losses[1].front());
      }
    }
  }
}

}  // namespace
}  // namespace memwall
