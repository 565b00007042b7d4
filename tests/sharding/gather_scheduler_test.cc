// The stage-3 prefetch order: by direction before a trace exists, then the
// recorded order of the previous step, and back to direction (and a new
// trace) when a step leaves it.
#include "sharding/gather_scheduler.h"

#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

using Groups = std::vector<int>;

TEST_CASE("the first step prefetches by direction", "[gather_scheduler]") {
  GatherScheduler s(5);
  CHECK(s.Upcoming().empty());  // nothing gathered yet
  s.OnGather(0);
  CHECK(s.Upcoming() == Groups{1, 2, 3, 4});
  s.OnGather(1);
  CHECK(s.Upcoming() == Groups{2, 3, 4});
  s.OnGather(4);
  s.OnGather(4);  // a repeat: backward
  CHECK(s.Upcoming() == Groups{3, 2, 1, 0});
  CHECK_FALSE(s.following());
}

TEST_CASE("later steps prefetch in the recorded order, tied weights included",
          "[gather_scheduler]") {
  GatherScheduler s(4);
  // Forward 0 1 2 then the head reads group 0 again; backward 0 2 1 0.
  const Groups step = {0, 1, 2, 0, 0, 2, 1, 0};
  for (int g : step) s.OnGather(g);
  s.EndStep();
  CHECK(s.trace() == step);
  s.OnGather(0);
  CHECK(s.following());
  CHECK(s.Upcoming() == Groups{1, 2, 0, 0, 2, 1, 0});
  s.OnGather(1);
  s.OnGather(2);
  // Direction would say 3; the trace knows the head needs 0.
  CHECK(s.Upcoming() == Groups{0, 0, 2, 1, 0});
  s.OnGather(0);
  s.OnGather(0);
  s.OnGather(2);
  s.OnGather(1);
  s.OnGather(0);
  CHECK(s.Upcoming().empty());  // the step ends here
  s.EndStep();
  CHECK(s.trace() == step);
}

TEST_CASE("a step that leaves the trace falls back to direction and becomes the trace",
          "[gather_scheduler]") {
  GatherScheduler s(4);
  for (int g : {0, 1, 2, 3, 3, 2, 1, 0}) s.OnGather(g);
  s.EndStep();
  s.OnGather(0);
  s.OnGather(2);  // recomputation changed the order
  CHECK_FALSE(s.following());
  CHECK(s.Upcoming() == Groups{3});
  s.OnGather(1);
  CHECK(s.Upcoming() == Groups{0});
  s.EndStep();
  CHECK(s.trace() == Groups{0, 2, 1});
  // An abandoned step keeps the trace.
  s.OnGather(3);
  s.AbortStep();
  CHECK(s.trace() == Groups{0, 2, 1});
  s.OnGather(0);
  CHECK(s.Upcoming() == Groups{2, 1});
}

}  // namespace
}  // namespace memwall
