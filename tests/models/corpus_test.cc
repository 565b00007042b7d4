// The built-in corpus is the same text on every compiler and every rank.
#include "models/corpus.h"

#include <string>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

TEST_CASE("the built-in corpus starts with fixed sentences for a seed", "[corpus]") {
  // Recorded from the build that trained every figure in
  // benchmarks/RESULTS.md (mt19937_64 from seed 1234, parts drawn end first).
  const ByteCorpus corpus = ByteCorpus::Synthetic(1 << 20, 1234);
  CHECK(corpus.size() == (1 << 20));
  CHECK(corpus.text().substr(0, 160) ==
        "the planner frees a checkpoint on every rank.\n"
        "a gradient shards the optimizer states before the step.\n"
        "each layer gathers the memory before the step.\n"
        "the optimiz");
  CHECK(ByteCorpus::Synthetic(4096, 1234).text() == corpus.text().substr(0, 4096));
  CHECK(ByteCorpus::Synthetic(4096, 1235).text() != corpus.text().substr(0, 4096));
}

}  // namespace
}  // namespace memwall
