#pragma once
// The HTTP transport: cpp-httplib's request parsing and routing, with fireline's own connection
// handling underneath.
//
// cpp-httplib 0.11 (Debian 12) serves each connection on a pool thread through a keep-alive
// loop over its own socket stream. HttpServer replaces that loop (process_and_close_socket) and
// the stream, which is what makes these possible:
//   - a deadline for reading a whole request (headers and body), on top of the per-read timeout,
//     so a slowloris client that trickles bytes cannot hold a worker thread for long;
//   - telling whether a handler's client is still connected (client_connected()), so a
//     generation whose client went away is cancelled, streaming or not;
//   - draining: stop_listening() closes the listening socket, lets requests in progress finish and
//     closes idle keep-alive connections, and serve() returns once every connection is done;
//   - a worker pool that grows with demand up to a cap (each streaming client holds a thread);
//   - a listen backlog larger than the library's fixed 5.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

#include "server/metrics.h"

namespace fl::server {

struct HttpLimits {
  std::chrono::milliseconds read_timeout{10000};       // one read waiting for bytes
  std::chrono::milliseconds write_timeout{10000};      // one write waiting for the client
  std::chrono::milliseconds request_timeout{30000};    // first byte of a request -> its last byte
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle connection waiting for a request
  int keep_alive_max_requests = 100;
  // Bytes one request may take, head and body (0: no limit). Enforced while reading, so it holds
  // for chunked bodies too (the library checks only Content-Length against its payload limit).
  size_t max_request_bytes = 0;
  int max_threads = 256;  // connections served at once; more wait for a free thread
  int listen_backlog = 1024;
};

class HttpServer : public httplib::Server {
 public:
  HttpServer(HttpLimits limits, ServerMetrics& metrics);
  ~HttpServer() override;

  // Binds host:port (port 0: any free port) and returns the port. Throws fl::Error.
  int bind(const std::string& host, int port);
  // Serves until stop_listening() and every connection is closed.
  void serve();
  // Thread-safe. Stops accepting connections; requests in progress finish; idle connections close.
  void stop_listening();
  bool draining() const { return draining_.load(); }

  // Called from a route handler: whether its client is still connected (true outside a handler).
  static bool client_connected();
  // Called from a handler that answers without reading the body (e.g. 413 on its Content-Length):
  // the connection closes after this response, gently enough that the client still reads it.
  static void close_after_response();
  // Called from the error handler: whether the request being answered ran past max_request_bytes.
  static bool request_over_limit();

 private:
  bool process_and_close_socket(socket_t sock) override;

  HttpLimits limits_;
  ServerMetrics& metrics_;
  std::atomic<bool> draining_{false};
  std::mutex listen_mutex_;
  bool listen_returned_ = false;  // the library has closed the listening socket
};

}  // namespace fl::server
