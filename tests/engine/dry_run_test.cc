// The dry run is trusted: one training step on meta allocates exactly what
// the same step allocates on host (requested and reserved peaks, per
// category, device and pinned pool) for every memory strategy, on every
// rank: run with N real ranks (mpirun), each rank's host step over MPI
// against its meta step as rank r of N over the simulated communicator
// that `memwall plan` uses.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "checkpointing/planner.h"
#include "engine/trainer.h"
#include "models/gpt.h"
#include "offload/nvme_store.h"
#include "runtime/simulated_communicator.h"
#include "runtime/units.h"
#include "tests/support/mpi_world.h"

namespace memwall {
namespace {

struct Strategy {
  std::string name;
  int stage;
  bool bf16;
  float offload_ratio;
  bool paging;
  std::string planner;
  bool overlap = false;
  std::string model = "gpt-tiny:layers=4";
  bool overlap_step = false;  // the CPU update overlapped with backward
  bool nvme = false;          // the offloaded states on NVMe (TEST_TMPDIR)
  // With nvme and paging: the parameter shards past this many elements on
  // NVMe too (-1: none).
  int64_t params_max_in_cpu = -1;
  bool gather_on_use = false;  // stage 3: block weights gathered per operation
  int64_t bucket = 30000;      // reduce_bucket_size (elements)
  // Hybrid sharding: mics_shard_size, at most the ranks (-1: none).
  int64_t shard = -1;
};

// One step's books on `backend`: the device's (returned), the pinned
// pool's, the collectives' calls and bytes (creation included), and the
// step's host synchronisations and kernel launches, and the bytes it moved
// to and from the NVMe files and their syncs.
AllocatorStats Step(Backend backend, const Strategy& s, AllocatorStats* pinned,
                    std::vector<CollectiveStats>* traffic, int64_t* syncs, int64_t* launches,
                    int64_t* nvme_moved, int64_t* nvme_syncs) {
  DeviceOptions o{backend, 0, 256 * kMiB};
  o.pinned_capacity_bytes = 256 * kMiB;
  auto device = CreateDevice(o).value();
  const int rank = testing::World().rank(), world = testing::World().world_size();
  std::unique_ptr<Communicator> simulated;
  if (backend == Backend::kMeta) simulated = SimulatedCommunicator::Create(rank, world).value();
  Communicator& comm = backend == Backend::kMeta ? *simulated : testing::World();
  comm.ResetStats();
  const GptConfig c = ParseGptModel(s.model).value();
  ShardingOptions options;
  options.zero.stage = s.stage;
  options.zero.reduce_bucket_size = s.bucket;
  options.zero.overlap_comm = s.overlap;
  options.bf16 = s.bf16;
  options.zero.offload_optimizer_ratio = s.offload_ratio;
  options.zero.offload_param = s.paging;
  options.zero.offload_overlap_step = s.overlap_step;
  options.zero.stage3_gather_on_use = s.gather_on_use;
  options.zero.mics_shard_size = s.shard > 0 ? std::min<int64_t>(s.shard, world) : -1;
  if (s.nvme) {
    const char* dir = std::getenv("TEST_TMPDIR");
    options.zero.offload_nvme_path = dir != nullptr ? dir : "/tmp";
    // Small chunks: several per group, streamed through two buffers.
    options.aio.block_size = 8192;
    options.aio.queue_depth = 2;
    options.zero.offload_buffer_count = 2;
    if (s.params_max_in_cpu >= 0) {
      options.zero.offload_param_nvme_path = options.zero.offload_nvme_path;
      options.zero.offload_param_max_in_cpu = s.params_max_in_cpu;
      options.zero.offload_param_buffer_count = 2;
    }
  }
  options.gradient_accumulation_steps = 2;
  auto trainer = Trainer::Create(MakeGpt(c).value(), std::make_unique<CrossEntropyLoss>(), options,
                                 *device, comm, 3)
                     .value();
  const int64_t sequences = 4;
  const Chain chain = trainer->ChainFor({sequences, c.seq}).value();
  PlannerOptions po;  // a budget only for optimal
  if (s.planner == "optimal") {
    po.budget = (NoRecomputation(chain).predicted_peak + FullRecomputation(chain).predicted_peak) / 2;
  }
  REQUIRE(trainer->SetRecomputationPlan(MakePlan(chain, s.planner, po).value(), chain).ok());
  std::vector<float> ids(sequences * c.seq), next(sequences * c.seq);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = float((i * 11) % c.vocab);
    next[i] = float((i * 11 + 1) % c.vocab);
  }
  std::vector<Batch> batches;
  for (int u = 0; u < 2; ++u) {
    Batch b;
    b.input = Tensor::FromHost(*device, ids, {sequences, c.seq}, MemoryCategory::kOther, "in").value();
    b.target = Tensor::FromHost(*device, next, {sequences * c.seq}, MemoryCategory::kOther, "t").value();
    batches.push_back(std::move(b));
  }
  const int64_t syncs_before = device->host_synchronizations();
  const int64_t launches_before = device->launches();
  const auto moved = [&](bool file_syncs) {
    int64_t n = 0;
    for (const NvmeStore* store :
         {trainer->optimizer().nvme_store(), trainer->optimizer().param_store()}) {
      if (store == nullptr) continue;
      n += file_syncs ? store->syncs() : store->bytes_read() + store->bytes_written();
    }
    return n;
  };
  const int64_t moved_before = moved(false), syncs_before_step = moved(true);
  REQUIRE(trainer->TrainStep(batches).ok());
  *nvme_moved = moved(false) - moved_before;
  *nvme_syncs = moved(true) - syncs_before_step;
  *syncs = device->host_synchronizations() - syncs_before;
  *launches = device->launches() - launches_before;
  traffic->clear();
  for (int k = 0; k < kNumCollectives; ++k) traffic->push_back(comm.stats(Collective(k)));
  *pinned = device->pinned_allocator()->stats();
  return device->allocator().stats();
}

TEST_CASE("a meta step allocates, communicates and synchronises exactly as the host step does, for every strategy",
          "[dryrun]") {
  const std::vector<Strategy> strategies = {
      {"stage 0, f32", 0, false, 0, false, "none"},
      {"stage 1, bf16", 1, true, 0, false, "none"},
      {"stage 2, bf16, sqrt", 2, true, 0, false, "sqrt"},
      {"stage 3, bf16, selective", 3, true, 0, false, "selective"},
      {"stage 2, bf16, offload 0.5", 2, true, 0.5f, false, "none"},
      {"stage 3, bf16, offload + paging, optimal", 3, true, 1.0f, true, "optimal"},
      // Overlapped communication: a reduction and prefetched gathers in
      // flight on the host's communication thread hold what meta holds.
      {"stage 2, bf16, overlap", 2, true, 0, false, "none", true},
      {"stage 3, bf16, overlap, sqrt", 3, true, 0, false, "sqrt", true},
      {"stage 2, bf16, offload, overlap", 2, true, 1.0f, false, "none", true},
      {"stage 3, bf16, offload + paging, overlap, optimal", 3, true, 1.0f, true, "optimal", true},
      // Large enough that the optimizer's initialisation staging, cached by
      // the allocator, shapes the step's segments.
      {"stage 0, bf16, hidden 448", 0, true, 0, false, "none", false,
       "gpt-tiny:layers=4,hidden=448,heads=7"},
      // The CPU update overlapped with backward: its buffers are the
      // caller's thread's, whatever the update thread's timing.
      {"stage 2, bf16, offload 0.5, overlap step", 2, true, 0.5f, false, "none", true,
       "gpt-tiny:layers=4", true},
      {"stage 3, bf16, offload + paging, overlap step", 3, true, 1.0f, true, "sqrt", true,
       "gpt-tiny:layers=4", true},
      {"stage 2, f32, offload, overlap step", 2, false, 1.0f, false, "none", false,
       "gpt-tiny:layers=4", true},
      // The NVMe tier: its chunk buffers and per-group scratch as a real
      // run's.
      {"stage 2, bf16, NVMe", 2, true, 1.0f, false, "none", false, "gpt-tiny:layers=4", false,
       true},
      {"stage 3, bf16, NVMe 0.5, overlap", 3, true, 0.5f, false, "none", true, "gpt-tiny:layers=4",
       false, true},
      {"stage 2, bf16, NVMe, overlap step", 2, true, 1.0f, false, "none", true, "gpt-tiny:layers=4",
       true, true},
      // Parameters on NVMe too: page buffers, the shared scratch, and the
      // shards read for each gather (prefetched ones with overlap).
      {"stage 3, bf16, NVMe params + states, sqrt", 3, true, 1.0f, true, "sqrt", false,
       "gpt-tiny:layers=4", false, true, 0},
      {"stage 3, bf16, NVMe params past 20000, overlap, optimal", 3, true, 1.0f, true, "optimal",
       true, "gpt-tiny:layers=4", false, true, 20000},
      {"stage 3, f32, NVMe params + states, overlap", 3, false, 1.0f, true, "none", true,
       "gpt-tiny:layers=4", false, true, 0},
      // Block weights gathered, reduced and released around their
      // operations (prefetched ahead with overlap).
      {"stage 3, bf16, gathered on use, overlap, sqrt", 3, true, 0, false, "sqrt", true,
       "gpt-tiny:layers=4", false, false, -1, true},
      {"stage 3, f32, gathered on use, selective", 3, false, 0, false, "selective", false,
       "gpt-tiny:layers=4", false, false, -1, true},
      {"stage 3, bf16, NVMe params, gathered on use, overlap, optimal", 3, true, 1.0f, true,
       "optimal", true, "gpt-tiny:layers=4", false, true, 0, true},
      // Memory-centric tiling: each block weight in 4 tiles and the tied
      // embedding in 3 tiles of its vocabulary, each gathered on use (the
      // tiles' gradients held from the head's backward to the embedding's);
      // and untiled: 4 column blocks of one parameter.
      {"stage 3, bf16, 4 + 3 tiles, NVMe params, gathered on use, overlap, sqrt", 3, true, 1.0f,
       true, "sqrt", true, "gpt-tiny:layers=4,tiles=4,vocab_tiles=3", false, true, 0, true},
      {"stage 3, f32, 4 + 3 tiles, gathered on use, selective", 3, false, 0, false, "selective",
       false, "gpt-tiny:layers=4,tiles=4,vocab_tiles=3", false, false, -1, true},
      {"stage 2, bf16, 4 + 4 tiles", 2, true, 0, false, "none", true,
       "gpt-tiny:layers=4,tiles=4,vocab_tiles=4"},
      // Gradients streamed to the host (and to NVMe) in many pieces: meta
      // runs the first piece of a group and counts the rest, as a real run
      // makes them (launches, synchronisations, the NVMe write).
      {"stage 2, bf16, offload, 2000-element buckets", 2, true, 1.0f, false, "none", false,
       "gpt-tiny:layers=4", false, false, -1, false, 2000},
      {"stage 2, bf16, NVMe, overlap step, 2000-element buckets", 2, true, 1.0f, false, "none",
       true, "gpt-tiny:layers=4", true, true, -1, false, 2000},
      // Hybrid sharding in groups of 2: the replicas' all-reduce at each
      // shard's last reduction, on the device or with the earlier
      // micro-batch's sum brought back from the host or NVMe.
      {"stage 3, bf16, hybrid, overlap, sqrt", 3, true, 0, false, "sqrt", true,
       "gpt-tiny:layers=4", false, false, -1, false, 30000, 2},
      {"stage 1, f32, hybrid, offload 0.5", 1, false, 0.5f, false, "none", false,
       "gpt-tiny:layers=4", false, false, -1, false, 30000, 2},
      {"stage 2, bf16, hybrid, offload, 2000-element buckets", 2, true, 1.0f, false, "none", false,
       "gpt-tiny:layers=4", false, false, -1, false, 2000, 2},
      {"stage 3, bf16, hybrid, NVMe params + states, overlap", 3, true, 1.0f, true, "none", true,
       "gpt-tiny:layers=4", false, true, 0, false, 2000, 2},
      {"stage 2, bf16, hybrid, offload, overlap step", 2, true, 1.0f, false, "none", true,
       "gpt-tiny:layers=4", true, false, -1, false, 2000, 2},
  };
  for (const Strategy& s : strategies) {
    INFO(s.name << ", rank " << testing::World().rank() << " of " << testing::World().world_size());
    AllocatorStats host_pinned, meta_pinned;
    std::vector<CollectiveStats> host_traffic, meta_traffic;
    int64_t host_syncs = 0, meta_syncs = 0, host_launches = 0, meta_launches = 0;
    int64_t host_moved = 0, meta_moved = 0, host_file_syncs = 0, meta_file_syncs = 0;
    const AllocatorStats host = Step(Backend::kHost, s, &host_pinned, &host_traffic, &host_syncs,
                                     &host_launches, &host_moved, &host_file_syncs);
    const AllocatorStats meta = Step(Backend::kMeta, s, &meta_pinned, &meta_traffic, &meta_syncs,
                                     &meta_launches, &meta_moved, &meta_file_syncs);
    // The NVMe files: the same bytes read and written, the same syncs.
    CHECK((host_moved > 0) == s.nvme);
    CHECK(meta_moved == host_moved);
    CHECK(meta_file_syncs == host_file_syncs);
    // The same host synchronisations and kernel launches: a dry run counts
    // a real run's (meta counts a reduction's repeated pieces unrun).
    CHECK(host_syncs > 0);
    CHECK(meta_syncs == host_syncs);
    CHECK(host_launches > 0);
    CHECK(meta_launches == host_launches);
    // The same collectives, to the byte.
    for (int k = 0; k < kNumCollectives; ++k) {
      INFO(CollectiveName(Collective(k)));
      CHECK(meta_traffic[k].calls == host_traffic[k].calls);
      CHECK(meta_traffic[k].bytes == host_traffic[k].bytes);
    }
    CHECK(meta.requested.peak == host.requested.peak);
    CHECK(meta.reserved.peak == host.reserved.peak);
    for (MemoryCategory c : kAllMemoryCategories) {
      INFO(MemoryCategoryName(c));
      CHECK(meta.by_category[static_cast<int>(c)].peak == host.by_category[static_cast<int>(c)].peak);
    }
    CHECK(meta_pinned.requested.peak == host_pinned.requested.peak);
    CHECK(meta_pinned.reserved.peak == host_pinned.reserved.peak);
  }
}

}  // namespace
}  // namespace memwall
