#include "sharding/gradient_reducer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "runtime/status.h"
#include "sharding/quantized_records.h"
#include "sharding/stage_rules.h"

namespace memwall {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    const ShardingOptions& config, Device& device, Communicator& comm, Stream& caller,
    Stream& comm_stream, Communicator* replicas) {
  std::array<std::unique_ptr<Event>, 2> reduced;
  for (std::unique_ptr<Event>& event : reduced) {
    MW_ASSIGN_OR_RETURN(event, device.CreateEvent());
  }
  std::unique_ptr<GradientReducer> reducer(
      new GradientReducer(config, device, comm, replicas, caller, comm_stream, std::move(reduced)));
  // On one node nothing crosses a node: the reduce-scatter stays exact.
  if (config.zero.quantized_gradients && StageRules(config.zero.stage).shards_gradients() &&
      comm.nodes() > 1) {
    const int per_node = comm.world_size() / comm.nodes();
    for (int r = 0; r < comm.world_size(); ++r) {
      if (comm.node_of(r) != r / per_node) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zero_optimization.zero_quantized_gradients: expected the ranks in consecutive "
            "nodes of equal size, got ", comm.world_size(), " ranks on ", comm.nodes(),
            " nodes with rank ", r, " on node ", comm.node_of(r),
            " (ranks_per_node or MEMWALL_RANKS_PER_NODE names the layout)"));
      }
    }
    MW_ASSIGN_OR_RETURN(reducer->node_, comm.SplitBlocks(per_node));
    MW_ASSIGN_OR_RETURN(reducer->across_, comm.SplitStrided(per_node));
  }
  return reducer;
}

GradientReducer::GradientReducer(const ShardingOptions& config, Device& device,
                                 Communicator& comm, Communicator* replicas, Stream& caller,
                                 Stream& comm_stream,
                                 std::array<std::unique_ptr<Event>, 2> reduced)
    : config_(config),
      device_(device),
      comm_(comm),
      replicas_(replicas),
      caller_(caller),
      comm_stream_(comm_stream),
      reduced_(std::move(reduced)) {}

absl::Status GradientReducer::SizeBuffers(const FlatGroup& flat, Buffers& buffers,
                                          bool earlier_from_host) {
  const DType dtype = config_.param_dtype(), reduce = config_.reduce_dtype;
  const size_t size = DTypeSize(reduce);
  const auto ensure = [&](DeviceBuffer& buffer, int64_t elements, const char* what) -> absl::Status {
    if (!buffer.empty() && buffer.size() >= elements * size) return absl::OkStatus();
    buffer.Reset();
    MW_ASSIGN_OR_RETURN(buffer, device_.Allocate(elements * size, MemoryCategory::kCommBuffer,
                                                 absl::StrCat(flat.name, what), comm_stream_));
    return absl::OkStatus();
  };
  if (StageRules(config_.zero.stage).all_reduces()) {
    // Widened in pieces of at most reduce_bucket_size elements, one buffer
    // reused for each, so a large group costs no full-size f32 copy.
    if (reduce == dtype) return absl::OkStatus();
    return ensure(buffers.wide, std::clamp<int64_t>(config_.zero.reduce_bucket_size, 1,
                                                    flat.padded_numel), ".allreduce");
  }
  const Pieces p = PiecesOf(flat);
  if (replicas_ != nullptr && reduce != dtype) {
    MW_RETURN_IF_ERROR(ensure(buffers.wide, std::clamp<int64_t>(config_.zero.reduce_bucket_size, 1,
                                                                flat.shard_numel), ".allreduce"));
  }
  if (replicas_ != nullptr && earlier_from_host && config_.gradient_accumulation_steps > 1) {
    // In the reduce dtype's elements, as ensure() sizes them.
    MW_RETURN_IF_ERROR(ensure(buffers.earlier, (p.piece * DTypeSize(dtype) + size - 1) / size,
                              ".earlier_gradients"));
  }
  if (p.pack) MW_RETURN_IF_ERROR(ensure(buffers.packed, comm_.world_size() * p.piece, ".reduce_input"));
  MW_RETURN_IF_ERROR(ensure(buffers.out, p.piece, ".reduce_output"));
  if (node_ == nullptr) return absl::OkStatus();
  const int nodes = across_->world_size();
  if (node_->world_size() > 1) {
    MW_RETURN_IF_ERROR(ensure(buffers.swizzled, comm_.world_size() * p.piece, ".qgz_reordered"));
    MW_RETURN_IF_ERROR(ensure(buffers.partial, nodes * p.piece, ".qgz_node_sums"));
  }
  MW_RETURN_IF_ERROR(ensure(buffers.part, p.piece, ".qgz_part"));
  // The records are 4-byte words: sized in elements of the reduce dtype.
  const int64_t words =
      nodes * QuantizedRecords(p.piece, config_.zero.quantization_block_size).words();
  MW_RETURN_IF_ERROR(ensure(buffers.sent, (words * 4 + size - 1) / size, ".qgz_sent"));
  return ensure(buffers.received, (words * 4 + size - 1) / size, ".qgz_received");
}

absl::Status GradientReducer::QuantizedReduceScatter(const void* input, void* out, int64_t count,
                                                     Buffers& buffers) {
  const DType reduce = config_.reduce_dtype;
  const size_t size = DTypeSize(reduce);
  const int per_node = node_->world_size(), nodes = across_->world_size();
  Stream& stream = comm_stream_;
  // 1. Inside the node, exactly: the j-th rank gets the node's sums of the
  // parts of ranks j, per_node + j, ...: the input reordered so those are
  // the j-th run of `nodes` parts (with one rank a node, the input is
  // those sums).
  const void* sums = input;
  if (per_node > 1) {
    for (int j = 0; j < per_node; ++j) {
      for (int k = 0; k < nodes; ++k) {
        MW_RETURN_IF_ERROR(device_.CopyAsync(
            ElementOffset(buffers.swizzled.data(), (int64_t{j} * nodes + k) * count, reduce),
            ElementOffset(input, (int64_t{k} * per_node + j) * count, reduce), count * size,
            stream));
      }
    }
    MW_RETURN_IF_ERROR(node_->ReduceScatter(buffers.swizzled.data(), buffers.partial.data(),
                                            nodes * count, reduce, ReduceOp::kSum, stream));
    sums = buffers.partial.data();
  }
  // 2. Across nodes: each node's sum of every shard quantized, sent to the
  // shard's rank, and the parts received dequantized and added in node
  // order.
  const QuantizedRecords records(count, config_.zero.quantization_block_size);
  for (int k = 0; k < nodes; ++k) {
    MW_RETURN_IF_ERROR(records.Quantize(device_, stream, ElementOffset(sums, k * count, reduce),
                                        reduce, buffers.sent.data(), k));
  }
  MW_RETURN_IF_ERROR(across_->AllToAll(buffers.sent.data(), buffers.received.data(),
                                       records.words(), DType::kF32, stream));
  for (int k = 0; k < nodes; ++k) {
    void* to = k == 0 ? out : buffers.part.data();
    MW_RETURN_IF_ERROR(records.Dequantize(device_, stream, buffers.received.data(), k, to, reduce));
    if (k > 0) {
      MW_RETURN_IF_ERROR(
          kernels::Accumulate(device_, stream, buffers.part.data(), reduce, out, reduce, count));
    }
  }
  return absl::OkStatus();
}

GradientReducer::Pieces GradientReducer::PiecesOf(const FlatGroup& flat) const {
  const int world = comm_.world_size();
  const int64_t shard = flat.shard_numel;
  const int64_t piece = std::clamp<int64_t>(config_.zero.reduce_bucket_size / world, 1, shard);
  // The collective reads world pieces laid out rank after rank: a copy (or
  // the widening cast) packs them unless the group goes in one piece in the
  // reduction's dtype, or there is one rank (a piece is then contiguous).
  const bool pack = config_.reduce_dtype != config_.param_dtype() || (piece < shard && world > 1);
  return Pieces{piece, pack};
}

absl::Status GradientReducer::AllReduce(const FlatGroup& flat, void* full, Buffers& buffers) {
  return AllReduceOver(comm_, full, flat.padded_numel, buffers);
}

absl::Status GradientReducer::AllReduceReplicas(const FlatGroup& flat, void* shard,
                                                Buffers& buffers) {
  if (replicas_ == nullptr) return absl::OkStatus();
  return AllReduceOver(*replicas_, shard, flat.shard_numel, buffers);
}

absl::Status GradientReducer::AllReduceReplicas(const FlatGroup& flat, const Earlier& earlier,
                                                const Consume& consume, Buffers& buffers) {
  if (replicas_ == nullptr) return absl::OkStatus();
  const int64_t piece = PiecesOf(flat).piece;
  for (int64_t begin = 0; begin < flat.shard_numel; begin += piece) {
    const int64_t count = std::min(piece, flat.shard_numel - begin);
    MW_RETURN_IF_ERROR(SumWithReplicas(earlier, begin, count, /*add=*/false, buffers));
    MW_RETURN_IF_ERROR(consume(begin, count, buffers.out.data()));
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::SumWithReplicas(const Earlier& earlier, int64_t begin,
                                              int64_t count, bool add, Buffers& buffers) {
  const DType dtype = config_.param_dtype(), reduce = config_.reduce_dtype;
  void* out = buffers.out.data();
  if (earlier) {
    MW_ASSIGN_OR_RETURN(const void* before, earlier(begin, count));
    MW_RETURN_IF_ERROR(device_.CopyAsync(buffers.earlier.data(), before,
                                         count * DTypeSize(dtype), comm_stream_));
    MW_RETURN_IF_ERROR(
        add ? kernels::Accumulate(device_, comm_stream_, buffers.earlier.data(), dtype, out,
                                  reduce, count)
            : kernels::Cast(device_, comm_stream_, buffers.earlier.data(), dtype, out, reduce,
                            count));
  }
  return replicas_->AllReduce(out, out, count, reduce, ReduceOp::kSum, comm_stream_);
}

absl::Status GradientReducer::AllReduceOver(Communicator& comm, void* full, int64_t n,
                                            Buffers& buffers) {
  const DType dtype = config_.param_dtype(), reduce = config_.reduce_dtype;
  if (reduce == dtype) {
    return comm.AllReduce(full, full, n, dtype, ReduceOp::kSum, comm_stream_);
  }
  const int64_t piece = std::clamp<int64_t>(config_.zero.reduce_bucket_size, 1, n);
  const DeviceBuffer& wide = buffers.wide;
  // Meta: the full pieces are alike, so the first runs and the rest are
  // counted, as in ReduceScatterPieces.
  const int64_t full_pieces = n / piece;
  const bool repeat = !device_.holds_bytes() && full_pieces > 1;
  // (Read only then: on host a communication thread may be counting.)
  const CollectiveStats before = repeat ? comm.stats(Collective::kAllReduce) : CollectiveStats{};
  const int64_t launches_before = Device::launches_by_this_thread();
  for (int64_t begin = 0; begin < n; begin += piece) {
    if (repeat && begin == piece) {
      const CollectiveStats after = comm.stats(Collective::kAllReduce);
      comm.CountRepeats(Collective::kAllReduce, after - before, full_pieces - 1);
      device_.CountLaunch((Device::launches_by_this_thread() - launches_before) *
                          (full_pieces - 1));
      begin = full_pieces * piece;
      if (begin >= n) break;
    }
    const int64_t count = std::min(piece, n - begin);
    void* slice = ElementOffset(full, begin, dtype);
    MW_RETURN_IF_ERROR(kernels::Cast(device_, comm_stream_, slice, dtype, wide.data(), reduce, count));
    MW_RETURN_IF_ERROR(
        comm.AllReduce(wide.data(), wide.data(), count, reduce, ReduceOp::kSum, comm_stream_));
    MW_RETURN_IF_ERROR(kernels::Cast(device_, comm_stream_, wide.data(), reduce, slice, dtype, count));
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::ReduceScatterPieces(const FlatGroup& flat, const void* full,
                                                  Buffers& buffers, const Consume& consume,
                                                  bool replicate, const Earlier& earlier,
                                                  bool repeatable, const Skipped& skipped) {
  const DType dtype = config_.param_dtype(), reduce = config_.reduce_dtype;
  const int world = comm_.world_size();
  const int64_t shard = flat.shard_numel;
  Stream& stream = comm_stream_;
  const auto [piece, pack] = PiecesOf(flat);
  const DeviceBuffer& packed = buffers.packed;
  const DeviceBuffer& out = buffers.out;
  // Meta, with a repeatable `consume`: the full pieces are alike, so the
  // first runs and the rest are counted (collective calls and bytes,
  // kernel launches, host synchronisations) without running, and a dry
  // run's cost does not grow with the number of pieces (a large world
  // makes pieces of a few hundred elements). The stats are read only then:
  // on host a communication thread may be counting.
  const int64_t full_pieces = shard / piece;
  const bool repeat = repeatable && !device_.holds_bytes() && full_pieces > 1;
  // (Hybrid sharding: the replicas' all-reduces count in their own group.)
  Communicator* const replicas = replicate ? replicas_ : nullptr;
  std::array<CollectiveStats, kNumCollectives> before{};
  for (int c = 0; c < kNumCollectives && repeat; ++c) before[c] = comm_.stats(Collective(c));
  const CollectiveStats replicas_before =
      repeat && replicas != nullptr ? replicas->stats(Collective::kAllReduce) : CollectiveStats{};
  // The first piece's launches and synchronisations are this thread's:
  // the CPU update thread (an overlapped step) synchronises meanwhile.
  const int64_t launches_before = Device::launches_by_this_thread();
  const int64_t syncs_before = Device::host_synchronizations_by_this_thread();
  for (int64_t begin = 0; begin < shard; begin += piece) {
    if (repeat && begin == piece) {
      // qgZ's pieces add all-to-alls (and their groups' reduce-scatters).
      for (int c = 0; c < kNumCollectives; ++c) {
        const CollectiveStats now = comm_.stats(Collective(c));
        comm_.CountRepeats(Collective(c), now - before[c], full_pieces - 1);
      }
      if (replicas != nullptr) {
        replicas->CountRepeats(Collective::kAllReduce,
                               replicas->stats(Collective::kAllReduce) - replicas_before,
                               full_pieces - 1);
      }
      device_.CountLaunch((Device::launches_by_this_thread() - launches_before) *
                          (full_pieces - 1));
      device_.CountHostSynchronizations(
          (Device::host_synchronizations_by_this_thread() - syncs_before) * (full_pieces - 1));
      if (skipped) MW_RETURN_IF_ERROR(skipped(piece, (full_pieces - 1) * piece));
      begin = full_pieces * piece;
      if (begin >= shard) break;
    }
    const int64_t count = std::min(piece, shard - begin);
    const void* input = ElementOffset(full, begin, dtype);
    if (pack && !device_.holds_bytes()) {
      // Meta moves no bytes: the world packing copies of a piece are only
      // counted (the casts are kernel launches), so a dry run's cost does
      // not grow with the simulated world size.
      if (reduce != dtype) device_.CountLaunch(world);
      input = packed.data();
    } else if (pack) {
      for (int r = 0; r < world; ++r) {
        void* to = ElementOffset(packed.data(), r * count, reduce);
        const void* from = ElementOffset(full, r * shard + begin, dtype);
        MW_RETURN_IF_ERROR(reduce != dtype
                               ? kernels::Cast(device_, stream, from, dtype, to, reduce, count)
                               : device_.CopyAsync(to, from, count * DTypeSize(dtype), stream));
      }
      input = packed.data();
    }
    MW_RETURN_IF_ERROR(
        node_ != nullptr
            ? QuantizedReduceScatter(input, out.data(), count, buffers)
            : comm_.ReduceScatter(input, out.data(), count, reduce, ReduceOp::kSum, stream));
    if (replicas != nullptr) {
      MW_RETURN_IF_ERROR(SumWithReplicas(earlier, begin, count, /*add=*/true, buffers));
    }
    // Stream order keeps the next piece from overwriting `out` (and
    // `packed`) before what `consume` enqueued has read them.
    MW_RETURN_IF_ERROR(consume(begin, count, out.data()));
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::ReduceScatter(const FlatGroup& flat, const void* full,
                                            void* shard_out, bool accumulate, bool final,
                                            Buffers& buffers) {
  const DType dtype = config_.param_dtype(), reduce = config_.reduce_dtype;
  MW_RETURN_IF_ERROR(ReduceScatterPieces(
      flat, full, buffers,
      [&](int64_t begin, int64_t count, const void* reduced) {
        void* to = ElementOffset(shard_out, begin, dtype);
        return accumulate
                   ? kernels::Accumulate(device_, comm_stream_, reduced, reduce, to, dtype, count)
                   : kernels::Cast(device_, comm_stream_, reduced, reduce, to, dtype, count);
      },
      /*replicate=*/false, /*earlier=*/nullptr, /*repeatable=*/true));
  return final ? AllReduceReplicas(flat, shard_out, buffers) : absl::OkStatus();
}

absl::Status GradientReducer::Pace(bool in_flight) {
  // The caller's stream is ordered after all but (in flight) the newest
  // reduction, so those reductions' blocks serve the caller's next
  // allocations.
  Event& newest = *reduced_[newest_];
  MW_RETURN_IF_ERROR(comm_stream_.Record(newest));
  if (!in_flight) return caller_.Wait(newest);
  newest_ = 1 - newest_;
  return caller_.Wait(*reduced_[newest_]);  // the one before: a no-op if none
}

}  // namespace memwall
