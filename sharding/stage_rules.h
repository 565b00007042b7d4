// StageRules: what a ZeRO stage shards, asked by name instead of comparing
// the stage number where it matters (ShardedOptimizer's one source of the
// stage's meaning).
//
//   stage 0  nothing sharded: every rank holds and updates whole groups;
//            gradients are all-reduced at the step.
//   stage 1  optimizer states (and f32 master weights) sharded: a rank
//            updates its shard; full gradients are reduce-scattered at the
//            step and the updated shards all-gathered into the parameters.
//   stage 2  as 1, and gradients sharded: a group's full gradient buffer
//            exists only from AcquireGradients to ReduceGradients.
//   stage 3  as 2, and parameters sharded: gathered on use, released after.
#ifndef MEMWALL_SHARDING_STAGE_RULES_H_
#define MEMWALL_SHARDING_STAGE_RULES_H_

#include <cstdint>

#include "sharding/flat_layout.h"

namespace memwall {

class StageRules {
 public:
  // `stage` in 0..3 (ShardedOptimizer::Create checks it).
  explicit StageRules(int stage) : stage_(stage) {}

  int stage() const { return stage_; }

  // Parameters live as shards and are gathered on use (stage 3).
  bool shards_parameters() const { return stage_ == 3; }
  // Gradients live as shards; full buckets only while acquired (2-3).
  bool shards_gradients() const { return stage_ >= 2; }
  // Each rank updates (and keeps state for) its shard only (1-3).
  bool shards_updates() const { return stage_ >= 1; }

  // The step reduces gradients held in full (0-1), by all-reduce (0) or
  // reduce-scatter (1).
  bool reduces_at_step() const { return stage_ <= 1; }
  bool all_reduces() const { return stage_ == 0; }
  // After the update, the full parameters are all-gathered from the
  // updated shards (1-2; stage 3 gathers on use, stage 0 updated all).
  bool gathers_after_update() const { return stage_ == 1 || stage_ == 2; }

  // Elements of group `g` a rank holds as parameters, and where they start
  // in the padded group.
  int64_t held_parameters(const FlatGroup& g) const {
    return shards_parameters() ? g.shard_numel : g.padded_numel;
  }
  int64_t held_parameters_begin(const FlatGroup& g, int rank) const {
    return shards_parameters() ? g.shard_begin(rank) : 0;
  }
  // Elements of group `g`'s gradients a rank holds between steps.
  int64_t held_gradients(const FlatGroup& g) const {
    return shards_gradients() ? g.shard_numel : g.padded_numel;
  }
  // Elements of group `g` a rank updates (0 for a frozen group: no
  // state), and where they start in the padded group.
  int64_t update_numel(const FlatGroup& g) const {
    if (!g.trainable) return 0;
    return shards_updates() ? g.shard_numel : g.padded_numel;
  }
  int64_t update_begin(const FlatGroup& g, int rank) const {
    return shards_updates() ? g.shard_begin(rank) : 0;
  }

 private:
  int stage_;
};

}  // namespace memwall

#endif  // MEMWALL_SHARDING_STAGE_RULES_H_
