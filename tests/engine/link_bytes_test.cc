// Link bytes on real ranks posing as nodes: a real host step's traffic
// inside and across nodes (the engine's step report) is the dry run's to
// the byte, at every ZeRO stage, and stage 3's all-gathers cross nodes as
// the topology says. Run on 1, 2 and 4 ranks as nodes of 2 (4 ranks: 2
// nodes; fewer: 1).
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "engine/dry_run.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/status.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

constexpr char kSpec[] = "gpt-tiny:layers=2,hidden=64,heads=2";

Config StageConfig(int stage) {
  Config c;
  c.bf16 = true;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 2;
  c.zero.stage = stage;
  c.zero.reduce_bucket_size = 20000;  // several groups: several calls
  c.ranks_per_node = 2;
  return c;
}

// The dry run of kSpec as rank 0 of `ranks` on a host device.
DryRunOptions Plan(int ranks) {
  DryRunOptions o;
  o.model = SpecModel(kSpec);
  o.gpus = ranks;
  o.runtime_allowance = 0;
  return o;
}

// The world posed as nodes of `per_node` ranks while it lives (then one
// node again, as mpirun starts the ranks).
struct PosedNodes {
  explicit PosedNodes(int per_node) { REQUIRE(testing::World().SetRanksPerNode(per_node).ok()); }
  ~PosedNodes() { (void)testing::World().SetRanksPerNode(testing::World().world_size()); }
};

// Real host steps on the world's ranks: the last one's report.
Trainer::StepReport RealStep(const Config& config, int steps = 1) {
  auto device = CreateDevice({Backend::kHost, 0, int64_t{256} * kMiB}).value();
  const GptConfig c = ParseGptModel(kSpec).value();
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), config,
                                 *device, testing::World(), 1)
                     .value();
  const int64_t b = config.train_micro_batch_size_per_gpu;
  std::vector<float> ids(b * c.seq);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 7 + testing::World().rank()) % c.vocab);
  std::vector<Batch> batches(config.gradient_accumulation_steps);
  for (Batch& batch : batches) {
    batch.input = Tensor::FromHost(*device, ids, {b, c.seq}, MemoryCategory::kOther, "in").value();
    batch.target = Tensor::FromHost(*device, ids, {b * c.seq}, MemoryCategory::kOther, "t").value();
  }
  absl::StatusOr<Trainer::StepReport> report = trainer->TrainStep(batches);
  for (int s = 1; s < steps && report.ok(); ++s) report = trainer->TrainStep(batches);
  REQUIRE(report.ok());
  return *report;
}

TEST_CASE("a real step's link bytes inside and across nodes are the dry run's to the byte",
          "[link]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  const PosedNodes posed(2);
  const int64_t nodes = (n + 1) / 2;
  for (int stage = 0; stage <= 3; ++stage) {
    const Config config = StageConfig(stage);
    const DryRunOptions o = Plan(n);
    const DryRunResult planned = DryRun(o, config).value();
    const Trainer::StepReport real = RealStep(config);
    INFO("stage " << stage << " on " << n << " ranks: inside " << real.traffic.intra_node
                  << ", across " << real.traffic.inter_node);
    CHECK(planned.nodes == nodes);
    CHECK(real.traffic.intra_node == planned.link_bytes.intra_node);
    CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
    // A rank's logical bytes over the step, each crossing into every node
    // but the first (twice for an all-reduce).
    const CollectiveStats& ar = planned.collectives[int(Collective::kAllReduce)];
    const CollectiveStats& ag = planned.collectives[int(Collective::kAllGather)];
    const CollectiveStats& rs = planned.collectives[int(Collective::kReduceScatter)];
    CHECK(ar.inter_node_bytes == 2 * (nodes - 1) * ar.bytes);
    CHECK(ag.inter_node_bytes == (nodes - 1) * ag.bytes);
    CHECK(rs.inter_node_bytes == (nodes - 1) * rs.bytes);
    CHECK(planned.link_bytes.intra_node + planned.link_bytes.inter_node ==
          (n - 1) * (2 * ar.bytes + ag.bytes + rs.bytes +
                     planned.collectives[int(Collective::kBroadcast)].bytes));
    if (stage == 3 && n > 1) {
      // Stage 3 gathers the bf16 parameters for each micro-batch's forward
      // and backward: 2 x 2 micro-batches x (at least) 2 bytes each.
      CHECK(ag.bytes >= 8 * planned.parameters);
    }
  }
}

TEST_CASE("qwZ's gathers move about half stage 3's, on real ranks as in the dry run",
          "[link][qwz]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  const PosedNodes posed(2);
  const Config exact = StageConfig(3);
  Config quantized = exact;
  quantized.zero.quantized_weights = true;
  quantized.zero.quantization_block_size = 256;
  const DryRunOptions o = Plan(n);
  const DryRunResult planned_exact = DryRun(o, exact).value();
  const DryRunResult planned = DryRun(o, quantized).value();
  const Trainer::StepReport real = RealStep(quantized);
  CHECK(real.traffic.intra_node == planned.link_bytes.intra_node);
  CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
  const CollectiveStats& q = planned.collectives[int(Collective::kAllGather)];
  const CollectiveStats& e = planned_exact.collectives[int(Collective::kAllGather)];
  CHECK(q.calls == e.calls);
  // bf16 to int8 with an f32 scale per 256: 1/2 + 4/512 of the bytes, each
  // shard's levels padded to a 4-byte word.
  CHECK(double(q.bytes) >= 0.5 * double(e.bytes));
  CHECK(double(q.bytes) <= (0.5 + 4.0 / 512) * double(e.bytes) + 4.0 * n * q.calls);
  // The reductions do not change.
  CHECK(planned.collectives[int(Collective::kReduceScatter)].bytes ==
        planned_exact.collectives[int(Collective::kReduceScatter)].bytes);
}

TEST_CASE("hpZ: a step's later gathers stay inside the block, exactly as stage 3 computes",
          "[link][hpz]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  if (n % 2 != 0) return;  // blocks of 2 ranks
  const PosedNodes posed(2);
  const Config exact = StageConfig(3);
  Config hpz = exact;
  hpz.zero.hpz_partition_size = 2;
  const DryRunOptions o = Plan(n);
  const DryRunResult planned_exact = DryRun(o, exact).value();
  const DryRunResult planned = DryRun(o, hpz).value();
  const Trainer::StepReport real_exact = RealStep(exact);
  const Trainer::StepReport real = RealStep(hpz);
  CHECK(real.traffic.intra_node == planned.link_bytes.intra_node);
  CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
  // The same parameters, gathered another way: the same loss, bit for bit.
  CHECK(real.loss == real_exact.loss);
  // 2 micro-batches, each gathering for forward (the tied embedding again
  // for the head) and backward: only each group's first gather of the step
  // crosses nodes, the bf16 model once (its groups padded to the ranks).
  const CollectiveStats& h = planned.collectives[int(Collective::kAllGather)];
  const CollectiveStats& e = planned_exact.collectives[int(Collective::kAllGather)];
  CHECK(h.calls == e.calls);
  const int64_t nodes = n / 2;
  CHECK(h.inter_node_bytes >= (nodes - 1) * 2 * planned.parameters);
  CHECK(h.inter_node_bytes <= (nodes - 1) * 2 * planned.parameters * 102 / 100);
  CHECK(e.inter_node_bytes >= 4 * h.inter_node_bytes);
  if (n == 4) {
    // Blocks of 3 do not tile 4 ranks: refused at the optimizer, by key.
    Config three = hpz;
    three.zero.hpz_partition_size = 3;
    auto device = CreateDevice({Backend::kHost, 0, int64_t{64} * kMiB}).value();
    const absl::Status refused =
        Trainer::Create(MakeGpt(ParseGptModel(kSpec).value()).value(),
                        std::make_unique<CrossEntropyLoss>(), three, *device, world, 1)
            .status();
    CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(refused.message()) ==
          "zero_optimization.zero_hpz_partition_size: group size: expected a divisor of the 4 "
          "ranks, got 3");
  }
  // The secondary partition: half of each gathered group per rank, held to
  // the step's end, booked as parameters.
  CHECK(planned.category_peaks[int(MemoryCategory::kParameter)] >
        planned_exact.category_peaks[int(MemoryCategory::kParameter)]);
}

TEST_CASE("qgZ: gradients cross nodes as int8 by all-to-all, and train as exact ones do",
          "[link][qgz]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  const PosedNodes posed(2);
  const int64_t nodes = (n + 1) / 2;
  const Config exact = StageConfig(3);
  Config qgz = exact;
  qgz.zero.quantized_gradients = true;
  qgz.zero.quantization_block_size = 256;
  const DryRunOptions o = Plan(n);
  const DryRunResult planned_exact = DryRun(o, exact).value();
  const DryRunResult planned = DryRun(o, qgz).value();
  const Trainer::StepReport real = RealStep(qgz);
  CHECK(real.traffic.intra_node == planned.link_bytes.intra_node);
  CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
  const CollectiveStats& e = planned_exact.collectives[int(Collective::kReduceScatter)];
  const CollectiveStats& rs = planned.collectives[int(Collective::kReduceScatter)];
  const CollectiveStats& a2a = planned.collectives[int(Collective::kAllToAll)];
  // Reduce-scatters stay inside nodes; across them only the all-to-alls of
  // int8 levels (and a scale per 256) of the f32 sums: a quarter and a bit.
  CHECK(rs.inter_node_bytes == 0);
  if (nodes > 1) {
    CHECK(e.inter_node_bytes > 0);
    CHECK(double(a2a.inter_node_bytes) >= 0.25 * double(e.inter_node_bytes));
    CHECK(double(a2a.inter_node_bytes) <= (0.25 + 1.0 / 256) * double(e.inter_node_bytes) +
                                              16.0 * double(a2a.calls));
  } else {
    CHECK(a2a.calls == 0);  // one node: exact, nothing quantized
  }
  if (n == 4) {
    // Nodes of 3 and 1: the reduction's two steps need equal nodes.
    REQUIRE(world.SetRanksPerNode(3).ok());
    auto device = CreateDevice({Backend::kHost, 0, int64_t{64} * kMiB}).value();
    const absl::Status uneven =
        Trainer::Create(MakeGpt(ParseGptModel(kSpec).value()).value(),
                        std::make_unique<CrossEntropyLoss>(), qgz, *device, world, 1)
            .status();
    CHECK(uneven.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(uneven.message()) ==
          "zero_optimization.zero_quantized_gradients: expected the ranks in consecutive nodes "
          "of equal size, got 4 ranks on 2 nodes with rank 2 on node 0 (ranks_per_node or "
          "MEMWALL_RANKS_PER_NODE names the layout)");
    REQUIRE(world.SetRanksPerNode(2).ok());  // nodes of 2 again
  }
  // Three steps: the losses stay within 0.5% of exact gradients' (equal on
  // one node).
  const Trainer::StepReport e3 = RealStep(exact, 3), q3 = RealStep(qgz, 3);
  if (nodes == 1) {
    CHECK(q3.loss == e3.loss);
  } else {
    CHECK(q3.loss != e3.loss);
    CHECK(std::abs(q3.loss - e3.loss) <= 0.005 * e3.loss);
  }
}

TEST_CASE("hybrid sharding: gathers and reduce-scatters stay in the node, the replicas' "
          "all-reduce crosses once a step", "[link][hybrid]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  if (n % 2 != 0) return;  // shard groups of 2 ranks
  const PosedNodes posed(2);
  const int64_t nodes = n / 2;
  const Config exact = StageConfig(3);
  Config hybrid = exact;
  hybrid.zero.mics_shard_size = 2;
  const DryRunResult planned_exact = DryRun(Plan(n), exact).value();
  const DryRunResult planned = DryRun(Plan(n), hybrid).value();
  const Trainer::StepReport real = RealStep(hybrid);
  CHECK(real.traffic.intra_node == planned.link_bytes.intra_node);
  CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
  const CollectiveStats& ag = planned.collectives[int(Collective::kAllGather)];
  const CollectiveStats& rs = planned.collectives[int(Collective::kReduceScatter)];
  const CollectiveStats& ar = planned.collectives[int(Collective::kAllReduce)];
  CHECK(ag.inter_node_bytes == 0);
  CHECK(rs.inter_node_bytes == 0);
  CHECK(planned.link_bytes.inter_node == ar.inter_node_bytes);
  if (nodes > 1) {
    // Stage 3 crosses with two bf16 gathers and an f32 reduce-scatter a
    // micro-batch (2 of them); hybrid with one f32 all-reduce (two
    // passes) of 1/2 the gradients by each of 2 replica groups a step:
    // half, a little more for the loss's all-reduce and the padding.
    INFO("across nodes per step: stage 3 " << planned_exact.link_bytes.inter_node
                                           << ", hybrid " << planned.link_bytes.inter_node);
    CHECK(double(planned.link_bytes.inter_node) <=
          0.51 * double(planned_exact.link_bytes.inter_node));
  }
  // A rank's model states: stage 3's on the shard group's 2 ranks, to the
  // byte.
  const DryRunResult on_two = DryRun(Plan(2), exact).value();
  for (MemoryCategory c : {MemoryCategory::kGradient, MemoryCategory::kOptimizerState}) {
    CHECK(planned.category_peaks[int(c)] == on_two.category_peaks[int(c)]);
  }
}

TEST_CASE("ZeRO++ whole: qwZ, hpZ and qgZ together cross nodes at most 1/3.5 of stage 3",
          "[link][zeropp]") {
  MpiCommunicator& world = testing::World();
  const int n = world.world_size();
  if (n != 4) return;  // 2 nodes of 2
  const PosedNodes posed(2);
  const Config exact = StageConfig(3);
  Config all = exact;
  all.zero.quantized_weights = true;
  all.zero.hpz_partition_size = 2;
  all.zero.quantized_gradients = true;
  const DryRunOptions o = Plan(n);
  const DryRunResult planned_exact = DryRun(o, exact).value();
  const DryRunResult planned = DryRun(o, all).value();
  const Trainer::StepReport real_exact = RealStep(exact);
  const Trainer::StepReport real = RealStep(all);
  CHECK(real.traffic.inter_node == planned.link_bytes.inter_node);
  CHECK(real_exact.traffic.inter_node == planned_exact.link_bytes.inter_node);
  INFO("across nodes per step: stage 3 " << real_exact.traffic.inter_node << ", ZeRO++ "
                                         << real.traffic.inter_node);
  CHECK(3.5 * double(real.traffic.inter_node) <= double(real_exact.traffic.inter_node));
}

}  // namespace
}  // namespace memwall
