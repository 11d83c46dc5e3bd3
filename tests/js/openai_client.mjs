// Drives a running `fireline serve --fake-engine` with the official `openai` npm client (v6) and
// prints what the client made of each response as JSON on stdout; tests/server/clients_test.cpp
// checks it. Nothing is asserted here, so a failure shows the whole picture.
//   node tests/js/openai_client.mjs BASE_URL API_KEY
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, timeout: 20000, maxRetries: 0 });
const model = "fireline-fake";
const out = {};

// Runs one check; an exception is recorded instead of ending the script.
async function check(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { exception: String(e), status: e.status ?? null, error: e.error ?? null };
  }
}

await check("models", async () => {
  const list = await client.models.list();
  return { ids: list.data.map((m) => m.id) };
});

await check("chat", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "hello from openai" }],
  });
  return {
    id: r.id,
    object: r.object,
    content: r.choices[0].message.content,
    finish_reason: r.choices[0].finish_reason,
    usage: r.usage,
  };
});

await check("stream", async () => {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "stream these words" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, finish_reason: finish, usage, chunks };
});

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

await check("tools", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "weather in Paris [[tool]]" }],
    tools,
  });
  const call = r.choices[0].message.tool_calls[0];
  return {
    finish_reason: r.choices[0].finish_reason,
    name: call.function.name,
    id: call.id,
    arguments: JSON.parse(call.function.arguments),
  };
});

await check("tools_stream", async () => {
  // The helper that accumulates streamed tool-call deltas into whole calls.
  const runner = client.chat.completions.stream({
    model,
    messages: [{ role: "user", content: "weather in Oslo [[tool]]" }],
    tools,
  });
  const final = await runner.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  return { finish_reason: final.choices[0].finish_reason, name: call.function.name, arguments: JSON.parse(call.function.arguments) };
});

await check("reasoning", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "think first" }],
    chat_template_kwargs: { enable_thinking: true },
  });
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "think first" }],
    reasoning_effort: "high",
    stream: true,
  });
  let streamed = "";
  let content = "";
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      streamed += c.delta?.reasoning_content ?? "";
      content += c.delta?.content ?? "";
    }
  }
  return {
    reasoning_content: r.choices[0].message.reasoning_content,
    content: r.choices[0].message.content,
    reasoning_tokens: r.usage.completion_tokens_details.reasoning_tokens,
    streamed_reasoning: streamed,
    streamed_content: content,
  };
});

await check("logprobs", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "rate these" }],
    logprobs: true,
    top_logprobs: 2,
  });
  // The stream helper gathers the chunks' logprobs into the final message's.
  const runner = client.chat.completions.stream({
    model,
    messages: [{ role: "user", content: "rate these" }],
    logprobs: true,
    top_logprobs: 2,
  });
  const final = await runner.finalChatCompletion();
  const entries = (lp) => (lp?.content ?? []).map((e) => ({ token: e.token, logprob: e.logprob, top: e.top_logprobs.length }));
  return { entries: entries(r.choices[0].logprobs), streamed: entries(final.choices[0].logprobs) };
});

// n = 3 streamed: the helper puts each choice together from the chunks that name its index.
await check("stream_n", async () => {
  const runner = client.chat.completions.stream({
    model,
    messages: [{ role: "user", content: "three at once" }],
    n: 3,
    stream_options: { include_usage: true },
  });
  const final = await runner.finalChatCompletion();
  return {
    choices: final.choices.map((c) => ({ index: c.index, content: c.message.content, finish_reason: c.finish_reason })),
    usage: final.usage,
  };
});

await check("completion", async () => {
  const r = await client.completions.create({ model, prompt: "complete me", max_tokens: 16 });
  return { object: r.object, text: r.choices[0].text, finish_reason: r.choices[0].finish_reason };
});

await check("bad_request", async () => {
  try {
    await client.chat.completions.create({ model, messages: [] });
    return { thrown: false };
  } catch (e) {
    return { thrown: true, status: e.status, type: e.type ?? null, param: e.param ?? null, message: e.message };
  }
});

await check("bad_key", async () => {
  const other = new OpenAI({ baseURL, apiKey: "wrong-key", timeout: 20000, maxRetries: 0 });
  try {
    await other.models.list();
    return { thrown: false };
  } catch (e) {
    return { thrown: true, status: e.status, name: e.constructor.name };
  }
});

process.stdout.write(JSON.stringify(out) + "\n");
