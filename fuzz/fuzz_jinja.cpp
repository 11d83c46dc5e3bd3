// Fuzzes the Jinja lexer, parser and interpreter: any byte string, taken as a template and rendered
// with a chat-like set of variables, must either render or fail with fl::Error (TemplateError);
// never crash, hang, overflow the stack or leak. Tight limits keep every input fast.
#include <cstdint>
#include <ctime>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja/template.h"

namespace {

const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "hi <b>"}, {"type": "image"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hm",
       "tool_calls": [{"id": "a1b2c3d4e", "type": "function",
                       "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5], "z": {"k": "v"}}}}]},
      {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "{\"ok\": 1}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<bos>", "eos_token": "<eos>"
  })");
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  fl::jinja::RenderOptions options;
  options.limits.max_depth = 200;
  options.limits.max_iterations = 2000;
  options.limits.max_output_bytes = 1 << 16;
  std::tm now{};
  now.tm_year = 126, now.tm_mon = 2, now.tm_mday = 9;
  options.now = now;
  try {
    fl::jinja::Template t(source, {.name = "fuzz"});
    volatile size_t sink = t.render(variables(), options).size();
    (void)sink;
  } catch (const fl::Error&) {
  }
  return 0;
}
