// GatherScheduler: the order in which stage 3 expects its flat groups to be
// gathered, so that GatherParameters can prefetch the next ones.
//
// Note [Recorded prefetch order]
// Rationale: a step does not gather groups in index order. A tied weight
// (GPT's LM head reads the embedding's group) is gathered at both ends of
// forward; recomputation inside backward gathers a segment's groups
// forward again in the middle of backward; a caller-owned model runs its
// units in whatever order its code does. Guessing the next group from the
// direction of the last two indices prefetches the wrong groups there: a
// wasted gather and its memory, and a wait on the group that was needed.
// Approach: as DeepSpeed's trace mode. A step's gathers are recorded in
// order; at the end of the step the record becomes the trace. In the next
// steps, after each gather that follows the trace, the scheduler proposes
// the groups the trace gathers next, in order. A gather that leaves the
// trace (a new recomputation plan, another number of micro-batches, a
// model that branches) ends its use for the rest of that step, and that
// step's record becomes the new trace.
// Limitations: the first step, and the rest of a step that left its trace,
// propose by direction (g+1, g+2, ... after a higher index, g-1, ... after
// a lower one or a repeat), as before the trace existed.
// The schedule depends only on the sequence of calls, never on timing, so a
// dry run prefetches exactly as a real run does. Thread-compatible.
#ifndef MEMWALL_SHARDING_GATHER_SCHEDULER_H_
#define MEMWALL_SHARDING_GATHER_SCHEDULER_H_

#include <vector>

namespace memwall {

class GatherScheduler {
 public:
  // `num_groups`: the groups are 0 .. num_groups - 1.
  explicit GatherScheduler(int num_groups) : num_groups_(num_groups) {}

  // GatherParameters(g) was called.
  void OnGather(int g);
  // The groups expected next after the last OnGather, nearest first (a
  // group may appear more than once; the caller skips those it holds).
  std::vector<int> Upcoming() const;
  // The step ended (Step()): this step's record becomes the trace.
  void EndStep();
  // The step was abandoned (AbortStep()): its partial record is dropped and
  // the trace kept.
  void AbortStep();

  // The trace in force (empty before the first step ends).
  const std::vector<int>& trace() const { return trace_; }
  // Whether the current step has followed the trace so far.
  bool following() const { return !trace_.empty() && !left_trace_; }

 private:
  int num_groups_;
  std::vector<int> trace_;
  std::vector<int> record_;  // this step's gathers so far
  bool left_trace_ = false;
  int last_ = -1;      // the last group gathered this step
  int previous_ = -1;  // the one before it
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_GATHER_SCHEDULER_H_
