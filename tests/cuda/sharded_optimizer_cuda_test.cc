// The sharded optimizer on the cuda backend with NCCL gives the same master
// weights, bit for bit, as on the host backend with MPI (the CUDA kernels
// are twins of the CPU ones, and constant gradients sum exactly). Skipped
// without a GPU per rank.
#include <cstring>
#include <vector>

#include "catch2/catch.hpp"
#include "kernels/ops.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/device.h"
#include "runtime/units.h"
#include "sharding/sharded_optimizer.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

const std::vector<std::pair<std::string, std::vector<int64_t>>> kParams = {
    {"a", {300, 7}}, {"b", {7}}, {"c", {1000}}, {"d", {}}};

std::vector<float> Train(Device& device, Communicator& comm, const ShardingOptions& options) {
  auto opt = ShardedOptimizer::Create(options, device, comm).value();
  for (size_t p = 0; p < kParams.size(); ++p) {
    const int64_t n = NumElements(kParams[p].second);
    std::vector<float> init(n);
    for (int64_t j = 0; j < n; ++j) init[j] = 0.001f * float((j * 7 + p) % 97);
    REQUIRE(opt->AddParameter(kParams[p].first, kParams[p].second, init).ok());
  }
  REQUIRE(opt->Finalize().ok());
  auto stream = device.CreateStream().value();
  const int groups = static_cast<int>(opt->layout().groups.size());
  for (int step = 0; step < 3; ++step) {
    for (int g = groups - 1; g >= 0; --g) {
      REQUIRE(opt->GatherParameters(g).ok());
      REQUIRE(opt->AcquireGradients(g).ok());
      for (int p : opt->layout().groups[g].parameters) {
        auto grad = opt->Gradient(kParams[p].first).value();
        // Multiples of 2^-10: sums over ranks are exact.
        const float value = float((step + 1) * (p + 1) * (comm.rank() + 1)) / 1024.0f;
        REQUIRE(kernels::Fill(device, *stream, grad.data, grad.dtype, grad.numel, value).ok());
      }
      REQUIRE(stream->Synchronize().ok());
      REQUIRE(opt->ReduceGradients(g).ok());
      REQUIRE(opt->ReleaseParameters(g).ok());
    }
    REQUIRE(opt->Step().ok());
  }
  std::vector<float> all;
  for (const auto& [name, shape] : kParams) {
    std::vector<float> w(NumElements(shape));
    REQUIRE(opt->MasterWeights(name, absl::MakeSpan(w)).ok());
    all.insert(all.end(), w.begin(), w.end());
  }
  return all;
}

TEST_CASE("cuda + NCCL ZeRO equals host + MPI ZeRO bit for bit", "[cuda][zero]") {
  MpiCommunicator& world = testing::World();
  auto gpu = CreateDevice({Backend::kCuda, world.rank() % CudaDeviceCount(), 0}).value();
  auto nccl = NcclCommunicator::Create(world, *gpu).value();
  auto host = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool overlap : {false, true}) {
      INFO("stage " << stage << ", overlap " << overlap);
      ShardingOptions options;
      options.zero.stage = stage;
      options.zero.overlap_comm = overlap;
      options.zero.reduce_bucket_size = 1000;
      options.bf16 = true;
      // The norm (summed in a different order on the GPU) stays below the
      // threshold, so the clip coefficient is exactly 1 on both.
      options.gradient_clipping = 1.0f;
      const std::vector<float> on_host = Train(*host, world, options);
      const std::vector<float> on_gpu = Train(*gpu, *nccl, options);
      REQUIRE(on_host.size() == on_gpu.size());
      CHECK(std::memcmp(on_host.data(), on_gpu.data(), on_host.size() * 4) == 0);
    }
  }
}

TEST_CASE("cuda offload (pinned, paging) equals the on-device update bit for bit",
          "[cuda][zero][offload]") {
  MpiCommunicator& world = testing::World();
  DeviceOptions options{Backend::kCuda, world.rank() % CudaDeviceCount(), 0};
  options.pinned_capacity_bytes = 256 * kMiB;
  auto gpu = CreateDevice(options).value();
  auto nccl = NcclCommunicator::Create(world, *gpu).value();
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool overlap : {false, true}) {
      INFO("stage " << stage << ", overlap " << overlap);
      ShardingOptions plain;
      plain.zero.stage = stage;
      plain.zero.overlap_comm = overlap;
      plain.zero.reduce_bucket_size = 1000;
      plain.bf16 = true;
      const std::vector<float> want = Train(*gpu, *nccl, plain);
      for (bool paging : {false, true}) {
        if (paging && stage != 3) continue;
        ShardingOptions offload = plain;
        offload.zero.offload_optimizer_ratio = 1.0f;
        offload.zero.offload_param = paging;
        const std::vector<float> got = Train(*gpu, *nccl, offload);
        REQUIRE(got.size() == want.size());
        CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace memwall
