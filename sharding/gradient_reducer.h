// GradientReducer: the collectives that reduce a flat group's gradients
// across data-parallel ranks, for ShardedOptimizer.
//
// Stage 0 all-reduces the full gradients in place; stages 1-3
// reduce-scatter them into this rank's shard. Both go in pieces of at most
// zero_optimization.reduce_bucket_size elements of the full buffer
// (DeepSpeed's meaning), widened to the reduction dtype (reduce_dtype) in
// a buffer the pieces reuse, so the temporaries stay bounded however large
// the group. Everything runs on the communication stream; the caller's
// stream is paced so that one reduction at a time overlaps its compute
// (Pace). On meta, pieces that are alike run once and the rest are counted
// (collective calls and bytes, launches, host synchronisations), so a dry
// run's cost does not grow with the number of pieces while its counts are
// those of a real run.
//
// With zero_quantized_gradients (ZeRO++ qgZ) a piece's reduce-scatter goes
// in two steps over ranks in nodes of n (N nodes; rank k*n + j is the
// j-th of node k): inside each node an exact reduce-scatter, its input
// reordered so that the j-th rank gets the node's sums for the shards of
// ranks j, n + j, 2n + j, ...; then across nodes, among the ranks with the
// same j, an all-to-all of those sums block-quantized to int8 (an f32
// scale per quantization_block_size elements), each rank summing the N
// dequantized parts of its own shard in f32, node by node in order. Across
// nodes it moves about a quarter of an f32 reduce-scatter's bytes (half a
// 16-bit one's); on one node it is the exact reduce-scatter.
//
// With hybrid sharding (zero_optimization.mics_shard_size) `comm` is this
// rank's shard group, which the reduce-scatters stay inside, and a shard
// is summed with its replicas (`replicas`: the ranks holding the same
// shard in the other groups) once it holds the step's last micro-batch:
// widened to the reduction dtype in pieces, all-reduced and rounded back
// (AllReduceReplicas; ReduceScatter's `final`). A caller whose shard is
// not on the device (it streams to the host as it is reduced) has the last
// reduction's pieces added to the earlier micro-batches' sum, brought
// back, and all-reduced before it sees them (ReduceScatterPieces'
// `replicate`). Either way every rank of a shard then holds the sum over
// all ranks, and the replicas' all-reduce runs once a step.
//
// Owns the pacing events; borrows the device, communicator and streams
// (the optimizer's). Not thread-safe.
#ifndef MEMWALL_SHARDING_GRADIENT_REDUCER_H_
#define MEMWALL_SHARDING_GRADIENT_REDUCER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "sharding/flat_layout.h"
#include "sharding/options.h"

namespace memwall {

class GradientReducer {
 public:
  // A reduction's temporaries (the widened all-reduce piece, the packed
  // reduce-scatter input and its output), reused while large enough and
  // allocated when not: a caller reducing several groups sizes them once
  // for all, so its reductions allocate nothing while earlier ones run.
  struct Buffers {
    DeviceBuffer wide, packed, out;
    // qgZ: the reordered input, the node's sums, the quantized parts sent
    // and received, a dequantized part.
    DeviceBuffer swizzled, partial, sent, received, part;
    // Hybrid sharding, a shard off the device: a piece of the earlier
    // micro-batches' sum (param_dtype).
    DeviceBuffer earlier;
  };
  // A group's reduce-scatter goes in pieces of `piece` shard elements;
  // `pack`: its input is packed rank after rank into Buffers::packed.
  struct Pieces {
    int64_t piece;
    bool pack;
  };
  // Called with elements [begin, begin + count) of this rank's shard of the
  // sum, in the reduction dtype, in a device buffer the next piece reuses
  // (what it enqueues on the communication stream reads it in time).
  using Consume = std::function<absl::Status(int64_t begin, int64_t count, const void* reduced)>;
  using Skipped = std::function<absl::Status(int64_t begin, int64_t count)>;
  // Elements [begin, begin + count) of the shard's sum over the step's
  // earlier micro-batches, wherever the caller keeps it (param_dtype; host
  // memory the device can copy from; null on meta).
  using Earlier = std::function<absl::StatusOr<const void*>(int64_t begin, int64_t count)>;

  // The two pacing events come from `device`. `config`, `device`, `comm`
  // (the ranks the states are sharded over), `replicas` (hybrid sharding's
  // replicas of this rank's shard; null without) and both streams must
  // outlive the reducer. With qgZ, splits `comm` into its nodes and the
  // ranks across them (collective): kInvalidArgument naming
  // zero_quantized_gradients unless the nodes are consecutive blocks of
  // equal size.
  static absl::StatusOr<std::unique_ptr<GradientReducer>> Create(
      const ShardingOptions& config, Device& device, Communicator& comm, Stream& caller,
      Stream& comm_stream, Communicator* replicas = nullptr);

  // Sizes `buffers` for group `flat`'s reduction (stage 0: all-reduce;
  // else reduce-scatter), allocating (comm buffers, on the communication
  // stream) what is missing or too small.
  // `earlier_from_host`: the caller's shard is on the host, and hybrid
  // sharding brings its earlier micro-batches' sum back (Buffers::earlier).
  absl::Status SizeBuffers(const FlatGroup& flat, Buffers& buffers,
                           bool earlier_from_host = false);
  Pieces PiecesOf(const FlatGroup& flat) const;

  // Stage 0: all-reduces `full` (param_dtype, padded) in place.
  absl::Status AllReduce(const FlatGroup& flat, void* full, Buffers& buffers);
  // Reduce-scatters `full` into `shard_out` (param_dtype), adding to it
  // (`accumulate`) or overwriting it; with hybrid sharding and `final`
  // (no more reductions into it this step), then sums it with its
  // replicas (AllReduceReplicas). Enqueued on the communication stream;
  // `buffers` must live until it has run.
  absl::Status ReduceScatter(const FlatGroup& flat, const void* full, void* shard_out,
                             bool accumulate, bool final, Buffers& buffers);
  // Hybrid sharding: sums this rank's `shard` of `flat` (param_dtype) with
  // its replicas', in the reduction dtype, in place; a no-op without.
  absl::Status AllReduceReplicas(const FlatGroup& flat, void* shard, Buffers& buffers);
  // Hybrid sharding, a shard off the device reduced fewer times than the
  // step's micro-batches: sums `earlier`'s shard (all of it) with the
  // replicas' piece by piece, handing each to `consume`; a no-op without.
  absl::Status AllReduceReplicas(const FlatGroup& flat, const Earlier& earlier,
                                 const Consume& consume, Buffers& buffers);
  // The reduce-scatter itself, calling `consume` for each piece. With
  // hybrid sharding and `replicate` (the step's last reduction into a shard
  // kept off the device), each piece is first added to `earlier`'s (if
  // set: the micro-batches before) and summed with the replicas, so that
  // consume sees the whole step's sum. Its buffers are `buffers`' (sized
  // by SizeBuffers first). `repeatable`: each full piece's consume does
  // what the first one's does (the same launches, host synchronisations
  // and allocations, freed again), so on meta the full pieces after the
  // first are counted, not run; `skipped`, if set, is then told the range
  // they cover (what consume keeps count of besides).
  absl::Status ReduceScatterPieces(const FlatGroup& flat, const void* full, Buffers& buffers,
                                   const Consume& consume, bool replicate,
                                   const Earlier& earlier = nullptr, bool repeatable = false,
                                   const Skipped& skipped = nullptr);

  // After a reduction is queued: orders the caller's stream after the
  // reductions before it (`in_flight`: the newest runs on while the caller
  // computes), or after it too (otherwise), with events, not host waits.
  // One reduction overlaps the caller's compute at a time, so the memory
  // reductions hold stays that of one group.
  absl::Status Pace(bool in_flight);

 private:
  GradientReducer(const ShardingOptions& config, Device& device, Communicator& comm,
                  Communicator* replicas, Stream& caller, Stream& comm_stream,
                  std::array<std::unique_ptr<Event>, 2> reduced);

  // All-reduces `n` elements (param_dtype) at `data` over `comm` in place,
  // widened to the reduction dtype in pieces of at most reduce_bucket_size
  // (Buffers::wide).
  absl::Status AllReduceOver(Communicator& comm, void* data, int64_t n, Buffers& buffers);
  // Hybrid sharding: elements [begin, begin + count) of this rank's shard
  // summed with the replicas' in Buffers::out (the reduction dtype): with
  // `earlier`, its part first added to out (`add`) or put in its place,
  // then out all-reduced across the replicas.
  absl::Status SumWithReplicas(const Earlier& earlier, int64_t begin, int64_t count, bool add,
                               Buffers& buffers);
  // qgZ's reduce-scatter of one piece: `input` holds the world's parts of
  // `count` elements rank after rank (reduce dtype), `out` gets this
  // rank's sum.
  absl::Status QuantizedReduceScatter(const void* input, void* out, int64_t count,
                                      Buffers& buffers);

  const ShardingOptions& config_;
  Device& device_;
  Communicator& comm_;
  Communicator* const replicas_;
  Stream& caller_;
  Stream& comm_stream_;
  // qgZ: this rank's node, and the ranks with its place in the other nodes.
  std::unique_ptr<Communicator> node_, across_;
  // Pace's events: the newest reduction's and the one before.
  std::array<std::unique_ptr<Event>, 2> reduced_;
  int newest_ = 0;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_GRADIENT_REDUCER_H_
