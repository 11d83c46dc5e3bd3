#include "server/server.h"

#include <strings.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "server/openai_format.h"

namespace fl::server {
namespace {

using nlohmann::ordered_json;

// Routes counted by name in /metrics; anything else is "other" (so random paths cannot grow the
// metric set).
std::string route_name(const std::string& path) {
  for (const char* route : {"/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/metrics"})
    if (path == route) return route;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

std::string error_type_for(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 500:
      return "server_error";
    case 503:
      return "server_busy";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// Compares without an early exit, so the time taken says nothing about how much of the key matched.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// A request may take its body limit plus room for the request line and headers (the library
// caps each header line at 8 KiB).
ServeConfig with_request_limit(ServeConfig config) {
  config.http.max_request_bytes = config.max_body_bytes + (256u << 10);
  return config;
}

}  // namespace

Server::Server(ServeConfig config, std::unique_ptr<Engine> engine, std::unique_ptr<PromptFrontend> frontend)
    : config_(with_request_limit(std::move(config))),
      loop_(std::move(engine), LoopLimits{config_.max_waiting}),
      frontend_(std::move(frontend)),
      http_(config_.http, metrics_) {
  FL_ASSERT(frontend_ != nullptr);
  started_at_ = static_cast<int64_t>(std::time(nullptr));
  std::random_device rd;
  id_prefix_ = fmt::format("{:08x}", rd());
  install_routes();
}

Server::~Server() {
  shutdown();
  join_watchdog();
}

void Server::join_watchdog() {
  std::thread watchdog;
  {
    std::lock_guard lock(shutdown_mutex_);  // shutdown() may be starting it on another thread
    watchdog = std::move(drain_watchdog_);
  }
  if (watchdog.joinable()) watchdog.join();
}

int Server::bind() {
  port_ = http_.bind(config_.host, config_.port);
  return port_;
}

void Server::run() {
  FL_ASSERT(port_ >= 0);
  http_.serve();
  // Every connection is closed; nothing can read events any more.
  loop_.cancel_all();
  join_watchdog();
}

void Server::shutdown(bool cancel_now) {
  std::lock_guard lock(shutdown_mutex_);
  if (cancel_now) loop_.cancel_all();
  if (shutting_down_) return;
  shutting_down_ = true;
  loop_.stop_accepting();
  http_.stop_listening();
  const auto deadline = std::chrono::steady_clock::now() + config_.drain_timeout;
  drain_watchdog_ = std::thread([this, deadline] {
    if (!loop_.wait_idle(deadline)) {
      log_warn("serve: requests still running after the drain timeout; cancelling them");
      loop_.cancel_all();
    }
  });
}

std::string Server::next_id(const char* prefix) {
  return fmt::format("{}-{}{:016x}", prefix, id_prefix_, next_id_.fetch_add(1));
}

void Server::send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status();
  if (error.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  if (error.status() == 503) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  res.set_content(error_body(error), "application/json");
}

bool Server::refuse_before_body(const httplib::Request& req, httplib::Response& res) {
  // Each refusal here comes before the body is read, so the connection closes after it: where
  // the request ends is unknown (or its body is not wanted).
  auto refuse_and_close = [&](const ApiError& error) {
    HttpServer::close_after_response();
    send_error(res, error);
    res.set_header("Connection", "close");
    return true;
  };
  // Framing the library would get wrong (RFC 9112 6.1, 6.3): it reads a body by the first of
  // several Content-Length headers and by Content-Length under a Transfer-Encoding it does not
  // decode, so the rest of the bytes would be read as a next request (request smuggling behind
  // a proxy that frames the message differently).
  auto refuse_framing = [&](const std::string& message) {
    return refuse_and_close(ApiError(400, "invalid_request_error", message));
  };
  const size_t lengths = req.get_header_value_count("Content-Length");
  for (size_t i = 1; i < lengths; ++i)
    if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length"))
      return refuse_framing("the request has several Content-Length headers that differ");
  if (req.has_header("Transfer-Encoding")) {
    const std::string te = req.get_header_value("Transfer-Encoding");
    if (req.get_header_value_count("Transfer-Encoding") != 1 || strcasecmp(te.c_str(), "chunked") != 0)
      return refuse_framing("Transfer-Encoding '" + te +
                            "' is not supported; send the body chunked or with Content-Length");
    if (lengths > 0) return refuse_framing("the request has both Transfer-Encoding and Content-Length");
  }
  // A POST without either has, by RFC 9112 6.3, no body; the library would instead read until
  // the client closes or the read timeout passes (10 s of a client waiting for nothing). Every
  // POST route takes a JSON body, so say what is missing at once.
  if (req.method == "POST" && lengths == 0 && !req.has_header("Transfer-Encoding"))
    return refuse_and_close(ApiError(411, "invalid_request_error",
                                     "the request has no Content-Length (or chunked Transfer-Encoding); every POST "
                                     "route takes a JSON body"));
  if (req.has_header("Content-Length")) {
    const std::string value = req.get_header_value("Content-Length");
    const bool digits =
        !value.empty() && value.size() <= 19 && value.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) return refuse_framing("Content-Length is not a byte count: " + value);
    if (std::stoull(value) > config_.max_body_bytes)
      return refuse_and_close(ApiError(
          413, "invalid_request_error",
          fmt::format("request body ({} bytes) is larger than the limit of {} bytes", value, config_.max_body_bytes),
          {}, "request_too_large"));
  }
  if (config_.api_key.empty() || req.path == "/health") return false;
  const std::string header = req.get_header_value("Authorization");
  const std::string expected = "Bearer " + config_.api_key;
  if (same_secret(header, expected)) return false;
  // Closed after it too: a keep-alive client's body, left unread, was parsed as its next request
  // (whose answer was then "400 malformed HTTP request").
  return refuse_and_close(ApiError(
      401, "authentication_error",
      header.empty() ? "missing API key: send it as 'Authorization: Bearer KEY'" : "invalid API key", {},
      "invalid_api_key"));
}

void Server::install_routes() {
  http_.set_payload_max_length(config_.max_body_bytes);

  // Runs after the headers and before the body is read: refuse oversized bodies by their
  // Content-Length without reading them, then check the API key (every route but /health).
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Range is ignored (RFC 9110 14.2 allows it): the library would otherwise cut a POST's answer,
    // or an error body, to the asked bytes (206, or a 4xx whose body is not whole JSON).
    const_cast<httplib::Request&>(req).ranges.clear();  // the library's own Request, not const
    return refuse_before_body(req, res) ? httplib::Server::HandlerResponse::Handled
                                        : httplib::Server::HandlerResponse::Unhandled;
  });
  // Expect: 100-continue: the library answers "100 Continue" before the pre-routing handler runs,
  // which invited a body that was then refused (413, 401) and dropped. The same checks answer
  // first: a refusal goes out in place of the 100.
  http_.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return refuse_before_body(req, res) ? res.status : 100;
  });

  // Errors raised by the library itself (unknown route, body too large, bad request line) come
  // with an empty body: give them the same JSON shape as ours.
  http_.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (HttpServer::request_over_limit()) {
          res.status = 413;  // a chunked body past the limit: the library reports it as 400
          HttpServer::close_after_response();
        } else if (res.status == 400 || res.status == 414) {
          // A request line, header or body the library could not read: where this request ends is
          // unknown, so what follows on the connection must not be read as a next request.
          HttpServer::close_after_response();
          res.set_header("Connection", "close");
        }
        std::string message;
        std::string code;
        switch (res.status) {
          case 404:
            message = fmt::format("no route for {} {}", req.method, req.path);
            break;
          case 413:
            message = fmt::format("request body is larger than the limit of {} bytes", config_.max_body_bytes);
            code = "request_too_large";
            break;
          case 414:
            message = "request URI is too long";
            break;
          case 400:
            message = "malformed HTTP request";
            break;
          default:
            message = fmt::format("HTTP status {}", res.status);
            break;
        }
        res.set_content(error_body(ApiError(res.status, error_type_for(res.status), message, {}, code)),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));

  http_.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    log_error("serve: handler failed: {}", what);
    send_error(res, ApiError(500, "server_error", "internal error: " + what));
  });

  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(route_name(req.path), res.status);
    if (res.status >= 400) metrics_.count_error(error_type_for(res.status));
    log_debug("{} {} -> {}", req.method, req.path, res.status);
  });

  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (http_.draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });

  auto model_json = [this] {
    const EngineInfo& info = loop_.info();
    return ordered_json{{"id", info.model_id},
                        {"object", "model"},
                        {"created", started_at_},
                        {"owned_by", "fireline"},
                        {"context_length", info.context_length}};
  };
  http_.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& res) {
    ordered_json j = {{"object", "list"}, {"data", ordered_json::array({model_json()})}};
    res.set_content(j.dump(), "application/json");
  });
  http_.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != loop_.info().model_id) {
      send_error(res,
                 ApiError(404, "not_found_error", fmt::format("model '{}' is not served here", req.matches[1].str()),
                          "model", "model_not_found"));
      return;
    }
    res.set_content(model_json().dump(), "application/json");
  });

  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(loop_.stats()), "text/plain; version=0.0.4");
  });

  http_.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res) { handle_chat(req, res); });
  http_.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res); });
}

}  // namespace fl::server
