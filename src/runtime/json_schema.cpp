#include "runtime/json_schema.h"

#include <map>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fl {

using nlohmann::json;

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const json& root) : root_(root) {}

  JsonSchema run() {
    JsonSchema out;
    nodes_.emplace_back();  // kAnyNode
    out.root_ = compile(root_, "schema");
    // anyOf checks once every $ref node holds its contents (while its target compiled, a
    // referenced node was a placeholder that takes every type).
    for (const auto& [index, path] : unions_) {
      uint8_t seen = 0;
      const std::vector<int32_t> alternatives = nodes_[static_cast<size_t>(index)].alternatives;
      for (size_t i = 0; i < alternatives.size(); ++i) {
        const JsonSchemaNode& an = nodes_[static_cast<size_t>(alternatives[i])];
        const std::string at = path + ".anyOf[" + std::to_string(i) + "]";
        if (!an.alternatives.empty()) fail("{}: an anyOf inside an anyOf is not supported", at);
        // Integers are numbers: two alternatives may not both take them.
        const uint8_t t = an.types & kJsonInteger ? static_cast<uint8_t>(an.types | kJsonNumber) : an.types;
        if (t & seen)
          fail("{}: the alternatives of an anyOf must start with different JSON types (its first byte picks one)", at);
        seen |= t;
      }
    }
    const JsonSchemaNode& r = nodes_[static_cast<size_t>(out.root_)];
    const uint8_t root_types = r.alternatives.empty() ? r.types : union_types(r);
    if (!(root_types & kJsonObject)) fail("schema: the root must allow an object (the answer is one JSON object)");
    out.nodes_ = std::move(nodes_);
    return out;
  }

 private:
  uint8_t union_types(const JsonSchemaNode& n) const {
    uint8_t t = 0;
    for (int32_t a : n.alternatives) t |= nodes_[static_cast<size_t>(a)].types;
    return t;
  }

  int32_t new_node() {
    if (nodes_.size() >= JsonSchema::kMaxNodes) fail("schema: more than {} subschemas", JsonSchema::kMaxNodes);
    nodes_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }

  static uint8_t type_bit(const json& name, const std::string& path) {
    if (!name.is_string()) fail("{}: a type must be a string, got {}", path, name.dump());
    const std::string& t = name.get_ref<const std::string&>();
    if (t == "null") return kJsonNull;
    if (t == "boolean") return kJsonBoolean;
    if (t == "integer") return kJsonInteger;
    if (t == "number") return kJsonNumber | kJsonInteger;
    if (t == "string") return kJsonString;
    if (t == "array") return kJsonArray;
    if (t == "object") return kJsonObject;
    fail("{}: unknown type \"{}\"", path, t);
  }

  // The type of a scalar enum value.
  static uint8_t value_type(const json& v) {
    if (v.is_null()) return kJsonNull;
    if (v.is_boolean()) return kJsonBoolean;
    if (v.is_number_integer() || v.is_number_unsigned()) return kJsonInteger | kJsonNumber;
    if (v.is_number()) return kJsonNumber;
    if (v.is_string()) return kJsonString;
    return 0;
  }

  static int64_t count(const json& v, const std::string& path) {
    if (!v.is_number_integer() && !v.is_number_unsigned()) fail("{}: must be a non-negative integer", path);
    const int64_t n = v.get<int64_t>();
    if (n < 0) fail("{}: must be a non-negative integer", path);
    return n;
  }

  // "#", "#/$defs/NAME", "#/definitions/NAME": compiled once, so recursion ends.
  int32_t reference(const json& ref, const std::string& path) {
    if (!ref.is_string()) fail("{}: $ref must be a string", path);
    const std::string& r = ref.get_ref<const std::string&>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
        if (!r.starts_with(prefix)) continue;
        const std::string section(prefix.substr(2, prefix.size() - 3));
        const std::string name = r.substr(prefix.size());
        if (root_.is_object() && root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
          target = &root_[section][name];
      }
    }
    if (!target) fail("{}: $ref \"{}\" is not \"#\" or a \"#/$defs/NAME\" of this schema", path, r);
    // The node exists before its contents, so a schema that refers to itself finds it.
    const int32_t index = new_node();
    refs_[r] = index;
    const int32_t body = compile(*target, path + "($ref " + r + ")");
    nodes_[static_cast<size_t>(index)] = nodes_[static_cast<size_t>(body)];
    return index;
  }

  int32_t compile(const json& s, const std::string& path) {
    if (++depth_ > 64) fail("{}: nested more than 64 levels", path);
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("{}: the schema false accepts nothing", path);
      return JsonSchema::kAnyNode;
    }
    if (!s.is_object()) fail("{}: a schema must be an object, got {}", path, s.dump());
    if (s.contains("$ref")) {
      for (const auto& [key, value] : s.items())
        if (key != "$ref" && !annotation(key) && key != "$defs" && key != "definitions")
          fail("{}.{}: beside $ref only annotations are supported", path, key);
      return reference(s["$ref"], path + ".$ref");
    }
    const int32_t index = new_node();
    JsonSchemaNode n;
    bool typed = false;
    for (const auto& [key, value] : s.items()) {
      const std::string at = path + "." + key;
      if (annotation(key) || key == "$defs" || key == "definitions") continue;
      if (key == "type") {
        typed = true;
        n.types = 0;
        if (value.is_array()) {
          if (value.empty()) fail("{}: an empty list of types accepts nothing", at);
          for (const json& t : value) n.types |= type_bit(t, at);
        } else {
          n.types = type_bit(value, at);
        }
      } else if (key == "enum" || key == "const") {
        const json values = key == "const" ? json::array({value}) : value;
        if (!values.is_array() || values.empty()) fail("{}: must be a non-empty list", at);
        if (values.size() > JsonSchema::kMaxEnumValues) fail("{}: more than {} values", at, JsonSchema::kMaxEnumValues);
        for (const json& v : values) {
          if (value_type(v) == 0) fail("{}: only scalar values (strings, numbers, booleans, null) are supported", at);
          n.enum_texts.push_back(v.dump());
        }
      } else if (key == "properties") {
        if (!value.is_object()) fail("{}: must be an object", at);
        if (value.size() > JsonSchema::kMaxProperties)
          fail("{}: more than {} properties", at, JsonSchema::kMaxProperties);
        for (const auto& [name, sub] : value.items()) {
          for (char c : name)
            if (static_cast<unsigned char>(c) < 0x20)
              fail("{}: property names with control characters are not supported", at);
          const std::string quoted = json(name).dump();
          n.property_keys.push_back(quoted.substr(1, quoted.size() - 2));
          n.property_nodes.push_back(-1);  // compiled below, after this node is stored
        }
      } else if (key == "required") {
        if (!value.is_array()) fail("{}: must be a list of property names", at);
      } else if (key == "additionalProperties") {
        if (!value.is_boolean() && !value.is_object()) fail("{}: must be true, false or a schema", at);
      } else if (key == "items") {
        if (!value.is_object() && !value.is_boolean())
          fail("{}: must be one schema (prefixItems is not supported)", at);
      } else if (key == "minItems") {
        n.min_items = count(value, at);
      } else if (key == "maxItems") {
        n.max_items = count(value, at);
      } else if (key == "anyOf") {
        if (!value.is_array() || value.empty()) fail("{}: must be a non-empty list of schemas", at);
        for (const auto& [other, unused] : s.items())
          if (other != "anyOf" && !annotation(other) && other != "$defs" && other != "definitions")
            fail("{}.{}: beside anyOf only annotations are supported; put it inside the alternatives", path, other);
      } else {
        fail(
            "{}: the keyword is not supported (what fireline can enforce while it samples: type, enum, const, "
            "properties, required, additionalProperties, items, minItems, maxItems, anyOf by type, $ref)",
            at);
      }
    }
    if (!n.enum_texts.empty()) {  // only values of the declared types can be written; the types: theirs
      std::vector<std::string> kept;
      uint8_t t = 0;
      for (const std::string& text : n.enum_texts) {
        uint8_t vt = value_type(json::parse(text));
        if (typed) vt &= n.types;  // (an integer under "number" stays; 2.5 under "integer" goes)
        if (vt == 0) continue;
        t |= vt;
        kept.push_back(text);
      }
      if (kept.empty()) fail("{}: no enum value has the declared type", path);
      n.enum_texts = std::move(kept);
      n.types = t;
    }
    if (n.max_items >= 0 && n.max_items < n.min_items) fail("{}: maxItems is below minItems", path);
    nodes_[static_cast<size_t>(index)] = n;

    // Subschemas, now that this node has its index (they may refer back to it).
    if (s.contains("properties")) {
      size_t i = 0;
      for (const auto& [name, sub] : s["properties"].items()) {
        const int32_t child = compile(sub, path + ".properties." + name);
        nodes_[static_cast<size_t>(index)].property_nodes[i++] = child;
      }
    }
    if (s.contains("required")) {
      uint64_t required = 0;
      for (const json& name : s["required"]) {
        if (!name.is_string()) fail("{}.required: property names must be strings", path);
        const std::string quoted = name.dump();
        const std::string key = quoted.substr(1, quoted.size() - 2);
        const auto& keys = nodes_[static_cast<size_t>(index)].property_keys;
        size_t k = 0;
        while (k < keys.size() && keys[k] != key) ++k;
        if (k == keys.size()) fail("{}.required: \"{}\" is not among the properties", path, name.get<std::string>());
        required |= uint64_t{1} << k;
      }
      nodes_[static_cast<size_t>(index)].required = required;
    }
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      nodes_[static_cast<size_t>(index)].additional =
          a.is_boolean() ? (a.get<bool>() ? JsonSchema::kAnyNode : -1) : compile(a, path + ".additionalProperties");
    }
    if (s.contains("items")) {
      const int32_t items = compile(s["items"], path + ".items");
      nodes_[static_cast<size_t>(index)].items = items;
    }
    if (s.contains("anyOf")) {  // checked in run(), once every $ref node is whole
      std::vector<int32_t> alternatives;
      size_t i = 0;
      for (const json& alt : s["anyOf"])
        alternatives.push_back(compile(alt, path + ".anyOf[" + std::to_string(i++) + "]"));
      nodes_[static_cast<size_t>(index)].alternatives = std::move(alternatives);
      unions_.emplace_back(index, path);
    }
    return index;
  }

  static bool annotation(const std::string& key) {
    static const std::set<std::string> kAnnotations = {"title", "description", "default",    "examples", "$schema",
                                                       "$id",   "$comment",    "deprecated", "readOnly", "writeOnly"};
    return kAnnotations.count(key) > 0;
  }

  const json& root_;
  std::vector<JsonSchemaNode> nodes_;
  std::vector<std::pair<int32_t, std::string>> unions_;  // anyOf nodes and their paths, checked last
  std::map<std::string, int32_t> refs_;
  int depth_ = 0;
};

JsonSchema JsonSchema::compile(const json& schema) { return JsonSchemaCompiler(schema).run(); }

}  // namespace fl
