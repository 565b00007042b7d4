// The auto strategy's step-time model: each term is its counted quantity
// over the profile's rate, and the dry run's counts are those of a real
// step (kernels launched, activation and workspace bytes written).
#include "engine/auto_strategy.h"

#include <set>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "engine/dry_run.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "models/spec.h"
#include "runtime/simulated_communicator.h"
#include "runtime/status.h"
#include "runtime/units.h"

namespace memwall {
namespace {

TEST_CASE("each predicted term is its count over the profile's rate", "[auto]") {
  Hardware hw;
  hw.flops = 1e12;
  hw.memory_bps = 1e11;
  hw.launch_seconds = 1e-5;
  hw.interconnect_bps = 1e10;
  hw.inter_node_bps = 1e9;
  hw.collective_latency = 1e-4;
  hw.pcie_bps = 2e10;
  hw.cpu_adam_bps = 2.8e10;
  hw.nvme_bps = 4e9;
  DryRunResult plan;
  plan.forward_flops = 1e12;   // x3 for forward and backward: 3 s
  plan.extra_flops = 5e11;     // recomputation: 0.5 s
  plan.transient_bytes = 5e10;  // written and read: 1 s
  plan.kernel_launches = 20000;  // 0.2 s
  // Link bytes, the whole job's: each of the 8 GPUs moves an eighth.
  plan.link_bytes.intra_node = 1.6e11;  // 2e10 per GPU: 2 s
  plan.link_bytes.inter_node = 8e9;     // 1e9 per GPU: 1 s
  plan.collectives[0].calls = 1000;  // 0.1 s
  plan.pcie_bytes = 4e10;            // 2 s
  plan.offloaded_elements = 1e9;     // 28 bytes each: 1 s
  plan.nvme_bytes_per_step = 2e9;    // 0.5 s
  plan.world = 8;
  Config config;
  config.zero.overlap_comm = true;
  const StepTime t = PredictStep(plan, config, hw);
  CHECK(t.flops == Approx(3.5));
  CHECK(t.memory == Approx(1.0));
  CHECK(t.launches == Approx(0.2));
  CHECK(t.communication == Approx(3.1));
  CHECK(t.across_nodes == Approx(1.0));
  CHECK(t.host_link == Approx(2.0));
  CHECK(t.cpu_update == Approx(1.0));
  CHECK(t.nvme == Approx(0.5));
  // Overlapped: compute (4.7 s) hides communication (3.1 s).
  CHECK(t.total == Approx(4.7 + 2.0 + 1.0 + 0.5));
  config.zero.overlap_comm = false;
  CHECK(PredictStepSeconds(plan, config, hw) == Approx(4.7 + 3.1 + 2.0 + 1.0 + 0.5));
  // One GPU: its collectives are local, and cost no interconnect time.
  plan.world = 1;
  CHECK(PredictStep(plan, config, hw).communication == 0.0);
  CHECK(PredictStepSeconds(plan, config, hw) == Approx(4.7 + 2.0 + 1.0 + 0.5));
  plan.world = 8;
  CHECK(t.ToString() ==
        "8.2000 s (FLOPs 3.5000 s, memory traffic 1.0000 s, kernel launches 0.2000 s, "
        "communication 3.1000 s (1.0000 s across nodes), host link 2.0000 s, CPU update 1.0000 "
        "s, NVMe 0.5000 s)");
  // The update overlapped with backward: all but the last-reduced group's
  // share (0.25 s) hides under backward (2/3 of 4.7 s).
  config.zero.overlap_comm = true;
  config.zero.stage = 2;
  config.zero.offload_overlap_step = true;
  plan.tail_offloaded_elements = 250'000'000;
  const StepTime o = PredictStep(plan, config, hw);
  CHECK(o.cpu_update_hidden == Approx(0.75));
  CHECK(o.total == Approx(4.7 + 2.0 + 0.25 + 0.5));
  CHECK(o.ToString() ==
        "7.4500 s (FLOPs 3.5000 s, memory traffic 1.0000 s, kernel launches 0.2000 s, "
        "communication 3.1000 s (1.0000 s across nodes), host link 2.0000 s, CPU update 1.0000 "
        "s (0.7500 s under backward), NVMe 0.5000 s)");
  // A short backward hides only its own length.
  plan.forward_flops = 1e11;  // compute 0.3 + 1.0 + 0.2 = 1.5 s; backward 1.0 s
  plan.extra_flops = 0;
  CHECK(PredictStep(plan, config, hw).cpu_update_hidden == Approx(0.75));
  plan.transient_bytes = 0;  // compute 0.5 s: backward 0.333 s
  CHECK(PredictStep(plan, config, hw).cpu_update_hidden == Approx(0.5 * 2 / 3));
  // On the host backend backward runs on the update's own cores: nothing
  // hides (benchmarks/overlap_benchmark measures it slower there).
  hw.device_is_cpu = true;
  CHECK(PredictStep(plan, config, hw).cpu_update_hidden == 0);
}

TEST_CASE("presets carry HBM bandwidth and a launch cost; unknown names are listed",
          "[auto]") {
  const Hardware h100 = HardwarePreset("h100-80gb").value();
  CHECK(h100.memory_bps == Approx(3350e9 * 0.8));
  CHECK(h100.launch_seconds == Approx(5e-6));
  // DGX H100: 8 GPUs a node, a 400 Gb/s rail each.
  CHECK(h100.gpus_per_node == 8);
  CHECK(h100.inter_node_bps == Approx(50e9));
  CHECK(HardwarePreset("v100-32gb")->inter_node_bps == Approx(6.25e9));
  CHECK(HardwarePreset("v100-32gb")->memory_bps == Approx(900e9 * 0.8));
  const absl::Status bad = HardwarePreset("tpu").status();
  CHECK(bad.code() == absl::StatusCode::kNotFound);
  CHECK(bad.message() ==
        "hardware 'tpu': expected one of v100-32gb, a100-40gb, a100-80gb, h100-80gb, h200, "
        "this-machine");
}

TEST_CASE("the dry run counts the kernels and transient bytes a real step has", "[auto]") {
  Config config;
  config.bf16 = true;
  config.train_micro_batch_size_per_gpu = 4;
  config.zero.stage = 2;
  config.activation_checkpointing.planner = "sqrt";
  const std::string spec = "gpt-tiny:layers=4";
  DryRunOptions options;
  options.model = SpecModel(spec);
  options.device_bytes = 256 * kMiB;
  options.runtime_allowance = 0;
  const DryRunResult plan = DryRun(options, config).value();
  CHECK(plan.kernel_launches > 0);

  // The same step on host, with the same recomputation plan.
  auto device = CreateDevice({Backend::kHost, 0, 256 * kMiB}).value();
  auto comm = SimulatedCommunicator::Create(0, 1).value();
  const GptConfig c = ParseGptModel(spec).value();
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), config,
                                 *device, *comm, 1)
                     .value();
  const Chain chain = trainer->ChainFor({4, c.seq}).value();
  REQUIRE(trainer->SetRecomputationPlan(plan.recompute, chain).ok());
  std::vector<float> ids(4 * c.seq);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % c.vocab);
  Batch batch;
  batch.input = Tensor::FromHost(*device, ids, {4, c.seq}, MemoryCategory::kOther, "in").value();
  batch.target = Tensor::FromHost(*device, ids, {4 * c.seq}, MemoryCategory::kOther, "t").value();
  auto transient = [&] {
    const AllocatorStats s = device->allocator().stats();
    int64_t bytes = 0;
    for (MemoryCategory m : {MemoryCategory::kActivation, MemoryCategory::kCheckpointedActivation,
                             MemoryCategory::kWorkspace}) {
      bytes += s.by_category[static_cast<int>(m)].allocated;
    }
    return bytes;
  };
  const int64_t launches = device->launches(), bytes = transient();
  REQUIRE(trainer->TrainStep({&batch, 1}).ok());
  CHECK(device->launches() - launches == plan.kernel_launches);
  CHECK(transient() - bytes == plan.transient_bytes);
}

TEST_CASE("--auto searches the micro-batch, keeping the global batch", "[auto]") {
  // GPT-2 124M, sequence 1024, 8 samples per GPU per step, on 4 GiB: at
  // micro-batch 8 no candidate fits (one block's activations alone are too
  // many even under optimal recomputation); at smaller ones some do.
  DryRunOptions options;
  options.model = SpecModel("gpt2-124m");
  options.device_bytes = 4 * kGiB;
  Config base;
  base.train_micro_batch_size_per_gpu = 8;
  const AutoResult r =
      AutoStrategy(options, base, HardwarePreset("a100-40gb").value(), true).value();
  std::set<int64_t> tried;
  bool eight_fits = false;
  for (const Candidate& c : r.candidates) {
    const int64_t m = c.config.train_micro_batch_size_per_gpu;
    tried.insert(m);
    CHECK(m * c.config.gradient_accumulation_steps == 8);
    CHECK(c.plan.batch == m);
    const std::string suffix = ", micro-batch " + std::to_string(m) + " x " + std::to_string(8 / m);
    CHECK(c.name.substr(c.name.size() - suffix.size()) == suffix);
    if (m == 8 && c.plan.fits) eight_fits = true;
  }
  CHECK(tried == std::set<int64_t>{1, 2, 4, 8});
  CHECK_FALSE(eight_fits);
  REQUIRE(r.best >= 0);
  CHECK(r.candidates[r.best].config.train_micro_batch_size_per_gpu < 8);

  // Without vary_micro_batch (an engine resolving "auto"), or with one
  // sample per step, nothing is searched and names are as before.
  const AutoResult fixed = AutoStrategy(options, base, HardwarePreset("a100-40gb").value()).value();
  CHECK(fixed.best < 0);  // micro-batch 8 fits nowhere
  base.train_micro_batch_size_per_gpu = 1;
  const AutoResult one =
      AutoStrategy(options, base, HardwarePreset("a100-40gb").value(), true).value();
  for (const AutoResult* r : {&fixed, &one}) {
    for (const Candidate& c : r->candidates) {
      CHECK(c.name.find("micro-batch") == std::string::npos);
      CHECK(c.config.gradient_accumulation_steps == 1);
    }
  }
}

// The auto strategy for a bf16 run at micro-batch 1 on the v100-32gb
// profile.
AutoResult AutoBf16(const DryRunOptions& options) {
  Config base;
  base.bf16 = true;
  base.train_micro_batch_size_per_gpu = 1;
  return AutoStrategy(options, base, HardwarePreset("v100-32gb").value()).value();
}

TEST_CASE("--auto keeps the parameters and gradients on NVMe when the host cannot hold them",
          "[auto][nvme]") {
  // GPT-2 1.5B (bf16: 3.1 GB of parameters, as much of gradients) on one
  // 16 GiB GPU with 2 GiB of host memory and 1 TiB of NVMe: paging from
  // pinned memory needs the shards in host memory; only the candidate with
  // everything on NVMe fits.
  DryRunOptions options;
  options.model = SpecModel("gpt2-1.5b");
  options.device_bytes = 16 * kGiB;
  options.host_bytes = 2 * kGiB;
  options.nvme_bytes = 1024 * kGiB;
  const AutoResult r = AutoBf16(options);
  REQUIRE(r.best >= 0);
  const Candidate& best = r.candidates[r.best];
  CHECK_THAT(best.name, Catch::StartsWith("stage 3, optimizer offload 1, parameter paging and "
                                          "gradients on NVMe, gathered on use"));
  CHECK(best.config.zero.offload_param);
  CHECK(best.config.zero.offload_param_nvme_path == "/local_nvme");
  CHECK(best.config.zero.stage3_gather_on_use);
  CHECK(best.plan.host_peak <= 2 * kGiB);
  for (const Candidate& c : r.candidates) {
    if (!c.config.zero.stage3_gather_on_use) CHECK_FALSE(c.plan.fits);
  }
  // The config it prints plans the same step.
  const Config printed = ParseConfig(ConfigToJson(best.config)).value();
  CHECK(DryRun(options, printed).value().device_requested_peak == best.plan.device_requested_peak);
}

TEST_CASE("--auto tiles a block operator that does not fit the device untiled",
          "[auto][nvme][tiles]") {
  // One block of hidden 8192: gathered on use from NVMe, its MLP weight
  // (8192 x 32768, bf16, with its gradient and their f32 copies) alone
  // needs more than the 3 GiB given (the step 6.66 GiB); in 2 tiles the
  // chosen step needs 2.41 GiB.
  const std::string spec = "gpt:layers=1,hidden=8192,heads=64,seq=64,vocab=256";
  CHECK(WithTiles(spec, 2).value() == spec + ",tiles=2,vocab_tiles=2");
  CHECK(WithTiles("gpt2-1.5b", 4).value() == "gpt2-1.5b:tiles=4,vocab_tiles=4");
  CHECK(WithTiles("gpt2-124m:tiles=2", 4).status().message() ==
        "model 'gpt2-124m:tiles=2': names its tiles already");
  CHECK(WithTiles("gpt2-124m", 5).status().message() ==
        "gpt tiles: expected a divisor of hidden 768, got 5");
  CHECK(WithTiles("gpt-tiny:vocab=3", 4).status().message() ==
        "gpt vocab_tiles: expected 1..vocab (3), got 4");
  CHECK(WithTiles("resnet50", 2).status().code() == absl::StatusCode::kNotFound);
  DryRunOptions options;
  options.model = SpecModel(spec);
  options.tiled_model = [&](int64_t tiles) -> absl::StatusOr<ModelFactory> {
    MW_ASSIGN_OR_RETURN(const std::string tiled, WithTiles(spec, tiles));
    return SpecModel(tiled);
  };
  options.device_bytes = 3 * kGiB;
  options.nvme_bytes = 1024 * kGiB;
  const AutoResult r = AutoBf16(options);
  REQUIRE(r.best >= 0);
  const Candidate& best = r.candidates[r.best];
  CHECK(best.tiles == 2);
  CHECK_THAT(best.name, Catch::StartsWith("stage 3, optimizer offload 1, parameter paging and "
                                          "gradients on NVMe, gathered on use") &&
                            Catch::EndsWith(", 2 tiles"));
  for (const Candidate& c : r.candidates) {
    if (c.plan.fits) CHECK(c.tiles > 1);  // nothing fits untiled
  }
  // The tiled model under the chosen config plans the same step.
  DryRunOptions tiled = options;
  tiled.model = SpecModel(spec + ",tiles=2,vocab_tiles=2");
  CHECK(DryRun(tiled, best.config).value().device_needed == best.plan.device_needed);
  CHECK(best.plan.device_needed < 3 * kGiB);
}

TEST_CASE("quantized weight gathers are listed, and chosen only where the config opts in",
          "[auto][qwz]") {
  // Llama 2 70B on 64 H100s in nodes of 8 with 25 Gb/s per GPU between
  // nodes: stage 3's gathers and reductions cross the slow network.
  DryRunOptions options;
  options.model = SpecModel("llama2-70b", 4096);
  options.gpus = 64;
  options.ranks_per_node = 8;
  options.device_bytes = int64_t{80} << 30;
  Hardware hw = HardwarePreset("h100-80gb").value();
  hw.inter_node_bps = 25e9 / 8;
  Config base;
  base.bf16 = true;
  base.train_micro_batch_size_per_gpu = 1;
  const AutoResult exact = AutoStrategy(options, base, hw).value();
  const Candidate* plain = nullptr;
  const Candidate* quantized = nullptr;
  for (const Candidate& c : exact.candidates) {
    if (c.name == "stage 3, recomputation optimal, buckets 50M") plain = &c;
    if (c.name == "stage 3, quantized weight gathers (qwZ), recomputation optimal, buckets 50M") {
      quantized = &c;
    }
  }
  REQUIRE(plain != nullptr);
  REQUIRE(quantized != nullptr);
  CHECK(quantized->changes_results);
  CHECK_FALSE(plain->changes_results);
  CHECK(quantized->config.zero.quantized_weights);
  // Half the gathers' bytes cross nodes; the reductions' stay.
  const CollectiveStats& qg = quantized->plan.collectives[int(Collective::kAllGather)];
  const CollectiveStats& pg = plain->plan.collectives[int(Collective::kAllGather)];
  CHECK(qg.inter_node_bytes < 0.51 * pg.inter_node_bytes);
  CHECK(quantized->plan.collectives[int(Collective::kReduceScatter)].inter_node_bytes ==
        plain->plan.collectives[int(Collective::kReduceScatter)].inter_node_bytes);
  REQUIRE(quantized->plan.fits);
  CHECK(quantized->step_seconds < plain->step_seconds);
  // The secondary partition inside each node (hpZ) is exact: it may win
  // without opting in, and it crosses nodes less.
  const Candidate* hpz = nullptr;
  for (const Candidate& c : exact.candidates) {
    if (c.name == "stage 3, secondary partition in 8 GPUs (hpZ), recomputation optimal, buckets "
                  "50M") {
      hpz = &c;
    }
  }
  REQUIRE(hpz != nullptr);
  CHECK_FALSE(hpz->changes_results);
  CHECK(hpz->config.zero.hpz_partition_size == 8);
  CHECK(hpz->plan.link_bytes.inter_node < plain->plan.link_bytes.inter_node);
  REQUIRE(exact.best >= 0);
  CHECK_FALSE(exact.candidates[exact.best].changes_results);
  // Quantized gradients too are listed, exact runs never take them.
  const Candidate* qgz = nullptr;
  for (const Candidate& c : exact.candidates) {
    if (c.name == "stage 3, quantized weight gathers (qwZ), secondary partition in 8 GPUs (hpZ), "
                  "quantized gradients (qgZ), recomputation optimal, buckets 50M") {
      qgz = &c;
    }
  }
  REQUIRE(qgz != nullptr);
  CHECK(qgz->changes_results);
  CHECK(qgz->plan.link_bytes.inter_node < quantized->plan.link_bytes.inter_node);
  // Hybrid sharding in each node is exact; its gathers and reduce-scatters
  // stay inside the node, and 70B's states over 8 GPUs (16 bytes each / 8)
  // fit 80 GB only with the optimizer offloaded.
  const Candidate* hybrid = nullptr;
  const Candidate* hybrid_offload = nullptr;
  for (const Candidate& c : exact.candidates) {
    if (c.name == "stage 3, sharded in groups of 8 GPUs (hybrid), recomputation optimal, "
                  "buckets 50M") {
      hybrid = &c;
    }
    if (c.name == "stage 3, optimizer offload 1, sharded in groups of 8 GPUs (hybrid), "
                  "recomputation optimal, buckets 50M") {
      hybrid_offload = &c;
    }
  }
  REQUIRE(hybrid != nullptr);
  REQUIRE(hybrid_offload != nullptr);
  CHECK_FALSE(hybrid->changes_results);
  CHECK(hybrid->config.zero.mics_shard_size == 8);
  CHECK(hybrid->plan.collectives[int(Collective::kAllGather)].inter_node_bytes == 0);
  CHECK(hybrid->plan.collectives[int(Collective::kReduceScatter)].inter_node_bytes == 0);
  CHECK(hybrid->plan.collectives[int(Collective::kAllReduce)].inter_node_bytes > 0);
  CHECK_FALSE(hybrid->plan.fits);
  CHECK(hybrid_offload->plan.fits);
  CHECK(hybrid_offload->plan.link_bytes.inter_node < plain->plan.link_bytes.inter_node);
  // Opted in to quantized weights only: the fastest with exact gradients.
  base.zero.quantized_weights = true;
  const AutoResult opted = AutoStrategy(options, base, hw).value();
  REQUIRE(opted.best >= 0);
  CHECK(opted.candidates[opted.best].changes_results);
  CHECK_FALSE(opted.candidates[opted.best].config.zero.quantized_gradients);
  // A config that quantizes names stage 3 with it: every candidate of
  // another stage leaves it off (its config must parse).
  for (const Candidate& c : opted.candidates) {
    CHECK(ParseConfig(ConfigToJson(c.config)).ok());
  }
}

}  // namespace
}  // namespace memwall
