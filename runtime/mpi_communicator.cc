#include "runtime/mpi_communicator.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/status.h"

namespace memwall {
namespace {

// MPI has no 16-bit float types: bf16 and f16 travel as 2-byte contiguous
// types of their own and reduce through user-defined operations that widen
// to f32, combine, and round back (to nearest even), as NCCL does.
struct MpiTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  // Indexed [dtype][op] for the 16-bit dtypes.
  MPI_Op ops[kNumDTypes][3] = {};
};

struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return std::min(a, b); }
};

template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float), typename Combine>
void Reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    b[i] = FromF32(Combine()(ToF32(a[i]), ToF32(b[i])));
  }
}

absl::once_flag types_once;
MpiTypes* types = nullptr;

absl::Status InitTypes() {
  absl::Status status;
  absl::call_once(types_once, [&status] {
    auto* t = new MpiTypes;
    auto check = [&status](int code, absl::string_view call) {
      if (status.ok()) status = MpiStatus(code, call);
    };
    check(MPI_Type_contiguous(2, MPI_BYTE, &t->bf16), "MPI_Type_contiguous");
    check(MPI_Type_commit(&t->bf16), "MPI_Type_commit");
    check(MPI_Type_contiguous(2, MPI_BYTE, &t->f16), "MPI_Type_contiguous");
    check(MPI_Type_commit(&t->f16), "MPI_Type_commit");
    const int bf16 = static_cast<int>(DType::kBF16), f16 = static_cast<int>(DType::kF16);
    check(MPI_Op_create(&Reduce16<Bf16ToF32, F32ToBf16, Sum>, 1, &t->ops[bf16][0]), "MPI_Op_create");
    check(MPI_Op_create(&Reduce16<Bf16ToF32, F32ToBf16, Max>, 1, &t->ops[bf16][1]), "MPI_Op_create");
    check(MPI_Op_create(&Reduce16<Bf16ToF32, F32ToBf16, Min>, 1, &t->ops[bf16][2]), "MPI_Op_create");
    check(MPI_Op_create(&Reduce16<F16ToF32, F32ToF16, Sum>, 1, &t->ops[f16][0]), "MPI_Op_create");
    check(MPI_Op_create(&Reduce16<F16ToF32, F32ToF16, Max>, 1, &t->ops[f16][1]), "MPI_Op_create");
    check(MPI_Op_create(&Reduce16<F16ToF32, F32ToF16, Min>, 1, &t->ops[f16][2]), "MPI_Op_create");
    types = t;
  });
  if (!status.ok()) return status;
  if (types == nullptr) return absl::InternalError("MPI datatypes failed to initialise earlier");
  return absl::OkStatus();
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16: return types->bf16;
    case DType::kF16: return types->f16;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiOp(DType dtype, ReduceOp op) {
  if (dtype == DType::kF32) {
    switch (op) {
      case ReduceOp::kSum: return MPI_SUM;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kMin: return MPI_MIN;
    }
  }
  const int index = static_cast<int>(op);
  MW_CHECK(index >= 0 && index < 3);
  return types->ops[static_cast<int>(dtype)][index];
}

// MPI counts are ints; larger collectives are issued in pieces of this many
// elements (a multiple of every dtype's vector width).
constexpr size_t kMaxChunkElements = size_t{1} << 30;

// Wait's polling: a collective among ranks that are all present completes
// in microseconds to milliseconds, so it spins this many MPI_Tests first,
// then yields the core between tests (ranks often share cores with each
// other and with their compute threads), and reads the clock once per this
// many polls.
constexpr int64_t kSpinPolls = 4096;
constexpr int64_t kPollsPerClockRead = 256;

void FinalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI initialised (asking for MPI_THREAD_MULTIPLE) unless it is, and
// finalised at exit.
absl::Status StartMpi() {
  int initialized = 0;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Initialized(&initialized), "MPI_Initialized"));
  if (!initialized) {
    int provided = 0;
    MW_RETURN_IF_ERROR(MpiStatus(
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
        "MPI_Init_thread"));
    std::atexit(FinalizeMpi);
  }
  return absl::OkStatus();
}

// The world JoinWorld made; MPI_COMM_NULL: MPI_COMM_WORLD is the world. Set
// once, by JoinWorld, before any communicator is made from the world.
MPI_Comm joined_world = MPI_COMM_NULL;

MPI_Comm World() { return joined_world != MPI_COMM_NULL ? joined_world : MPI_COMM_WORLD; }

// Before OpenJoinPorts and JoinWorld: MPI started, kFailedPrecondition
// naming `call` if this process already runs among other ranks (launched
// by mpirun, or joined), and the singleton's errors returned.
absl::Status StartJoining(absl::string_view call) {
  MW_RETURN_IF_ERROR(StartMpi());
  int size = 1;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(World(), &size), "MPI_Comm_size"));
  if (size > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": this process already runs among ", size, " MPI ranks (",
        joined_world != MPI_COMM_NULL ? "joined before" : "launched by mpirun", ")"));
  }
  // A singleton's calls outside any communicator (MPI_Open_port) report to
  // MPI_COMM_WORLD's handler, its connect and accept to MPI_COMM_SELF's:
  // errors returned, not the process ended.
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                               "MPI_Comm_set_errhandler"));
  return MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN),
                   "MPI_Comm_set_errhandler");
}

// Each rank's node, named by its lowest rank: the ranks whose host names
// (MPI_Get_processor_name) are equal. Collective over `comm`.
absl::StatusOr<std::vector<int>> NodesByHostName(MPI_Comm comm, int size) {
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Get_processor_name(mine, &length), "MPI_Get_processor_name"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                                             MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm),
                               "MPI_Allgather (each rank's host name)"));
  absl::flat_hash_map<std::string, int> lowest;  // host name -> its lowest rank
  std::vector<int> node_ids(size);
  for (int r = 0; r < size; ++r) {
    const char* name = names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    node_ids[r] = lowest.emplace(std::string(name, strnlen(name, MPI_MAX_PROCESSOR_NAME)), r)
                      .first->second;
  }
  return node_ids;
}

absl::Status CheckHostStream(const Stream& stream, absl::string_view call) {
  if (stream.native_handle() != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": the MPI communicator works on host memory; use a host or "
              "meta stream (use the NCCL communicator for cuda)"));
  }
  return absl::OkStatus();
}

// "3", "1 and 3", "1, 2 and 3".
template <typename Int>
std::string Listed(const std::vector<Int>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppend(&text, i == 0 ? "" : i + 1 == values.size() ? " and " : ", ", values[i]);
  }
  return text;
}

}  // namespace

void AbortRanks(int code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(World(), &size);
  if (size > 1) {
    std::fflush(stderr);
    MPI_Abort(World(), code);
  }
}

absl::Status MpiStatus(int code, absl::string_view call) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::InternalError(absl::StrCat(call, ": ", absl::string_view(text, length)));
}

absl::StatusOr<MpiPlace> MpiWorld() {
  MW_RETURN_IF_ERROR(StartMpi());
  MpiPlace place;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(World(), &place.rank), "MPI_Comm_rank"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(World(), &place.size), "MPI_Comm_size"));
  return place;
}

absl::StatusOr<std::vector<std::string>> OpenJoinPorts(int size) {
  if (size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenJoinPorts: size: expected at least 2 ranks, got ", size));
  }
  MW_RETURN_IF_ERROR(StartJoining("OpenJoinPorts"));
  std::vector<std::string> ports;
  for (int k = 1; k < size; ++k) {
    char port[MPI_MAX_PORT_NAME] = {};
    MW_RETURN_IF_ERROR(MpiStatus(MPI_Open_port(MPI_INFO_NULL, port), "OpenJoinPorts: MPI_Open_port"));
    ports.emplace_back(port);
  }
  return ports;
}

absl::Status JoinWorld(int rank, int size, const std::vector<std::string>& ports) {
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("JoinWorld: rank: expected 0 to ", size - 1, ", got ", rank));
  }
  if (ports.size() + 1 != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JoinWorld: ports: expected ", size - 1, " (one per rank after the first), got ",
        ports.size()));
  }
  MW_RETURN_IF_ERROR(StartJoining("JoinWorld"));
  constexpr absl::string_view kServer =
      " (processes started without mpirun join through a common ompi-server: "
      "OMPI_MCA_pmix_server_uri must name it in every process's environment when MPI starts)";
  MPI_Comm current = MPI_COMM_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_SELF, &current), "MPI_Comm_dup"));
  // Joins the rank connecting on `port` to `current` (this rank's side:
  // `accepting` or connecting), it ordered after current's ranks.
  auto grow = [&](const std::string& port, bool accepting) -> absl::Status {
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    const int rc = accepting
        ? MPI_Comm_accept(port.c_str(), MPI_INFO_NULL, 0, current, &inter)
        : MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, current, &inter);
    if (rc != MPI_SUCCESS) {
      return absl::InternalError(absl::StrCat(
          "JoinWorld: rank ", rank, ": ", MpiStatus(rc, accepting ? "MPI_Comm_accept"
                                                                  : "MPI_Comm_connect").message(),
          kServer));
    }
    const int merge = MPI_Intercomm_merge(inter, accepting ? 0 : 1, &merged);
    MPI_Comm_free(&inter);
    MW_RETURN_IF_ERROR(MpiStatus(merge, "JoinWorld: MPI_Intercomm_merge"));
    MPI_Comm_free(&current);
    current = merged;
    return MpiStatus(MPI_Comm_set_errhandler(current, MPI_ERRORS_RETURN),
                     "MPI_Comm_set_errhandler");
  };
  if (rank > 0) MW_RETURN_IF_ERROR(grow(ports[rank - 1], /*accepting=*/false));
  for (int k = rank + 1; k < size; ++k) MW_RETURN_IF_ERROR(grow(ports[k - 1], /*accepting=*/true));
  int joined_rank = -1, joined_size = 0;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(current, &joined_rank), "MPI_Comm_rank"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(current, &joined_size), "MPI_Comm_size"));
  if (joined_rank != rank || joined_size != size) {
    return absl::InternalError(absl::StrCat("JoinWorld: joined as rank ", joined_rank, " of ",
                                            joined_size, ", expected ", rank, " of ", size));
  }
  if (rank == 0) {
    for (const std::string& port : ports) MPI_Close_port(port.c_str());
  }
  joined_world = current;
  return absl::OkStatus();
}

absl::StatusOr<int> RanksPerNodeFromEnvironment() {
  const char* posed = std::getenv("MEMWALL_RANKS_PER_NODE");
  if (posed == nullptr) return 0;
  int ranks_per_node = 0;
  if (!absl::SimpleAtoi(posed, &ranks_per_node) || ranks_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MEMWALL_RANKS_PER_NODE: expected an integer >= 1, got '", posed, "'"));
  }
  return ranks_per_node;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    CommunicatorOptions options) {
  MW_RETURN_IF_ERROR(StartMpi());
  MW_RETURN_IF_ERROR(InitTypes());
  MPI_Comm comm = MPI_COMM_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(World(), &comm), "MPI_Comm_dup"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                               "MPI_Comm_set_errhandler"));
  int rank = 0, size = 1, level = MPI_THREAD_SINGLE;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(comm, &size), "MPI_Comm_size"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Query_thread(&level), "MPI_Query_thread"));
  std::unique_ptr<MpiCommunicator> created(new MpiCommunicator(
      comm, rank, size, options, /*threads_allowed=*/level >= MPI_THREAD_SERIALIZED));
  MW_ASSIGN_OR_RETURN(const int posed, RanksPerNodeFromEnvironment());
  if (posed > 0) {
    MW_RETURN_IF_ERROR(created->SetRanksPerNode(posed));
    return created;
  }
  if (joined_world != MPI_COMM_NULL) {
    MW_ASSIGN_OR_RETURN(const std::vector<int> node_ids, NodesByHostName(comm, size));
    created->set_node_of(node_ids);
    return created;
  }
  // The nodes: ranks that share memory are one, named by its lowest rank.
  MPI_Comm node = MPI_COMM_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type (MPI_COMM_TYPE_SHARED)"));
  int lowest = rank;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  MW_RETURN_IF_ERROR(MpiStatus(rc, "MPI_Allreduce (this node's lowest rank)"));
  std::vector<int> node_ids(size);
  MW_RETURN_IF_ERROR(MpiStatus(
      MPI_Allgather(&lowest, 1, MPI_INT, node_ids.data(), 1, MPI_INT, comm),
      "MPI_Allgather (each rank's node)"));
  created->set_node_of(node_ids);
  return created;
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::DoSplit(int color, int position,
                                                                      int size) {
  MW_ASSIGN_OR_RETURN(std::unique_ptr<MpiCommunicator> group, SplitMpi(color, position, size));
  return std::unique_ptr<Communicator>(std::move(group));
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::SplitMpi(int color,
                                                                          int position,
                                                                          int size) {
  MPI_Comm comm = MPI_COMM_NULL;
  MW_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_split(comm_, color, position, &comm), "MPI_Comm_split"));
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                               "MPI_Comm_set_errhandler"));
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, position, size, options(), threads_allowed_));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int world_size,
                                 CommunicatorOptions options, bool threads_allowed)
    : Communicator(rank, world_size, options), comm_(comm), threads_allowed_(threads_allowed) {
  int64_t* memory = nullptr;
  MPI_Win board = MPI_WIN_NULL;
  // MPI_Win_allocate reports on comm_'s handler (errors returned): a
  // library without a window for this communicator leaves it unboarded.
  if (MPI_Win_allocate(kBoardSlots * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, comm_,
                       &memory, &board) != MPI_SUCCESS) {
    return;
  }
  MPI_Win_set_errhandler(board, MPI_ERRORS_RETURN);
  // The slots are written with plain stores and read long after: that
  // needs the unified memory model (stores reach the others' reads without
  // a synchronising call, as with shared memory and RDMA). The model is the
  // window's, alike on every rank, so all free it together.
  int* model = nullptr;
  int has_model = 0;
  if (MPI_Win_get_attr(board, MPI_WIN_MODEL, &model, &has_model) != MPI_SUCCESS ||
      !has_model || *model != MPI_WIN_UNIFIED) {
    MPI_Win_free(&board);
    return;
  }
  if (MPI_Win_lock_all(MPI_MODE_NOCHECK, board) != MPI_SUCCESS) return;
  std::fill(memory, memory + kBoardSlots, 0);
  board_ = board;
  slots_ = memory;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::Wait(MPI_Request& request, absl::string_view call) {
  // Every rank posts the same collectives on comm_ in the same order, each
  // waited here once: the count is where this rank has got to.
  const int64_t posted = ++slots_[kPosted];
  const absl::Duration timeout = options().timeout;
  if (timeout == absl::InfiniteDuration()) {
    MW_RETURN_IF_ERROR(MpiStatus(MPI_Wait(&request, MPI_STATUS_IGNORE), call));
    slots_[kCompleted] = posted;
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    MW_RETURN_IF_ERROR(MpiStatus(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call));
    if (done) {
      slots_[kCompleted] = posted;
      return absl::OkStatus();
    }
    ++slots_[kPolls];
    if (polls >= kSpinPolls) std::this_thread::yield();
    if (polls % kPollsPerClockRead == 0 && absl::Now() >= deadline) {
      // MPI cannot cancel a collective: the request stays posted and the
      // communicator breaks (Guard), so this rank issues nothing after it.
      return absl::DeadlineExceededError(absl::StrCat(
          call, " on rank ", rank(), " of ", world_size(), ": not every rank joined within ",
          absl::FormatDuration(timeout),
          " (a rank failed, is stuck or stopped calling collectives)", Absentees(posted)));
    }
  }
}

std::vector<std::array<int64_t, MpiCommunicator::kBoardSlots>> MpiCommunicator::ReadBoard(
    absl::Time deadline, std::vector<bool>& read) {
  const int n = world_size();
  // MPI may still write into a read that never completes: its buffer is
  // then left to it (the communicator is broken; the job ends).
  std::unique_ptr<std::array<int64_t, kBoardSlots>[]> slots(
      new std::array<int64_t, kBoardSlots>[n]);
  std::vector<MPI_Request> requests(n, MPI_REQUEST_NULL);
  read.assign(n, false);
  for (int r = 0; r < n; ++r) {
    if (r == rank()) {
      std::copy(slots_, slots_ + kBoardSlots, slots[r].begin());
      read[r] = true;
    } else if (MPI_Rget(slots[r].data(), kBoardSlots, MPI_INT64_T, r, 0, kBoardSlots,
                        MPI_INT64_T, board_, &requests[r]) != MPI_SUCCESS) {
      requests[r] = MPI_REQUEST_NULL;
    }
  }
  for (bool pending = true; pending && absl::Now() < deadline;) {
    pending = false;
    for (int r = 0; r < n; ++r) {
      if (read[r] || requests[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&requests[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        requests[r] = MPI_REQUEST_NULL;
      } else if (done) {
        read[r] = true;
      } else {
        pending = true;
      }
    }
    if (pending) std::this_thread::yield();
  }
  std::vector<std::array<int64_t, kBoardSlots>> result(slots.get(), slots.get() + n);
  if (std::find(read.begin(), read.end(), false) != read.end()) slots.release();
  return result;
}

std::string MpiCommunicator::Absentees(int64_t posted) {
  if (board_ == MPI_WIN_NULL) {
    return "; which ranks never arrived is unknown (MPI offered no one-sided window to read "
           "them)";
  }
  // Those that time out in it too stop polling: they say so first.
  slots_[kGaveUp] = posted;
  const absl::Duration grace = std::min(options().timeout, absl::Seconds(1));
  std::vector<bool> read;
  const auto first = ReadBoard(absl::Now() + grace, read);
  std::vector<int> absent, silent, stalled;
  std::vector<int64_t> theirs;
  for (int r = 0; r < world_size(); ++r) {
    if (!read[r]) {
      silent.push_back(r);
    } else if (first[r][kPosted] < posted) {
      absent.push_back(r);
      theirs.push_back(first[r][kPosted]);
    } else if (r != rank() && first[r][kPosted] == posted && first[r][kCompleted] < posted) {
      stalled.push_back(r);  // posted it and waits in it, or stopped there: watched below
    }
  }
  // A rank waiting in it polls, or gives up at its own timeout; a live rank
  // the scheduler set aside resumes within the grace. Those whose polls
  // stand still for all of it have stopped inside it.
  const absl::Time watched = absl::Now() + grace;
  while (!stalled.empty() && absl::Now() < watched) {
    absl::SleepFor(absl::Milliseconds(20));
    std::vector<bool> again;
    const auto now = ReadBoard(absl::Now() + grace, again);
    stalled.erase(std::remove_if(stalled.begin(), stalled.end(),
                                 [&](int r) {
                                   return again[r] && (now[r][kPolls] != first[r][kPolls] ||
                                                       now[r][kCompleted] >= posted ||
                                                       now[r][kGaveUp] >= posted);
                                 }),
                  stalled.end());
  }
  std::string said;
  if (!absent.empty()) {
    absl::StrAppend(&said, "; never arrived: ", NameRanks(absent), ", which had posted ",
                    Listed(theirs), " of this communicator's MPI collectives to this rank's ",
                    posted);
  }
  if (!stalled.empty()) {
    absl::StrAppend(&said, "; stalled inside it: ", NameRanks(stalled),
                    " (posted it, then stopped polling: a stopped process, or stuck in MPI)");
  }
  if (!silent.empty()) {
    absl::StrAppend(&said, "; ", NameRanks(silent), " could not be read within ",
                    absl::FormatDuration(grace), " (whether ", silent.size() == 1 ? "it" : "they",
                    " arrived is unknown)");
  }
  if (said.empty()) {
    said = "; every rank arrived and is polling (the transfer itself outlasted the timeout)";
  }
  return said;
}

std::string MpiCommunicator::NameRanks(const std::vector<int>& ranks) const {
  std::string named = absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", Listed(ranks));
  std::vector<int> world(ranks.size(), MPI_UNDEFINED);
  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  if (MPI_Comm_group(comm_, &group) == MPI_SUCCESS &&
      MPI_Comm_group(World(), &world_group) == MPI_SUCCESS &&
      MPI_Group_translate_ranks(group, static_cast<int>(ranks.size()), ranks.data(),
                                world_group, world.data()) == MPI_SUCCESS &&
      world != ranks) {
    absl::StrAppend(&named, " (world ", ranks.size() == 1 ? "rank " : "ranks ", Listed(world),
                    ")");
  }
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
  return named;
}

absl::Status MpiCommunicator::AllReduceHost(void* values, int count, MPI_Datatype type,
                                            MPI_Op op, absl::string_view what) {
  MW_RETURN_IF_ERROR(FailedEarlier(what));
  int size = 0;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Type_size(type, &size), "MPI_Type_size"));
  const size_t bytes = static_cast<size_t>(size) * count;
  // Reduced in a buffer of its own that a timed-out exchange leaves to MPI,
  // so a rank arriving late never writes into the caller's memory.
  std::unique_ptr<char[]> buffer(new char[bytes]);
  std::memcpy(buffer.get(), values, bytes);
  MPI_Request request = MPI_REQUEST_NULL;
  absl::Status status = MpiStatus(
      MPI_Iallreduce(MPI_IN_PLACE, buffer.get(), count, type, op, comm_, &request),
      absl::StrCat("MPI_Iallreduce (", what, ")"));
  if (status.ok()) status = Wait(request, absl::StrCat("MPI_Iallreduce (", what, ")"));
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kDeadlineExceeded) buffer.release();
    return Break(status);
  }
  std::memcpy(values, buffer.get(), bytes);
  return absl::OkStatus();
}

absl::StatusOr<int> MpiCommunicator::RanksOnThisNode() {
  MPI_Comm node;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node) !=
      MPI_SUCCESS) {
    return absl::InternalError("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  }
  int size = 0;
  const int rc = MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) return absl::InternalError("MPI_Comm_size failed on this node's ranks");
  return size;
}

absl::Status MpiCommunicator::MinMaxOverRanks(const std::vector<int64_t>& values,
                                              std::vector<int64_t>& min,
                                              std::vector<int64_t>& max) {
  // One all-reduce of (v, -v) per field gives each field's max and min.
  const size_t n = values.size();
  std::vector<int64_t> both(2 * n);
  for (size_t i = 0; i < n; ++i) {
    both[i] = values[i];
    both[n + i] = -values[i];
  }
  MW_RETURN_IF_ERROR(AllReduceHost(both.data(), static_cast<int>(2 * n), MPI_INT64_T, MPI_MAX,
                                   "agreement check"));
  max.assign(both.begin(), both.begin() + n);
  min.resize(n);
  for (size_t i = 0; i < n; ++i) min[i] = -both[n + i];
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Execute(Stream& stream,
                                      std::function<absl::Status()> collective) {
  if (stream.native_handle() != nullptr || !threads_allowed_) return collective();
  return stream.RunHost(std::move(collective));
}

absl::Status MpiCommunicator::Agree(const Signature& signature) {
  return AgreeTimed(signature, [this](const std::vector<int64_t>& values,
                                      std::vector<int64_t>& min, std::vector<int64_t>& max) {
    return MinMaxOverRanks(values, min, max);
  });
}

absl::Status MpiCommunicator::DoAllReduce(const void* send, void* recv,
                                          size_t count, DType dtype, ReduceOp op,
                                          Stream& stream) {
  MW_RETURN_IF_ERROR(CheckHostStream(stream, "AllReduce"));
  const size_t size = DTypeSize(dtype);
  for (size_t done = 0; done < count; done += kMaxChunkElements) {
    const size_t n = std::min(kMaxChunkElements, count - done);
    char* out = static_cast<char*>(recv) + done * size;
    const void* in = send == recv ? MPI_IN_PLACE
                                  : static_cast<const char*>(send) + done * size;
    MPI_Request request = MPI_REQUEST_NULL;
    MW_RETURN_IF_ERROR(MpiStatus(MPI_Iallreduce(in, out, static_cast<int>(n), MpiType(dtype),
                                                MpiOp(dtype, op), comm_, &request),
                                 "MPI_Iallreduce"));
    MW_RETURN_IF_ERROR(Wait(request, "AllReduce (MPI_Iallreduce)"));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoReduceScatter(const void* send, void* recv,
                                              size_t recv_count, DType dtype,
                                              ReduceOp op, Stream& stream) {
  MW_RETURN_IF_ERROR(CheckHostStream(stream, "ReduceScatter"));
  if (recv_count > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReduceScatter: ", recv_count, " elements per rank exceed MPI's int count"));
  }
  const size_t bytes = recv_count * DTypeSize(dtype);
  const char* own_chunk = static_cast<const char*>(send) + rank() * bytes;
  // MPI's in-place form reads the whole input from recv, a different layout
  // from NCCL's (recv inside send); reduce into a temporary instead.
  std::unique_ptr<char[]> staging;
  void* out = recv;
  if (recv == own_chunk && bytes > 0) {
    staging.reset(new char[bytes]);
    out = staging.get();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(
      MPI_Ireduce_scatter_block(send, out, static_cast<int>(recv_count), MpiType(dtype),
                                MpiOp(dtype, op), comm_, &request),
      "MPI_Ireduce_scatter_block"));
  if (absl::Status done = Wait(request, "ReduceScatter (MPI_Ireduce_scatter_block)");
      !done.ok()) {
    // The request stays posted: leave the staging to it (the caller's
    // buffers are the caller's; see communicator.h).
    if (done.code() == absl::StatusCode::kDeadlineExceeded) staging.release();
    return done;
  }
  if (staging) std::memcpy(recv, staging.get(), bytes);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoAllGather(const void* send, void* recv,
                                          size_t send_count, DType dtype,
                                          Stream& stream) {
  MW_RETURN_IF_ERROR(CheckHostStream(stream, "AllGather"));
  if (send_count > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather: ", send_count, " elements per rank exceed MPI's int count"));
  }
  const size_t bytes = send_count * DTypeSize(dtype);
  const void* in = send == static_cast<const char*>(recv) + rank() * bytes
                       ? MPI_IN_PLACE
                       : send;
  MPI_Request request = MPI_REQUEST_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Iallgather(in, static_cast<int>(send_count), MpiType(dtype),
                                              recv, static_cast<int>(send_count),
                                              MpiType(dtype), comm_, &request),
                               "MPI_Iallgather"));
  return Wait(request, "AllGather (MPI_Iallgather)");
}

absl::Status MpiCommunicator::DoBroadcast(void* buffer, size_t count, DType dtype,
                                          int root, Stream& stream) {
  MW_RETURN_IF_ERROR(CheckHostStream(stream, "Broadcast"));
  const size_t size = DTypeSize(dtype);
  for (size_t done = 0; done < count; done += kMaxChunkElements) {
    const size_t n = std::min(kMaxChunkElements, count - done);
    MPI_Request request = MPI_REQUEST_NULL;
    MW_RETURN_IF_ERROR(MpiStatus(MPI_Ibcast(static_cast<char*>(buffer) + done * size,
                                            static_cast<int>(n), MpiType(dtype), root, comm_,
                                            &request),
                                 "MPI_Ibcast"));
    MW_RETURN_IF_ERROR(Wait(request, "Broadcast (MPI_Ibcast)"));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::DoAllToAll(const void* send, void* recv, size_t send_count,
                                         DType dtype, Stream& stream) {
  MW_RETURN_IF_ERROR(CheckHostStream(stream, "AllToAll"));
  if (send_count > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllToAll: ", send_count, " elements per rank exceed MPI's int count"));
  }
  MPI_Request request = MPI_REQUEST_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Ialltoall(send, static_cast<int>(send_count), MpiType(dtype),
                                             recv, static_cast<int>(send_count), MpiType(dtype),
                                             comm_, &request),
                               "MPI_Ialltoall"));
  return Wait(request, "AllToAll (MPI_Ialltoall)");
}

absl::Status MpiCommunicator::DoBarrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  MW_RETURN_IF_ERROR(MpiStatus(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier"));
  return Wait(request, "Barrier (MPI_Ibarrier)");
}

}  // namespace memwall
