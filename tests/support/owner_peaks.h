// A memory listener recording, per owner, the live bytes now and the most
// it held at once: what activation-accounting tests compare to the layers'
// declarations.
#ifndef MEMWALL_TESTS_SUPPORT_OWNER_PEAKS_H_
#define MEMWALL_TESTS_SUPPORT_OWNER_PEAKS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "runtime/memory.h"

namespace memwall::testing {

class OwnerPeaks : public MemoryListener {
 public:
  void OnMemoryEvent(const MemoryEvent& e) override {
    if (e.kind != MemoryEvent::Kind::kAlloc && e.kind != MemoryEvent::Kind::kFree) return;
    const std::string owner(e.owner);
    int64_t& now = current[owner];
    now += e.kind == MemoryEvent::Kind::kAlloc ? e.bytes : -e.bytes;
    peak[owner] = std::max(peak[owner], now);
  }
  std::map<std::string, int64_t> current, peak;
};

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_OWNER_PEAKS_H_
