#include "server/battery.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace fl::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) words.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

// Distinct share and most-frequent share of a run of words.
void shares(const std::vector<std::string>& w, size_t begin, size_t end, double& distinct, double& top) {
  std::unordered_map<std::string_view, int> counts;
  int most = 0;
  for (size_t i = begin; i < end; ++i) most = std::max(most, ++counts[w[i]]);
  const double n = static_cast<double>(end - begin);
  distinct = counts.size() / n;
  top = most / n;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Filler prose for the haystack: sentences of words drawn by a fixed generator, so the text is the
// same on every run and has no repeated phrases for a model to lock onto.
std::string filler(int n_words) {
  static const char* kWords[] = {
      "river",  "stone",   "garden",  "window", "morning", "quiet",   "market",  "letter",  "harbor",   "lantern",
      "copper", "meadow",  "thunder", "violet", "engine",  "pocket",  "silver",  "forest",  "candle",   "basket",
      "winter", "bridge",  "orchard", "pebble", "canvas",  "velvet",  "island",  "shadow",  "compass",  "feather",
      "ribbon", "valley",  "marble",  "saddle", "timber",  "crystal", "harvest", "anchor",  "blanket",  "cellar",
      "walked", "noticed", "carried", "opened", "painted", "counted", "folded",  "watched", "borrowed", "mended",
      "slowly", "briefly", "gently",  "often",  "rarely",  "nearby",  "across",  "beneath", "beyond",   "along",
      "old",    "bright",  "narrow",  "heavy",  "distant", "patient", "curious", "hollow",  "golden",   "simple",
      "a",      "the",     "every",   "some",   "another", "their",   "her",     "his",     "our",      "each"};
  constexpr size_t kCount = sizeof(kWords) / sizeof(kWords[0]);
  uint64_t state = 0x2545F4914F6CDD1Dull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  std::string out;
  int in_sentence = 0;
  const int sentence_length = 9;
  for (int i = 0; i < n_words; ++i) {
    std::string w = kWords[next() % kCount];
    if (in_sentence == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    out += w;
    if (++in_sentence == sentence_length + static_cast<int>(next() % 6)) {
      out += ". ";
      in_sentence = 0;
    } else {
      out += ' ';
    }
  }
  return out + "\n";
}

std::string base_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.compare(url.size() - 3, 3, "/v1") == 0) url.resize(url.size() - 3);
  if (url.find("://") == std::string::npos) url = "http://" + url;
  return url;
}

// One streamed chat completion, read as it arrives.
struct TurnResult {
  std::string content, reasoning, tool_text;
  std::string finish_reason;
  int64_t completion_tokens = 0;
  double ttft_ms = -1;
  std::string error;
};

TurnResult stream_turn(httplib::Client& client, const httplib::Headers& headers, const json& body) {
  TurnResult r;
  std::string pending;
  std::map<int, std::string> tools;
  const auto t0 = Clock::now();
  bool done = false;
  auto on_event = [&](const std::string& data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    json chunk = json::parse(data, nullptr, false);
    if (chunk.is_discarded()) {
      r.error = "the stream sent an event that is not JSON";
      return;
    }
    if (chunk.contains("error")) {
      r.error = "error event: " + chunk["error"].value("message", chunk["error"].dump());
      return;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object())
      r.completion_tokens = chunk["usage"].value("completion_tokens", int64_t{0});
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return;
    const json& choice = chunk["choices"][0];
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
      r.finish_reason = choice["finish_reason"];
    if (!choice.contains("delta") || !choice["delta"].is_object()) return;
    const json& delta = choice["delta"];
    auto text = [&](const char* key) -> std::string {
      return delta.contains(key) && delta[key].is_string() ? delta[key].get<std::string>() : std::string();
    };
    const std::string reasoning = text("reasoning_content"), content = text("content");
    if (r.ttft_ms < 0 && !(reasoning.empty() && content.empty()))
      r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.reasoning += reasoning;
    r.content += content;
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
      for (const auto& call : delta["tool_calls"]) {
        const int index = call.value("index", 0);
        if (call.contains("function") && call["function"].is_object()) {
          const json& fn = call["function"];
          if (fn.contains("name") && fn["name"].is_string()) tools[index] += fn["name"].get<std::string>();
          if (fn.contains("arguments") && fn["arguments"].is_string())
            tools[index] += fn["arguments"].get<std::string>();
        }
      }
    }
  };

  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = headers;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string error_body;
  int status = 0;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, n);
      return error_body.size() < (1u << 20);
    }
    pending.append(data, n);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
    }
    return true;
  };
  auto res = client.send(req);
  if (!res) {
    r.error = "no response: " + httplib::to_string(res.error());
    return r;
  }
  if (status != 200) {
    json e = json::parse(error_body, nullptr, false);
    std::string message =
        !e.is_discarded() && e.contains("error") ? e["error"].value("message", error_body) : error_body;
    r.error = "HTTP " + std::to_string(status) + ": " + message;
    return r;
  }
  if (r.error.empty() && !done) r.error = "the stream ended without [DONE]";
  for (const auto& [_, t] : tools) r.tool_text += t;
  return r;
}

}  // namespace

bool is_attractor(std::string_view text) {
  const auto w = split_words(text);
  const size_t n = w.size();
  if (n == 0) return false;
  double distinct, top;
  const size_t head = std::min<size_t>(n, 128);
  shares(w, 0, head, distinct, top);
  if (head >= 16 && (distinct < 0.15 || top > 0.5)) return true;
  shares(w, n - head, n, distinct, top);
  if (head >= 16 && (distinct < 0.30 || top > 0.5)) return true;
  if (n >= 6) {
    const size_t half = n / 2;
    std::map<std::tuple<std::string_view, std::string_view, std::string_view>, int> grams;
    for (size_t i = half; i + 2 < n; ++i) ++grams[{w[i], w[i + 1], w[i + 2]}];
    size_t total = 0, repeated = 0;
    for (const auto& [_, count] : grams) {
      total += count;
      if (count > 1) repeated += count;
    }
    if (total > 0 && static_cast<double>(repeated) / total > 0.5) return true;
  }
  return false;
}

std::vector<BatteryCase> default_battery_cases(int needle_words) {
  std::vector<BatteryCase> cases = {
      {"code",
       {"Write a Python function merge_sorted(a, b) that merges two sorted lists into one sorted list without "
        "calling sorted() or sort(). Include a short docstring."},
       {"def merge_sorted"}},
      {"arithmetic",
       {"A train travels at 60 km/h for 2.5 hours, then at 40 km/h for 1.5 hours. How many kilometres does it "
        "travel in total? Show the steps, then give the total."},
       {"210"}},
      {"factual", {"What is the capital of France? Answer in one sentence."}, {"Paris"}},
      {"prose",
       {"Continue this story in four sentences: The lighthouse keeper climbed down to the rocks at dawn and found "
        "something that had not been there the night before."},
       {}},
      {"instruction", {"Reply with exactly the word BANANA in capital letters and nothing else."}, {"BANANA"}},
      {"recall",
       {"My name is Priya and my favourite colour is teal. Please acknowledge in one short sentence.",
        "What is my favourite colour? Answer in one word."},
       {"teal"}},
  };
  const int before = std::max(0, needle_words / 10);
  std::string haystack = filler(before) + "The secret code for the vault is 7316. " + filler(needle_words - before) +
                         "\nWhat is the secret code for the vault? Answer with the number only.";
  cases.push_back({"needle", {std::move(haystack)}, {"7316"}});
  return cases;
}

std::vector<BatteryCase> load_battery_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read the battery cases file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_array()) fail("{}: expected a JSON array of cases", path);
  std::vector<BatteryCase> cases;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& c = j[i];
    if (!c.is_object()) fail("{}: case {} is not an object", path, i);
    BatteryCase bc;
    bc.name = c.contains("name") && c["name"].is_string() ? c["name"].get<std::string>() : "case" + std::to_string(i);
    if (c.contains("prompt") && c["prompt"].is_string()) bc.turns.push_back(c["prompt"]);
    if (c.contains("turns") && c["turns"].is_array())
      for (const auto& t : c["turns"]) {
        if (!t.is_string()) fail("{}: case {} has a turn that is not a string", path, bc.name);
        bc.turns.push_back(t);
      }
    if (bc.turns.empty()) fail("{}: case {} has neither \"prompt\" nor \"turns\"", path, bc.name);
    if (c.contains("expect")) {
      const json& e = c["expect"];
      if (e.is_string())
        bc.expect.push_back(e);
      else if (e.is_array())
        for (const auto& s : e) {
          if (!s.is_string()) fail("{}: case {} has an expect entry that is not a string", path, bc.name);
          bc.expect.push_back(s);
        }
      else
        fail("{}: case {}: expect must be a string or an array of strings", path, bc.name);
    }
    cases.push_back(std::move(bc));
  }
  if (cases.empty()) fail("{}: no cases", path);
  return cases;
}

std::vector<BatteryRow> run_battery(const BatteryOptions& options, const std::vector<BatteryCase>& cases,
                                    const std::function<void(const BatteryRow&)>& on_row) {
  const std::string url = base_url(options.url);
  httplib::Client client(url);
  if (!client.is_valid()) fail("battery: cannot use the URL {}", options.url);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(static_cast<time_t>(options.timeout.count()), 0);
  client.set_write_timeout(60, 0);
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);

  std::string model = options.model;
  if (model.empty()) {
    auto res = client.Get("/v1/models", headers);
    if (!res) fail("battery: cannot reach {}: {}", url, httplib::to_string(res.error()));
    json j = json::parse(res->body, nullptr, false);
    if (res->status != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].contains("id"))
      fail("battery: {}/v1/models answered {} without a model list", url, res->status);
    model = j["data"][0]["id"].get<std::string>();
  }

  std::vector<BatteryRow> rows;
  for (bool thinking : options.thinking) {
    for (const auto& c : cases) {
      BatteryRow row;
      row.name = c.name;
      row.thinking = thinking;
      json messages = json::array();
      const auto t0 = Clock::now();
      TurnResult turn;
      for (const auto& user : c.turns) {
        messages.push_back({{"role", "user"}, {"content", user}});
        json body = {{"model", model},
                     {"messages", messages},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"max_tokens", options.max_tokens},
                     {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
        turn = stream_turn(client, headers, body);
        if (!turn.error.empty()) break;
        row.completion_tokens += turn.completion_tokens;
        row.runaway = row.runaway || turn.finish_reason == "length";
        row.empty = row.empty || (turn.content.empty() && turn.tool_text.empty());
        row.attractor = row.attractor || is_attractor(turn.reasoning + " " + turn.content);
        messages.push_back({{"role", "assistant"}, {"content", turn.content}});
      }
      row.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      row.error = turn.error;
      row.finish_reason = turn.finish_reason;
      row.ttft_ms = turn.ttft_ms;
      row.answer = turn.content;
      if (row.error.empty() && !c.expect.empty()) {
        // The answer, else tool-call text, else the reasoning (a model may only say it there).
        const std::string haystack = lower(!turn.content.empty()     ? turn.content
                                           : !turn.tool_text.empty() ? turn.tool_text
                                                                     : turn.reasoning);
        row.expected = static_cast<int>(c.expect.size());
        for (const auto& e : c.expect) row.found += haystack.find(lower(e)) != std::string::npos;
        row.retrieval_miss = row.found < row.expected;
      }
      if (!row.error.empty()) row.runaway = row.empty = row.attractor = row.retrieval_miss = false;
      if (on_row) on_row(row);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace fl::server
