// Wrapping an existing model's optimizer step with memwall's ShardedOptimizer.
//
// The model below is a plain two-layer MLP (tanh hidden layer, squared-error
// loss) written with loops over float pointers: it knows nothing of memwall
// except that it reads its weights from, and adds its gradients into, the
// pointers the optimizer hands out. Each MPI rank trains on its own samples
// of a synthetic regression task (data parallelism); the ZeRO stage comes
// from a DeepSpeed-style config.
//
//   mpirun -np 2 bazel-bin/examples/mlp_zero --stage 3 --steps 200
//   (tools/mpirun.sh 2 ... adds the settings containers need)
//
// It prints the loss (averaged over ranks) as it falls and, at the end, each
// rank's device memory by category.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/units.h"
#include "sharding/sharded_optimizer.h"

namespace {

// ---- The user's model: no memwall types below this line until main(). ----

constexpr int kIn = 16, kHidden = 64, kOut = 4, kBatch = 32;

struct Weights {
  const float *w1, *b1, *w2, *b2;
};
struct Grads {
  float *w1, *b1, *w2, *b2;
};

// The task: y = sin(x A) for a fixed A.
void Sample(long index, float* x, float* y) {
  unsigned state = static_cast<unsigned>(index) * 2654435761u + 12345u;
  for (int i = 0; i < kIn; ++i) {
    state = state * 1664525u + 1013904223u;
    x[i] = (state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  for (int o = 0; o < kOut; ++o) {
    float dot = 0;
    for (int i = 0; i < kIn; ++i) dot += x[i] * std::cos(0.7f * i + 1.3f * o);
    y[o] = std::sin(dot);
  }
}

// Layer 1: h = tanh(x W1 + b1).
void Layer1Forward(const Weights& p, const float* x, float* h) {
  for (int j = 0; j < kHidden; ++j) {
    float s = p.b1[j];
    for (int i = 0; i < kIn; ++i) s += x[i] * p.w1[i * kHidden + j];
    h[j] = std::tanh(s);
  }
}

// Layer 2: out = h W2 + b2; returns the squared error, writes d(loss)/d(out).
float Layer2Forward(const Weights& p, const float* h, const float* y, float* dout) {
  float loss = 0;
  for (int o = 0; o < kOut; ++o) {
    float s = p.b2[o];
    for (int j = 0; j < kHidden; ++j) s += h[j] * p.w2[j * kOut + o];
    const float e = s - y[o];
    loss += 0.5f * e * e / kBatch;
    dout[o] = e / kBatch;
  }
  return loss;
}

void Layer2Backward(const Weights& p, const float* h, const float* dout, Grads& g, float* dh) {
  for (int j = 0; j < kHidden; ++j) {
    float s = 0;
    for (int o = 0; o < kOut; ++o) {
      g.w2[j * kOut + o] += h[j] * dout[o];
      s += p.w2[j * kOut + o] * dout[o];
    }
    dh[j] = s;
  }
  for (int o = 0; o < kOut; ++o) g.b2[o] += dout[o];
}

void Layer1Backward(const float* x, const float* h, const float* dh, Grads& g) {
  for (int j = 0; j < kHidden; ++j) {
    const float dz = dh[j] * (1.0f - h[j] * h[j]);
    for (int i = 0; i < kIn; ++i) g.w1[i * kHidden + j] += x[i] * dz;
    g.b1[j] += dz;
  }
}

std::vector<float> InitialValues(int n, int fan_in, unsigned seed) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = ((seed >> 8) * (2.0f / 16777216.0f) - 1.0f) / std::sqrt(float(fan_in));
  }
  return v;
}

// ---- Wiring it to memwall. ----

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "mlp_zero: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int stage = 2, steps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--stage") stage = std::atoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: mlp_zero [--stage 0..3] [--steps N]\n");
      return 2;
    }
  }
  auto comm = memwall::MpiCommunicator::Create();
  if (!comm.ok()) return Fail(comm.status());
  const int rank = (*comm)->rank(), ranks = (*comm)->world_size();
  // One flat group per layer: layer 1 has kIn*kHidden + kHidden elements.
  auto config = memwall::ParseConfig(absl::StrCat(R"({
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0001}},
      "gradient_clipping": 1.0,
      "zero_optimization": {"stage": )", stage, R"(, "overlap_comm": true,
                            "reduce_bucket_size": )", kIn * kHidden + kHidden, "}}"));
  if (!config.ok()) return Fail(config.status());
  auto device = memwall::CreateDevice({memwall::Backend::kHost, rank, 64 * memwall::kMiB});
  if (!device.ok()) return Fail(device.status());
  auto created = memwall::ShardedOptimizer::Create(*config, **device, **comm);
  if (!created.ok()) return Fail(created.status());
  memwall::ShardedOptimizer& opt = **created;

  const std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"layer1.weight", {kIn, kHidden}}, {"layer1.bias", {kHidden}},
      {"layer2.weight", {kHidden, kOut}}, {"layer2.bias", {kOut}}};
  unsigned seed = 1;
  for (const auto& [name, shape] : params) {
    const int n = static_cast<int>(memwall::NumElements(shape));
    const std::vector<float> init = name.find("bias") != std::string::npos
                                        ? std::vector<float>(n, 0.0f)
                                        : InitialValues(n, static_cast<int>(shape[0]), seed++);
    if (auto s = opt.AddParameter(name, shape, init); !s.ok()) return Fail(s);
  }
  if (auto s = opt.Finalize(); !s.ok()) return Fail(s);
  const int layer1 = opt.GroupOf("layer1.weight").value(), layer2 = opt.GroupOf("layer2.weight").value();

  auto weights = [&]() {
    auto f = [&](const char* name) { return static_cast<const float*>(opt.Parameter(name)->data); };
    return Weights{f("layer1.weight"), f("layer1.bias"), f("layer2.weight"), f("layer2.bias")};
  };
  std::vector<float> x(kBatch * kIn), y(kBatch * kOut), h(kBatch * kHidden), dout(kBatch * kOut),
      dh(kBatch * kHidden);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      Sample(long(step) * ranks * kBatch + rank * kBatch + b, &x[b * kIn], &y[b * kOut]);
    }
    // Forward: stage 3 gathers each layer's group just before it runs.
    float loss = 0;
    auto check = [](const absl::Status& s) {
      if (!s.ok()) std::exit(Fail(s));
    };
    check(opt.GatherParameters(layer1));
    if (layer2 != layer1) check(opt.GatherParameters(layer2));
    const Weights w = weights();
    for (int b = 0; b < kBatch; ++b) Layer1Forward(w, &x[b * kIn], &h[b * kHidden]);
    for (int b = 0; b < kBatch; ++b) {
      loss += Layer2Forward(w, &h[b * kHidden], &y[b * kOut], &dout[b * kOut]);
    }
    // Backward in reverse, each group's gradients reduced right after.
    check(opt.AcquireGradients(layer2));
    auto grad = [&](const char* name) { return static_cast<float*>(opt.Gradient(name)->data); };
    Grads g{nullptr, nullptr, grad("layer2.weight"), grad("layer2.bias")};
    for (int b = 0; b < kBatch; ++b) {
      Layer2Backward(w, &h[b * kHidden], &dout[b * kOut], g, &dh[b * kHidden]);
    }
    if (layer2 != layer1) {
      check(opt.ReduceGradients(layer2));
      check(opt.ReleaseParameters(layer2));
      check(opt.AcquireGradients(layer1));
    }
    g.w1 = grad("layer1.weight");
    g.b1 = grad("layer1.bias");
    for (int b = 0; b < kBatch; ++b) Layer1Backward(&x[b * kIn], &h[b * kHidden], &dh[b * kHidden], g);
    check(opt.ReduceGradients(layer1));
    check(opt.ReleaseParameters(layer1));
    auto result = opt.Step();
    if (!result.ok()) return Fail(result.status());

    float mean = loss;
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, (*comm)->comm());
    mean /= ranks;
    if (step == 0) first_loss = mean;
    last_loss = mean;
    if (rank == 0 && (step % 20 == 0 || step == steps - 1)) {
      std::printf("step %4d  loss %.5f  grad norm %.4f\n", step, mean, result->grad_norm);
    }
  }

  const memwall::AllocatorStats s = (*device)->allocator().stats();
  const long long mine[4] = {
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kParameter)].current),
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kGradient)].current),
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kOptimizerState)].current),
      static_cast<long long>(s.requested.peak)};
  std::vector<long long> all(4 * ranks);
  MPI_Gather(mine, 4, MPI_LONG_LONG, all.data(), 4, MPI_LONG_LONG, 0, (*comm)->comm());
  if (rank == 0) {
    std::printf("\nZeRO stage %d on %d rank%s: loss %.5f -> %.5f\n", stage, ranks,
                ranks == 1 ? "" : "s", first_loss, last_loss);
    std::printf("per-rank device memory at the end (allocator, bytes):\n");
    std::printf("  rank  parameter   gradient  optimizer_state  peak (all)\n");
    for (int r = 0; r < ranks; ++r) {
      std::printf("  %4d %10lld %10lld %16lld %11lld\n", r, all[4 * r], all[4 * r + 1],
                  all[4 * r + 2], all[4 * r + 3]);
    }
  }
  return last_loss < first_loss ? 0 : 1;
}
