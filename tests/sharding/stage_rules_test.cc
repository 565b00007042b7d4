// StageRules against ZeRO's definitions (Rajbhandari et al., 2020): stage 1
// partitions the optimizer states, stage 2 also the gradients, stage 3 also
// the parameters; stage 0 is plain data parallelism. One group of 1024
// padded elements on 4 ranks (shards of 256), seen from rank 2.
#include "sharding/stage_rules.h"

#include "catch2/catch.hpp"

namespace memwall {
namespace {

FlatGroup Group(bool trainable = true) {
  FlatGroup g;
  g.name = "block";
  g.numel = 1000;
  g.padded_numel = 1024;
  g.shard_numel = 256;
  g.trainable = trainable;
  return g;
}

TEST_CASE("what each stage shards, and what a rank holds and updates") {
  struct Row {
    int stage;
    bool updates, gradients, parameters;
    int64_t held_parameters, held_begin, held_gradients, update_numel, update_begin;
  };
  const Row rows[] = {
      {0, false, false, false, 1024, 0, 1024, 1024, 0},
      {1, true, false, false, 1024, 0, 1024, 256, 512},
      {2, true, true, false, 1024, 0, 256, 256, 512},
      {3, true, true, true, 256, 512, 256, 256, 512},
  };
  for (const Row& r : rows) {
    INFO("stage " << r.stage);
    const StageRules rules(r.stage);
    const FlatGroup g = Group();
    CHECK(rules.shards_updates() == r.updates);
    CHECK(rules.shards_gradients() == r.gradients);
    CHECK(rules.shards_parameters() == r.parameters);
    CHECK(rules.held_parameters(g) == r.held_parameters);
    CHECK(rules.held_parameters_begin(g, 2) == r.held_begin);
    CHECK(rules.held_gradients(g) == r.held_gradients);
    CHECK(rules.update_numel(g) == r.update_numel);
    CHECK(rules.update_begin(g, 2) == r.update_begin);
    CHECK(rules.update_numel(Group(/*trainable=*/false)) == 0);
  }
}

TEST_CASE("which collectives each stage's step makes") {
  // Stages 0-1 reduce the full gradients at the step (all-reduce at 0,
  // reduce-scatter at 1); 2-3 reduce them in backward. Stages 1-2
  // all-gather the updated shards into the full parameters; 3 gathers on
  // use, 0 updated everything.
  CHECK(StageRules(0).reduces_at_step());
  CHECK(StageRules(0).all_reduces());
  CHECK(StageRules(1).reduces_at_step());
  CHECK_FALSE(StageRules(1).all_reduces());
  CHECK_FALSE(StageRules(2).reduces_at_step());
  CHECK_FALSE(StageRules(3).reduces_at_step());
  CHECK_FALSE(StageRules(0).gathers_after_update());
  CHECK(StageRules(1).gathers_after_update());
  CHECK(StageRules(2).gathers_after_update());
  CHECK_FALSE(StageRules(3).gathers_after_update());
}

}  // namespace
}  // namespace memwall
