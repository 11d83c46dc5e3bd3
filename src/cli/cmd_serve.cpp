// fireline serve [MODEL] : the OpenAI-compatible HTTP server (docs/http-api.md). Binds 127.0.0.1
// by default; -d detaches into the background with a pid file and a log under the fireline home;
// SIGTERM (or `fireline stop`) drains requests in flight and exits.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "cli/commands.h"
#include "cli/generation_cli.h"
#include "cli/model_arg.h"
#include "core/environment.h"
#include "core/error.h"
#include "core/log.h"
#include "server/daemon.h"
#include "server/fake_engine.h"
#include "server/model_engine.h"
#include "server/server.h"
#include "server/template_frontend.h"

namespace fl::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 11435;
  // Given or not: an empty value given (an unset shell variable) is an error, not "no key".
  std::optional<std::string> api_key, api_key_file;
  int64_t max_seq = 0;  // 0: the model's context, at most 4096
  int64_t prefill_chunk = 0;  // 0: 512
  std::string backend;  // empty: cuda when available, else cpu
  std::string kv;       // empty: q8 on cuda, f32 on cpu
  std::string precision;         // empty: bf16 (generation_cli.h)
  std::optional<uint64_t> seed;  // for requests without one
  int parallel = 4;
  int tp = 1;       // --tp: ranks of a tensor-parallel split (GPUs over NCCL, or CPU threads)
  bool ep = false;  // --ep: deal the experts out over those ranks
  bool detach = false;
  int queue = 0;
  int64_t max_body = 4 << 20;
  int http_threads = 256;
  double request_timeout_s = 30;
  double read_timeout_s = 10;
  double drain_timeout_s = 30;
  // Test engine (hidden): a scripted stand-in for a model.
  bool fake_engine = false;
  int fake_token_ms = 0;
  int fake_prefill_ms = 0;
};

std::chrono::milliseconds seconds_option(double s, const char* name) {
  if (!(s > 0 && s <= 86400)) fail("{} {} is outside (0, 86400] seconds", name, s);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

std::string read_api_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read the API key file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string key = ss.str();
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
  if (key.empty()) fail("the API key file {} is empty", path);
  return key;
}

std::string url_host(const std::string& host) { return host.find(':') != std::string::npos ? "[" + host + "]" : host; }

// The name /v1/models lists: a store name as given, a built-in model's name, a file's stem.
std::string served_model_id(const std::string& arg, const std::string& resolved) {
  if (resolved.starts_with(kEmbeddedPrefix)) return resolved.substr(kEmbeddedPrefix.size());
  if (resolved == arg && !std::filesystem::exists(arg)) return arg;
  std::filesystem::path p = std::filesystem::path(resolved).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  return p.has_extension() && p.extension() == ".fire" ? p.stem().string() : p.filename().string();
}

// The engine and prompt frontend of a real model (the loaded model is kept in `loaded`).
std::pair<std::unique_ptr<server::Engine>, std::unique_ptr<server::PromptFrontend>> model_engine(
    const ServeOptions& opt, LoadedModel& loaded) {
  const std::string resolved = opt.model.empty() ? default_model_path() : resolve_model_arg(opt.model);
  GenerationFlags flags;
  flags.backend = opt.backend;
  flags.kv = opt.kv;
  flags.precision = opt.precision;
  flags.ctx = opt.max_seq;
  flags.prefill_chunk = opt.prefill_chunk;
  flags.tp = opt.tp;
  flags.ep = opt.ep;
  loaded = load_model_for_text(resolved, flags, opt.parallel);
  const ModelText& text = *loaded.text;
  if (!text.chat_template)
    fail("{} has no usable chat template{}{}; serve needs one for /v1/chat/completions", resolved,
         text.chat_template_error.empty() ? "" : ": ", text.chat_template_error);
  server::ModelEngineConfig config;
  config.model_id = served_model_id(opt.model, resolved);
  config.context_length = loaded.context;
  config.parallel = opt.parallel;
  config.kv_dtype = loaded.kv_dtype;
  config.prefill_chunk = loaded.prefill_chunk;
  auto engine = std::make_unique<server::ModelEngine>(*loaded.model, loaded.text, config);
  auto frontend = std::make_unique<server::TemplatePromptFrontend>(chat::ChatTemplate(text.chat_template->source()), text.tokenizer);
  log_info("serve: {} on {} (KV {}, context {} x {} sequences), loaded in {:.2f} s", resolved, loaded.backend_name,
           loaded.kv_name, loaded.context, opt.parallel, loaded.load_s);
  return {std::move(engine), std::move(frontend)};
}

void run_serve(const ServeOptions& opt) {
  if (opt.parallel < 1 || opt.parallel > 1024) fail("--parallel {} is outside 1..1024", opt.parallel);
  if (opt.max_seq != 0 && opt.max_seq < 16) fail("--max-seq {} is too small (at least 16)", opt.max_seq);
  if (opt.queue < 0) fail("--queue {} must not be negative", opt.queue);
  if (opt.max_body < 1024) fail("--max-body {} is too small (at least 1024 bytes)", opt.max_body);
  if (opt.http_threads < 2 || opt.http_threads > 16384) fail("--http-threads {} is outside 2..16384", opt.http_threads);
  if (opt.api_key && opt.api_key_file) fail("give --api-key or --api-key-file, not both");
  if (opt.api_key && opt.api_key->empty())
    fail("--api-key is empty; give the key, or leave --api-key out to serve without one");
  if (opt.api_key_file && opt.api_key_file->empty()) fail("--api-key-file is empty; give the file that holds the key");
  // `--host "$HOST"` with HOST unset listened on every interface while printing an empty address.
  if (opt.host.empty())
    fail("--host is empty; give an address (127.0.0.1: this machine only, 0.0.0.0: every interface)");

  server::ServeConfig config;
  config.host = opt.host;
  config.port = opt.port;
  config.api_key = opt.api_key_file ? read_api_key_file(*opt.api_key_file) : opt.api_key.value_or("");
  config.max_waiting = opt.queue;
  config.default_seed = opt.seed;
  config.max_body_bytes = static_cast<size_t>(opt.max_body);
  config.http.max_threads = opt.http_threads;
  config.http.request_timeout = seconds_option(opt.request_timeout_s, "--request-timeout");
  config.http.read_timeout = seconds_option(opt.read_timeout_s, "--read-timeout");
  config.drain_timeout = seconds_option(opt.drain_timeout_s, "--drain-timeout");

  // Detach before any thread exists (the model is loaded in the daemon, which reports back once
  // it listens, or why it failed).
  const Environment env = Environment::from_process();
  const auto paths = server::DaemonPaths::under(env.home);
  std::optional<server::Daemon> daemon;
  if (opt.detach) daemon.emplace(server::detach(paths));

  // The signals are blocked (and watched) before any thread exists, the model's included. Until
  // the server runs, a signal ends the process at once: there is nothing to drain.
  server::SignalWatcher signals;
  std::atomic<server::Server*> running{nullptr};
  signals.start(
      [&running](int sig) {
        server::Server* srv = running.load();
        if (!srv) {
          log_info("serve: signal {} received while starting: exiting", sig);
          std::_Exit(128 + sig);
        }
        log_info("serve: signal {} received: draining requests in flight (a second signal cancels them)", sig);
        srv->shutdown();
      },
      [&running](int sig) {
        server::Server* srv = running.load();
        if (!srv) std::_Exit(128 + sig);
        log_info("serve: second signal: cancelling requests in flight");
        srv->shutdown(/*cancel_now=*/true);
      });
  LoadedModel loaded;  // outlives the server, whose engine uses it
  try {
    std::unique_ptr<server::Engine> engine;
    std::unique_ptr<server::PromptFrontend> frontend;
    if (opt.fake_engine) {
      server::FakeEngineConfig fake;
      fake.context_length = opt.max_seq > 0 ? opt.max_seq : 4096;
      fake.parallel = opt.parallel;
      fake.token_delay = std::chrono::milliseconds(std::max(0, opt.fake_token_ms));
      fake.prefill_delay = std::chrono::milliseconds(std::max(0, opt.fake_prefill_ms));
      engine = std::make_unique<server::FakeEngine>(fake);
      frontend = std::make_unique<server::FakePromptFrontend>();
    } else {
      std::tie(engine, frontend) = model_engine(opt, loaded);
      config.sampling_defaults = loaded.text->defaults.sampling;
    }
    server::Server srv(config, std::move(engine), std::move(frontend));
    const int port = srv.bind();
    const std::string url = fmt::format("http://{}:{}", url_host(opt.host), port);
    const auto& info = srv.engine_info();
    std::printf("fireline serve: %s on %s (context %lld, parallel %d)\n", info.model_id.c_str(), url.c_str(),
                static_cast<long long>(info.context_length), info.parallel);
    std::fflush(stdout);
    if (opt.host != "127.0.0.1" && opt.host != "localhost" && opt.host != "::1" && config.api_key.empty())
      log_warn("serving on {} without --api-key: anyone who can reach it can use it", opt.host);
    if (daemon)
      daemon->report_ready(fmt::format("fireline serve: listening on {} (pid {}, log {}); `fireline stop` ends it", url,
                                       ::getpid(), paths.log_file.string()));
    running.store(&srv);
    srv.run();
    signals.stop();  // before srv goes away
    running.store(nullptr);
    log_info("serve: stopped");
  } catch (const Error& e) {
    if (daemon) daemon->report_failure(e.what());
    throw;
  }
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto opt = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("model", opt->model,
                  "The model to serve: a .fire file, a checkpoint directory or a name from `fireline list` "
                  "(default: the built-in model)");
  cmd->add_option("--host", opt->host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", opt->port, "Port to listen on; 0 picks a free one (default 11435)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", opt->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--api-key-file", opt->api_key_file, "Read the API key from this file (keeps it out of ps)");
  cmd->add_option("--max-seq,--ctx", opt->max_seq,
                  "Context per sequence in tokens, prompt + output (default: the model's, at most 4096)");
  cmd->add_option("--backend", opt->backend, "cpu, cuda or cuda:N (default: cuda when available, else cpu)");
  cmd->add_option("--tp", opt->tp,
                  "Split the model over this many ranks (tensor parallel; GPUs 0..N-1 over NCCL, or CPU threads)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--ep", opt->ep, "With --tp: deal a mixture-of-experts model's experts out over the ranks");
  cmd->add_option("--kv", opt->kv, "KV cache type: f32, bf16, q8 (default: q8 on cuda, f32 on cpu)");
  add_precision_option(cmd, opt->precision);
  add_prefill_chunk_option(cmd, opt->prefill_chunk);
  cmd->add_option("--seed", opt->seed, "Sampling seed of requests that give none (default: a random one each)");
  cmd->add_option("--parallel", opt->parallel, "Sequences generated together (default 4)");
  cmd->add_flag("-d,--detach", opt->detach, "Run in the background: pid file and log under the fireline home");
  cmd->add_option("--queue", opt->queue,
                  "Requests that may wait for a free sequence; more get 503 (default 4 x --parallel)");
  cmd->add_option("--max-body", opt->max_body, "Largest request body in bytes; larger gets 413 (default 4 MiB)");
  cmd->add_option("--http-threads", opt->http_threads, "Connections served at once (default 256)");
  cmd->add_option("--request-timeout", opt->request_timeout_s,
                  "Seconds a client has to send a whole request (default 30)");
  cmd->add_option("--read-timeout", opt->read_timeout_s, "Seconds one read may wait for the client (default 10)");
  cmd->add_option("--drain-timeout", opt->drain_timeout_s,
                  "On SIGTERM, seconds to let requests finish before cancelling them (default 30)");
  cmd->add_flag("--fake-engine", opt->fake_engine, "Serve the scripted test engine instead of a model")->group("");
  cmd->add_option("--fake-token-ms", opt->fake_token_ms, "Test engine: milliseconds per step")->group("");
  cmd->add_option("--fake-prefill-ms", opt->fake_prefill_ms, "Test engine: extra milliseconds in a task's first step")
      ->group("");
  cmd->callback([opt] { run_serve(*opt); });
}

}  // namespace fl::cli
