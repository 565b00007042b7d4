#include "runtime/communicator.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/status.h"

namespace memwall {

absl::string_view CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce: return "AllReduce";
    case Collective::kReduceScatter: return "ReduceScatter";
    case Collective::kAllGather: return "AllGather";
    case Collective::kBroadcast: return "Broadcast";
    case Collective::kBarrier: return "Barrier";
    case Collective::kAllToAll: return "AllToAll";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

LinkBytes LinkBytesOf(Collective collective, int64_t bytes, int ranks, int nodes) {
  if (collective == Collective::kAllToAll) {
    const int64_t per_node = ranks / nodes;
    return {(per_node - 1) * bytes, (ranks - per_node) * bytes};
  }
  const int64_t passes = collective == Collective::kAllReduce ? 2
                         : collective == Collective::kBarrier ? 0
                                                              : 1;
  return {passes * (ranks - nodes) * bytes, passes * (nodes - 1) * bytes};
}

int64_t Communicator::total_bytes() const {
  int64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.bytes;
  return total;
}

LinkBytes Communicator::total_link_bytes() const {
  LinkBytes total;
  for (const CollectiveStats& s : stats_) {
    total.intra_node += s.intra_node_bytes;
    total.inter_node += s.inter_node_bytes;
  }
  return total;
}

absl::Status Communicator::SetRanksPerNode(int ranks_per_node) {
  if (ranks_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks per node: expected >= 1, got ", ranks_per_node));
  }
  std::vector<int> node_ids(world_size_);
  for (int r = 0; r < world_size_; ++r) node_ids[r] = r / ranks_per_node;
  set_node_of(node_ids);
  return absl::OkStatus();
}

void Communicator::set_node_of(const std::vector<int>& node_ids) {
  // Renumbered in order of first appearance: node_of(0) is 0.
  std::map<int, int> number;
  for (int r = 0; r < world_size_; ++r) {
    const auto [it, added] = number.emplace(node_ids[r], static_cast<int>(number.size()));
    node_of_[r] = it->second;
  }
  nodes_ = static_cast<int>(number.size());
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(
    int color, const std::vector<int>& members) {
  MW_RETURN_IF_ERROR(FailedEarlier("Split"));
  const int position =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  MW_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                      DoSplit(color, position, static_cast<int>(members.size())));
  std::vector<int> node_ids;
  for (int m : members) node_ids.push_back(node_of_[m]);
  group->set_node_of(node_ids);
  group->parent_ = this;
  group->parent_groups_ = world_size_ / group->world_size_;
  return group;
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::SplitNode() {
  std::vector<int> members;
  for (int r = 0; r < world_size_; ++r) {
    if (node_of_[r] == node_of_[rank_]) members.push_back(r);
  }
  return Split(node_of_[rank_], members);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::SplitBlocks(int size) {
  if (size < 1 || world_size_ % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size: expected a divisor of the ", world_size_, " ranks, got ", size));
  }
  std::vector<int> members;
  const int first = rank_ / size * size;
  for (int r = first; r < first + size; ++r) members.push_back(r);
  return Split(rank_ / size, members);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::SplitStrided(int stride) {
  if (stride < 1 || world_size_ % stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group stride: expected a divisor of the ", world_size_, " ranks, got ", stride));
  }
  std::vector<int> members;
  for (int r = rank_ % stride; r < world_size_; r += stride) members.push_back(r);
  return Split(rank_ % stride, members);
}

std::array<int64_t, 5> Communicator::Encode(const Signature& signature) {
  return {static_cast<int64_t>(signature.collective), signature.count,
          static_cast<int64_t>(signature.dtype), static_cast<int64_t>(signature.op),
          signature.root};
}

absl::Status Communicator::DisagreementError(const Signature& mine,
                                             const std::array<int64_t, 5>& min,
                                             const std::array<int64_t, 5>& max) const {
  const std::string call =
      absl::StrCat(CollectiveName(mine.collective), " on rank ", rank_, " of ",
                   world_size_, ": ");
  if (min[0] != max[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, "ranks called different collectives at the same point"));
  }
  if (min[1] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, "another rank rejected its arguments to this call (see its error)"));
  }
  if (min[1] != max[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, "ranks disagree on the element count (from ", min[1], " to ",
        max[1], "; this rank passed ", mine.count, ")"));
  }
  if (min[2] != max[2]) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, "ranks disagree on the dtype (this rank passed ",
        DTypeName(mine.dtype), ")"));
  }
  if (min[3] != max[3]) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, "ranks disagree on the reduction (this rank passed ",
        ReduceOpName(mine.op), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      call, "ranks disagree on the root (from ", min[4], " to ", max[4],
      "; this rank passed ", mine.root, ")"));
}

absl::Status Communicator::Prepare(const Signature& signature, bool has_null_buffer,
                                   absl::Status local) {
  const std::string call = absl::StrCat(CollectiveName(signature.collective),
                                        " on rank ", rank_, " of ", world_size_);
  // Local checks first, but every rank still joins the agreement round so a
  // bad call on one rank cannot leave the others hanging in the collective.
  if (local.ok() && (signature.root < 0 || signature.root >= world_size_)) {
    local = absl::InvalidArgumentError(absl::StrCat(
        call, ": root ", signature.root, " is not a rank (expected 0..",
        world_size_ - 1, ")"));
  } else if (local.ok() && has_null_buffer && signature.count > 0 && moves_bytes()) {
    local = absl::InvalidArgumentError(
        absl::StrCat(call, ": a buffer is null but count is ", signature.count));
  }
  if (options_.check_agreement) {
    Signature shared = signature;
    // A rank with a local error poisons the agreement (count -1) so every
    // rank fails together.
    if (!local.ok()) shared.count = -1;
    absl::Status agreed = Agree(shared);
    if (!local.ok()) return local;
    return agreed;
  }
  return local;
}

absl::Status Communicator::AgreeTimed(const Signature& signature, const MinMax& min_max) {
  // Fields 5 and 6: the last round's wait (us), and wait * 2^20 + rank, whose
  // minimum names the rank that waited least (ties: the lower rank).
  constexpr int64_t kRankBits = 20;
  const std::array<int64_t, 5> encoded = Encode(signature);
  std::vector<int64_t> values(encoded.begin(), encoded.end());
  values.push_back(previous_wait_us_);
  values.push_back(previous_wait_us_ < 0 ? -1 : (previous_wait_us_ << kRankBits) + rank_);
  std::vector<int64_t> min, max;
  const absl::Time start = absl::Now();
  MW_RETURN_IF_ERROR(min_max(values, min, max));
  previous_wait_us_ = std::min<int64_t>(absl::ToInt64Microseconds(absl::Now() - start),
                                        (int64_t{1} << 40) - 1);
  if (min[5] >= 0) {
    const int64_t last = min[6] & ((int64_t{1} << kRankBits) - 1);
    ++arrivals_.last[last];
    arrivals_.cost[last] += double(max[5] - min[5]) * 1e-6;
  }
  const std::array<int64_t, 5> lo = {min[0], min[1], min[2], min[3], min[4]};
  const std::array<int64_t, 5> hi = {max[0], max[1], max[2], max[3], max[4]};
  if (lo == hi) return absl::OkStatus();
  return DisagreementError(signature, lo, hi);
}

absl::Status Communicator::health() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

int64_t Communicator::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

void Communicator::InjectFailure(int64_t call) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_at_ = call;
}

absl::Status Communicator::FailedEarlier(absl::string_view what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_.ok()) return absl::OkStatus();
  return absl::Status(broken_.code(),
                      absl::StrCat(what, " on rank ", rank_, " of ", world_size_,
                                   ": the communicator failed earlier (", broken_.message(), ")"));
}

absl::Status Communicator::Guard(Collective collective,
                                 const std::function<absl::Status()>& body) {
  int64_t call = 0;
  bool inject = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    call = ++calls_;
    inject = call == fail_at_;
  }
  MW_RETURN_IF_ERROR(FailedEarlier(CollectiveName(collective)));
  if (inject) {
    return Break(absl::UnavailableError(
        absl::StrCat(CollectiveName(collective), " on rank ", rank_, " of ", world_size_,
                     ": injected failure of collective call ", call,
                     "; this rank left without joining the others")));
  }
  absl::Status status = body();
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) return Break(status);
  return status;
}

absl::Status Communicator::Break(const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Already broken: `error` is the breaking error on its way out (a control
  // exchange inside a collective broke it), or one after it.
  if (!broken_.ok()) return error;
  broken_ = absl::Status(error.code(),
                         absl::StrCat(error.message(),
                                      "; the communicator is unusable now: end the job and "
                                      "resume from the last checkpoint"));
  return broken_;
}

void Communicator::Count(Collective collective, int64_t bytes) {
  Add(collective, bytes, LinkBytesOf(collective, bytes, world_size_, nodes_));
}

void Communicator::Add(Collective collective, int64_t bytes, const LinkBytes& link) {
  CollectiveStats& s = stats_[static_cast<int>(collective)];
  ++s.calls;
  s.bytes += bytes;
  s.intra_node_bytes += link.intra_node;
  s.inter_node_bytes += link.inter_node;
  if (parent_ != nullptr) {
    parent_->Add(collective, bytes,
                 {link.intra_node * parent_groups_, link.inter_node * parent_groups_});
  }
}

void Communicator::CountRepeats(Collective collective, const CollectiveStats& delta,
                                int64_t repeats) {
  CollectiveStats& s = stats_[static_cast<int>(collective)];
  s.calls += delta.calls * repeats;
  s.bytes += delta.bytes * repeats;
  s.intra_node_bytes += delta.intra_node_bytes * repeats;
  s.inter_node_bytes += delta.inter_node_bytes * repeats;
  if (parent_ != nullptr) {
    parent_->CountRepeats(collective,
                          {delta.calls, delta.bytes, delta.intra_node_bytes * parent_groups_,
                           delta.inter_node_bytes * parent_groups_},
                          repeats);
  }
}

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count,
                                     DType dtype, ReduceOp op, Stream& stream) {
  return Execute(stream, [=, &stream] {
    return Guard(Collective::kAllReduce, [&] {
      MW_RETURN_IF_ERROR(
          Prepare({Collective::kAllReduce, static_cast<int64_t>(count), dtype, op, 0},
                  send == nullptr || recv == nullptr));
      MW_RETURN_IF_ERROR(DoAllReduce(send, recv, count, dtype, op, stream));
      Count(Collective::kAllReduce, static_cast<int64_t>(count * DTypeSize(dtype)));
      return absl::OkStatus();
    });
  });
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv,
                                         size_t recv_count, DType dtype,
                                         ReduceOp op, Stream& stream) {
  return Execute(stream, [=, &stream] {
    return Guard(Collective::kReduceScatter, [&] {
      MW_RETURN_IF_ERROR(Prepare(
          {Collective::kReduceScatter, static_cast<int64_t>(recv_count), dtype, op, 0},
          send == nullptr || recv == nullptr));
      MW_RETURN_IF_ERROR(DoReduceScatter(send, recv, recv_count, dtype, op, stream));
      Count(Collective::kReduceScatter,
            static_cast<int64_t>(recv_count * world_size_ * DTypeSize(dtype)));
      return absl::OkStatus();
    });
  });
}

absl::Status Communicator::AllGather(const void* send, void* recv,
                                     size_t send_count, DType dtype,
                                     Stream& stream) {
  return Execute(stream, [=, &stream] {
    return Guard(Collective::kAllGather, [&] {
      MW_RETURN_IF_ERROR(Prepare(
          {Collective::kAllGather, static_cast<int64_t>(send_count), dtype, ReduceOp::kSum, 0},
          send == nullptr || recv == nullptr));
      MW_RETURN_IF_ERROR(DoAllGather(send, recv, send_count, dtype, stream));
      Count(Collective::kAllGather,
            static_cast<int64_t>(send_count * world_size_ * DTypeSize(dtype)));
      return absl::OkStatus();
    });
  });
}

absl::Status Communicator::Broadcast(void* buffer, size_t count, DType dtype,
                                     int root, Stream& stream) {
  return Execute(stream, [=, &stream] {
    return Guard(Collective::kBroadcast, [&] {
      MW_RETURN_IF_ERROR(Prepare(
          {Collective::kBroadcast, static_cast<int64_t>(count), dtype, ReduceOp::kSum, root},
          buffer == nullptr));
      MW_RETURN_IF_ERROR(DoBroadcast(buffer, count, dtype, root, stream));
      Count(Collective::kBroadcast, static_cast<int64_t>(count * DTypeSize(dtype)));
      return absl::OkStatus();
    });
  });
}

absl::Status Communicator::AllToAll(const void* send, void* recv, size_t send_count,
                                    DType dtype, Stream& stream) {
  return Execute(stream, [=, &stream] {
    return Guard(Collective::kAllToAll, [&] {
      MW_RETURN_IF_ERROR(Prepare(
          {Collective::kAllToAll, static_cast<int64_t>(send_count), dtype, ReduceOp::kSum, 0},
          send == nullptr || recv == nullptr,
          send == recv && send != nullptr && send_count > 0
              ? absl::InvalidArgumentError(absl::StrCat(
                    "AllToAll on rank ", rank_, " of ", world_size_,
                    ": send and recv are the same buffer (not in place)"))
              : absl::OkStatus()));
      MW_RETURN_IF_ERROR(DoAllToAll(send, recv, send_count, dtype, stream));
      Count(Collective::kAllToAll,
            static_cast<int64_t>(send_count * world_size_ * DTypeSize(dtype)));
      return absl::OkStatus();
    });
  });
}

absl::Status Communicator::Barrier() {
  return Guard(Collective::kBarrier, [this] {
    MW_RETURN_IF_ERROR(DoBarrier());
    Count(Collective::kBarrier, 0);
    return absl::OkStatus();
  });
}

}  // namespace memwall
