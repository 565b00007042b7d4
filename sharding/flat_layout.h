// Flat parameter groups: the arithmetic of ZeRO sharding.
//
// Parameters, in registration order, are packed into groups that follow
// layers: a layer is a run of consecutive parameters whose names share the
// prefix before the last '.' ("block3.attn.qkv" for "block3.attn.qkv.weight"
// and ".bias"), and layers are packed whole into groups of at most
// `bucket_elements` (a layer larger than that gets a group of its own; no
// layer, and so no parameter, is ever split between groups). A caller may
// instead name the units itself (ParameterSpec::group, as FSDP2's
// fully_shard names modules): the consecutive parameters of one named unit
// form exactly one group of that name, whatever the bucket size. Each group
// is one contiguous buffer, padded at its end so it splits evenly into
// `world_size` shards of a multiple of `alignment_elements`; rank r owns
// elements [r * shard_numel, (r + 1) * shard_numel) of every group. Sharding
// is then a range computation and every collective a single call.
//
// Frozen parameters (ParameterSpec::trainable false: fine-tuning's fixed
// embeddings) are sharded and gathered like the others but have no
// gradient and no optimizer state, so a group is all trainable or all
// frozen: a change of trainability starts a new group (and a new layer),
// and an explicit unit must not mix the two.
#ifndef MEMWALL_SHARDING_FLAT_LAYOUT_H_
#define MEMWALL_SHARDING_FLAT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memwall {

struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Non-empty: the explicit unit (flat group) this parameter belongs to;
  // its parameters must be consecutive. Empty: grouped by layer and bucket.
  std::string group;
  // False: frozen (no gradient, no optimizer state).
  bool trainable = true;
};

// Where one parameter lives: elements [offset, offset + numel) of a group.
struct ParameterPlacement {
  int group = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

struct FlatGroup {
  // "first.param.name" or "first.param.name..last.param.name"; used as the
  // owner of the group's memory.
  std::string name;
  // Indices into the parameter list, in order.
  std::vector<int> parameters;
  // Elements of the parameters, and after padding.
  int64_t numel = 0;
  int64_t padded_numel = 0;
  // padded_numel / world_size.
  int64_t shard_numel = 0;
  // Whether its parameters train (all of them do, or none).
  bool trainable = true;

  int64_t shard_begin(int rank) const { return rank * shard_numel; }
  // Padding elements that fall in rank r's shard.
  int64_t padding_in_shard(int rank) const;
};

struct FlatLayout {
  int world_size = 1;
  std::vector<FlatGroup> groups;
  // One per parameter, in registration order.
  std::vector<ParameterPlacement> placements;
  // SUMs over groups.
  int64_t numel = 0;
  int64_t padded_numel = 0;
};

// Element count of a shape (1 for a scalar, shape {}).
int64_t NumElements(const std::vector<int64_t>& shape);

// Plans the groups. Errors (kInvalidArgument) name the offending parameter
// or argument: no parameters, an empty or duplicate name, a dimension < 1,
// an explicit group whose parameters are not consecutive or mix trainable
// and frozen ones, world_size < 1,
// bucket_elements < 1, alignment_elements < 1.
absl::StatusOr<FlatLayout> BuildFlatLayout(const std::vector<ParameterSpec>& parameters,
                                          int world_size, int64_t bucket_elements,
                                          int64_t alignment_elements);

}  // namespace memwall

#endif  // MEMWALL_SHARDING_FLAT_LAYOUT_H_
