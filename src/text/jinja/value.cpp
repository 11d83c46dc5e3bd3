#include "text/jinja/value.h"

#include "core/error.h"

namespace fl::jinja {

// ---- DictData ----

void DictData::reindex() const {
  index_.clear();
  if (entries_.size() <= kIndexAt) return;
  index_.reserve(entries_.size() * 2);
  for (size_t k = 0; k < entries_.size(); ++k) index_.emplace(entries_[k].first, k);
}

const Value* DictData::find(std::string_view key) const {
  if (entries_.size() > kIndexAt) {
    if (index_.size() != entries_.size()) reindex();
    auto it = index_.find(std::string(key));
    return it == index_.end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& [k, v] : entries_)
    if (k == key) return &v;
  return nullptr;
}

Value* DictData::find(std::string_view key) { return const_cast<Value*>(std::as_const(*this).find(key)); }

void DictData::set(std::string key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (entries_.size() > kIndexAt) {
    if (index_.size() + 1 == entries_.size()) {
      index_.emplace(entries_.back().first, entries_.size() - 1);
    } else {
      reindex();
    }
  }
}

bool DictData::erase(std::string_view key) {
  for (size_t k = 0; k < entries_.size(); ++k) {
    if (entries_[k].first == key) {
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(k));
      reindex();
      return true;
    }
  }
  return false;
}

// ---- RenderArena ----

namespace {
thread_local RenderArena* g_arena = nullptr;
}

RenderArena::RenderArena() : previous_(g_arena) { g_arena = this; }

RenderArena::~RenderArena() {
  g_arena = previous_;
  // Keep every object alive while clearing, so that clearing one cannot free another that is
  // still waiting in the list.
  std::vector<std::shared_ptr<void>> alive;
  alive.reserve(entries_.size());
  for (auto& e : entries_) alive.push_back(e.object.lock());
  for (size_t k = 0; k < entries_.size(); ++k)
    if (alive[k]) entries_[k].clear(alive[k].get());
}

void RenderArena::track(const std::shared_ptr<ListData>& p) {
  if (g_arena) g_arena->entries_.push_back({p, [](void* o) { static_cast<ListData*>(o)->items.clear(); }});
}

void RenderArena::track(const std::shared_ptr<DictData>& p) {
  if (g_arena) g_arena->entries_.push_back({p, [](void* o) { static_cast<DictData*>(o)->clear(); }});
}

void RenderArena::track_other(std::weak_ptr<void> p, void (*clear)(void*)) {
  if (g_arena) g_arena->entries_.push_back({std::move(p), clear});
}

// ---- Value ----

Value Value::undefined(std::string hint) {
  Value v;
  v.str_ = std::move(hint);
  return v;
}

Value Value::none() {
  Value v;
  v.type_ = Type::none;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.num_.b = true;
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.type_ = Type::list;
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  RenderArena::track(data);
  v.obj_ = std::move(data);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.list_mut().is_tuple = true;
  return v;
}

Value Value::dict(DictData data) {
  Value v;
  v.type_ = Type::dict;
  auto p = std::make_shared<DictData>(std::move(data));
  RenderArena::track(p);
  v.obj_ = std::move(p);
  return v;
}

Value Value::ns(DictData data) {
  Value v;
  v.type_ = Type::ns;
  auto p = std::make_shared<DictData>(std::move(data));
  RenderArena::track(p);
  v.obj_ = std::move(p);
  return v;
}

Value Value::callable(std::shared_ptr<Callable> fn) {
  Value v;
  v.type_ = Type::callable;
  v.obj_ = std::move(fn);
  return v;
}

Value Value::loop(std::shared_ptr<LoopData> data) {
  Value v;
  v.type_ = Type::loop;
  v.obj_ = std::move(data);
  return v;
}

namespace {

Value from_json_at(const nlohmann::ordered_json& json, int depth) {
  if (depth > 512) fail("JSON value nested more than 512 levels deep");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(json.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData data;
      for (const auto& [key, item] : json.items()) data.set(key, from_json_at(item, depth + 1));
      return Value::dict(std::move(data));
    }
    default: fail("JSON value of type {} cannot be used in a template", json.type_name());
  }
}

nlohmann::ordered_json to_json_at(const Value& v, int depth) {
  if (depth > 512) fail("value nested more than 512 levels deep");
  switch (v.type()) {
    case Value::Type::undefined:
    case Value::Type::none: return nullptr;
    case Value::Type::boolean: return v.as_bool();
    case Value::Type::integer: return v.as_int();
    case Value::Type::floating: return v.as_double();
    case Value::Type::string: return v.as_string();
    case Value::Type::list: {
      auto arr = nlohmann::ordered_json::array();
      for (const auto& item : v.items()) arr.push_back(to_json_at(item, depth + 1));
      return arr;
    }
    case Value::Type::dict:
    case Value::Type::ns: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [key, item] : v.dict_data().entries()) obj[key] = to_json_at(item, depth + 1);
      return obj;
    }
    default: fail("a {} cannot be converted to JSON", v.type_name());
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& json) { return from_json_at(json, 0); }

nlohmann::ordered_json Value::to_json() const { return to_json_at(*this, 0); }

double Value::as_double() const {
  switch (type_) {
    case Type::floating: return num_.d;
    case Type::integer: return static_cast<double>(num_.i);
    case Type::boolean: return num_.b ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (type_) {
    case Type::undefined:
    case Type::none: return false;
    case Type::boolean: return num_.b;
    case Type::integer: return num_.i != 0;
    case Type::floating: return num_.d != 0.0;
    case Type::string: return !str_.empty();
    case Type::list: return !items().empty();
    case Type::dict: return !dict_data().empty();
    default: return true;
  }
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::undefined: return "undefined";
    case Type::none: return "NoneType";
    case Type::boolean: return "bool";
    case Type::integer: return "int";
    case Type::floating: return "float";
    case Type::string: return "str";
    case Type::list: return list_data().is_tuple ? "tuple" : "list";
    case Type::dict: return "dict";
    case Type::ns: return "Namespace";
    case Type::callable: return "function";
    case Type::loop: return "LoopContext";
  }
  return "?";
}

}  // namespace fl::jinja
