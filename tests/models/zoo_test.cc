// The shape-only zoo: parameter counts against the published ones, exact
// activation accounting on meta through the real training step, and a clear
// refusal to compute.
#include "models/zoo.h"

#include <map>

#include "catch2/catch.hpp"
#include "tests/support/owner_peaks.h"
#include "engine/trainer.h"
#include "models/layers.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"

namespace memwall {
namespace {

TEST_CASE("zoo parameter counts match the published models", "[zoo]") {
  // torchvision's resnet50: 25,557,032 ("25.6M"); Meta's LLaMA-7B:
  // 6,738,415,616; Llama-2-70B: 68,976,648,192.
  CHECK(CountParameters(MakeZooModel("resnet50", 0).value()) == 25'557'032);
  CHECK(CountParameters(MakeZooModel("llama-7b", 2048).value()) == 6'738'415'616);
  CHECK(CountParameters(MakeZooModel("llama2-70b", 4096).value()) == 68'976'648'192);
  // ResNeSt-269 is published at 110.9M; the "like" network keeps its
  // parameters (deep stem, radix-2 grouped split attention) and differs in
  // parameter-free details (average-pool downsampling).
  const double resnest = CountParameters(MakeZooModel("resnest269", 0).value());
  INFO("resnest269-like: " << resnest);
  CHECK(std::fabs(resnest - 110.9e6) <= 0.01 * 110.9e6);
  auto unknown = MakeZooModel("vgg16", 0);
  CHECK(std::string(unknown.status().message()) ==
        "model 'vgg16': expected one of resnet50, resnest269, llama-7b, llama2-70b");
}

TEST_CASE("meta runs a ResNet-50 step with every layer's activations exact", "[zoo][meta]") {
  auto device = CreateDevice({Backend::kMeta, 0, 64 * kGiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 8).value();
  ShardingOptions options;
  options.zero.stage = 2;
  options.zero.reduce_bucket_size = 4'000'000;
  auto trainer = Trainer::Create(MakeZooModel("resnet50", 0).value(), std::make_unique<MseLoss>(),
                                 options, *device, *comm, 1)
                     .value();
  const int64_t batch = 16, size = 224;
  Batch b;
  b.input = Tensor::Empty(*device, DType::kF32, {batch, 3, size, size}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(*device, DType::kF32, {batch, 1000}, MemoryCategory::kOther, "data").value();
  testing::OwnerPeaks peaks;
  device->allocator().AddListener(&peaks);
  REQUIRE(trainer->TrainStep({&b, 1}).ok());
  device->allocator().RemoveListener(&peaks);
  std::vector<int64_t> shape = {batch, 3, size, size};
  int64_t total = 0;
  for (const auto& layer : trainer->layers()) {
    INFO(layer->name());
    const DType dtype = trainer->optimizer().config().param_dtype();
    CHECK(peaks.peak[layer->name()] == layer->ActivationBytes(shape, dtype));
    total += layer->ActivationBytes(shape, dtype);
    shape = layer->OutputShape(shape).value();
  }
  CHECK(shape == std::vector<int64_t>{batch, 1000});
  // Conv and BN outputs of ResNet-50 at batch 16, 224x224, in f32: about
  // 1.7 GiB (ReLUs run in place on the BN outputs).
  INFO("activations: " << FormatBytes(total));
  CHECK(total > 1 * kGiB);
  CHECK(total < 4 * kGiB);
}

TEST_CASE("zoo layers refuse to compute on a device with bytes", "[zoo]") {
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  auto small = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto stem_only = MakeZooModel("resnet50", 0).value();
  stem_only.resize(1);
  auto t = Trainer::Create(std::move(stem_only), std::make_unique<MseLoss>(), ShardingOptions(),
                           *small, *comm, 1).value();
  Batch b;
  b.input = Tensor::Empty(*small, DType::kF32, {1, 3, 32, 32}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(*small, DType::kF32, {1, 64, 8, 8}, MemoryCategory::kOther, "data").value();
  auto step = t->TrainStep({&b, 1});
  CHECK(step.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(step.status().message()), Catch::StartsWith("layer 'stem' is shape-only"));
}

}  // namespace
}  // namespace memwall
