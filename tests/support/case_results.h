// Per-test-case outcomes recorded by a Catch2 listener, so memwall's test
// mains can print one closing line that counts test cases:
//   memwall-tests: P passed, F failed[, S skipped]
// (.ci/run sums these lines over all test binaries.)
#ifndef MEMWALL_TESTS_SUPPORT_CASE_RESULTS_H_
#define MEMWALL_TESTS_SUPPORT_CASE_RESULTS_H_

#include <vector>

namespace memwall::testing {

// 1 for each failed test case, 0 for each passed one, in run order.
std::vector<int>& CaseFailures();

}  // namespace memwall::testing

#endif  // MEMWALL_TESTS_SUPPORT_CASE_RESULTS_H_
