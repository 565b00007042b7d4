// libFuzzer entry for memwall::fuzz::ModelSpec (tests/fuzz/targets.h); built and
// run by tools/fuzz.sh with clang.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memwall::fuzz::ModelSpec(data, size);
  return 0;
}
