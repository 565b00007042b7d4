// Flat-group arithmetic with exact expected numbers.
#include "sharding/flat_layout.h"

#include "catch2/catch.hpp"

namespace memwall {
namespace {

std::vector<ParameterSpec> Specs() {
  return {{"embed", {100, 16}},   // 1600
          {"block0.w", {16, 16}}, // 256
          {"block0.b", {16}},     // 16
          {"block1.w", {16, 16}}, // 256
          {"block1.b", {16}},     // 16
          {"head", {}}};          // 1 (a scalar)
}

TEST_CASE("groups pack consecutive parameters up to the bucket size", "[flat]") {
  auto layout = BuildFlatLayout(Specs(), /*world_size=*/4, /*bucket_elements=*/300, /*alignment=*/8);
  REQUIRE(layout.ok());
  // embed alone (larger than a bucket), block0 (272), block1 + head (273).
  REQUIRE(layout->groups.size() == 3);
  const FlatGroup& g0 = layout->groups[0];
  CHECK(g0.name == "embed");
  CHECK(g0.numel == 1600);
  CHECK(g0.padded_numel == 1600);  // 1600 = 50 * 32
  CHECK(g0.shard_numel == 400);
  const FlatGroup& g1 = layout->groups[1];
  CHECK(g1.name == "block0.w..block0.b");
  CHECK(g1.parameters == std::vector<int>{1, 2});
  CHECK(g1.numel == 272);
  CHECK(g1.padded_numel == 288);  // next multiple of 4 * 8
  CHECK(g1.shard_numel == 72);
  CHECK(g1.shard_begin(3) == 216);
  CHECK(g1.padding_in_shard(3) == 16);
  CHECK(g1.padding_in_shard(2) == 0);
  const FlatGroup& g2 = layout->groups[2];
  CHECK(g2.name == "block1.w..head");
  CHECK(g2.numel == 273);
  CHECK(g2.padded_numel == 288);
  CHECK(g2.padding_in_shard(3) == 15);
  CHECK(layout->numel == 2145);
  CHECK(layout->padded_numel == 2176);
  REQUIRE(layout->placements.size() == 6);
  CHECK(layout->placements[2].group == 1);
  CHECK(layout->placements[2].offset == 256);
  CHECK(layout->placements[2].numel == 16);
  CHECK(layout->placements[5].group == 2);
  CHECK(layout->placements[5].offset == 272);
  CHECK(layout->placements[5].numel == 1);
}

TEST_CASE("groups never split a layer", "[flat]") {
  // block0 (weight 256 + bias 16) exceeds a 260-element bucket: it stays
  // whole in a group of its own rather than leaving its bias behind.
  auto layout = BuildFlatLayout(Specs(), 1, 260, 1);
  REQUIRE(layout.ok());
  REQUIRE(layout->groups.size() == 4);
  CHECK(layout->groups[1].name == "block0.w..block0.b");
  CHECK(layout->groups[1].numel == 272);
  CHECK(layout->groups[2].name == "block1.w..block1.b");
  CHECK(layout->groups[3].name == "head");
  // Several small layers share a group up to the bucket size.
  auto packed = BuildFlatLayout({{"l0.w", {10}}, {"l0.b", {2}}, {"l1.w", {10}}, {"l1.b", {2}},
                                {"l2.w", {10}}, {"l2.b", {2}}},
                               1, 24, 1);
  REQUIRE(packed.ok());
  REQUIRE(packed->groups.size() == 2);
  CHECK(packed->groups[0].parameters == std::vector<int>{0, 1, 2, 3});
  CHECK(packed->groups[1].parameters == std::vector<int>{4, 5});
}

TEST_CASE("one rank and a huge bucket make one unpadded-but-aligned group", "[flat]") {
  auto layout = BuildFlatLayout(Specs(), 1, int64_t{1} << 40, 1);
  REQUIRE(layout.ok());
  REQUIRE(layout->groups.size() == 1);
  CHECK(layout->groups[0].padded_numel == 2145);
  CHECK(layout->groups[0].shard_numel == 2145);
  CHECK(layout->groups[0].padding_in_shard(0) == 0);
}

TEST_CASE("shards tile every group exactly for any world size", "[flat]") {
  for (int world : {1, 2, 3, 4, 7, 64}) {
    auto layout = BuildFlatLayout(Specs(), world, 500, 16);
    REQUIRE(layout.ok());
    for (const FlatGroup& g : layout->groups) {
      CHECK(g.padded_numel % (16 * world) == 0);
      CHECK(g.padded_numel - g.numel < 16 * world);
      int64_t padding = 0;
      for (int r = 0; r < world; ++r) padding += g.padding_in_shard(r);
      CHECK(padding == g.padded_numel - g.numel);
    }
  }
}

TEST_CASE("explicit groups are one group each, whatever the bucket size", "[flat]") {
  std::vector<ParameterSpec> specs = Specs();
  // embed alone in "input"; both blocks in "trunk"; the head by name prefix.
  specs[0].group = "input";
  for (int p = 1; p <= 4; ++p) specs[p].group = "trunk";
  for (int64_t bucket : {int64_t{1}, int64_t{300}, int64_t{1} << 40}) {
    CAPTURE(bucket);
    auto layout = BuildFlatLayout(specs, /*world_size=*/2, bucket, /*alignment=*/8);
    REQUIRE(layout.ok());
    REQUIRE(layout->groups.size() == 3);
    CHECK(layout->groups[0].name == "input");
    CHECK(layout->groups[0].numel == 1600);
    CHECK(layout->groups[1].name == "trunk");
    CHECK(layout->groups[1].parameters == std::vector<int>{1, 2, 3, 4});
    CHECK(layout->groups[1].numel == 544);
    CHECK(layout->groups[1].padded_numel == 544);  // 34 * 16
    CHECK(layout->groups[2].name == "head");  // never joins a named group
    CHECK(layout->placements[3].group == 1);
    CHECK(layout->placements[3].offset == 272);
  }
  specs[3].group = "input";  // "input" again after "trunk" began
  auto split = BuildFlatLayout(specs, 2, 300, 8);
  CHECK(split.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(split.status().message()) ==
        "parameter 'block1.w': group 'input' already ended; a group's parameters must be "
        "registered consecutively");
}

TEST_CASE("bad parameter lists are rejected by name", "[flat]") {
  auto dup = BuildFlatLayout({{"a", {2}}, {"a", {3}}}, 2, 10, 1);
  CHECK(std::string(dup.status().message()) == "parameter 'a': registered twice");
  auto zero = BuildFlatLayout({{"w", {4, 0}}}, 2, 10, 1);
  CHECK(std::string(zero.status().message()) == "parameter 'w': shape[1] is 0; expected >= 1");
  auto unnamed = BuildFlatLayout({{"", {4}}}, 2, 10, 1);
  CHECK(std::string(unnamed.status().message()) == "parameter 0: the name is empty");
  CHECK(std::string(BuildFlatLayout({}, 2, 10, 1).status().message()) == "parameters: none registered");
  CHECK(std::string(BuildFlatLayout(Specs(), 0, 10, 1).status().message()) ==
        "world size: expected >= 1, got 0");
  CHECK(std::string(BuildFlatLayout(Specs(), 2, 0, 1).status().message()) ==
        "bucket size: expected >= 1 element, got 0");
  CHECK(std::string(BuildFlatLayout(Specs(), 2, 10, 0).status().message()) ==
        "alignment: expected >= 1 element, got 0");
}

}  // namespace
}  // namespace memwall
