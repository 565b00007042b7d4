#include "runtime/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace memwall {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

absl::StatusOr<cudaStream_t> CudaStreamOf(const Stream& stream, absl::string_view call) {
  if (stream.native_handle() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": the NCCL communicator needs a cuda stream (use the MPI "
              "communicator for host memory)"));
  }
  return static_cast<cudaStream_t>(stream.native_handle());
}

}  // namespace

absl::Status NcclStatus(ncclResult_t code, absl::string_view call) {
  if (code == ncclSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", ncclGetErrorString(code));
  switch (code) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    MpiCommunicator& bootstrap, Device& device, CommunicatorOptions options) {
  if (device.backend() != Backend::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicator: needs a cuda device, got ", device.name()));
  }
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    MW_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  }
  MW_RETURN_IF_ERROR(MpiStatus(
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap.comm()), "MPI_Bcast (NCCL id)"));
  ncclComm_t comm = nullptr;
  MW_RETURN_IF_ERROR(NcclStatus(
      ncclCommInitRank(&comm, bootstrap.world_size(), id, bootstrap.rank()),
      "ncclCommInitRank"));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(bootstrap, comm, options));
}

NcclCommunicator::~NcclCommunicator() { (void)ncclCommDestroy(comm_); }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::DoSplit(int color, int position,
                                                                       int size) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> bootstrap,
                      bootstrap_.SplitMpi(color, position, size));
  ncclComm_t comm = nullptr;
  MW_RETURN_IF_ERROR(
      NcclStatus(ncclCommSplit(comm_, color, position, &comm, nullptr), "ncclCommSplit"));
  std::unique_ptr<NcclCommunicator> group(new NcclCommunicator(*bootstrap, comm, options()));
  group->owned_bootstrap_ = std::move(bootstrap);
  return std::unique_ptr<Communicator>(std::move(group));
}

absl::Status NcclCommunicator::Agree(const Signature& signature) {
  return AgreeTimed(signature, [this](const std::vector<int64_t>& values,
                                      std::vector<int64_t>& min, std::vector<int64_t>& max) {
    return bootstrap_.MinMaxOverRanks(values, min, max);
  });
}

absl::Status NcclCommunicator::DoAllReduce(const void* send, void* recv,
                                           size_t count, DType dtype, ReduceOp op,
                                           Stream& stream) {
  MW_ASSIGN_OR_RETURN(cudaStream_t s, CudaStreamOf(stream, "AllReduce"));
  return NcclStatus(
      ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op), comm_, s),
      "ncclAllReduce");
}

absl::Status NcclCommunicator::DoReduceScatter(const void* send, void* recv,
                                               size_t recv_count, DType dtype,
                                               ReduceOp op, Stream& stream) {
  MW_ASSIGN_OR_RETURN(cudaStream_t s, CudaStreamOf(stream, "ReduceScatter"));
  return NcclStatus(ncclReduceScatter(send, recv, recv_count, NcclType(dtype),
                                      NcclOp(op), comm_, s),
                    "ncclReduceScatter");
}

absl::Status NcclCommunicator::DoAllGather(const void* send, void* recv,
                                           size_t send_count, DType dtype,
                                           Stream& stream) {
  MW_ASSIGN_OR_RETURN(cudaStream_t s, CudaStreamOf(stream, "AllGather"));
  return NcclStatus(ncclAllGather(send, recv, send_count, NcclType(dtype), comm_, s),
                    "ncclAllGather");
}

absl::Status NcclCommunicator::DoAllToAll(const void* send, void* recv, size_t send_count,
                                          DType dtype, Stream& stream) {
  MW_ASSIGN_OR_RETURN(cudaStream_t s, CudaStreamOf(stream, "AllToAll"));
  // NCCL has no all-to-all of its own: one send and one receive per peer,
  // grouped into one operation.
  const size_t bytes = send_count * DTypeSize(dtype);
  MW_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
  absl::Status posted = absl::OkStatus();
  for (int r = 0; r < world_size() && posted.ok(); ++r) {
    posted = NcclStatus(ncclSend(static_cast<const char*>(send) + r * bytes, send_count,
                                 NcclType(dtype), r, comm_, s),
                        "ncclSend");
    if (posted.ok()) {
      posted = NcclStatus(ncclRecv(static_cast<char*>(recv) + r * bytes, send_count,
                                   NcclType(dtype), r, comm_, s),
                          "ncclRecv");
    }
  }
  const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  MW_RETURN_IF_ERROR(posted);
  return ended;
}

absl::Status NcclCommunicator::DoBroadcast(void* buffer, size_t count, DType dtype,
                                           int root, Stream& stream) {
  MW_ASSIGN_OR_RETURN(cudaStream_t s, CudaStreamOf(stream, "Broadcast"));
  return NcclStatus(
      ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm_, s),
      "ncclBroadcast");
}

absl::Status NcclCommunicator::DoBarrier() {
  // NCCL has no barrier; the host-side ranks meet over MPI.
  return bootstrap_.Barrier();
}

}  // namespace memwall
