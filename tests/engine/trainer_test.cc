// The training step on real MPI ranks (mpirun -np 1, 2, 4): every ZeRO
// stage, with and without overlap, tracks a single-process run over the
// whole global batch; activations are accounted exactly; the loss falls;
// meta runs the same schedule without bytes.
//
// Tolerance: ranks split the batch's rows, so GEMM and gradient sums add in
// another order than the single-process run; f32 rounding then differs by a
// few ulp per step. Losses must agree to 1e-5 relative and weights to 2e-4
// absolute after 10 Adam steps (lr 1e-2: an ulp-level gradient difference
// moves a weight by far less than lr per step).
#include "engine/trainer.h"

#include <mpi.h>

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "checkpointing/planner.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"
#include "tests/support/gpt_run.h"
#include "tests/support/mpi_world.h"
#include "tests/support/owner_peaks.h"

namespace memwall {
namespace {

using testing::World;

constexpr int kIn = 16, kOut = 4, kRowsPerRank = 8;
const std::vector<int64_t> kWidths = {kIn, 32, 32, kOut};

// Rows [first, first + rows) of the synthetic task y = sin(x A).
Batch MakeBatch(Device& device, int64_t first, int64_t rows, int step) {
  Batch b;
  b.input = Tensor::Empty(device, DType::kF32, {rows, kIn}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(device, DType::kF32, {rows, kOut}, MemoryCategory::kOther, "data").value();
  if (!device.holds_bytes()) return b;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sample = (first + r) + 1000 * step;
    float* x = b.input.data_as<float>() + r * kIn;
    for (int i = 0; i < kIn; ++i) x[i] = std::sin(0.37f * sample + 1.1f * i);
    for (int o = 0; o < kOut; ++o) {
      float dot = 0;
      for (int i = 0; i < kIn; ++i) dot += x[i] * std::cos(0.7f * i + 1.3f * o);
      b.target.data_as<float>()[r * kOut + o] = std::sin(dot);
    }
  }
  return b;
}

ShardingOptions Options(int stage, bool overlap) {
  ShardingOptions o;
  o.zero.stage = stage;
  o.zero.overlap_comm = overlap;
  o.zero.reduce_bucket_size = 600;  // a few groups, each whole layers
  o.optimizer.lr = 1e-2f;
  o.gradient_clipping = 5.0f;
  return o;
}

struct Run {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> own_comm;
  std::unique_ptr<Trainer> trainer;
};

Run Start(const ShardingOptions& options, Communicator* comm, Backend backend = Backend::kHost) {
  Run run;
  run.device = CreateDevice({backend, 0, 256 * kMiB}).value();
  if (comm == nullptr) {
    run.own_comm = SimulatedCommunicator::Create(0, 1).value();
    comm = run.own_comm.get();
  }
  auto trainer = Trainer::Create(MakeMlp(kWidths), std::make_unique<MseLoss>(), options,
                                 *run.device, *comm, /*seed=*/7);
  REQUIRE(trainer.ok());
  run.trainer = std::move(trainer).value();
  return run;
}

std::vector<float> Weights(Trainer& t) {
  std::vector<float> all;
  for (const auto& layer : t.layers()) {
    for (const ParameterDecl& d : layer->Parameters()) {
      std::vector<float> w(NumElements(d.shape));
      REQUIRE(t.optimizer().MasterWeights(layer->name() + "." + d.name, absl::MakeSpan(w)).ok());
      all.insert(all.end(), w.begin(), w.end());
    }
  }
  return all;
}

TEST_CASE("every stage tracks the single-process run over the global batch", "[trainer]") {
  const int n = World().world_size(), r = World().rank();
  constexpr int kSteps = 10;
  // The reference: one process, every rank's rows in one batch, stage 0.
  Run reference = Start(Options(0, false), nullptr);
  std::vector<float> reference_losses;
  for (int k = 0; k < kSteps; ++k) {
    Batch b = MakeBatch(*reference.device, 0, kRowsPerRank * n, k);
    reference_losses.push_back(reference.trainer->TrainStep({&b, 1}).value().loss);
  }
  const std::vector<float> reference_weights = Weights(*reference.trainer);
  for (int i = 0; i < 8; ++i) {
    const int stage = i % 4;
    const bool overlap = i >= 4;
    INFO("stage " << stage << ", overlap " << overlap << ", " << n << " ranks");
    Run run = Start(Options(stage, overlap), &World());
    for (int k = 0; k < kSteps; ++k) {
      Batch b = MakeBatch(*run.device, r * kRowsPerRank, kRowsPerRank, k);
      auto report = run.trainer->TrainStep({&b, 1});
      REQUIRE(report.ok());
      float mean = report->loss;
      MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, World().comm());
      mean /= n;
      REQUIRE(std::fabs(mean - reference_losses[k]) <= 1e-5f * reference_losses[k]);
    }
    const std::vector<float> weights = Weights(*run.trainer);
    REQUIRE(weights.size() == reference_weights.size());
    for (size_t j = 0; j < weights.size(); ++j) {
      REQUIRE(std::fabs(weights[j] - reference_weights[j]) <= 2e-4f);
    }
  }
}

TEST_CASE("gpt-tiny with its tied head trains the same on every stage and rank count",
          "[trainer][gpt]") {
  constexpr int kGptSteps = 20;
  const int n = World().world_size(), r = World().rank();
  const GptConfig c = GptPreset("gpt-tiny").value();
  auto batch = [&](Device& device, int64_t first_seq, int64_t sequences, int step) {
    Batch b;
    b.input = Tensor::Empty(device, DType::kF32, {sequences, c.seq}, MemoryCategory::kOther, "data").value();
    b.target = Tensor::Empty(device, DType::kF32, {sequences * c.seq}, MemoryCategory::kOther, "data").value();
    for (int64_t i = 0; i < sequences * c.seq; ++i) {
      const int64_t t = (first_seq * c.seq + i) * 7 + step * 3;
      b.input.data_as<float>()[i] = float(t % c.vocab);
      b.target.data_as<float>()[i] = float((t + 5) % c.vocab);
    }
    return b;
  };
  auto start = [&](int stage, bool overlap, Communicator* comm, std::unique_ptr<Device>& device,
                   std::unique_ptr<Communicator>& own) {
    device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
    if (comm == nullptr) {
      own = SimulatedCommunicator::Create(0, 1).value();
      comm = own.get();
    }
    ShardingOptions o = Options(stage, overlap);
    o.zero.reduce_bucket_size = 60000;  // embedding, blocks, head in several groups
    return Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), o, *device,
                           *comm, 3)
        .value();
  };
  std::unique_ptr<Device> ref_device;
  std::unique_ptr<Communicator> ref_comm;
  auto reference = start(0, false, nullptr, ref_device, ref_comm);
  std::vector<float> losses;
  for (int k = 0; k < kGptSteps; ++k) {
    Batch b = batch(*ref_device, 0, 2 * n, k);
    losses.push_back(reference->TrainStep({&b, 1}).value().loss);
  }
  for (int i = 0; i < 8; ++i) {
    const int stage = i % 4;
    const bool overlap = i >= 4;
    INFO("stage " << stage << ", overlap " << overlap << ", " << n << " ranks");
    std::unique_ptr<Device> device;
    std::unique_ptr<Communicator> unused;
    auto trainer = start(stage, overlap, &World(), device, unused);
    REQUIRE(trainer->optimizer().layout().groups.size() >= 3);
    for (int k = 0; k < kGptSteps; ++k) {
      Batch b = batch(*device, 2 * r, 2, k);
      float mean = trainer->TrainStep({&b, 1}).value().loss;
      MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, World().comm());
      mean /= n;
      REQUIRE(std::fabs(mean - losses[k]) <= 1e-5f * losses[k]);
    }
  }
}

// Rank r's micro-batch of step `step` for gpt-tiny-shaped models: two
// sequences of synthetic tokens.
TEST_CASE("gathering on use trains gpt-tiny bit for bit as whole-layer gathers, holding less",
          "[trainer][gpt][gather_on_use]") {
  const int n = World().world_size(), r = World().rank();
  const GptConfig c = GptPreset("gpt-tiny").value();
  auto batch = [&](Device& device, int step) { return testing::GptBatch(device, c, r, step); };
  for (bool bf16 : {false, true}) {
    for (bool overlap : {false, true}) {
      for (const char* planner : {"none", "full"}) {
        INFO((bf16 ? "bf16" : "f32")
             << ", overlap " << overlap << ", recomputation " << planner << ", " << n << " ranks");
        std::vector<float> losses[2], weights[2];
        int64_t parameter_peak[2] = {0, 0};
        for (int on_use = 0; on_use < 2; ++on_use) {
          auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
          ShardingOptions o = Options(3, overlap);
          // Clipping off: the global norm sums per group, and the groups
          // differ (by use, or by layer and bucket); every other sum is
          // the same, element by element.
          o.gradient_clipping = 0;
          o.bf16 = bf16;
          o.zero.reduce_bucket_size = 60000;
          // No prefetch: the peak then compares what each mode holds in
          // use (a prefetch window holds the same either way).
          o.zero.stage3_prefetch_bucket_size = 0;
          o.zero.stage3_gather_on_use = on_use == 1;
          auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                         o, *device, World(), 3)
                             .value();
          const Chain chain = trainer->ChainFor({2, c.seq}).value();
          REQUIRE(trainer->SetRecomputationPlan(MakePlan(chain, planner, {}).value(), chain).ok());
          for (int k = 0; k < 4; ++k) {
            Batch b = batch(*device, k);
            losses[on_use].push_back(trainer->TrainStep({&b, 1}).value().loss);
          }
          weights[on_use] = Weights(*trainer);
          parameter_peak[on_use] = device->allocator()
                                       .stats()
                                       .by_category[static_cast<int>(MemoryCategory::kParameter)]
                                       .peak;
          if (on_use == 1) {
            // A group per weight and bias: 6 in each of the 2 blocks.
            int per_use = 0;
            for (const FlatGroup& g : trainer->optimizer().layout().groups) {
              per_use += absl::StartsWith(g.name, "block");
            }
            CHECK(per_use == 12);
          }
        }
        CHECK(losses[1] == losses[0]);
        REQUIRE(weights[1].size() == weights[0].size());
        CHECK(std::memcmp(weights[1].data(), weights[0].data(), weights[0].size() * 4) == 0);
        // The device holds a block's weight at a time, not the whole block.
        CHECK(parameter_peak[1] < parameter_peak[0]);
      }
    }
  }
}

// What tiling keeps exact, and what it does not. A tiled operator computes
// its output in column blocks (the embedding's head: vocabulary blocks), and
// its input gradient as a sum over those blocks, tile 0 writing and each
// other tile adding its part: the same sum as the plain operator's GEMM, in
// another order, so its rounding differs. Hence, against the plain untiled
// model (tiles 1): the same initial weights and the same first loss, bit for
// bit (each output element is the plain operator's dot product), and then
// training that agrees to rounding (the tolerances of this file's header).
// Against the untiled weight computed in the same blocks
// (tile_parameters false): bit for bit throughout, so that holding one tile
// on the device at a time changes nothing else.
TEST_CASE(
    "tiled blocks and embedding train as the untiled operators: bit for bit in the same blocks, "
    "to rounding against the plain model, one tile on the device at a time",
    "[trainer][gpt][tiles]") {
  const int n = World().world_size(), r = World().rank();
  GptConfig c = GptPreset("gpt-tiny").value();
  auto batch = [&](Device& device, int step) { return testing::GptBatch(device, c, r, step); };
  for (int64_t tiles : {2, 4}) {
    for (bool bf16 : {false, true}) {
      for (int stage : {0, 3}) {
        INFO(tiles << " tiles, " << (bf16 ? "bf16" : "f32") << ", stage " << stage << ", " << n
                   << " ranks");
        // 0: the untiled weight computed in column blocks, 1: tile
        // parameters, 2: the plain model (tiles 1).
        std::vector<float> losses[3], initial[3], trained[3];
        int64_t parameter_peak[3] = {0, 0, 0};
        for (int tiled = 0; tiled < 3; ++tiled) {
          auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
          ShardingOptions o = Options(stage, false);
          o.gradient_clipping = 0;  // the norm sums by group, and the groups differ
          o.bf16 = bf16;
          o.zero.reduce_bucket_size = 60000;
          o.zero.stage3_gather_on_use = stage == 3;
          GptConfig config = c;
          if (tiled < 2) {
            config.tiles = tiles;
            // The tied embedding and head in 3 or 5 tiles of the 256 tokens
            // (86 + 85 + 85; 52 + 4 x 51): uneven, as 50257 is in any count.
            config.vocab_tiles = tiles + 1;
            config.tile_parameters = tiled == 1;
          }
          auto trainer =
              Trainer::Create(MakeGpt(config).value(), std::make_unique<CrossEntropyLoss>(), o,
                              *device, World(), 3)
                  .value();
          if (tiled == 1 && stage == 3) {
            // Gathered on use: each tile, and each bias, a group of its own.
            int tile_groups = 0;
            for (const FlatGroup& g : trainer->optimizer().layout().groups) {
              tile_groups += absl::StrContains(g.name, "_tile");
            }
            CHECK(tile_groups == c.layers * 4 * tiles + config.vocab_tiles);
          }
          // The same initial model, tiled or not.
          initial[tiled] = testing::WholeWeights(*trainer, config);
          for (int k = 0; k < 4; ++k) {
            Batch b = batch(*device, k);
            losses[tiled].push_back(trainer->TrainStep({&b, 1}).value().loss);
          }
          trained[tiled] = testing::WholeWeights(*trainer, config);
          parameter_peak[tiled] = device->allocator()
                                      .stats()
                                      .by_category[static_cast<int>(MemoryCategory::kParameter)]
                                      .peak;
        }
        CHECK(initial[1] == initial[0]);
        CHECK(losses[1] == losses[0]);
        REQUIRE(trained[1].size() == trained[0].size());
        CHECK(std::memcmp(trained[1].data(), trained[0].data(), trained[0].size() * 4) == 0);
        // Stage 3, gathered on use: the device holds a tile, not the weight.
        if (stage == 3) CHECK(parameter_peak[1] < parameter_peak[0]);
        // The plain model: the same start and first loss, then to rounding.
        CHECK(initial[2] == initial[1]);
        CHECK(losses[2][0] == losses[1][0]);
        for (size_t k = 1; k < losses[2].size(); ++k) {
          CHECK(losses[1][k] == Approx(losses[2][k]).epsilon(1e-4));
        }
        REQUIRE(trained[2].size() == trained[1].size());
        float worst = 0;
        for (size_t j = 0; j < trained[2].size(); ++j) {
          worst = std::max(worst, std::abs(trained[2][j] - trained[1][j]));
        }
        CHECK(worst <= 1e-3f);
      }
    }
  }
}

TEST_CASE("frozen blocks keep their weights and hold no gradient or optimizer state",
          "[trainer][gpt][frozen]") {
  const int r = World().rank();
  struct Variant {
    int stage;
    bool on_use;  // stage3_gather_on_use
    int64_t tiles;
  };
  for (const Variant& v : {Variant{0, false, 1}, Variant{3, false, 1}, Variant{3, true, 2}}) {
    INFO("stage " << v.stage << ", gather on use " << v.on_use << ", " << v.tiles << " tiles, "
                  << World().world_size() << " ranks");
    GptConfig c = GptPreset("gpt-tiny").value();
    c.frozen_blocks = 1;
    c.tiles = v.tiles;
    auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
    ShardingOptions o = Options(v.stage, false);
    o.zero.reduce_bucket_size = 60000;
    o.zero.stage3_gather_on_use = v.on_use;
    auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), o,
                                   *device, World(), 3)
                       .value();
    // block0's parameters are frozen groups; the rest train.
    int64_t frozen = 0, trainable = 0;
    for (const FlatGroup& g : trainer->optimizer().layout().groups) {
      const bool in_block0 = absl::StartsWith(g.name, "block0");  // "block0 (frozen)"
      CHECK(g.trainable == !in_block0);
      (g.trainable ? trainable : frozen) += g.numel;
    }
    CHECK(frozen == 12 * 64 * 64 + 13 * 64);  // one block: 12 h^2 + 13 h
    CHECK(frozen + trainable == GptParameterCount(c));
    const auto values = [&](const std::string& name, int64_t n) {
      std::vector<float> out(n);
      REQUIRE(trainer->optimizer().MasterWeights(name, absl::MakeSpan(out)).ok());
      return out;
    };
    const std::string fc = v.tiles > 1 ? ".fc_weight_tile0" : ".fc_weight";
    const int64_t fc_size = 64 * 256 / v.tiles;
    const std::vector<float> fc0 = values("block0" + fc, fc_size);
    const std::vector<float> fc1 = values("block1" + fc, fc_size);
    const std::vector<float> wte = values("embed.wte", 256 * 64);
    for (int k = 0; k < 3; ++k) {
      Batch b = testing::GptBatch(*device, c, r, k);
      REQUIRE(trainer->TrainStep({&b, 1}).ok());
    }
    CHECK(values("block0" + fc, fc_size) == fc0);  // frozen: bit for bit
    CHECK(values("block1" + fc, fc_size) != fc1);
    // The embedding, below the frozen block, trains: gradients flow through
    // block0 to its input.
    CHECK(values("embed.wte", 256 * 64) != wte);
  }
}

TEST_CASE("the loss falls", "[trainer]") {
  Run run = Start(Options(2, true), &World());
  float first = 0, last = 0;
  for (int k = 0; k < 80; ++k) {
    Batch b = MakeBatch(*run.device, World().rank() * kRowsPerRank, kRowsPerRank, k % 4);
    last = run.trainer->TrainStep({&b, 1}).value().loss;
    if (k == 0) first = last;
  }
  CHECK(last < 0.5f * first);
}

TEST_CASE("each layer's activation bytes equal what the allocator records", "[trainer][memory]") {
  for (const auto& [backend, dtype] : std::vector<std::pair<Backend, DType>>{
           {Backend::kHost, DType::kF32}, {Backend::kMeta, DType::kF32},
           {Backend::kHost, DType::kBF16}, {Backend::kMeta, DType::kF16}}) {
    INFO(BackendName(backend) << ", " << DTypeName(dtype) << " activations");
    ShardingOptions options = Options(3, false);
    options.bf16 = dtype == DType::kBF16;
    options.fp16 = dtype == DType::kF16;
    Run run = Start(options, nullptr, backend);
    testing::OwnerPeaks peaks;
    run.device->allocator().AddListener(&peaks);
    const int64_t rows = 24;
    Batch b = MakeBatch(*run.device, 0, rows, 0);
    REQUIRE(run.trainer->TrainStep({&b, 1}).ok());
    run.device->allocator().RemoveListener(&peaks);
    std::vector<int64_t> shape = {rows, kIn};
    for (const auto& layer : run.trainer->layers()) {
      INFO(layer->name());
      CHECK(peaks.peak[layer->name()] == layer->ActivationBytes(shape, dtype));
      CHECK(peaks.current[layer->name()] == 0);  // freed after its backward
      shape = layer->OutputShape(shape).value();
    }
  }
}

TEST_CASE("meta runs the real schedule at a size this machine could not hold", "[trainer][meta]") {
  // A 4096-wide MLP (about 100M parameters) with 8192 rows, rank 0 of 64.
  auto device = CreateDevice({Backend::kMeta, 0, 32 * kGiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 64).value();
  ShardingOptions options = Options(3, false);
  options.zero.reduce_bucket_size = 20'000'000;
  const std::vector<int64_t> widths = {4096, 16384, 4096, 16384, 4096};
  auto trainer = Trainer::Create(MakeMlp(widths), std::make_unique<MseLoss>(), options, *device,
                                 *comm, 7);
  REQUIRE(trainer.ok());
  const int64_t rows = 8192;
  Batch b;
  b.input = Tensor::Empty(*device, DType::kF32, {rows, 4096}, MemoryCategory::kOther, "data").value();
  b.target = Tensor::Empty(*device, DType::kF32, {rows, 4096}, MemoryCategory::kOther, "data").value();
  REQUIRE((*trainer)->TrainStep({&b, 1}).ok());
  const AllocatorStats s = device->allocator().stats();
  // Activations at the end of forward: every layer's output.
  int64_t activations = 0;
  std::vector<int64_t> shape = {rows, 4096};
  for (const auto& layer : (*trainer)->layers()) {
    activations += layer->ActivationBytes(shape, DType::kF32);
    shape = layer->OutputShape(shape).value();
  }
  CHECK(s.by_category[int(MemoryCategory::kActivation)].peak >= activations);
  const int64_t P = (*trainer)->optimizer().layout().padded_numel;
  CHECK(P >= 4 * 4096 * 16384);
  // Stage 3 in f32 on 64 ranks: parameters, gradients, Adam moments per rank.
  CHECK(s.by_category[int(MemoryCategory::kOptimizerState)].current == 8 * P / 64);
  CHECK(comm->stats(Collective::kReduceScatter).bytes == 4 * P);
}

TEST_CASE("bf16 and fp16 storage with f32 compute track the f32 run", "[trainer][mixed]") {
  // Same data and initial values; the low-precision runs round parameters
  // and gradients to 8 (bf16) or 11 (f16) significant bits, so losses drift
  // from the f32 run by a few percent over 10 steps at most.
  const int n = World().world_size(), r = World().rank();
  std::vector<float> f32_losses;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int stage : {0, 3}) {
      INFO(DTypeName(dtype) << ", stage " << stage << ", " << n << " ranks");
      ShardingOptions o = Options(stage, true);
      o.bf16 = dtype == DType::kBF16;
      o.fp16 = dtype == DType::kF16;
      o.loss_scale.initial_scale_power = 12;
      Run run = Start(o, &World());
      for (int k = 0; k < 10; ++k) {
        Batch b = MakeBatch(*run.device, r * kRowsPerRank, kRowsPerRank, k);
        auto report = run.trainer->TrainStep({&b, 1});
        REQUIRE(report.ok());
        REQUIRE(report->step.applied);
        float mean = report->loss;
        MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, World().comm());
        mean /= n;
        if (dtype == DType::kF32 && stage == 0) {
          f32_losses.push_back(mean);
        } else {
          REQUIRE(std::fabs(mean - f32_losses[k]) <= 0.05f * f32_losses[k]);
        }
      }
      // The parameters the model sees really are low precision.
      const auto view = run.trainer->optimizer().Parameter("fc0.bias");
      if (stage < 3) CHECK(view.value().dtype == dtype);
    }
  }
}

TEST_CASE("a step waits on the device a constant number of times, whatever the depth",
          "[trainer][sync]") {
  // The host waits only to read values back (the loss, the token-id check,
  // the inf/nan and norm scan, stages 1-3's exchange of it) and once at the
  // end of the step: never per layer or per parameter.
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool bf16 : {false, true}) {
      for (bool clipping : {false, true}) {
        CAPTURE(stage, bf16, clipping);
        std::vector<int64_t> counts;
        for (int layers : {2, 5}) {
          const GptConfig c = ParseGptModel(absl::StrCat("gpt-tiny:layers=", layers)).value();
          auto device = CreateDevice({Backend::kHost, World().rank(), 256 * kMiB}).value();
          ShardingOptions o = Options(stage, /*overlap=*/true);
          o.bf16 = bf16;
          o.gradient_clipping = clipping ? 1.0f : 0.0f;
          o.zero.reduce_bucket_size = 60000;  // about a group per block
          auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(),
                                         o, *device, World(), 1)
                             .value();
          std::vector<float> ids(2 * c.seq);
          for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((7 * i + World().rank()) % c.vocab);
          Batch b;
          b.input = Tensor::FromHost(*device, ids, {2, c.seq}, MemoryCategory::kOther, "x").value();
          b.target = Tensor::FromHost(*device, ids, {2 * c.seq}, MemoryCategory::kOther, "y").value();
          REQUIRE(trainer->TrainStep({&b, 1}).ok());  // the first step also initialises
          const int64_t before = device->host_synchronizations();
          REQUIRE(trainer->TrainStep({&b, 1}).ok());
          counts.push_back(device->host_synchronizations() - before);
        }
        CHECK(counts[0] == counts[1]);
        // Loss, token ids, the scan, the exchange (stages 1-3), the step's
        // entry and end, the reductions' reuse, and stages 0-1's held
        // reductions (stage 0 only when it widens bf16 to f32).
        const int held = stage == 1 || (stage == 0 && bf16) ? 1 : 0;
        CHECK(counts[0] == (stage == 0 ? 6 : 7) + held);
      }
    }
  }
}

// A Linear layer that names use groups of its parameters as told.
class UseGrouped final : public Layer {
 public:
  // `frozen`: a parameter declared frozen ("" for none).
  UseGrouped(std::vector<std::vector<std::string>> sets, std::string frozen = "")
      : Layer("fc"), linear_("fc", 4, 4), sets_(std::move(sets)), frozen_(std::move(frozen)) {}
  std::vector<ParameterDecl> Parameters() const override {
    std::vector<ParameterDecl> decls = linear_.Parameters();
    for (ParameterDecl& d : decls) d.trainable = d.name != frozen_;
    return decls;
  }
  std::vector<std::vector<std::string>> UseGroups() const override { return sets_; }
  absl::StatusOr<std::vector<int64_t>> OutputShape(const std::vector<int64_t>& in) const override {
    return linear_.OutputShape(in);
  }
  int64_t ActivationBytes(const std::vector<int64_t>& in, DType dtype) const override {
    return linear_.ActivationBytes(in, dtype);
  }
  double ForwardFlops(const std::vector<int64_t>& in) const override {
    return linear_.ForwardFlops(in);
  }
  absl::StatusOr<Tensor> Forward(LayerContext& ctx, const Tensor& x) override {
    return linear_.Forward(ctx, x);
  }
  absl::StatusOr<Tensor> Backward(LayerContext& ctx, const Tensor& x, const Tensor& dy) override {
    return linear_.Backward(ctx, x, dy);
  }

 private:
  Linear linear_;
  const std::vector<std::vector<std::string>> sets_;
  const std::string frozen_;
};

TEST_CASE("gathering on use refuses use groups that do not cover a layer's parameters once",
          "[trainer][gather_on_use][errors]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  ShardingOptions o = Options(3, false);
  o.zero.stage3_gather_on_use = true;
  const auto create = [&](std::vector<std::vector<std::string>> sets, std::string frozen = "") {
    std::vector<std::unique_ptr<Layer>> layers;
    layers.push_back(std::make_unique<UseGrouped>(std::move(sets), std::move(frozen)));
    return Trainer::Create(std::move(layers), std::make_unique<MseLoss>(), o, *device, *comm, 7)
        .status();
  };
  CHECK(create({{"weight", "bias"}}).ok());
  CHECK(create({{"weight"}, {"bias"}}).ok());
  CHECK(create({{"weight"}, {"weight", "bias"}}).message() ==
        "Trainer: layer 'fc' lists 'weight' in two use groups");
  CHECK(create({{"weight"}}).message() ==
        "Trainer: layer 'fc' cannot gather 'bias' on use (every parameter in one use group, "
        "none naming a group of its own)");
  CHECK(create({{"weight", "bias", "scale"}}).message() ==
        "Trainer: layer 'fc' lists use groups of parameters it does not declare");
  // A frozen parameter gathers on use in a group of its own kind.
  CHECK(create({{"weight"}, {"bias"}}, "weight").ok());
  CHECK(create({{"weight", "bias"}}, "bias").message() ==
        "Trainer: layer 'fc' cannot gather 'bias' on use with the rest of its use group (they "
        "train; it is frozen, or the other way round)");
  // Below stage 3 the layer gathers nothing on use: its groups are the
  // engine's, whatever it lists.
  o.zero.stage = 2;
  CHECK(create({{"weight"}}).ok());
}

TEST_CASE("the trainer rejects what it cannot run, by name", "[trainer][errors]") {
  auto device = CreateDevice({Backend::kHost, 0, 64 * kMiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  std::vector<std::unique_ptr<Layer>> twins;
  twins.push_back(std::make_unique<Gelu>("act"));
  twins.push_back(std::make_unique<Gelu>("act"));
  auto t = Trainer::Create(std::move(twins), std::make_unique<MseLoss>(), Options(0, false), *device, *comm, 7);
  CHECK(std::string(t.status().message()) == "Trainer: two layers are named 'act'");
  auto ok = Trainer::Create(MakeMlp(kWidths), std::make_unique<MseLoss>(), Options(0, false),
                            *device, *comm, 7).value();
  Batch b = MakeBatch(*device, 0, 4, 0);
  auto two = ok->TrainStep({});
  CHECK(std::string(two.status().message()) ==
        "TrainStep: 0 micro-batches for gradient_accumulation_steps 1");
  Batch wrong;
  wrong.input = Tensor::Empty(*device, DType::kF32, {4, kIn + 1}, MemoryCategory::kOther, "data").value();
  wrong.target = std::move(b.target);
  auto bad = ok->TrainStep({&wrong, 1});
  CHECK(std::string(bad.status().message()) ==
        "layer 'fc0': expected an input of shape [rows, 16], got [4, 17]");
}

}  // namespace
}  // namespace memwall
