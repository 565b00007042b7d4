// Collectives between GPUs with NCCL, one process (and one GPU) per rank.
// The NCCL unique id is created on rank 0 and broadcast over MPI; the
// agreement check and Barrier also run over MPI (host-side counts only),
// within the MPI communicator's timeout. Collectives are enqueued on the
// caller's cuda stream and complete asynchronously; the transfers have no
// timeout of memwall's (a stuck peer stalls the stream's synchronisation).
#ifndef MEMWALL_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_
#define MEMWALL_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_

#include <nccl.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/communicator.h"
#include "runtime/mpi_communicator.h"

namespace memwall {

// OK for ncclSuccess; otherwise "<call>: <ncclGetErrorString>" (kInternal;
// kInvalidArgument for ncclInvalidArgument/ncclInvalidUsage;
// kUnavailable for ncclSystemError).
absl::Status NcclStatus(ncclResult_t code, absl::string_view call);

class NcclCommunicator final : public Communicator {
 public:
  // Creates the NCCL communicator over the ranks of `bootstrap` for the GPU
  // `device` (a cuda device). `bootstrap` must outlive the result.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      MpiCommunicator& bootstrap, Device& device, CommunicatorOptions options = {});
  ~NcclCommunicator() override;

  absl::string_view kind() const override { return "nccl"; }

 private:
  NcclCommunicator(MpiCommunicator& bootstrap, ncclComm_t comm,
                   CommunicatorOptions options)
      : Communicator(bootstrap.rank(), bootstrap.world_size(), options),
        bootstrap_(bootstrap),
        comm_(comm) {
    // The same ranks on the same nodes.
    std::vector<int> node_ids(bootstrap.world_size());
    for (int r = 0; r < bootstrap.world_size(); ++r) node_ids[r] = bootstrap.node_of(r);
    set_node_of(node_ids);
  }

  absl::Status Agree(const Signature& signature) override;
  // ncclCommSplit, bootstrapped over the same split of MPI's ranks (owned).
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

  std::unique_ptr<MpiCommunicator> owned_bootstrap_;  // a split's; bootstrap_ refers to it
  MpiCommunicator& bootstrap_;
  ncclComm_t comm_;
};

}  // namespace memwall

#endif  // MEMWALL_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_
