// Collectives over MPI between processes launched by mpirun (one per rank),
// on host memory. On a synchronous host stream a call completes before it
// returns; on an asynchronous host stream (Device::CreateAsyncStream) it runs
// on the stream's thread, in order, so communication overlaps the caller's
// compute. That needs MPI_THREAD_SERIALIZED or better from the MPI library;
// with less, collectives run on the calling thread.
//
// Every MPI call is non-blocking and polled against options.timeout (see
// communicator.h): a rank that is gone or stuck makes the others fail with
// kDeadlineExceeded, never wait forever, and the error names the ranks that
// never arrived and those stalled inside the collective. For that each rank
// keeps, in a one-sided MPI window (the board), how many collectives it has
// posted on the communicator and completed, and a count of its polls while
// waiting: plain local stores (the unified memory model), read by the
// others only when they time out (MPI_Rget, no answer needed from the rank
// read: a stopped or busy rank's counts are read through shared memory or
// RDMA; where the MPI library cannot read them, the error says so). Where
// MPI offers no such window (e.g. Open MPI's pt2pt component under
// MPI_THREAD_MULTIPLE, or a window of the separate model), the error says
// the ranks are unknown.
#ifndef MEMWALL_RUNTIME_MPI_COMMUNICATOR_H_
#define MEMWALL_RUNTIME_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/communicator.h"

namespace memwall {

// OK for MPI_SUCCESS; otherwise kInternal "<call>: <MPI error string>".
absl::Status MpiStatus(int code, absl::string_view call);

// Ends every rank of a multi-rank job (MPI_Abort with `code`, after
// flushing stderr), for an error on this rank: the others may be waiting in
// a collective it will never join. Returns (does nothing) when MPI is not
// running or the job has one rank.
void AbortRanks(int code);

// This process's rank in the world (MPI_COMM_WORLD, or the world JoinWorld
// made) and the number of processes in it (0 of 1 without mpirun), MPI
// initialised as MpiCommunicator::Create does; no collective.
struct MpiPlace {
  int rank = 0;
  int size = 1;
};
absl::StatusOr<MpiPlace> MpiWorld();

// Joining processes started without mpirun into one MPI world: under
// torchrun each process is an MPI singleton (rank 0 of 1). Rank 0 of the job
// to be opens one MPI port per other rank (OpenJoinPorts), hands the names to
// them by another channel (torch.distributed's), and every process calls
// JoinWorld: rank k connects on its port once ranks 0..k-1 accept there
// together, and the intercommunicators are merged in rank order. After it,
// memwall's world (MpiWorld, AbortRanks, every MpiCommunicator::Create) is
// the joined one, ranks as given; its nodes are the ranks that share a host
// name (MPI_COMM_TYPE_SHARED does not span separately started processes).
// Open MPI connects singletons only through a common ompi-server, named by
// OMPI_MCA_pmix_server_uri in each process's environment when MPI starts;
// without one the connect fails (kInternal, naming the variable). MPI's
// connect and accept have no timeout: a rank that never calls JoinWorld
// leaves the others waiting in it.
//
// OpenJoinPorts: kFailedPrecondition if this process already runs among
// other MPI ranks; kInvalidArgument for size < 2.
absl::StatusOr<std::vector<std::string>> OpenJoinPorts(int size);
// Collective over the `size` processes (ports: OpenJoinPorts' names, the
// same on every rank). kFailedPrecondition if this process already runs
// among other MPI ranks (mpirun, or an earlier JoinWorld); kInvalidArgument
// for a rank outside [0, size) or ports.size() != size - 1.
absl::Status JoinWorld(int rank, int size, const std::vector<std::string>& ports);

// MEMWALL_RANKS_PER_NODE: 0 when unset; kInvalidArgument naming it unless
// an integer >= 1.
absl::StatusOr<int> RanksPerNodeFromEnvironment();

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI if no one has (asking for MPI_THREAD_MULTIPLE and taking
  // what the library offers; MPI is finalised at exit), then works on a
  // duplicate of the world (MPI_COMM_WORLD, or JoinWorld's) with errors
  // returned, not fatal. A process started without mpirun (and not joined)
  // is rank 0 of a world of 1. Its nodes() are the machines its ranks share
  // memory on (MPI_COMM_TYPE_SHARED; a joined world: host names), or, with
  // MEMWALL_RANKS_PER_NODE=n set, consecutive blocks of n ranks (one machine
  // posing as several nodes); errors name the variable.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      CommunicatorOptions options = {});
  ~MpiCommunicator() override;

  absl::string_view kind() const override { return "mpi"; }
  // The duplicated communicator (NCCL bootstraps over it).
  MPI_Comm comm() const { return comm_; }

  // `count` values of `type` in host memory reduced in place over the ranks
  // with `op`, on the calling thread, waiting at most options.timeout: for
  // small exchanges of control values (agreement checks, progress lines),
  // not counted in stats() and not a collective for InjectFailure. Fails at
  // once on a broken communicator, and a failure here breaks it. `what`
  // names the exchange in errors.
  absl::Status AllReduceHost(void* values, int count, MPI_Datatype type, MPI_Op op,
                             absl::string_view what);
  // How many ranks of this communicator run on this machine, this one
  // included (MPI_COMM_TYPE_SHARED: the ranks that can share memory).
  // Collective: every rank calls it.
  absl::StatusOr<int> RanksOnThisNode();
  // Per-field minimum and maximum of `values` over the ranks (one
  // AllReduceHost). Used by the agreement checks of MPI and NCCL.
  absl::Status MinMaxOverRanks(const std::vector<int64_t>& values, std::vector<int64_t>& min,
                               std::vector<int64_t>& max);
  // DoSplit's group as an MpiCommunicator (NCCL's split bootstraps over it).
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> SplitMpi(int color, int position, int size);

 private:
  // Collective over `comm` (opens the board).
  MpiCommunicator(MPI_Comm comm, int rank, int world_size, CommunicatorOptions options,
                  bool threads_allowed);

  absl::Status Execute(Stream& stream, std::function<absl::Status()> collective) override;
  absl::Status Agree(const Signature& signature) override;
  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int position,
                                                        int size) override;
  absl::Status DoAllReduce(const void* send, void* recv, size_t count,
                           DType dtype, ReduceOp op, Stream& stream) override;
  absl::Status DoReduceScatter(const void* send, void* recv, size_t recv_count,
                               DType dtype, ReduceOp op, Stream& stream) override;
  absl::Status DoAllGather(const void* send, void* recv, size_t send_count,
                           DType dtype, Stream& stream) override;
  absl::Status DoBroadcast(void* buffer, size_t count, DType dtype, int root,
                           Stream& stream) override;
  absl::Status DoBarrier() override;
  absl::Status DoAllToAll(const void* send, void* recv, size_t send_count, DType dtype,
                          Stream& stream) override;
  // Completes `request` (from the non-blocking MPI call `call`, just
  // posted on comm_), polling it until options.timeout has passed: then
  // kDeadlineExceeded naming the ranks that never arrived (Absentees).
  absl::Status Wait(MPI_Request& request, absl::string_view call);
  // The board's slots per rank (each rank writes its own; others only
  // read): collectives posted on comm_, completed, polls while waiting, and
  // the collective it timed out in.
  static constexpr int kPosted = 0, kCompleted = 1, kPolls = 2, kGaveUp = 3, kBoardSlots = 4;
  // Every rank's slots, read with MPI_Rget until `deadline`; read[r] says
  // whether rank r's were (this rank's own always are).
  std::vector<std::array<int64_t, kBoardSlots>> ReadBoard(absl::Time deadline,
                                                          std::vector<bool>& read);
  // "; never arrived: rank 3, ..." for the ranks whose board shows fewer
  // collectives posted than this rank's `posted`, "; stalled inside it: ..."
  // for those that posted it but whose polls stand still for a second (the
  // timeout if shorter); ranks that could not be read, and a transfer that
  // outlasted the timeout with every rank present, are said as such.
  std::string Absentees(int64_t posted);
  // "rank 3", "ranks 1 and 3", with their world ranks where these differ
  // (a split).
  std::string NameRanks(const std::vector<int>& ranks) const;

  MPI_Comm comm_;
  // Whether the MPI library lets another thread make the calls.
  const bool threads_allowed_;
  // The board: a window over kBoardSlots int64s per rank (MPI_WIN_NULL: MPI
  // offered none). Never freed: MPI_Win_free is collective and would wait
  // forever for a rank that left; its bytes (and the MPI library's own
  // duplicate of comm_) go at MPI_Finalize.
  MPI_Win board_ = MPI_WIN_NULL;
  // This rank's slots: the window's memory, or (unboarded) a member.
  std::array<int64_t, kBoardSlots> unboarded_{};
  int64_t* slots_ = unboarded_.data();
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_MPI_COMMUNICATOR_H_
