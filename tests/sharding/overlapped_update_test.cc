// OverlappedUpdate: a host slice's update handed to the update thread runs
// there, leaves the slice's current state alone until the step commits, and
// a failure on the thread reaches Finish with nothing handed over kept.
//
// The reference is the first AdamW step's closed form (from zero moments
// the bias-corrected update of a gradient g is g / (|g| + eps)), in double.
#include <cmath>
#include <vector>

#include "catch2/catch.hpp"
#include "kernels/ops.h"
#include "runtime/tensor.h"
#include "runtime/units.h"
#include "sharding/host_optimizer.h"
#include "sharding/overlapped_update.h"

namespace memwall {
namespace {

constexpr int64_t kN = 1000;

float Weight(int64_t i) { return 0.5f * std::sin(0.37f * i + 1); }
// Exact in bf16, so the staged gradients are these values.
float Grad(int64_t i) { return std::ldexp(static_cast<float>((i * 7) % 31 - 15), -8); }

struct Fixture {
  std::unique_ptr<Device> device =
      CreateDevice({Backend::kHost, 0, 64 * kMiB, 64 * kMiB}).value();
  std::unique_ptr<Stream> stream = device->CreateStream().value();
  std::unique_ptr<HostOptimizerSlice> slice;
  std::unique_ptr<OverlappedUpdate> overlapped =
      OverlappedUpdate::Create(*device, /*cores=*/{}).value();
  kernels::AdamParams adam;

  Fixture() {
    HostOptimizerSlice::Options options;
    options.speculative = true;
    slice = HostOptimizerSlice::Create(*device, HostOptimizerSlice::Rule::kAdam, true,
                                       DType::kBF16, kN, "g0", options)
                .value();
    std::vector<float> w(kN);
    for (int64_t i = 0; i < kN; ++i) w[i] = Weight(i);
    REQUIRE(slice->WriteState(0, 0, kN, w.data()).ok());
    overlapped->SetGroups(1, nullptr, {});
    adam.lr = 1e-2f;
    adam.weight_decay = 0.1f;
    adam.adamw = true;
    adam.step = 1;
  }

  int64_t PinnedWorkspace() const {
    return device->pinned_allocator()
        ->stats()
        .by_category[static_cast<int>(MemoryCategory::kWorkspace)]
        .current;
  }
};

TEST_CASE("a handed-over update runs on the thread and leaves the current state until commit") {
  Fixture f;
  std::vector<float> g32(kN);
  for (int64_t i = 0; i < kN; ++i) g32[i] = Grad(i);
  auto wide = Tensor::FromHost(*f.device, g32, {kN}, MemoryCategory::kGradient, "g32").value();
  auto grads = Tensor::Empty(*f.device, DType::kBF16, {kN}, MemoryCategory::kGradient, "g").value();
  REQUIRE(kernels::Cast(*f.device, *f.stream, wide.data(), DType::kF32, grads.data(),
                        DType::kBF16, kN)
              .ok());
  REQUIRE(f.slice->StageGradients(*f.stream, grads.data()).ok());
  REQUIRE(f.overlapped->Hand(0, *f.slice, "g0", {StateTier::Segment{0, kN, f.adam, {}}}, *f.stream,
                             nullptr)
              .ok());
  CHECK(f.overlapped->handed(0));
  // Its refreshed parameters' pinned buffer is allocated at the hand-over.
  CHECK(f.PinnedWorkspace() == kN * 2);
  REQUIRE(f.overlapped->Finish().ok());
  CHECK(f.overlapped->busy_seconds() > 0);
  REQUIRE(f.overlapped->segments(0).size() == 1);
  CHECK(f.overlapped->segments(0)[0].count == kN);

  // Until the commit the slice's state is the one before the step.
  std::vector<float> master(kN);
  REQUIRE(f.slice->ReadState(0, 0, kN, master.data()).ok());
  for (int64_t i = 0; i < kN; ++i) REQUIRE(master[i] == Weight(i));

  auto params = Tensor::Empty(*f.device, DType::kBF16, {kN}, MemoryCategory::kParameter, "p").value();
  REQUIRE(f.slice->Commit(*f.stream, params.data()).ok());
  REQUIRE(f.slice->ReadState(0, 0, kN, master.data()).ok());
  const auto* refreshed = static_cast<const uint16_t*>(params.data());
  for (int64_t i = 0; i < kN; ++i) {
    const double g = Grad(i), w = Weight(i);
    const double want = w * (1 - 1e-2 * 0.1) - 1e-2 * g / (std::fabs(g) + 1e-8);
    INFO("element " << i);
    REQUIRE(std::fabs(master[i] - want) <= 1e-6 * std::fabs(want) + 1e-9);
    // The parameters the thread refreshed are the new master weights in bf16.
    REQUIRE(refreshed[i] == F32ToBf16(master[i]));
  }
  f.overlapped->Drop(0);
  CHECK_FALSE(f.overlapped->handed(0));
  CHECK(f.PinnedWorkspace() == 0);
}

TEST_CASE("a failure on the update thread reaches Finish, and nothing handed over stays") {
  Fixture f;
  // No gradients staged: the slice refuses to update.
  REQUIRE(f.overlapped->Hand(0, *f.slice, "g0", {StateTier::Segment{0, kN, f.adam, {}}}, *f.stream,
                             nullptr)
              .ok());
  const absl::Status finished = f.overlapped->Finish();
  CHECK(finished.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(finished.message() == "offloaded optimizer states of 'g0': no gradients staged");
  CHECK_FALSE(f.overlapped->handed(0));
  CHECK(f.PinnedWorkspace() == 0);
}

}  // namespace
}  // namespace memwall
