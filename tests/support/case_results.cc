#include "tests/support/case_results.h"

// Listener base classes are only declared with external interfaces on.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "catch2/catch.hpp"

namespace memwall::testing {

std::vector<int>& CaseFailures() {
  static auto* failures = new std::vector<int>();
  return *failures;
}

namespace {

class CaseResultListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    CaseFailures().push_back(stats.totals.assertions.failed > 0 ? 1 : 0);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(CaseResultListener)

}  // namespace memwall::testing
