#pragma once
// An HTTP server on 127.0.0.1 (a free port) inside the test process, for testing `pull` without a
// network: each path serves a body with a chosen behaviour, and the server records the Range
// header of every request so a test can check that a resume asked for the right bytes.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace fl::test {

enum class Serve {
  normal,        // 200, or 206 / 416 for a Range request, as RFC 9110 says
  drop_after,    // like normal, but the connection is closed once `drop_at` bytes of the file were sent
  ignore_range,  // always 200 with the whole body, whatever the Range header says
  wrong_range,   // a Range request gets 206 with the whole body (Content-Range from byte 0)
  not_found,     // 404
  redirect,      // 302 to `redirect_to` (a path on this server)
};

struct Route {
  std::string body;
  Serve serve = Serve::normal;
  size_t drop_at = 0;       // drop_after: the file offset where the connection is closed
  std::string redirect_to;  // redirect: the target path

  static Route file(std::string body) { return make(std::move(body), Serve::normal); }
  static Route dropping_at(std::string body, size_t at) {
    Route r = make(std::move(body), Serve::drop_after);
    r.drop_at = at;
    return r;
  }
  static Route ignoring_range(std::string body) { return make(std::move(body), Serve::ignore_range); }
  static Route with_wrong_range(std::string body) { return make(std::move(body), Serve::wrong_range); }
  static Route not_found() { return make("", Serve::not_found); }
  static Route redirect(std::string to) {
    Route r = make("", Serve::redirect);
    r.redirect_to = std::move(to);
    return r;
  }

 private:
  static Route make(std::string body, Serve serve) {
    Route r;
    r.body = std::move(body);
    r.serve = serve;
    return r;
  }
};

class LoopbackServer {
 public:
  LoopbackServer();   // listening when it returns
  ~LoopbackServer();  // stops and joins the server thread
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  void set_route(const std::string& path, Route route);
  std::string url(const std::string& path) const;  // http://127.0.0.1:PORT/path
  int port() const { return port_; }
  // The Range header of each GET of `path` so far, in order ("" for none).
  std::vector<std::string> ranges(const std::string& path) const;

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mutex_;
  std::map<std::string, Route> routes_;
  std::map<std::string, std::vector<std::string>> ranges_;
};

}  // namespace fl::test
