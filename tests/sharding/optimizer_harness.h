// The sharded optimizer tests' toy model and harness (shared by
// sharded_optimizer_test.cc and sharded_optimizer_offload_test.cc; see
// the former's comment for the model's exactness argument).
#ifndef MEMWALL_TESTS_SHARDING_OPTIMIZER_HARNESS_H_
#define MEMWALL_TESTS_SHARDING_OPTIMIZER_HARNESS_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/device.h"
#include "runtime/units.h"
#include "sharding/sharded_optimizer.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace zero_test {

using testing::World;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
};

inline const std::vector<Param> kModel = {
    {"embed", {37, 5}},   {"block0.w", {5, 7}}, {"block0.b", {7}},
    {"block1.w", {7, 9}}, {"block1.b", {9}},    {"head", {}},
};

inline std::vector<float> Initial(size_t p) {
  const int64_t n = NumElements(kModel[p].shape);
  std::vector<float> values(n);
  for (int64_t j = 0; j < n; ++j) values[j] = 0.1f * std::sin(0.3f * j + 1.7f * p);
  return values;
}

inline float Load(DType dtype, const void* data, int64_t j) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[j];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[j]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[j]);
  }
  return 0;
}

inline float Round(DType dtype, float x) {
  switch (dtype) {
    case DType::kF32:
      return x;
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(x));
    case DType::kF16:
      return F16ToF32(F32ToF16(x));
  }
  return x;
}

inline void Store(DType dtype, void* data, int64_t j, float x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[j] = x;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[j] = F32ToBf16(x);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[j] = F32ToF16(x);
      break;
  }
}

// The model's gradient for element j of parameter p on rank r, step k,
// micro-batch u, given the parameter's current value w: a multiple of 2^-12
// in (-1, 1), times the loss scale.
inline float ModelGradient(size_t p, int64_t j, int r, int k, int u, float w, float loss_scale) {
  const float x = 0.6f * std::sin(0.37f * j + 1.3f * r + 0.7f * k + 0.11f * u + 2.1f * p) +
                  0.3f * std::tanh(4.0f * w);
  return std::floor(x * 4096.0f) / 4096.0f * loss_scale;
}

inline ShardingOptions Options(int stage, DType dtype, int accumulation, float clipping,
                        bool overlap = false) {
  ShardingOptions o;
  o.zero.stage = stage;
  // Small groups: several per model, most with padding.
  o.zero.reduce_bucket_size = 64;
  o.zero.overlap_comm = overlap;
  o.fp16 = dtype == DType::kF16;
  o.bf16 = dtype == DType::kBF16;
  o.loss_scale.initial_scale_power = 8;
  o.loss_scale.hysteresis = 1;
  o.gradient_accumulation_steps = accumulation;
  o.gradient_clipping = clipping;
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.01f;
  return o;
}

struct Run {
  std::unique_ptr<Device> device;
  std::unique_ptr<ShardedOptimizer> opt;
};

inline Run Start(const ShardingOptions& options, int64_t pinned = 64 * kMiB) {
  Run run;
  DeviceOptions device{Backend::kHost, 0, 256 * kMiB};
  device.pinned_capacity_bytes = pinned;
  run.device = CreateDevice(device).value();
  auto opt = ShardedOptimizer::Create(options, *run.device, World());
  REQUIRE(opt.ok());
  run.opt = std::move(opt).value();
  for (size_t p = 0; p < kModel.size(); ++p) {
    REQUIRE(run.opt->AddParameter(kModel[p].name, kModel[p].shape, Initial(p)).ok());
  }
  REQUIRE(run.opt->Finalize().ok());
  return run;
}

// One training step as a driver runs it: for each micro-batch, a forward
// pass over the groups (gather, read, release) and a backward pass in
// reverse (gather, acquire, add gradients, reduce, release); then Step().
// `multiplier` (a power of two, so values stay exact) scales the step's
// gradients, to make a step clip or not.
inline void MicroBatches(ShardedOptimizer& opt, int k, float inject_inf = 0, float multiplier = 1) {
  const int r = World().rank();
  const FlatLayout& layout = opt.layout();
  const int groups = static_cast<int>(layout.groups.size());
  for (int u = 0; u < opt.config().gradient_accumulation_steps; ++u) {
    for (int g = 0; g < groups; ++g) {
      REQUIRE(opt.GatherParameters(g).ok());
      for (int p : layout.groups[g].parameters) REQUIRE(opt.Parameter(kModel[p].name).ok());
      REQUIRE(opt.ReleaseParameters(g).ok());
    }
    for (int g = groups - 1; g >= 0; --g) {
      REQUIRE(opt.GatherParameters(g).ok());
      REQUIRE(opt.AcquireGradients(g).ok());
      for (int p : layout.groups[g].parameters) {
        auto w = opt.Parameter(kModel[p].name).value();
        auto grad = opt.Gradient(kModel[p].name).value();
        for (int64_t j = 0; j < grad.numel; ++j) {
          const float value =
              multiplier * ModelGradient(p, j, r, k, u, Load(w.dtype, w.data, j), opt.loss_scale());
          Store(grad.dtype, grad.data, j, Load(grad.dtype, grad.data, j) + value);
        }
        if (inject_inf != 0 && p == 1) Store(grad.dtype, grad.data, 3, inject_inf);
      }
      REQUIRE(opt.ReduceGradients(g).ok());
      REQUIRE(opt.ReleaseParameters(g).ok());
    }
  }
}

inline ShardedOptimizer::StepResult TrainStep(ShardedOptimizer& opt, int k, float inject_inf = 0) {
  MicroBatches(opt, k, inject_inf);
  auto result = opt.Step();
  REQUIRE(result.ok());
  return *result;
}

// The unsharded reference: one process plays all ranks with plain loops,
// in the order stage 0 defines (accumulate per rank, then reduce).
struct Reference {
  std::vector<std::vector<float>> master, low, m, v;
  float loss_scale;
  int64_t steps = 0;

  explicit Reference(const ShardingOptions& o) {
    loss_scale = o.fp16 ? std::ldexp(1.0f, o.loss_scale.initial_scale_power) : 1.0f;
    for (size_t p = 0; p < kModel.size(); ++p) {
      master.push_back(Initial(p));
      low.push_back(master.back());
      for (float& x : low.back()) x = Round(o.param_dtype(), x);
      m.emplace_back(master.back().size(), 0.0f);
      v.emplace_back(master.back().size(), 0.0f);
    }
  }

  void Step(const ShardingOptions& o, int k, int ranks) {
    const DType dt = o.param_dtype();
    std::vector<std::vector<float>> reduced;
    double squares = 0;
    for (size_t p = 0; p < kModel.size(); ++p) {
      std::vector<float> sum(low[p].size(), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        for (size_t j = 0; j < sum.size(); ++j) {
          float acc = 0.0f;
          for (int u = 0; u < o.gradient_accumulation_steps; ++u) {
            acc = Round(dt, acc + ModelGradient(p, j, r, k, u, low[p][j], loss_scale));
          }
          sum[j] += acc;
        }
      }
      for (float& x : sum) {
        x = Round(dt, x);
        squares += double(x) * x;
      }
      reduced.push_back(sum);
    }
    const double unscale = 1.0 / (double(ranks) * o.gradient_accumulation_steps * loss_scale);
    const double norm = std::sqrt(squares) * unscale;
    double coefficient = 1.0;
    if (o.gradient_clipping > 0 && norm > o.gradient_clipping) {
      coefficient = o.gradient_clipping / (norm + 1e-6);
    }
    kernels::AdamParams adam;
    adam.lr = o.optimizer.lr;
    adam.weight_decay = o.optimizer.weight_decay;
    adam.adamw = o.optimizer.adamw;
    adam.step = ++steps;
    adam.grad_scale = static_cast<float>(unscale * coefficient);
    const kernels::AdamConstants c = kernels::MakeAdamConstants(adam);
    for (size_t p = 0; p < kModel.size(); ++p) {
      for (size_t j = 0; j < low[p].size(); ++j) {
        kernels::AdamElement(c, master[p][j], reduced[p][j], m[p][j], v[p][j]);
        low[p][j] = Round(dt, master[p][j]);
      }
    }
  }
};

inline const char* Name(DType dtype) { return DTypeName(dtype); }

// Everything a run ends with, for bitwise comparisons: each parameter's
// master weights and its parameter view's bytes.
inline std::vector<float> Finish(ShardedOptimizer& opt) {
  std::vector<float> all;
  for (const Param& p : kModel) {
    std::vector<float> w(NumElements(p.shape));
    REQUIRE(opt.MasterWeights(p.name, absl::MakeSpan(w)).ok());
    all.insert(all.end(), w.begin(), w.end());
    const int g = opt.GroupOf(p.name).value();
    REQUIRE(opt.GatherParameters(g).ok());
    const auto view = opt.Parameter(p.name).value();
    for (int64_t j = 0; j < view.numel; ++j) all.push_back(Load(view.dtype, view.data, j));
    REQUIRE(opt.ReleaseParameters(g).ok());
  }
  return all;
}

}  // namespace zero_test
}  // namespace memwall

#endif  // MEMWALL_TESTS_SHARDING_OPTIMIZER_HARNESS_H_
