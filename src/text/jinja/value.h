#pragma once
// The values a Jinja template computes with. They follow Python's data model as Jinja2 (and so
// Hugging Face transformers) sees it: undefined and none are different things, int and float are
// different types (1.0 prints "1.0"), strings are sequences of code points, lists and dicts are
// shared by reference (an append through one name is seen through every other), dicts keep
// insertion order (tojson writes keys in that order).
//
// What this is not: a general Python object model. Dict keys are strings (JSON data and template
// literals only ever use strings), and there are no sets or user classes.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fl::jinja {

class Value;
class Interpreter;
struct CallArgs;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;  // tuples print as (a, b) and cannot be appended to
};

// Insertion-ordered string-keyed map. Small dicts (the common case: a chat message) are searched
// linearly; a hash index is built once a dict grows past a few dozen keys.
class DictData {
 public:
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
  bool erase(std::string_view key);
  // Defined after Value, which must be complete first.
  void clear();
  size_t size() const;
  bool empty() const;
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  void reindex() const;
  std::vector<std::pair<std::string, Value>> entries_;
  mutable std::unordered_map<std::string, size_t> index_;  // only when entries_.size() > kIndexAt
  static constexpr size_t kIndexAt = 32;
};

// Something a template can call: a builtin function, a macro, a bound method such as
// `message.get`. `name` is used in error messages.
class Callable {
 public:
  explicit Callable(std::string name) : name_(std::move(name)) {}
  virtual ~Callable() = default;
  virtual Value call(Interpreter& interp, CallArgs& args) = 0;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// The `loop` variable of a for loop. Its attributes are computed on access.
struct LoopData {
  std::shared_ptr<const ListData> items;  // the items iterated (after any inline `if`)
  int64_t index0 = 0;
  int64_t depth0 = 0;
  std::shared_ptr<Callable> recurse;  // set for `for ... recursive` loops: loop(children)
};

// Every list, dict, namespace and frame made during one render is recorded here, and emptied when
// the render ends. Templates can build reference cycles (a macro closes over the frame that holds
// it; x.append(x)); emptying everything the render made breaks them, so nothing leaks. Nothing a
// render creates is reachable afterwards (a render returns only text), so this is safe.
class RenderArena {
 public:
  RenderArena();
  ~RenderArena();
  RenderArena(const RenderArena&) = delete;
  RenderArena& operator=(const RenderArena&) = delete;
  // Records an object if a render is in progress on this thread.
  static void track(const std::shared_ptr<ListData>& p);
  static void track(const std::shared_ptr<DictData>& p);
  static void track_other(std::weak_ptr<void> p, void (*clear)(void*));

 private:
  struct Entry {
    std::weak_ptr<void> object;
    void (*clear)(void*);
  };
  std::vector<Entry> entries_;
  RenderArena* previous_;
};

class Value {
 public:
  enum class Type : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, ns, callable, loop };

  Value() = default;  // undefined
  Value(bool b) : type_(Type::boolean) { num_.b = b; }
  Value(int i) : type_(Type::integer) { num_.i = i; }
  Value(int64_t i) : type_(Type::integer) { num_.i = i; }
  Value(double d) : type_(Type::floating) { num_.d = d; }
  Value(std::string s) : type_(Type::string), str_(std::move(s)) {}
  Value(std::string_view s) : type_(Type::string), str_(s) {}
  Value(const char* s) : type_(Type::string), str_(s) {}

  // An undefined value remembers what was looked up, for the error if it is later misused.
  static Value undefined(std::string hint = {});
  static Value none();
  // A markupsafe.Markup string (from |safe or |escape): adding a plain string to it HTML-escapes
  // the plain one, as Jinja2 does even with autoescaping off. Prints like any other string.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict(DictData data = {});
  static Value ns(DictData data = {});
  static Value callable(std::shared_ptr<Callable> fn);
  static Value loop(std::shared_ptr<LoopData> data);

  // JSON in: objects become dicts (order kept), integers stay integers, floats stay floats.
  static Value from_json(const nlohmann::ordered_json& json);
  // JSON out, for tests and for handing values back to C++ (undefined becomes null).
  nlohmann::ordered_json to_json() const;

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::undefined; }
  bool is_none() const { return type_ == Type::none; }
  bool is_bool() const { return type_ == Type::boolean; }
  bool is_int() const { return type_ == Type::integer; }
  bool is_float() const { return type_ == Type::floating; }
  bool is_number() const { return type_ == Type::integer || type_ == Type::floating || type_ == Type::boolean; }
  bool is_string() const { return type_ == Type::string; }
  bool is_markup() const { return type_ == Type::string && num_.b; }
  bool is_list() const { return type_ == Type::list; }  // lists and tuples
  bool is_tuple() const { return type_ == Type::list && list_data().is_tuple; }
  bool is_dict() const { return type_ == Type::dict; }
  bool is_ns() const { return type_ == Type::ns; }
  bool is_callable() const { return type_ == Type::callable; }
  bool is_loop() const { return type_ == Type::loop; }

  bool as_bool() const { return num_.b; }
  int64_t as_int() const { return type_ == Type::boolean ? (num_.b ? 1 : 0) : num_.i; }
  double as_double() const;  // integer, float or boolean as a double
  const std::string& as_string() const { return str_; }
  const std::string& undefined_hint() const { return str_; }

  // Lists, dicts and namespaces are shared by reference (Python semantics), so the *_mut accessors
  // hand out the shared object even through a const Value.
  const ListData& list_data() const { return *static_cast<const ListData*>(obj_.get()); }
  ListData& list_mut() const { return *static_cast<ListData*>(obj_.get()); }
  const std::vector<Value>& items() const { return list_data().items; }
  const DictData& dict_data() const { return *static_cast<const DictData*>(obj_.get()); }  // dicts, namespaces
  DictData& dict_mut() const { return *static_cast<DictData*>(obj_.get()); }
  Callable& callable_ref() const { return *static_cast<Callable*>(obj_.get()); }
  std::shared_ptr<Callable> callable_ptr() const { return std::static_pointer_cast<Callable>(obj_); }
  const LoopData& loop_data() const { return *static_cast<const LoopData*>(obj_.get()); }

  // Identity of a shared object (lists, dicts, namespaces, callables), for `is sameas`.
  const void* identity() const { return obj_.get(); }

  // Python truthiness: empty strings, lists and dicts, 0, 0.0, none and undefined are false.
  bool truthy() const;

  // Python type name as it appears in error messages ('str', 'int', 'dict', ...).
  const char* type_name() const;

 private:
  Type type_ = Type::undefined;
  union {
    bool b;
    int64_t i;
    double d;
  } num_{};
  std::string str_;              // string payload, or the undefined hint
  std::shared_ptr<void> obj_;    // ListData, DictData, Callable or LoopData
};

inline size_t DictData::size() const { return entries_.size(); }
inline bool DictData::empty() const { return entries_.empty(); }
inline void DictData::clear() {
  entries_.clear();
  index_.clear();
}

}  // namespace fl::jinja
