// The engine facade on real MPI ranks (mpirun -np 1, 2, 4): a caller-owned
// model trained through Engine equals the same arithmetic driven by the
// Trainer bit for bit, at every stage, in f32 and bf16, with accumulation;
// explicit parameter groups are the flat groups; checkpoints of a
// caller-owned model resume bit for bit at another stage; stage "auto" is
// resolved for layer models and refused where it cannot be; an unresolved
// stage never reaches training; out-of-memory errors say what would fit.
#include "engine/engine.h"

#include <sched.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/auto_strategy.h"
#include "kernels/elementwise.h"
#include "models/spec.h"
#include "runtime/status.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

using testing::World;

// ---- The model: y = tanh(x W + b) twice, then half the squared error. ----
// Plain loops, shared by the caller-owned model and the Layer the Trainer
// drives, so both run the same arithmetic in the same order.

constexpr int kRows = 6;
const std::vector<int64_t> kWidths = {5, 7, 3};

void DenseForward(const float* w, const float* b, const float* x, float* y, int rows, int in,
                  int out) {
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      float s = b[o];
      for (int i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + o];
      y[r * out + o] = std::tanh(s);
    }
  }
}

// Adds the parameter gradients into dw, db; writes dx (may be null).
void DenseBackward(const float* w, const float* x, const float* y, const float* dy, float* dw,
                   float* db, float* dx, int rows, int in, int out) {
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      const float dz = dy[r * out + o] * (1.0f - y[r * out + o] * y[r * out + o]);
      for (int i = 0; i < in; ++i) dw[i * out + o] += x[r * in + i] * dz;
      db[o] += dz;
    }
    if (dx == nullptr) continue;
    for (int i = 0; i < in; ++i) {
      float s = 0;
      for (int o = 0; o < out; ++o) {
        s += w[i * out + o] * dy[r * out + o] * (1.0f - y[r * out + o] * y[r * out + o]);
      }
      dx[r * in + i] = s;
    }
  }
}

float HalfSquaredError(const float* y, const float* t, float* dy, int n) {
  float loss = 0;
  for (int j = 0; j < n; ++j) {
    const float e = y[j] - t[j];
    loss += 0.5f * e * e / kRows;
    dy[j] = e / kRows;
  }
  return loss;
}

std::vector<float> Rows(int rank, int position, int width, float phase) {
  std::vector<float> v(kRows * width);
  for (int j = 0; j < kRows * width; ++j) {
    v[j] = std::sin(0.37f * (100 * position + 17 * rank + j) + phase);
  }
  return v;
}

std::vector<float> Initial(int64_t n, int layer, bool bias) {
  std::vector<float> v(n);
  for (int64_t j = 0; j < n; ++j) v[j] = bias ? 0.01f * j : 0.3f * std::cos(1.3f * j + layer);
  return v;
}

// The model as a memwall Layer: activations kept in f32 (so both paths
// read exactly the values they computed), parameters and gradients through
// the context's f32 forms.
class TanhDense final : public Layer {
 public:
  TanhDense(std::string name, int in, int out) : Layer(std::move(name)), in_(in), out_(out) {}
  std::vector<ParameterDecl> Parameters() const override {
    return {{"weight", {in_, out_}}, {"bias", {out_}}};
  }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& x) const override {
    return std::vector<int64_t>{x[0], out_};
  }
  int64_t ActivationBytes(const std::vector<int64_t>& x, DType) const override {
    return 4 * x[0] * out_;
  }
  double ForwardFlops(const std::vector<int64_t>& x) const override { return 2.0 * x[0] * in_ * out_; }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& input) override {
    MW_ASSIGN_OR_RETURN(Tensor y, ctx.Activation({input.shape()[0], out_}, DType::kF32));
    MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
    MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("bias"));
    if (ctx.computes()) {
      DenseForward(w, b, input.data_as<const float>(), y.data_as<float>(), kRows, in_, out_);
    }
    return y;
  }
  // The engine keeps the output for the next layer, not for this one:
  // backward recomputes it (the same loops give the same values).
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& input,
                                  const Tensor& grad_output) override {
    MW_ASSIGN_OR_RETURN(Tensor dx, ctx.InputGradient(input.shape()));
    MW_ASSIGN_OR_RETURN(Tensor y, ctx.Workspace({input.shape()[0], out_}));
    MW_ASSIGN_OR_RETURN(const float* w, ctx.Param("weight"));
    MW_ASSIGN_OR_RETURN(const float* b, ctx.Param("bias"));
    MW_ASSIGN_OR_RETURN(float* dw, ctx.Grad("weight"));
    MW_ASSIGN_OR_RETURN(float* db, ctx.Grad("bias"));
    if (ctx.computes()) {
      DenseForward(w, b, input.data_as<const float>(), y.data_as<float>(), kRows, in_, out_);
      DenseBackward(w, input.data_as<const float>(), y.data_as<const float>(),
                    grad_output.data_as<const float>(), dw, db, dx.data_as<float>(), kRows, in_,
                    out_);
    }
    return dx;
  }

 private:
  const int64_t in_, out_;
};

class HalfSquaredErrorLoss final : public LossFunction {
 public:
  absl::StatusOr<float> Compute(LayerContext& ctx, const Tensor& output, const Tensor& target,
                                Tensor& grad_output) override {
    if (!ctx.computes()) return 0.0f;
    return HalfSquaredError(output.data_as<const float>(), target.data_as<const float>(),
                            grad_output.data_as<float>(), static_cast<int>(output.numel()));
  }
};

std::string LayerName(int l) { return absl::StrCat("dense", l); }

Model LayerModel() {
  Model m;
  for (size_t l = 0; l + 1 < kWidths.size(); ++l) {
    m.layers.push_back(std::make_unique<TanhDense>(LayerName(l), kWidths[l], kWidths[l + 1]));
  }
  m.loss = std::make_unique<HalfSquaredErrorLoss>();
  m.input = {kRows, kWidths.front()};
  m.target = {kRows, kWidths.back()};
  return m;
}

std::vector<ParameterGroup> CallerGroups() {
  std::vector<ParameterGroup> groups;
  for (size_t l = 0; l + 1 < kWidths.size(); ++l) {
    const int64_t in = kWidths[l], out = kWidths[l + 1];
    groups.push_back({LayerName(l),
                      {{LayerName(l) + ".weight", {in, out}, Initial(in * out, l, false)},
                       {LayerName(l) + ".bias", {out}, Initial(out, l, true)}}});
  }
  return groups;
}

Config ConfigFor(int stage, bool bf16, int accumulation) {
  Config c;
  c.zero.stage = stage;
  c.zero.overlap_comm = stage > 0;
  c.zero.reduce_bucket_size = 1;  // a group per layer on the Trainer path
  c.bf16 = bf16;
  c.gradient_accumulation_steps = accumulation;
  c.gradient_clipping = 0.5f;
  c.optimizer.lr = 0.05f;
  c.optimizer.weight_decay = 0.01f;
  c.train_micro_batch_size_per_gpu = kRows;
  return c;
}

EngineOptions Options(Backend backend = Backend::kHost) {
  EngineOptions o;
  o.backend = backend;
  o.world = &World();
  o.device_bytes = 64 * kMiB;
  return o;
}

// Backward of layer l into the gradients: an f32 model adds straight into
// the gradient views (accumulating over micro-batches where they hold the
// previous ones), a bf16 one computes f32 gradients and adds them once
// (AddGradient), as memwall's own LayerContext does.
void CallerBackward(ModelStates& states, int l, const std::vector<float>& w,
                    const std::vector<float>& x, const std::vector<float>& y,
                    const std::vector<float>& dy, std::vector<float>& dx) {
  const int in = kWidths[l], out = kWidths[l + 1];
  const std::string weight = LayerName(l) + ".weight", bias = LayerName(l) + ".bias";
  float* dx_or_null = l > 0 ? dx.data() : nullptr;
  if (states.param_dtype() == DType::kF32) {
    float* dw = static_cast<float*>(states.Gradient(weight).value().data);
    float* db = static_cast<float*>(states.Gradient(bias).value().data);
    DenseBackward(w.data(), x.data(), y.data(), dy.data(), dw, db, dx_or_null, kRows, in, out);
    return;
  }
  std::vector<float> dw(in * out, 0.0f), db(out, 0.0f);
  DenseBackward(w.data(), x.data(), y.data(), dy.data(), dw.data(), db.data(), dx_or_null, kRows,
                in, out);
  REQUIRE(states.AddGradient(weight, dw).ok());
  REQUIRE(states.AddGradient(bias, db).ok());
}

// One step of the caller-owned model: per micro-batch, each group gathered
// before its forward, gradients acquired, added, reduced, and the group
// released after its backward; then the optimizer step. Returns the mean
// loss over the micro-batches (summed in double, as the Trainer does).
float CallerStep(Engine& engine, int step) {
  ModelStates& states = engine.states();
  const int layers = static_cast<int>(kWidths.size()) - 1;
  const int accumulation = engine.config().gradient_accumulation_steps;
  double loss = 0;
  for (int u = 0; u < accumulation; ++u) {
    const int position = step * accumulation + u;
    std::vector<std::vector<float>> acts = {Rows(World().rank(), position, kWidths[0], 0.0f)};
    std::vector<std::vector<float>> w(layers), b(layers);
    for (int l = 0; l < layers; ++l) {
      const int in = kWidths[l], out = kWidths[l + 1];
      REQUIRE(states.Gather(l).ok());
      w[l].resize(in * out);
      b[l].resize(out);
      REQUIRE(states.ReadParameter(LayerName(l) + ".weight", absl::MakeSpan(w[l])).ok());
      REQUIRE(states.ReadParameter(LayerName(l) + ".bias", absl::MakeSpan(b[l])).ok());
      acts.emplace_back(kRows * out);
      DenseForward(w[l].data(), b[l].data(), acts[l].data(), acts[l + 1].data(), kRows, in, out);
    }
    const std::vector<float> target = Rows(World().rank(), position, kWidths.back(), 1.0f);
    std::vector<float> dy(target.size());
    loss += HalfSquaredError(acts.back().data(), target.data(), dy.data(),
                             static_cast<int>(dy.size()));
    for (int l = layers - 1; l >= 0; --l) {
      REQUIRE(states.AcquireGradients(l).ok());
      std::vector<float> dx(kRows * kWidths[l]);
      CallerBackward(states, l, w[l], acts[l], acts[l + 1], dy, dx);
      REQUIRE(states.ReduceGradients(l).ok());
      REQUIRE(states.Release(l).ok());
      dy = std::move(dx);
    }
  }
  REQUIRE(engine.Step().ok());
  return static_cast<float>(loss / accumulation);
}

std::vector<Batch> TrainerBatches(Device& device, int step, int accumulation) {
  std::vector<Batch> batches;
  for (int u = 0; u < accumulation; ++u) {
    const int position = step * accumulation + u;
    Batch b;
    b.input = Tensor::FromHost(device, Rows(World().rank(), position, kWidths.front(), 0.0f),
                               {kRows, kWidths.front()}, MemoryCategory::kOther, "x")
                  .value();
    b.target = Tensor::FromHost(device, Rows(World().rank(), position, kWidths.back(), 1.0f),
                                {kRows, kWidths.back()}, MemoryCategory::kOther, "y")
                   .value();
    batches.push_back(std::move(b));
  }
  return batches;
}

// Every state of every group, gathered (collective).
std::vector<std::vector<float>> States(ModelStates& states) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < states.layout().groups.size(); ++g) {
    for (int s = 0; s < states.num_states(); ++s) {
      out.push_back(states.GatherState(static_cast<int>(g), s).value());
    }
  }
  return out;
}

// The layer model's initial values are drawn from the seed; the caller's
// are its own. Start both from the same: the caller's values into the
// Trainer's optimizer (SetState on the master weights sets the parameters).
void CopyInitialValues(ModelStates& from_caller, ModelStates& to) {
  const std::vector<std::vector<float>> states = States(from_caller);
  const int per_group = from_caller.num_states();
  for (size_t g = 0; g < to.layout().groups.size(); ++g) {
    REQUIRE(to.SetState(static_cast<int>(g), 0, states[g * per_group]).ok());
  }
}

TEST_CASE("a caller-owned model through the engine trains bit for bit like the Trainer path",
          "[engine][equivalence]") {
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool bf16 : {false, true}) {
      for (int accumulation : {1, 2}) {
        CAPTURE(stage, bf16, accumulation);
        const Config config = ConfigFor(stage, bf16, accumulation);
        auto caller = Engine::Create(Options(), config, CallerGroups()).value();
        auto layers =
            Engine::Create(Options(), config, [](int64_t) -> absl::StatusOr<Model> {
              return LayerModel();
            }).value();
        REQUIRE(layers->trainer() != nullptr);
        REQUIRE(caller->trainer() == nullptr);
        CopyInitialValues(caller->states(), layers->states());
        for (int step = 0; step < 3; ++step) {
          const float caller_loss = CallerStep(*caller, step);
          const std::vector<Batch> batches = TrainerBatches(layers->device(), step, accumulation);
          const Trainer::StepReport report = layers->TrainStep(batches).value();
          CHECK(report.loss == caller_loss);
        }
        CHECK(caller->steps() == 3);
        CHECK(layers->steps() == 3);
        CHECK(States(caller->states()) == States(layers->states()));
      }
    }
  }
}

TEST_CASE("explicit parameter groups are the flat groups, whatever the bucket size",
          "[engine][groups]") {
  Config config = ConfigFor(3, true, 1);
  config.zero.reduce_bucket_size = 500'000'000;  // would pack everything into one group
  auto engine = Engine::Create(Options(), config, CallerGroups()).value();
  const FlatLayout& layout = engine->states().layout();
  REQUIRE(layout.groups.size() == 2);
  CHECK(layout.groups[0].name == "dense0");
  CHECK(layout.groups[0].parameters == std::vector<int>{0, 1});
  CHECK(layout.groups[0].numel == 5 * 7 + 7);
  CHECK(layout.groups[1].name == "dense1");
  CHECK(layout.groups[1].numel == 7 * 3 + 3);

  // The f32 forms: bf16 storage read back widened exactly, and a
  // gradient added in f32 rounds once to bf16.
  ModelStates& states = engine->states();
  REQUIRE(states.Gather(1).ok());
  std::vector<float> bias(3);
  REQUIRE(states.ReadParameter("dense1.bias", absl::MakeSpan(bias)).ok());
  const std::vector<float> initial = Initial(3, 1, true);
  for (int j = 0; j < 3; ++j) CHECK(bias[j] == Bf16ToF32(F32ToBf16(initial[j])));
  std::vector<float> four(4);
  const absl::Status wrong = states.ReadParameter("dense1.bias", absl::MakeSpan(four));
  CHECK(wrong.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(wrong.message()) == "parameter 'dense1.bias': 4 f32 values for 3 elements");
  REQUIRE(states.AcquireGradients(1).ok());
  REQUIRE(states.AddGradient("dense1.bias", std::vector<float>{1.0f / 3, 2.0f, -0.1f}).ok());
  const ModelStates::View grad = states.Gradient("dense1.bias").value();
  CHECK(static_cast<const uint16_t*>(grad.data)[0] == F32ToBf16(1.0f / 3));
  CHECK(static_cast<const uint16_t*>(grad.data)[2] == F32ToBf16(-0.1f));
  REQUIRE(states.ReduceGradients(1).ok());
  REQUIRE(states.Release(1).ok());
  REQUIRE(states.AbortStep().ok());

  // Bad groups are named, and none of a refused group stays registered.
  auto empty = Engine::Create(Options(), config, {{"g", {}}});
  CHECK(std::string(empty.status().message()) == "AddParameterGroup('g'): the group has no parameters");
  std::vector<ParameterGroup> twice = CallerGroups();
  twice[1].name = "dense0";
  auto dup = Engine::Create(Options(), config, twice);
  CHECK(dup.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(dup.status().message()) == "AddParameterGroup('dense0'): a group of that name exists");
  std::vector<ParameterGroup> bad_values = CallerGroups();
  bad_values[0].parameters[1].values.pop_back();
  auto short_values = Engine::Create(Options(), config, bad_values);
  CHECK(std::string(short_values.status().message()) ==
        "parameter 'dense0.bias': 6 initial values for a shape of 7 elements");
}

TEST_CASE("a caller-owned model's checkpoint resumes bit for bit at another stage",
          "[engine][checkpoint]") {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/engine_ckpt_np",
                                       World().world_size());
  if (World().rank() == 0) std::filesystem::remove_all(dir);
  REQUIRE(World().Barrier().ok());
  auto straight = Engine::Create(Options(), ConfigFor(1, true, 1), CallerGroups()).value();
  for (int step = 0; step < 4; ++step) {
    CallerStep(*straight, step);
    if (step == 1) REQUIRE(straight->SaveCheckpoint(dir, 2).value() == dir + "/step-00000002");
  }
  auto resumed = Engine::Create(Options(), ConfigFor(3, true, 1), CallerGroups()).value();
  REQUIRE(resumed->LoadCheckpoint(dir).value().path == dir + "/step-00000002");
  CHECK(resumed->steps() == 2);
  for (int step = 2; step < 4; ++step) CallerStep(*resumed, step);
  CHECK(States(resumed->states()) == States(straight->states()));
  CHECK(resumed->states().steps_applied() == 4);

  // Another model's checkpoint is refused before anything changes.
  std::vector<ParameterGroup> other = CallerGroups();
  other[0].parameters[0].name = "dense0.kernel";
  auto stranger = Engine::Create(Options(), ConfigFor(3, true, 1), other).value();
  const std::vector<std::vector<float>> before = States(stranger->states());
  const absl::StatusOr<LoadedCheckpoint> refused = stranger->LoadCheckpoint(dir);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("no parameter 'dense0.kernel' (the checkpoint is of another model)"));
  CHECK(States(stranger->states()) == before);
}

TEST_CASE("what the engine cannot run is refused by name", "[engine][errors]") {
  Config automatic = ConfigFor(0, false, 1);
  automatic.zero.stage = kAutoStage;
  auto caller_auto = Engine::Create(Options(), automatic, CallerGroups());
  CHECK(caller_auto.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(caller_auto.status().message()) ==
        "zero_optimization.stage: \"auto\" dry-runs whole training steps, which needs a model of "
        "memwall layers; a caller-owned model names its stage (0..3)");
  Config recompute = ConfigFor(2, false, 1);
  recompute.activation_checkpointing.planner = "sqrt";
  CHECK(std::string(Engine::Create(Options(), recompute, CallerGroups()).status().message()) ==
        "activation_checkpointing: a caller-owned model runs its own forward and backward, so "
        "memwall cannot recompute it; expected planner \"none\", got \"sqrt\"");

  // Below the engine, the Trainer refuses an unresolved stage on every
  // rank rather than training without reductions.
  auto device = CreateDevice({Backend::kHost, World().rank(), 64 * kMiB}).value();
  Model m = LayerModel();
  auto trainer = Trainer::Create(std::move(m.layers), std::move(m.loss), automatic, *device,
                                 World(), 1);
  CHECK(trainer.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(trainer.status().message()) ==
        "ShardedOptimizer: zero_optimization.stage: expected 0, 1, 2 or 3, got -1 (\"auto\" "
        "unresolved: the engine resolves it)");

  auto layers = Engine::Create(Options(), ConfigFor(0, false, 1), [](int64_t) -> absl::StatusOr<Model> {
    return LayerModel();
  }).value();
  CHECK(layers->Step().status().code() == absl::StatusCode::kFailedPrecondition);
  auto caller = Engine::Create(Options(), ConfigFor(0, false, 1), CallerGroups()).value();
  CHECK(std::string(caller->TrainStep({}).status().message()) ==
        "TrainStep: this engine trains a caller-owned model; call Step() after its backward");
}

TEST_CASE("ranks that disagree on the run are refused, naming what differs", "[engine][errors]") {
  const int rank = World().rank(), ranks = World().world_size();
  EngineOptions o = Options();
  o.seed = rank == ranks - 1 ? 8 : 7;  // the last rank was started with another --seed
  o.model_description = "dense x2";
  auto seeds = Engine::Create(o, ConfigFor(2, false, 1), [](int64_t) -> absl::StatusOr<Model> {
    return LayerModel();
  });
  std::vector<ParameterGroup> groups = CallerGroups();
  if (rank == ranks - 1) groups[1].parameters[0].values[3] += 1.0f;  // other initial values
  o.seed = 7;
  o.data_description = rank == 0 ? "a.txt, 10 bytes" : "b.txt, 10 bytes";
  auto values = Engine::Create(o, ConfigFor(2, false, 1), groups);
  if (ranks == 1) {  // nothing to disagree with
    CHECK(seeds.ok());
    CHECK(values.ok());
    return;
  }
  CHECK(seeds.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(seeds.status().message()) ==
        absl::StrCat("the ranks disagree on the run's seed: every rank must start with the same "
                     "config, model, seed, data and schedule (rank ", rank, " of ", ranks,
                     " has seed ", rank == ranks - 1 ? 8 : 7, ")"));
  CHECK(values.status().code() == absl::StatusCode::kInvalidArgument);
  // A caller's model is named by what differs, not by a description it
  // never had.
  CHECK(std::string(values.status().message()) ==
        absl::StrCat("the ranks disagree on the run's model (its parameters' names, shapes or "
                     "initial values), data: every rank must start with the same config, model, "
                     "seed, data and schedule (rank ", rank, " of ", ranks, " has data '",
                     rank == 0 ? "a" : "b", ".txt, 10 bytes')"));
  // A loop whose steps differ would meet the others in other collectives.
  o.data_description = "a.txt, 10 bytes";
  o.schedule_description = rank == 0 ? "--steps 5" : "--steps 6";
  auto schedules = Engine::Create(o, ConfigFor(2, false, 1), CallerGroups());
  CHECK(std::string(schedules.status().message()) ==
        absl::StrCat("the ranks disagree on the run's schedule: every rank must start with the "
                     "same config, model, seed, data and schedule (rank ", rank, " of ", ranks,
                     " has schedule '--steps ", rank == 0 ? 5 : 6, "')"));
}

TEST_CASE("the CPU update's threads are the machine's cores shared by its ranks",
          "[engine][offload]") {
  // mpirun starts every rank of these tests on this machine.
  CHECK(World().RanksOnThisNode().value() == World().world_size());
  CHECK(CpuUpdateThreadBudget(16, 1) == 16);
  CHECK(CpuUpdateThreadBudget(16, 3) == 5);
  CHECK(CpuUpdateThreadBudget(2, 4) == 1);  // never none
  // On host the CPU computes backward too: the update keeps one thread
  // (MEMWALL_CPU_THREADS unset in tests), or the config's count.
  Config config = ConfigFor(2, false, 1);
  config.zero.offload_optimizer_ratio = 1.0f;
  const auto model = [](int64_t) -> absl::StatusOr<Model> { return LayerModel(); };
  auto engine = Engine::Create(Options(), config, model);
  REQUIRE(engine.ok());
  CHECK((*engine)->cpu_update_threads() == 1);
  CHECK((*engine)->config().zero.offload_cpu_threads == 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  const int cores = CPU_COUNT(&set);
  config.zero.offload_cpu_threads = cores;
  engine = Engine::Create(Options(), config, model);
  REQUIRE(engine.ok());
  CHECK((*engine)->cpu_update_threads() == cores);
  // More threads than cores only share them (and thousands abort the OpenMP
  // runtime under a memory limit): refused, naming the key.
  config.zero.offload_cpu_threads = 1024;
  engine = Engine::Create(Options(), config, model);
  CHECK(engine.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(engine.status().message()) ==
        absl::StrCat("zero_optimization.offload_optimizer.cpu_threads: expected at most this "
                     "process's ", cores, " cores (0: the cores shared by the ranks on the "
                     "machine), got 1024"));
}

TEST_CASE("stage auto resolves for a layer model, and out of memory says what fits",
          "[engine][auto]") {
  // A dry run on meta as rank 0 of 8: GPT-2 small at micro-batch 2 in 2 GiB,
  // where stage 0's model states alone (16 bytes x 124M) leave no room.
  EngineOptions o = Options(Backend::kMeta);
  o.simulate_ranks = 8;
  o.device_bytes = 2 * kGiB;
  o.plan_command = "memwall plan ...";
  if (World().world_size() != 1) return;  // meta runs as one process
  Config automatic;
  automatic.bf16 = true;
  automatic.train_micro_batch_size_per_gpu = 2;
  automatic.zero.stage = kAutoStage;
  auto engine = Engine::Create(o, automatic, SpecModel("gpt2-124m")).value();
  CHECK(engine->config().zero.stage >= 0);
  CHECK(engine->config().zero.stage <= 3);
  CHECK_THAT(engine->auto_choice(), Catch::StartsWith("stage "));
  // Ranked on the preset of its device memory, as `memwall plan --auto`
  // ranks: the same choice as naming that preset.
  REQUIRE(PresetForMemory(o.device_bytes) == "v100-32gb");
  EngineOptions named = o;
  named.hardware = "v100-32gb";
  CHECK(Engine::Create(named, automatic, SpecModel("gpt2-124m")).value()->auto_choice() ==
        engine->auto_choice());
  CHECK(engine->communicator().world_size() == 8);
  std::vector<Batch> batches =
      EmptyBatches(engine->device(), 1, engine->input_shape(), engine->target_shape()).value();
  REQUIRE(engine->TrainStep(batches).ok());

  // The same model at stage 0 does not fit: its model states alone
  // overflow, and the error says so, what would fit, and where the
  // reports of that moment are.
  Config zero0 = automatic;
  zero0.zero.stage = 0;
  o.oom_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/engine_oom");
  const absl::Status oom = Engine::Create(o, zero0, SpecModel("gpt2-124m")).status();
  CHECK(oom.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(oom.message()),
             Catch::StartsWith("out of memory on meta:0: cannot allocate 474.70 MiB") &&
                 Catch::Contains("It happened while allocating the model states. The auto "
                                 "strategy fits it with stage ") &&
                 Catch::Contains("; the config and full plan: memwall plan ...") &&
                 Catch::Contains("Memory reports of this moment: " + o.oom_dir + "/rank0/"));
  CHECK(std::filesystem::exists(o.oom_dir + "/rank0/profile.json"));
}

}  // namespace
}  // namespace memwall
