// gpt-tiny trained on cuda (cuBLAS, the CUDA NN kernels, NCCL) tracks the
// same run on host (OpenBLAS, the CPU kernels, MPI) on every ZeRO stage.
// The GEMMs add in different orders, so losses agree to a tolerance, not
// bit for bit. Needs one GPU per rank: skipped without.
#include <cmath>
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

}  // namespace
}  // namespace memwall
