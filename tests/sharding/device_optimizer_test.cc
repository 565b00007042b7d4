// The device tier of optimizer state (Note [State tiers]): what it keeps
// and where, Adam and SGD checked against the published update rules
// computed here in double, and the host and device tiers driven through the
// one StateTier interface ending bit for bit alike.
#include "sharding/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "kernels/cpu/cpu_kernels.h"
#include "sharding/host_optimizer.h"
#include "runtime/units.h"

namespace memwall {
namespace {

constexpr int64_t kN = 777;

std::vector<float> Values(uint32_t seed, float scale) {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = scale * std::sin(0.37f * i + seed);
  return v;
}

TEST_CASE("device tier: moments and 16-bit master weights are its own, tagged", "[state_tier]") {
  auto device = CreateDevice({Backend::kMeta, 0, 64 * kMiB}).value();
  auto stream = device->CreateStream().value();
  auto adam = DeviceOptimizerSlice::Create(*device, *stream, StateTier::Rule::kAdam, true,
                                           DType::kBF16, kN, "g0", nullptr).value();
  CHECK(adam->num_states() == 3);
  CHECK(adam->two_phase() == false);
  CHECK(adam->scratch_bytes() == 0);
  const AllocatorStats stats = device->allocator().stats();
  CHECK(stats.by_category[static_cast<int>(MemoryCategory::kOptimizerState)].current == 3 * kN * 4);
  const auto owners = device->allocator().OwnerBytes();
  std::vector<std::string> names;
  for (const auto& [owner, bytes] : owners) {
    CHECK(bytes == kN * 4);
    names.push_back(owner.first);
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"g0.exp_avg", "g0.exp_avg_sq", "g0.master"});
  // f32 SGD without momentum: the parameters are the master weights and
  // nothing is allocated.
  auto sgd = DeviceOptimizerSlice::Create(*device, *stream, StateTier::Rule::kSgd, false,
                                          DType::kF32, kN, "g1", nullptr).value();
  CHECK(sgd->num_states() == 1);
  CHECK(device->allocator().stats().num_allocations == 3);
  const absl::Status bad = sgd->ReadState(1, 0, 1, nullptr);
  CHECK(bad.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(bad.message()) == "device optimizer state 1 of 1, elements [0, 1) of 777");
  const absl::Status past_end = adam->WriteState(0, 700, 78, nullptr);
  CHECK(past_end.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(past_end.message()) ==
        "device optimizer state 0 of 3, elements [700, 778) of 777");
}

TEST_CASE("device tier: one AdamW step and one SGD step follow the published rules",
          "[state_tier]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto stream = device->CreateStream().value();
  const std::vector<float> p0 = Values(1, 0.5f), g = Values(2, 0.1f);
  auto params = device->Allocate(kN * 4, MemoryCategory::kParameter, "p").value();
  auto grads = device->Allocate(kN * 4, MemoryCategory::kGradient, "g").value();
  REQUIRE(device->CopyAsync(grads.data(), g.data(), kN * 4, *stream).ok());
  for (bool adam : {true, false}) {
    INFO((adam ? "adamw" : "sgd with momentum"));
    REQUIRE(device->CopyAsync(params.data(), p0.data(), kN * 4, *stream).ok());
    auto tier = DeviceOptimizerSlice::Create(
                    *device, *stream, adam ? StateTier::Rule::kAdam : StateTier::Rule::kSgd, true,
                    DType::kF32, kN, "g", static_cast<float*>(params.data()))
                    .value();
    StateTier::Segment all{0, kN};
    all.adam.lr = 1e-2f;
    all.adam.weight_decay = 0.1f;
    all.adam.adamw = true;
    all.sgd.lr = 0.05f;
    all.sgd.momentum = 0.9f;
    StateTier::UpdateArgs args;
    args.segments = absl::MakeConstSpan(&all, 1);
    args.grads = grads.data();
    args.params = params.data();
    StateTier& as_tier = *tier;
    REQUIRE(as_tier.Update(*stream, args).ok());
    REQUIRE(as_tier.Commit(*stream, params.data()).ok());
    std::vector<float> p(kN), m(kN);
    REQUIRE(as_tier.ReadState(0, 0, kN, p.data()).ok());
    REQUIRE(as_tier.ReadState(1, 0, kN, m.data()).ok());
    for (int64_t i = 0; i < kN; ++i) {
      const double gi = g[i], pi = p0[i];
      double want, want_m;
      if (adam) {
        // Step 1: m = (1-b1) g, v = (1-b2) g^2, bias-corrected to g and g^2;
        // AdamW decays the weight by lr * wd first.
        want_m = 0.1 * gi;
        want = pi * (1 - 1e-2 * 0.1) - 1e-2 * gi / (std::fabs(gi) + 1e-8);
      } else {
        want_m = gi;  // the momentum buffer starts as the gradient
        want = pi - 0.05 * gi;
      }
      CHECK(p[i] == Approx(want).margin(1e-6));
      CHECK(m[i] == Approx(want_m).margin(1e-7));
    }
  }
}

TEST_CASE("host and device tiers end bit for bit alike through StateTier", "[state_tier]") {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    INFO(DTypeName(dtype));
    DeviceOptions o{Backend::kHost, 0, 64 * kMiB};
    o.pinned_capacity_bytes = 16 * kMiB;
    auto device = CreateDevice(o).value();
    auto stream = device->CreateStream().value();
    const size_t size = DTypeSize(dtype);
    const std::vector<float> master0 = Values(3, 0.5f), g32 = Values(4, 0.2f);
    std::vector<char> g(kN * size);
    kernels::cpu::Kernels().cast(g32.data(), DType::kF32, g.data(), dtype, kN);
    auto grads = device->Allocate(kN * size, MemoryCategory::kGradient, "g").value();
    REQUIRE(device->CopyAsync(grads.data(), g.data(), kN * size, *stream).ok());
    auto device_params = device->Allocate(kN * size, MemoryCategory::kParameter, "dp").value();
    auto host_params = device->Allocate(kN * size, MemoryCategory::kParameter, "hp").value();
    std::unique_ptr<StateTier> tiers[2];
    tiers[0] = DeviceOptimizerSlice::Create(*device, *stream, StateTier::Rule::kAdam, true, dtype,
                                            kN, "dev", dtype == DType::kF32
                                                           ? static_cast<float*>(device_params.data())
                                                           : nullptr)
                   .value();
    tiers[1] = HostOptimizerSlice::Create(*device, StateTier::Rule::kAdam, true, dtype, kN, "host")
                   .value();
    void* params[2] = {device_params.data(), host_params.data()};
    std::vector<float> result[2][3];
    for (int t = 0; t < 2; ++t) {
      StateTier& tier = *tiers[t];
      REQUIRE(tier.WriteState(0, 0, kN, master0.data()).ok());
      auto scratch = device->AllocatePinned(std::max<int64_t>(tier.scratch_bytes(), 1),
                                            MemoryCategory::kWorkspace, "scratch")
                         .value();
      for (int step = 1; step <= 3; ++step) {
        if (t == 1) {
          REQUIRE(static_cast<HostOptimizerSlice&>(tier).StageGradients(*stream, grads.data()).ok());
        }
        // Two hyperparameter groups: the second half with another lr.
        StateTier::Segment halves[2] = {{0, kN / 2}, {kN / 2, kN - kN / 2}};
        halves[0].adam.lr = 3e-3f;
        halves[1].adam.lr = 1e-3f;
        for (StateTier::Segment& h : halves) h.adam.step = step;
        StateTier::UpdateArgs args;
        args.segments = halves;
        args.grads = grads.data();
        args.params = params[t];
        args.scratch = scratch.data();
        REQUIRE(tier.Update(*stream, args).ok());
        REQUIRE(tier.Commit(*stream, params[t]).ok());
      }
      for (int which = 0; which < 3; ++which) {
        result[t][which].resize(kN);
        REQUIRE(tier.ReadState(which, 0, kN, result[t][which].data()).ok());
      }
    }
    for (int which = 0; which < 3; ++which) {
      INFO("state " << which);
      CHECK(std::memcmp(result[0][which].data(), result[1][which].data(), kN * 4) == 0);
    }
    REQUIRE(stream->Synchronize().ok());
    CHECK(std::memcmp(device_params.data(), host_params.data(), kN * size) == 0);
  }
}


TEST_CASE("a param_group without momentum in a tier that keeps buffers: torch's plain SGD",
          "[state_tier]") {
  // torch's SGD keeps no momentum buffer for a param_group whose momentum
  // is 0: p -= lr * g every step. Its part of the tier's buffer stays zero;
  // the other half (momentum 0.9) follows buf = 0.9 buf + g.
  DeviceOptions o{Backend::kHost, 0, 64 * kMiB};
  o.pinned_capacity_bytes = 16 * kMiB;
  auto device = CreateDevice(o).value();
  auto stream = device->CreateStream().value();
  const std::vector<float> p0 = Values(5, 0.5f), g = Values(6, 0.1f);
  auto grads = device->Allocate(kN * 4, MemoryCategory::kGradient, "g").value();
  REQUIRE(device->CopyAsync(grads.data(), g.data(), kN * 4, *stream).ok());
  auto params = device->Allocate(kN * 4, MemoryCategory::kParameter, "p").value();
  for (bool host : {false, true}) {
    INFO((host ? "host tier" : "device tier"));
    std::unique_ptr<StateTier> tier;
    if (host) {
      tier = HostOptimizerSlice::Create(*device, StateTier::Rule::kSgd, true, DType::kF32, kN,
                                        "host")
                 .value();
    } else {
      tier = DeviceOptimizerSlice::Create(*device, *stream, StateTier::Rule::kSgd, true,
                                          DType::kF32, kN, "dev",
                                          static_cast<float*>(params.data()))
                 .value();
    }
    REQUIRE(tier->WriteState(0, 0, kN, p0.data()).ok());
    auto scratch = device->AllocatePinned(std::max<int64_t>(tier->scratch_bytes(), 1),
                                          MemoryCategory::kWorkspace, "scratch")
                       .value();
    StateTier::Segment halves[2] = {{0, kN / 2}, {kN / 2, kN - kN / 2}};
    for (StateTier::Segment& h : halves) h.sgd.lr = 0.05f;
    halves[0].sgd.momentum = 0.9f;
    for (int step = 0; step < 2; ++step) {
      if (host) {
        REQUIRE(static_cast<HostOptimizerSlice&>(*tier).StageGradients(*stream, grads.data()).ok());
      }
      StateTier::UpdateArgs args;
      args.segments = halves;
      args.grads = grads.data();
      args.params = params.data();
      args.scratch = scratch.data();
      REQUIRE(tier->Update(*stream, args).ok());
      REQUIRE(tier->Commit(*stream, params.data()).ok());
    }
    std::vector<float> p(kN), m(kN);
    REQUIRE(tier->ReadState(0, 0, kN, p.data()).ok());
    REQUIRE(tier->ReadState(1, 0, kN, m.data()).ok());
    for (int64_t i = 0; i < kN; ++i) {
      const double gi = g[i];
      const bool momentum = i < kN / 2;
      // Two steps: the buffer is g, then 0.9 g + g.
      const double want = p0[i] - 0.05 * gi - 0.05 * (momentum ? 1.9 * gi : gi);
      CHECK(p[i] == Approx(want).margin(1e-6));
      CHECK(m[i] == Approx(momentum ? 1.9 * gi : 0.0).margin(1e-7));
    }
  }
}

}  // namespace
}  // namespace memwall
