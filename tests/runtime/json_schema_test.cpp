// JSON Schema constraints on JsonPrefix (structured output): what compiles and what is refused
// with the keyword's path; documents the checker accepts or refuses byte by byte; and random walks
// through the checker (every step choosing among the bytes it accepts) that must never reach a
// dead end and must end in objects an independent validator, written here, accepts.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/json_prefix.h"
#include "runtime/json_schema.h"

namespace fl {
namespace {

using nlohmann::json;

// The compile error's message, or "" when the schema compiles.
std::string compile_error(const json& schema) {
  try {
    JsonSchema::compile(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchema, RefusesWhatItCannotEnforceByPath) {
  const json object = {{"type", "object"}};
  EXPECT_EQ(compile_error(object), "");
  struct Case {
    json schema;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{{"type", "object"}, {"properties", {{"age", {{"type", "integer"}, {"minimum", 0}}}}}},
       "schema.properties.age.minimum: the keyword is not supported"},
      {{{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"pattern", "a+"}}}}}},
       "schema.properties.s.pattern"},
      {{{"oneOf", json::array({object})}}, "schema.oneOf"},
      {{{"type", "array"}}, "the root must allow an object"},
      {{{"type", "object"}, {"required", {"x"}}}, "\"x\" is not among the properties"},
      {{{"type", "object"}, {"properties", {{"e", {{"enum", json::array({json::object()})}}}}}}, "only scalar values"},
      {{{"anyOf", json::array({object, {{"type", "object"}}})}}, "must start with different JSON types"},
      {{{"anyOf", json::array({object, {{"type", "integer"}}, {{"type", "number"}}})}}, "different JSON types"},
      {{{"type", "object"}, {"properties", {{"p", {{"$ref", "#/$defs/missing"}}}}}}, "is not \"#\" or a"},
      {{{"type", "object"}, {"properties", {{"p", {{"type", "wat"}}}}}}, "unknown type \"wat\""},
      {{{"type", "object"}, {"properties", {{"p", {{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}}}}},
       "maxItems is below minItems"},
      {{{"type", "object"}, {"properties", {{"p", false}}}}, "the schema false accepts nothing"},
  };
  for (const Case& c : cases) {
    const std::string error = compile_error(c.schema);
    EXPECT_NE(error.find(c.says), std::string::npos) << c.schema.dump() << "\n  gave: " << error;
  }
}

bool accepts(const JsonSchema& schema, const std::string& text) {
  JsonPrefix p(&schema);
  return p.feed(text) && p.complete();
}

// How many bytes of `text` the checker takes before refusing one (text.size(): all of them).
size_t accepted_bytes(const JsonSchema& schema, const std::string& text) {
  JsonPrefix p(&schema);
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.feed(text[i])) return i;
  return text.size();
}

const json kPerson = {{"type", "object"},
                      {"properties",
                       {{"name", {{"type", "string"}}},
                        {"age", {{"type", "integer"}}},
                        {"tags", {{"type", "array"}, {"items", {{"enum", {"a", "b"}}}}, {"maxItems", 2}}},
                        {"kind", {{"enum", {"cat", "dog", nullptr}}}},
                        {"score", {{"type", {"number", "null"}}}}}},
                      {"required", {"name", "age"}},
                      {"additionalProperties", false}};

TEST(JsonSchema, ChecksTypesKeysRequiredEnumsAndCounts) {
  const JsonSchema s = JsonSchema::compile(kPerson);
  for (const char* ok : {R"({"name":"x","age":3})", R"({ "age": -3 , "name": "y", "tags": ["a", "b"] })",
                         R"({"name":"x","age":0,"kind":null,"score":1.5e3})",
                         R"({"name":"\u0078","age":1,"kind":"dog"})", R"({"name":"x","age":1,"score":null,"tags":[]})"})
    EXPECT_TRUE(accepts(s, ok)) << ok;
  struct Bad {
    std::string text;
    size_t refused_at;  // the first byte the checker refuses
  };
  const std::vector<Bad> bad = {
      {R"({"name":"x"})", 11},                               // '}' before the required age
      {R"({"name":"x","age":3.5})", 19},                     // a fraction in an integer
      {R"({"nam":1})", 5},                                   // a key that is no property's name
      {R"({"name":"x","name":"y"})", 13},                    // a property written twice
      {R"({"age":1,"name":"x","tags":["a","b","a"]})", 35},  // a comma for a third item past maxItems
      {R"({"age":1,"name":"x","tags":["c"]})", 29},          // an item outside the enum
      {R"({"age":1,"name":"x","kind":"cow"})", 29},          // "cat" and "dog" part at 'o'
      {R"({"age":1,"name":"x","kind":"ca"})", 30},           // a prefix of an enum text is not one
      {R"({"age":"1"})", 7},                                 // a string for an integer
      {R"({"age":1,"name":"x","score":true})", 28},
      {R"({"x":1})", 2},
  };
  for (const Bad& b : bad) EXPECT_EQ(accepted_bytes(s, b.text), b.refused_at) << b.text;
  // With every property written, a comma has nothing to introduce.
  EXPECT_EQ(accepted_bytes(s, R"({"name":"x","age":1,"tags":[],"kind":null,"score":1,)"), 51u);
}

// What Pydantic's model_json_schema() writes for a model with a nested optional model.
const json kPydantic = json::parse(R"({
  "$defs": {"Pet": {"properties": {"name": {"title": "Name", "type": "string"},
                                   "legs": {"default": 4, "title": "Legs", "type": "integer"}},
                    "required": ["name"], "title": "Pet", "type": "object"}},
  "properties": {"owner": {"title": "Owner", "type": "string"},
                 "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}], "default": null},
                 "friends": {"items": {"$ref": "#/$defs/Pet"}, "title": "Friends", "type": "array", "minItems": 1}},
  "required": ["owner", "friends"], "title": "Model", "type": "object"})");

TEST(JsonSchema, PydanticRefsAndOptionalAlternatives) {
  const JsonSchema s = JsonSchema::compile(kPydantic);
  EXPECT_TRUE(accepts(s, R"({"owner":"a","friends":[{"name":"b"}],"pet":{"name":"c","legs":3}})"));
  EXPECT_TRUE(accepts(s, R"({"owner":"a","friends":[{"name":"b","extra":[1,{"x":null}]}],"pet":null})"));
  EXPECT_FALSE(accepts(s, R"({"owner":"a","friends":[]})"));                       // minItems 1
  EXPECT_FALSE(accepts(s, R"({"owner":"a","friends":[{"name":"b"}],"pet":{}})"));  // Pet needs a name
  EXPECT_FALSE(accepts(s, R"({"owner":"a","friends":[{"name":"b"}],"pet":3})"));   // neither alternative
  // A schema that refers to itself.
  const JsonSchema tree = JsonSchema::compile(
      {{"type", "object"}, {"properties", {{"child", {{"$ref", "#"}}}}}, {"additionalProperties", false}});
  EXPECT_TRUE(accepts(tree, R"({"child":{"child":{}}})"));
  EXPECT_FALSE(accepts(tree, R"({"child":{"kid":{}}})"));
}

// Cases a review found: one spelling per key (no repeats, no escapes but \" and \\), an enum's
// values of other types than the declared one dropped (no dead end), anyOf checked once $refs are
// whole (Pydantic's recursive Optional[Self]), nothing but annotations beside anyOf.
TEST(JsonSchema, KeysHaveOneSpellingAndUnionsSeeWholeRefs) {
  const JsonSchema a =
      JsonSchema::compile({{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}, {"a/b", true}}}});
  EXPECT_EQ(accepted_bytes(a, R"({"a":1,"a":"x"})"), 9u);  // the second "a" ends
  EXPECT_EQ(accepted_bytes(a, R"({"\u0061":"x"})"), 3u);   // \u in a key
  EXPECT_EQ(accepted_bytes(a, R"({"a\/b":1})"), 4u);       // \/ in a key
  EXPECT_TRUE(accepts(a, R"({"a/b":[1],"other":{"x\"y":2}})"));
  const JsonSchema typed_enum = JsonSchema::compile(
      {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}, {"enum", {1, 2.5}}}}}}, {"required", {"a"}}});
  EXPECT_EQ(accepted_bytes(typed_enum, R"({"a":2)"), 5u);  // 2.5 is no integer: only 1 is left
  EXPECT_TRUE(accepts(typed_enum, R"({"a":1})"));
  const JsonSchema linked = JsonSchema::compile(json::parse(R"({
      "$defs": {"Node": {"type": "object", "properties": {"child": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}},
      "$ref": "#/$defs/Node"})"));
  EXPECT_TRUE(accepts(linked, R"({"child":{"child":{"child":null}}})"));
  EXPECT_FALSE(accepts(linked, R"({"child":3})"));
  EXPECT_NE(
      compile_error(json::parse(R"({"anyOf": [{"type": "object"}, {"type": "null"}], "additionalProperties": false})"))
          .find("schema.additionalProperties: beside anyOf only annotations"),
      std::string::npos);
  EXPECT_NE(
      compile_error(
          json::parse(
              R"({"$defs": {"T": {"anyOf": [{"type": "object", "properties": {"x": {"anyOf": [{"$ref": "#/$defs/T"}]}}}, {"type": "null"}]}},
                                       "$ref": "#/$defs/T"})"))
          .find("an anyOf inside an anyOf"),
      std::string::npos);
}

// ---- random walks against an independent validator of the same subset ----

bool valid(const json& v, const json& schema, const json& root);

bool valid_type(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  // (a literal past 64 bits parses as a double: still an integer when it has no fraction)
  if (t == "integer")
    return v.is_number_integer() || v.is_number_unsigned() ||
           (v.is_number() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "array") return v.is_array();
  if (t == "object") return v.is_object();
  return false;
}

bool valid(const json& v, const json& schema, const json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    if (ref == "#") return valid(v, root, root);
    return valid(v, root["$defs"][ref.substr(std::string("#/$defs/").size())], root);
  }
  if (schema.contains("anyOf")) {
    for (const json& alt : schema["anyOf"])
      if (valid(v, alt, root)) return true;
    return false;
  }
  if (schema.contains("type")) {
    const json& t = schema["type"];
    bool any = false;
    for (const json& name : t.is_array() ? t : json::array({t})) any = any || valid_type(v, name);
    if (!any) return false;
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const json& e : schema["enum"]) found = found || e.dump() == v.dump();
    if (!found) return false;
  }
  if (v.is_object()) {
    const json props = schema.value("properties", json::object());
    for (const json& r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    const json extra = schema.value("additionalProperties", json(true));
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (!valid(value, props[key], root)) return false;
      } else if (!valid(value, extra, root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (n < schema.value("minItems", int64_t{0})) return false;
    if (schema.contains("maxItems") && n > schema["maxItems"].get<int64_t>()) return false;
    if (schema.contains("items"))
      for (const json& item : v)
        if (!valid(item, schema["items"], root)) return false;
  }
  return true;
}

TEST(JsonSchema, RandomWalksNeverStallAndEndValid) {
  const std::string alphabet = "{}[]\",: \n-0123456789.eE+abcdefghijklmnopqrstuvwxyz\\/ABC";
  const std::string closers = "\"}]:";  // preferred (when allowed), so that most walks end
  // Required properties behind arbitrary other keys are never written by chance: the Pydantic
  // schema walks in OpenAI's strict form (no other keys); other keys walk in a schema of their own.
  json strict = kPydantic;
  strict["additionalProperties"] = false;
  strict["$defs"]["Pet"]["additionalProperties"] = false;
  const json other_keys = {
      {"type", "object"},
      {"additionalProperties", {{"type", "array"}, {"items", {{"type", {"integer", "string"}}}}, {"maxItems", 3}}}};
  for (const json& schema : {kPerson, strict, other_keys}) {
    const JsonSchema s = JsonSchema::compile(schema);
    std::mt19937 rng(5);
    int completed = 0;
    for (int walk = 0; walk < 300; ++walk) {
      JsonPrefix p(&s);
      std::string text;
      for (int step = 0; step < 2000 && !p.complete(); ++step) {
        std::vector<char> allowed, closing;
        for (char c : alphabet) {
          // (no exponents after a digit: 3E824 is JSON, but past what nlohmann parses into a double)
          const bool after_digit = !text.empty() && text.back() >= '0' && text.back() <= '9';
          if (after_digit && (c == 'e' || c == 'E')) continue;
          JsonPrefix trial = p;
          if (!trial.feed(c)) continue;
          allowed.push_back(c);
          if (closers.find(c) != std::string::npos) closing.push_back(c);
        }
        ASSERT_FALSE(allowed.empty()) << "a dead end after " << text;
        const std::vector<char>& pool = !closing.empty() && rng() % 4 != 0 ? closing : allowed;
        const char c = pool[rng() % pool.size()];
        ASSERT_TRUE(p.feed(c));
        text += c;
      }
      if (!p.complete()) continue;
      ++completed;
      const json v = json::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << text;
      EXPECT_TRUE(valid(v, schema, schema)) << text;
    }
    EXPECT_GE(completed, 100) << schema.dump();
  }
}

}  // namespace
}  // namespace fl
