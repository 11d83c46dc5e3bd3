#pragma once
// A fireline server with the fake engine, in-process on 127.0.0.1 and a free port, plus the raw
// socket and SSE helpers the server tests share.
#include <httplib.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/fake_engine.h"
#include "server/server.h"

namespace fl::test {

class TestServer {
 public:
  explicit TestServer(server::ServeConfig config = {}, server::FakeEngineConfig fake = {});
  ~TestServer();  // shuts down and waits for run() to return

  int port() const { return port_; }
  server::Server& server() { return *server_; }
  server::FakeEngineCounters& engine() { return *counters_; }
  httplib::Client client() const;

  // POST a JSON body; returns the response (status -1 when no response came).
  struct Reply {
    int status = -1;
    std::string body;
    httplib::Headers headers;
    nlohmann::json json() const;  // parses body (fails the test on invalid JSON)
  };
  Reply post(const std::string& path, const std::string& body, const httplib::Headers& headers = {}) const;
  Reply post(const std::string& path, const nlohmann::json& body, const httplib::Headers& headers = {}) const {
    return post(path, body.dump(), headers);
  }
  Reply get(const std::string& path, const httplib::Headers& headers = {}) const;

  // Waits until `done` holds or `timeout` passes; true when it held.
  template <typename F>
  static bool eventually(F done, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

 private:
  std::unique_ptr<server::Server> server_;
  std::shared_ptr<server::FakeEngineCounters> counters_;
  std::thread thread_;
  int port_ = -1;
};

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_payloads(const std::string& body);

// Raw sockets, for what a well-behaved client library will not do.
int connect_local(int port);  // blocking TCP connection to 127.0.0.1:port (-1 on failure)
bool send_all(int fd, const std::string& bytes);
// Reads until the peer closes or `timeout` passes.
std::string read_until_closed(int fd, std::chrono::milliseconds timeout);
// True when the peer has closed the connection within `timeout` (read returns 0 or an error).
bool closed_within(int fd, std::chrono::milliseconds timeout);

// A minimal chat request body.
nlohmann::json chat_body(const std::string& user_text, bool stream = false);

}  // namespace fl::test
