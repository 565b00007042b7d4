// JsonReader: typed reads that check the type first and name the key path
// and what was expected; required keys, nested objects and lists; unknown
// keys refused by Finish().
#include "runtime/json_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace memwall {
namespace {

using Json = nlohmann::json;

std::string Message(const absl::Status& s) {
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST_CASE("typed reads take what fits and name what does not", "[json_reader]") {
  const Json doc = Json::parse(R"({"n": 5e8, "big": 9223372036854775807, "half": 2.5,
                                   "f": 0.25, "s": "x", "b": true, "c": "two"})");
  JsonReader r = JsonReader::Open(doc, "", "file a.json: ").value();
  int64_t n = 0, big = 0, half = 7;
  REQUIRE(r.Int("n", 1, INT64_MAX, n).ok());
  CHECK(n == 500000000);
  REQUIRE(r.Int("big", 0, INT64_MAX, big).ok());
  CHECK(big == INT64_MAX);
  CHECK(Message(r.Int("half", 0, 10, half)) == "file a.json: half: expected an integer 0..10, got 2.5");
  CHECK(half == 7);  // unchanged
  float f = 0;
  REQUIRE(r.Float("f", 0, 1, true, "a fraction in (0, 1]", f).ok());
  CHECK(f == 0.25f);
  std::string c;
  CHECK(Message(r.Choice("c", {"one", "three"}, c)) ==
        "file a.json: c: expected one of \"one\", \"three\", got \"two\"");
  int64_t absent = 3;
  REQUIRE(r.Int("absent", 0, 9, absent).ok());  // optional: left as it was
  CHECK(absent == 3);
  CHECK(Message(r.Finish()) ==
        "file a.json: b: unknown key (known here: absent, big, c, f, half, n)");
}

TEST_CASE("lists, nested objects and required keys", "[json_reader]") {
  const Json doc = Json::parse(
      R"({"shape": [2, 3], "names": ["a", "b"], "inner": {"k": -1}, "items": [{"v": 1}],
          "neg": [1, -2], "mixed": ["a", 1], "scalar": 4})");
  JsonReader r = JsonReader::Open(doc, "top").value();
  std::vector<int64_t> shape;
  REQUIRE(r.Ints("shape", 0, INT64_MAX, shape).ok());
  CHECK(shape == std::vector<int64_t>{2, 3});
  std::vector<std::string> names;
  REQUIRE(r.Strings("names", names).ok());
  CHECK(names == std::vector<std::string>{"a", "b"});
  std::vector<int64_t> neg = {9};
  CHECK(Message(r.Ints("neg", 0, INT64_MAX, neg)) ==
        "top.neg: expected a list of integers >= 0, got [1,-2]");
  CHECK(neg == std::vector<int64_t>{9});
  CHECK(Message(r.Strings("mixed", names)) == "top.mixed: expected a list of strings, got [\"a\",1]");

  JsonReader inner = r.Object("inner").value();
  int64_t k = 0;
  CHECK(Message(inner.Int("k", 0, INT64_MAX, k)) == "top.inner.k: expected an integer >= 0, got -1");
  CHECK(Message(r.Object("scalar").status()) == "top.scalar: expected an object, got 4");
  CHECK(Message(r.Object("nothing").status()) == "top.nothing: missing");

  const Json* items = r.List("items").value();
  REQUIRE(items->size() == 1);
  JsonReader item = JsonReader::Open((*items)[0], r.Path("items") + "[0]", r.prefix()).value();
  CHECK(Message(item.Require({"v", "w"})) == "top.items[0].w: missing");
  CHECK(Message(r.List("shape2").status()) == "top.shape2: missing");
  CHECK(Message(r.List("inner").status()) == "top.inner: expected a list, got {\"k\":-1}");
  CHECK(Message(JsonReader::Open(Json::array(), "", "", "manifest").status()) ==
        "manifest: expected an object, got []");
}

}  // namespace
}  // namespace memwall
