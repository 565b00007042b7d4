// Wrapping an existing model's optimizer step with memwall's engine
// (engine/engine.h).
//
// The model below is a plain two-layer MLP (tanh hidden layer, squared-error
// loss) written with loops over float pointers: it knows nothing of memwall
// except that it reads its weights from, and adds its gradients into, the
// pointers the engine's sharded optimizer hands out. The engine starts the
// MPI ranks and the device, registers each layer as one unit, and steps. Each MPI rank trains on its own samples
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
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "runtime/units.h"

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

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "mlp_zero: %s\n", status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) Fail(value.status());
  return std::move(value).value();
}
void Check(const absl::Status& status) {
  if (!status.ok()) Fail(status);
}

// Each layer is one unit: one flat group that gathers, reduces and
// releases together.
memwall::ParameterGroup Unit(const std::string& layer, int in, int out, unsigned seed) {
  return {layer,
          {{layer + ".weight", {in, out}, InitialValues(in * out, in, seed)},
           {layer + ".bias", {out}, std::vector<float>(out, 0.0f)}}};
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
  const memwall::Config config = Check(memwall::ParseConfig(absl::StrCat(R"({
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0001}},
      "gradient_clipping": 1.0,
      "zero_optimization": {"stage": )", stage, R"(, "overlap_comm": true}})")));
  memwall::EngineOptions options;  // host backend, this process's MPI rank
  options.device_bytes = 64 * memwall::kMiB;
  const std::unique_ptr<memwall::Engine> engine = Check(memwall::Engine::Create(
      options, config, {Unit("layer1", kIn, kHidden, 1), Unit("layer2", kHidden, kOut, 2)}));
  memwall::ModelStates& states = engine->states();
  const int rank = engine->communicator().rank(), ranks = engine->communicator().world_size();
  auto param = [&](const char* name) { return static_cast<const float*>(Check(states.Parameter(name)).data); };
  auto grad = [&](const char* name) { return static_cast<float*>(Check(states.Gradient(name)).data); };

  std::vector<float> x(kBatch * kIn), y(kBatch * kOut), h(kBatch * kHidden), dout(kBatch * kOut),
      dh(kBatch * kHidden);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      Sample(long(step) * ranks * kBatch + rank * kBatch + b, &x[b * kIn], &y[b * kOut]);
    }
    // Forward: stage 3 gathers each unit just before it runs (else no-ops).
    Check(states.Gather(0));
    Check(states.Gather(1));
    const Weights w{param("layer1.weight"), param("layer1.bias"), param("layer2.weight"),
                    param("layer2.bias")};
    float loss = 0;
    for (int b = 0; b < kBatch; ++b) Layer1Forward(w, &x[b * kIn], &h[b * kHidden]);
    for (int b = 0; b < kBatch; ++b) {
      loss += Layer2Forward(w, &h[b * kHidden], &y[b * kOut], &dout[b * kOut]);
    }
    // Backward in reverse, each unit's gradients reduced right after it.
    Check(states.AcquireGradients(1));
    Grads g{nullptr, nullptr, grad("layer2.weight"), grad("layer2.bias")};
    for (int b = 0; b < kBatch; ++b) {
      Layer2Backward(w, &h[b * kHidden], &dout[b * kOut], g, &dh[b * kHidden]);
    }
    Check(states.ReduceGradients(1));
    Check(states.Release(1));
    Check(states.AcquireGradients(0));
    g.w1 = grad("layer1.weight");
    g.b1 = grad("layer1.bias");
    for (int b = 0; b < kBatch; ++b) Layer1Backward(&x[b * kIn], &h[b * kHidden], &dh[b * kHidden], g);
    Check(states.ReduceGradients(0));
    Check(states.Release(0));
    const memwall::StepResult result = Check(engine->Step());

    float mean = loss;
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, engine->world().comm());
    mean /= ranks;
    if (step == 0) first_loss = mean;
    last_loss = mean;
    if (rank == 0 && (step % 20 == 0 || step == steps - 1)) {
      std::printf("step %4d  loss %.5f  grad norm %.4f\n", step, mean, result.grad_norm);
    }
  }

  const memwall::AllocatorStats s = engine->device().allocator().stats();
  const long long mine[4] = {
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kParameter)].current),
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kGradient)].current),
      static_cast<long long>(s.by_category[int(memwall::MemoryCategory::kOptimizerState)].current),
      static_cast<long long>(s.requested.peak)};
  std::vector<long long> all(4 * ranks);
  MPI_Gather(mine, 4, MPI_LONG_LONG, all.data(), 4, MPI_LONG_LONG, 0, engine->world().comm());
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
