#include "store/loopback_server.h"

#include <chrono>
#include <stdexcept>

#include <httplib.h>

namespace fl::test {
namespace {

constexpr size_t kChunkBytes = 16 * 1024;

// The first byte a "bytes=N-" or "bytes=N-M" header asks for; npos for anything else.
size_t range_start(const std::string& header) {
  if (header.rfind("bytes=", 0) != 0) return std::string::npos;
  size_t end = 0;
  try {
    const unsigned long long start = std::stoull(header.substr(6), &end);
    if (header.size() <= 6 + end || header[6 + end] != '-') return std::string::npos;
    return static_cast<size_t>(start);
  } catch (const std::exception&) {
    return std::string::npos;
  }
}

}  // namespace

LoopbackServer::LoopbackServer() : server_(std::make_unique<httplib::Server>()) {
  server_->Get(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib 0.11 would apply the Range header to our response on its own (and answers 206
    // even for ranges past the end); the server under test decides itself, so drop its parsed copy.
    // The Request object belongs to the server and is not const, so this is well defined.
    const_cast<httplib::Request&>(req).ranges.clear();
    const std::string range = req.get_header_value("Range");
    Route route;
    {
      std::lock_guard lock(mutex_);
      ranges_[req.path].push_back(range);
      auto it = routes_.find(req.path);
      if (it == routes_.end()) {
        res.status = 404;
        res.set_content("no such route", "text/plain");
        return;
      }
      route = it->second;
    }
    if (route.serve == Serve::not_found) {
      res.status = 404;
      res.set_content("not found", "text/plain");
      return;
    }
    if (route.serve == Serve::redirect) {
      res.status = 302;
      res.set_header("Location", route.redirect_to);
      return;
    }
    auto body = std::make_shared<std::string>(std::move(route.body));
    size_t start = 0;
    if (!range.empty() && route.serve == Serve::wrong_range) {
      res.status = 206;
      res.set_header("Content-Range", "bytes 0-" + std::to_string(body->size() - 1) + "/" + std::to_string(body->size()));
    } else if (!range.empty() && route.serve != Serve::ignore_range) {
      start = range_start(range);
      if (start == std::string::npos || start >= body->size()) {
        res.status = 416;
        res.set_header("Content-Range", "bytes */" + std::to_string(body->size()));
        return;
      }
      res.status = 206;
      res.set_header("Content-Range",
                     "bytes " + std::to_string(start) + "-" + std::to_string(body->size() - 1) + "/" +
                         std::to_string(body->size()));
    } else {
      res.status = 200;
    }
    const size_t drop_at = route.serve == Serve::drop_after ? route.drop_at : body->size();
    res.set_content_provider(body->size() - start, "application/octet-stream",
                             [body, start, drop_at](size_t offset, size_t length, httplib::DataSink& sink) {
                               const size_t at = start + offset;
                               if (at >= drop_at) return false;  // closes the connection mid-body
                               const size_t n = std::min({length, kChunkBytes, drop_at - at});
                               sink.write(body->data() + at, n);
                               return true;
                             });
  });
  port_ = server_->bind_to_any_port("127.0.0.1");
  if (port_ <= 0) throw std::runtime_error("loopback server: cannot bind 127.0.0.1");
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("loopback server did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

LoopbackServer::~LoopbackServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void LoopbackServer::set_route(const std::string& path, Route route) {
  std::lock_guard lock(mutex_);
  routes_[path] = std::move(route);
}

std::string LoopbackServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + path;
}

std::vector<std::string> LoopbackServer::ranges(const std::string& path) const {
  std::lock_guard lock(mutex_);
  auto it = ranges_.find(path);
  return it == ranges_.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace fl::test
