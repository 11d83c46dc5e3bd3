#pragma once
// The fireline HTTP server: OpenAI-compatible routes over an InferenceLoop.
//
//   GET  /health                 liveness (no API key needed)
//   GET  /v1/models              the served model (and /v1/models/{id})
//   POST /v1/chat/completions    chat, streamed as SSE or whole
//   POST /v1/completions         raw text completion
//   GET  /metrics                Prometheus text
//
// Route handlers run on HTTP worker threads: they parse and validate the body, render and
// tokenize the prompt (PromptFrontend), submit a GenerationTask to the InferenceLoop, and format
// the events they get back. docs/http-api.md describes the API.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "server/api_error.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/inference_loop.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/prompt_frontend.h"

namespace fl::server {

struct ServeConfig {
  std::string host = "127.0.0.1";
  int port = 11435;                                // 0: any free port
  std::string api_key;                             // empty: no authentication
  int max_waiting = 0;                             // admission queue; 0: 4 x the engine's parallel sequences
  size_t max_body_bytes = 4u << 20;                // larger bodies get 413
  int retry_after_s = 1;                           // Retry-After on 503 (queue full)
  std::chrono::milliseconds drain_timeout{30000};  // SIGTERM: wait this long for requests, then cancel
  HttpLimits http;
  RequestLimits requests;
  SamplingParams sampling_defaults;  // for fields a request leaves out (the model's generation_config)
  std::optional<uint64_t> default_seed;  // the seed of requests that give none (else a random one each)
};

class Server {
 public:
  Server(ServeConfig config, std::unique_ptr<Engine> engine, std::unique_ptr<PromptFrontend> frontend);
  ~Server();  // shuts down (cancelling what is left) if run() was used
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the address; returns the port (the chosen one when config.port is 0). Throws fl::Error.
  int bind();
  // Serves until shutdown() has drained every connection. Call bind() first.
  void run();
  // Thread-safe, returns at once: stop accepting; requests in flight get drain_timeout to finish,
  // then their generations are cancelled (at once with cancel_now). run() returns when every
  // connection is closed.
  void shutdown(bool cancel_now = false);

  int port() const { return port_; }
  const EngineInfo& engine_info() const { return loop_.info(); }
  LoopStats stats() const { return loop_.stats(); }
  const ServerMetrics& metrics() const { return metrics_; }

 private:
  void install_routes();
  // The checks made on a request's head before its body is read (framing, size, API key): true
  // when it is refused, with `res` holding the error.
  bool refuse_before_body(const httplib::Request& req, httplib::Response& res);
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  // Submits a request's tasks (one per prompt and choice: n consecutive tasks per prompt, choice
  // i = tasks[i]) and answers: SSE when `stream` (the choices' chunks interleaved as they come,
  // each with its index), else one JSON body.
  void respond(std::vector<GenerationTask> tasks, const GenerationRequest& generation, bool chat,
               httplib::Response& res);
  // The whole (not streamed) response of `tasks`, `per_prompt` consecutive ones per prompt.
  void respond_many(std::vector<GenerationTask> tasks, bool chat, int per_prompt, httplib::Response& res);
  // Queues every task under the response id `id`, or none (503: queue full or shutting down).
  std::vector<std::shared_ptr<TaskStream>> submit_all(std::vector<GenerationTask> tasks, const std::string& id);
  void send_error(httplib::Response& res, const ApiError& error);
  std::string next_id(const char* prefix);
  void join_watchdog();

  ServeConfig config_;
  ServerMetrics metrics_;
  InferenceLoop loop_;
  std::unique_ptr<PromptFrontend> frontend_;
  HttpServer http_;
  int port_ = -1;
  int64_t started_at_ = 0;  // unix seconds, for /v1/models
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{1};

  std::mutex shutdown_mutex_;
  bool shutting_down_ = false;
  std::thread drain_watchdog_;
};

}  // namespace fl::server
