// Status helpers used at every fallible boundary in memwall.
//
// Debian's Abseil (20220623) has no ABSL_RETURN_IF_ERROR, so memwall keeps
// its own two macros. Programming errors are MW_CHECKs (abort with a
// message); bad input and resource failures are absl::Status values.
#ifndef MEMWALL_RUNTIME_STATUS_H_
#define MEMWALL_RUNTIME_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define MW_RETURN_IF_ERROR(expr)                         \
  do {                                                   \
    ::absl::Status mw_status_ = (expr);                  \
    if (!mw_status_.ok()) return mw_status_;             \
  } while (false)

#define MW_STATUS_CONCAT_INNER_(a, b) a##b
#define MW_STATUS_CONCAT_(a, b) MW_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be
// a declaration (`auto x`) or an existing variable.
#define MW_ASSIGN_OR_RETURN(lhs, rexpr) \
  MW_ASSIGN_OR_RETURN_IMPL_(MW_STATUS_CONCAT_(mw_statusor_, __LINE__), lhs, rexpr)

#define MW_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

// A broken invariant: a bug in memwall, never the caller's input.
#define MW_CHECK(cond)                                                   \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: MW_CHECK failed: %s\n", __FILE__,     \
                   __LINE__, #cond);                                     \
      std::abort();                                                      \
    }                                                                    \
  } while (false)

#endif  // MEMWALL_RUNTIME_STATUS_H_
