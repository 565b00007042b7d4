// Collectives between data-parallel ranks, one process per rank.
//
// Implementations: MpiCommunicator (host memory, processes launched by
// mpirun), NcclCommunicator (GPU memory; bootstrapped over MPI) and
// SimulatedCommunicator (meta backend: sizes only, no bytes move).
//
// Every collective is called by all ranks in the same order with the same
// element count, dtype, operation and root. Implementations that can check
// this across ranks do (see CommunicatorOptions::check_agreement) and return
// the same kInvalidArgument on every rank when ranks disagree, instead of
// hanging or corrupting memory.
//
// No collective waits forever: a rank waits at most options.timeout for the
// others (MPI; see CommunicatorOptions). A collective that times out or fails
// in transfer breaks the communicator: MPI cannot cancel a collective it has
// started, so every later call returns the first error at once, and the job
// must end (memwall's CLI ends every rank) and resume from its last
// checkpoint. Until it ends MPI may still read and write the buffers of the
// call that failed: they must not be freed. Disagreement and argument errors leave it usable.
//
// Byte counters (per collective, SUM over calls, counted on success) use the
// size of the whole logical buffer of one call, in bytes:
//   AllReduce      count * dtype size            (the buffer reduced)
//   ReduceScatter  recv_count * world * size     (the full input)
//   AllGather      send_count * world * size     (the full output)
//   Broadcast      count * dtype size
//   Barrier        0
//   AllToAll       send_count * world * size     (the full input)
// So one step of plain data parallelism over P elements counts P bytes of
// AllReduce, which the ZeRO paper counts as 2P of traffic (a reduce-scatter
// plus an all-gather); ZeRO-1/2 count P of ReduceScatter and P of AllGather.
//
// Link bytes (the same counters, per link) are that traffic: what one call
// moves over links, summed over the whole job, split into the bytes moved
// inside a node and across nodes (nodes(), the topology). For a call of B
// logical bytes over k ranks on g nodes, as a node-aware (hierarchical)
// algorithm moves it, each byte crossing a node boundary once:
//   AllGather, ReduceScatter, Broadcast   across (g-1)*B, inside (k-g)*B
//   AllReduce (a reduce-scatter and an all-gather)  twice those
//   Barrier                               0
//   AllToAll  (with m = k/g ranks a node: each rank keeps its own part
//              and sends the rest)          across (k-m)*B, inside (m-1)*B
// Across nodes that is the least any algorithm moves (every node but one
// must receive B, less for a gather the shares its own ranks hold, and
// those shares add up to B over the nodes); inside, every other byte a rank
// receives. The sum, (k-1)*B (twice for AllReduce), is what a ring moves.
#ifndef MEMWALL_RUNTIME_COMMUNICATOR_H_
#define MEMWALL_RUNTIME_COMMUNICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace memwall {

enum class ReduceOp : uint8_t { kSum = 0, kMax, kMin };

enum class Collective : uint8_t {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kAllToAll,
};

constexpr int kNumCollectives = 6;

// "AllReduce", "ReduceScatter", ...
absl::string_view CollectiveName(Collective collective);
absl::string_view ReduceOpName(ReduceOp op);

// COUNT of successful calls, SUM of their logical bytes, and SUM of their
// link bytes inside and across nodes, whole job (see above).
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t intra_node_bytes = 0;
  int64_t inter_node_bytes = 0;
};

// The calls and bytes counted between two readings of the same stats.
inline CollectiveStats operator-(const CollectiveStats& after, const CollectiveStats& before) {
  return {after.calls - before.calls, after.bytes - before.bytes,
          after.intra_node_bytes - before.intra_node_bytes,
          after.inter_node_bytes - before.inter_node_bytes};
}

// Link bytes inside and across nodes (see above).
struct LinkBytes {
  int64_t intra_node = 0;
  int64_t inter_node = 0;

  LinkBytes& operator+=(const LinkBytes& other) {
    intra_node += other.intra_node;
    inter_node += other.inter_node;
    return *this;
  }
};
inline LinkBytes operator-(const LinkBytes& after, const LinkBytes& before) {
  return {after.intra_node - before.intra_node, after.inter_node - before.inter_node};
}
// Of one call of `bytes` logical bytes of `collective` over `ranks` ranks
// on `nodes` nodes.
LinkBytes LinkBytesOf(Collective collective, int64_t bytes, int ranks, int nodes);

// The bucket effect: the slowest rank sets the pace. Each collective's
// agreement round (CommunicatorOptions::check_agreement) is where ranks
// wait for the last to arrive, so each rank times its wait there, and the
// next round shares those times: the rank that waited least arrived last,
// and the longest wait less the shortest is the time it cost the others.
// Clock-free (each rank times its own wait), the same on every rank, one
// call behind (the last call's arrivals are compared at the next one).
// Between ranks arriving within noise of each other the last one is
// chance; `cost` weighs each call by the wait it caused. The collectives
// compared are the sum of `last`, the whole wait the sum of `cost`.
struct Arrivals {
  std::vector<int64_t> last;  // per rank: collectives it arrived last to
  std::vector<double> cost;   // per rank: seconds the others waited for it, arriving last
};

struct CommunicatorOptions {
  // Before each collective, confirm (with one small all-reduce of the call's
  // signature) that every rank called the same collective with the same
  // count, dtype, operation and root. Costs one latency per call.
  bool check_agreement = true;
  // How long one rank waits for the others in one MPI call of a collective
  // (the agreement round, each piece of the transfer) before the collective
  // fails with kDeadlineExceeded and breaks the communicator. A rank that
  // crashed, hangs or stopped calling collectives then stops the job within
  // this time instead of never. Infinite: wait as long as MPI does.
  // NCCL transfers are asynchronous on the GPU stream and not covered (their
  // agreement round, over MPI, is).
  absl::Duration timeout = absl::Minutes(10);
};

// Not thread-safe: one thread issues a rank's collectives. A collective on
// an asynchronous host stream runs, with its checks and counting, on that
// stream's thread in stream order; its errors then surface at the stream's
// Synchronize(), and its counters are current once the stream is synchronised.
// Do not issue collectives on the same communicator from another thread (or
// another stream) while such work is in flight: ranks must see one order.
class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // CommunicatorOptions::timeout.
  absl::Duration timeout() const { return options_.timeout; }
  // "mpi", "nccl" or "simulated".
  virtual absl::string_view kind() const = 0;
  // How many nodes (machines) the ranks run on, 1..world_size(): what the
  // link bytes count as inside or across nodes. MPI detects it (ranks that
  // share memory are one node) unless MEMWALL_RANKS_PER_NODE is set;
  // SetRanksPerNode overrides either.
  int nodes() const { return nodes_; }
  // The node (0..nodes()-1, numbered in rank order) rank `r` runs on.
  int node_of(int r) const { return node_of_[r]; }
  // Places the ranks in consecutive blocks of `ranks_per_node` per node
  // (the last block may be smaller): a config naming the layout, or one
  // machine posing as several nodes. Local, no collective: every rank
  // must pass the same value. Errors: kInvalidArgument below 1.
  absl::Status SetRanksPerNode(int ranks_per_node);

  // Sub-communicators, for sharding inside a group of ranks (hybrid
  // sharding, ZeRO++'s secondary partition). Collective: every rank makes
  // the same split and gets the group holding it, its ranks in their order
  // here. A group's options are this communicator's, its nodes those its
  // ranks run on (so its link bytes count what crosses between them), its
  // counters and arrivals its own. Its collectives count in the
  // communicator it was split from too (which must outlive it), as this
  // rank's calls and logical bytes and the whole job's link bytes (its
  // group's, times the groups: every group makes the same call), so the
  // world's counters hold all a rank's traffic.
  //   SplitNode()            the ranks on this rank's node
  //   SplitBlocks(size)      ranks [k*size, (k+1)*size)
  //   SplitStrided(stride)   the ranks equal to this one modulo `stride`
  // Errors: kInvalidArgument naming the size unless it divides
  // world_size(); the implementation's for a failed split.
  absl::StatusOr<std::unique_ptr<Communicator>> SplitNode();
  absl::StatusOr<std::unique_ptr<Communicator>> SplitBlocks(int size);
  absl::StatusOr<std::unique_ptr<Communicator>> SplitStrided(int stride);

  // recv[i] = op over ranks of send[i], for i < count. In place when
  // send == recv.
  absl::Status AllReduce(const void* send, void* recv, size_t count, DType dtype,
                         ReduceOp op, Stream& stream);
  // Rank r receives op over ranks of send[r*recv_count, (r+1)*recv_count).
  // `send` holds recv_count * world_size elements. In place when
  // recv == send + rank * recv_count (elements).
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count,
                             DType dtype, ReduceOp op, Stream& stream);
  // recv[r*send_count, (r+1)*send_count) = rank r's send. `recv` holds
  // send_count * world_size elements. In place when
  // send == recv + rank * send_count (elements).
  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         DType dtype, Stream& stream);
  // Every rank's buffer becomes root's.
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root,
                         Stream& stream);
  // recv[r*send_count, (r+1)*send_count) = rank r's
  // send[rank*send_count, (rank+1)*send_count): each rank's r-th part goes
  // to rank r. Both hold send_count * world_size elements; not in place.
  absl::Status AllToAll(const void* send, void* recv, size_t send_count, DType dtype,
                        Stream& stream);
  // Returns when every rank has entered the barrier.
  absl::Status Barrier();

  // OK while the communicator is usable; once a collective has failed in
  // transfer or timed out, the error every later call returns (kUnavailable
  // or kDeadlineExceeded; see the top of this file). Thread-safe.
  absl::Status health() const;
  // Collectives called so far, every kind, failed ones included (the count
  // InjectFailure refers to).
  int64_t calls() const;
  // Fault injection for tests: the collective that is this communicator's
  // call number `call` (1-based, as counted by calls()) fails on this rank
  // without joining the others, as if the rank had lost its link: it
  // returns kUnavailable and breaks the communicator; the other ranks'
  // calls time out. 0 cancels.
  void InjectFailure(int64_t call);

  CollectiveStats stats(Collective collective) const {
    return stats_[static_cast<int>(collective)];
  }
  // Adds to the stats `repeats` more calls like the ones `delta` (a
  // difference of this communicator's stats) counts, without running them:
  // a dry run's identical pieces of one reduction (meta moves no bytes),
  // accounted once so that its cost does not grow with their number. A
  // split's group adds them to its parent too, as its collectives do.
  void CountRepeats(Collective collective, const CollectiveStats& delta, int64_t repeats);
  // SUM over all collectives of the logical bytes, and of the link bytes.
  int64_t total_bytes() const;
  LinkBytes total_link_bytes() const;
  void ResetStats() { stats_ = {}; }
  // See Arrivals: world_size() zeros until a collective is compared (none
  // without check_agreement); a period's are the difference of two
  // readings (Trainer::StepReport's, a step's).
  const Arrivals& arrivals() const { return arrivals_; }

 protected:
  // What one rank passed to one collective.
  struct Signature {
    Collective collective;
    int64_t count;  // elements (per rank for ReduceScatter/AllGather)
    DType dtype;
    ReduceOp op;
    int root;
  };

  Communicator(int rank, int world_size, CommunicatorOptions options)
      : rank_(rank),
        world_size_(world_size),
        options_(options),
        node_of_(world_size, 0),
        arrivals_{std::vector<int64_t>(world_size, 0), std::vector<double>(world_size, 0.0)} {}

  const CommunicatorOptions& options() const { return options_; }
  // Implementations that know the topology (MpiCommunicator::Create) set
  // it: each rank's node, any ids (renumbered 0.. in rank order).
  void set_node_of(const std::vector<int>& node_ids);
  // The group `color` of a split in which every rank names its own group:
  // this rank is rank `position` of its `size`. The base sets the result's
  // topology.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int position,
                                                                int size) = 0;
  // OK while usable; else "<what> on rank r of n: the communicator failed
  // earlier (<the first error>)", with the first error's code.
  absl::Status FailedEarlier(absl::string_view what) const;
  // Breaks the communicator with `error` (see health()) and returns `error`
  // with what to do next appended; when it is already broken, returns
  // `error` as it is.
  absl::Status Break(const absl::Status& error);

  // Runs one whole collective (checks, transfer, counting) in `stream`'s
  // order. The default runs it now, on the calling thread.
  virtual absl::Status Execute(Stream& stream, std::function<absl::Status()> collective) {
    return collective();
  }
  // Whether buffers hold bytes (false for the simulated communicator, which
  // accepts null pointers).
  virtual bool moves_bytes() const { return true; }
  // Returns the same error on every rank unless all ranks passed `signature`.
  // Only called when options.check_agreement is set.
  virtual absl::Status Agree(const Signature& signature) = 0;
  // Per-field minima and maxima over the ranks of `values` (the same
  // length on every rank).
  using MinMax = std::function<absl::Status(const std::vector<int64_t>& values,
                                            std::vector<int64_t>& min,
                                            std::vector<int64_t>& max)>;
  // Agree() for implementations with a min/max exchange: the signature's
  // fields and the arrival fields (Arrivals) in one round, timed.
  absl::Status AgreeTimed(const Signature& signature, const MinMax& min_max);

  virtual absl::Status DoAllReduce(const void* send, void* recv, size_t count,
                                   DType dtype, ReduceOp op, Stream& stream) = 0;
  virtual absl::Status DoReduceScatter(const void* send, void* recv,
                                       size_t recv_count, DType dtype,
                                       ReduceOp op, Stream& stream) = 0;
  virtual absl::Status DoAllGather(const void* send, void* recv,
                                   size_t send_count, DType dtype,
                                   Stream& stream) = 0;
  virtual absl::Status DoBroadcast(void* buffer, size_t count, DType dtype,
                                   int root, Stream& stream) = 0;
  virtual absl::Status DoBarrier() = 0;
  virtual absl::Status DoAllToAll(const void* send, void* recv, size_t send_count, DType dtype,
                                  Stream& stream) = 0;

  // Formats the disagreement error from the per-field minima and maxima
  // over ranks, in Signature field order. Shared by implementations.
  absl::Status DisagreementError(const Signature& mine,
                                 const std::array<int64_t, 5>& min,
                                 const std::array<int64_t, 5>& max) const;
  static std::array<int64_t, 5> Encode(const Signature& signature);

 private:
  // Checks the call here and, with check_agreement, across ranks; a local
  // error (`local`, or a null buffer) fails every rank alike.
  absl::Status Prepare(const Signature& signature, bool has_null_buffer,
                       absl::Status local = absl::OkStatus());
  void Count(Collective collective, int64_t bytes);
  // Adds one call to the stats, and to the parent's (see the splits).
  void Add(Collective collective, int64_t bytes, const LinkBytes& link);
  // Runs one collective's `body` unless the communicator is broken or this
  // is the injected failure, and breaks it when `body` fails other than
  // with kInvalidArgument (ranks agreed on those before moving a byte).
  absl::Status Guard(Collective collective, const std::function<absl::Status()>& body);

  // The group `color` of `members` (this communicator's ranks in their
  // order there, this rank among them).
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, const std::vector<int>& members);

  const int rank_;
  const int world_size_;
  const CommunicatorOptions options_;
  std::vector<int> node_of_;
  int nodes_ = 1;
  // Set for a split's group: where its collectives also count, and how
  // many groups the split made.
  Communicator* parent_ = nullptr;
  int64_t parent_groups_ = 1;
  std::array<CollectiveStats, kNumCollectives> stats_{};
  Arrivals arrivals_;
  int64_t previous_wait_us_ = -1;  // this rank's wait in the last round; -1: none

  // std::mutex, which ThreadSanitizer sees (see runtime/host_device.cc).

  mutable std::mutex mutex_;
  absl::Status broken_ ABSL_GUARDED_BY(mutex_);
  int64_t calls_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t fail_at_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_COMMUNICATOR_H_
