#include "runtime/stream_order.h"

#include <algorithm>

#include "runtime/device.h"
#include "runtime/status.h"

namespace memwall {

StreamId StreamOrder::Register(Stream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const StreamId id = next_id_++;
  streams_[id] = stream;
  return id;
}

void StreamOrder::Unregister(StreamId id) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(id);
  // Its work has drained: blocks stamped with it are free for everyone.
  host_seen_[id] = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint64_t StreamOrder::Now() const { return clock_.load(std::memory_order_acquire); }

EventMark StreamOrder::OnRecord(StreamId stream) {
  return EventMark{stream, clock_.fetch_add(1, std::memory_order_acq_rel) + 1};
}

void StreamOrder::OnWait(StreamId waiter, const EventMark& event) {
  if (event.mark == 0 || event.stream == waiter) return;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& known = waited_[{waiter, event.stream}];
  known = std::max(known, event.mark);
}

void StreamOrder::OnHostWait(const EventMark& event) {
  if (event.mark == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& known = host_seen_[event.stream];
  known = std::max(known, event.mark);
}

void StreamOrder::OnStreamSynchronize(StreamId stream) {
  std::lock_guard<std::mutex> lock(mu_);
  host_seen_[stream] = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
  // Every wait enqueued on it has completed too, and with it the work it
  // waited for.
  for (auto it = waited_.lower_bound({stream, 0});
       it != waited_.end() && it->first.first == stream; ++it) {
    uint64_t& known = host_seen_[it->first.second];
    known = std::max(known, it->second);
  }
}

void StreamOrder::OnDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  device_seen_ = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint64_t StreamOrder::KnownLocked(StreamId user, StreamId stream) const {
  uint64_t known = device_seen_;
  if (auto it = host_seen_.find(stream); it != host_seen_.end()) {
    known = std::max(known, it->second);
  }
  if (user != kHostOrder) {
    if (auto it = waited_.find({user, stream}); it != waited_.end()) {
      known = std::max(known, it->second);
    }
  }
  return known;
}

bool StreamOrder::Ordered(StreamId user, const StreamStamp& stamp) const {
  if (stamp.stream == kHostOrder || stamp.stream == user) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return KnownLocked(user, stamp.stream) > stamp.clock;
}

absl::Status StreamOrder::Drain(const std::vector<StreamId>& streams) {
  std::vector<Stream*> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (StreamId id : streams) {
      if (auto it = streams_.find(id); it != streams_.end()) live.push_back(it->second);
    }
  }
  for (Stream* stream : live) MW_RETURN_IF_ERROR(stream->Synchronize());
  return absl::OkStatus();
}

std::vector<Stream*> StreamOrder::Streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Stream*> out;
  for (const auto& [id, stream] : streams_) out.push_back(stream);
  return out;
}

}  // namespace memwall
