#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace fl::server {
namespace {

using Clock = std::chrono::steady_clock;

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = -1;
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// One accepted connection, read through a buffer (httplib reads request lines a byte at a time).
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const HttpLimits& limits) : fd_(fd), limits_(limits) {}

  // Waits for the next request's first byte. False on timeout, drain, or a closed connection.
  bool wait_for_request(const std::atomic<bool>& draining) {
    if (begin_ < buffer_.size()) return true;
    const auto deadline = Clock::now() + limits_.keep_alive_timeout;
    while (!draining.load()) {
      const int wait = std::min(ms_until(deadline), 100);
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, wait);
      if (rc > 0) return (p.revents & POLLIN) != 0;
      if (rc < 0 && errno != EINTR) return false;
      if (Clock::now() >= deadline) return false;
    }
    return false;
  }
  void start_request() {
    deadline_ = Clock::now() + limits_.request_timeout;
    consumed_ = 0;
    over_limit_ = false;
  }
  bool over_limit() const { return over_limit_; }

  bool is_readable() const override {
    if (begin_ < buffer_.size()) return true;
    const int wait = std::min(ms_until(deadline_), static_cast<int>(limits_.read_timeout.count()));
    if (wait <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    int rc;
    do rc = ::poll(&p, 1, wait);
    while (rc < 0 && errno == EINTR);
    return rc > 0;
  }

  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(limits_.write_timeout.count()));
    while (rc < 0 && errno == EINTR);
    return rc > 0 && (p.revents & (POLLERR | POLLHUP)) == 0 && peer_connected();
  }

  ssize_t read(char* ptr, size_t size) override {
    if (limits_.max_request_bytes > 0) {
      if (consumed_ >= limits_.max_request_bytes) {
        over_limit_ = true;
        return -1;
      }
      size = std::min(size, limits_.max_request_bytes - consumed_);
    }
    if (begin_ == buffer_.size()) {
      if (!is_readable()) return -1;
      buffer_.resize(kBufferSize);
      ssize_t n;
      do n = ::recv(fd_, buffer_.data(), buffer_.size(), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) {
        buffer_.clear();
        begin_ = 0;
        return n;
      }
      buffer_.resize(static_cast<size_t>(n));
      begin_ = 0;
    }
    const size_t n = std::min(size, buffer_.size() - begin_);
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    consumed_ += n;
    if (begin_ == buffer_.size()) {
      buffer_.clear();
      begin_ = 0;
    }
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    pollfd p{fd_, POLLOUT, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(limits_.write_timeout.count()));
    while (rc < 0 && errno == EINTR);
    if (rc <= 0 || (p.revents & (POLLERR | POLLHUP))) return -1;
    ssize_t n;
    do n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // False once the client has closed its side or reset the connection. Bytes it sent ahead (a
  // pipelined request) count as connected.
  bool peer_connected() const {
    if (begin_ < buffer_.size()) return true;
    char c;
    ssize_t n;
    do n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n > 0) return true;
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }

 private:
  static constexpr size_t kBufferSize = 16384;
  const int fd_;
  const HttpLimits& limits_;
  std::vector<char> buffer_;
  size_t begin_ = 0;
  Clock::time_point deadline_ = Clock::now();
  size_t consumed_ = 0;  // bytes of the current request handed to the library
  bool over_limit_ = false;
};

thread_local const ConnectionStream* t_connection = nullptr;
thread_local bool t_close_after_response = false;

// Closes a connection whose client may still be sending (a refused body): stop writing, then read
// and drop what arrives for a moment, so the close does not reset the connection before the
// client has read the response.
void close_lingering(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  char buf[16384];
  size_t dropped = 0;
  while (dropped < (4u << 20)) {
    pollfd p{fd, POLLIN, 0};
    const int wait = ms_until(deadline);
    if (wait <= 0 || ::poll(&p, 1, wait) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

// Worker threads for connections: starts one more whenever a connection arrives and no thread is
// idle, up to `max_threads`; later connections wait in order. Threads live until shutdown.
class ElasticPool final : public httplib::TaskQueue {
 public:
  explicit ElasticPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}
  ~ElasticPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(fn));
    // Idle threads that were notified but have not woken yet still count as idle, so compare
    // with the jobs waiting rather than with zero.
    if (static_cast<int>(jobs_.size()) > idle_ && static_cast<int>(threads_.size()) < max_threads_) {
      threads_.emplace_back([this] { work(); });
    } else {
      wake_.notify_one();
    }
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      threads.swap(threads_);
    }
    wake_.notify_all();
    for (auto& t : threads) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, and every accepted connection was served
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const int max_threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

HttpServer::HttpServer(HttpLimits limits, ServerMetrics& metrics) : limits_(limits), metrics_(metrics) {
  const int max_threads = limits_.max_threads;
  new_task_queue = [max_threads] { return new ElasticPool(max_threads); };
  // Our connection loop enforces these; the library only writes them into Keep-Alive headers.
  set_keep_alive_max_count(static_cast<size_t>(std::max(1, limits_.keep_alive_max_requests)));
  set_keep_alive_timeout(
      std::max<time_t>(1, std::chrono::duration_cast<std::chrono::seconds>(limits_.keep_alive_timeout).count()));
  // The library's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half of the connections. SO_REUSEADDR alone still allows a quick restart.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // SO_RCVTIMEO/SO_SNDTIMEO on accepted sockets: a backstop under the poll-based timeouts.
  set_read_timeout(std::chrono::duration_cast<std::chrono::seconds>(limits_.read_timeout).count() + 1, 0);
  set_write_timeout(std::chrono::duration_cast<std::chrono::seconds>(limits_.write_timeout).count() + 1, 0);
}

HttpServer::~HttpServer() = default;

int HttpServer::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) fail("port {} is outside 0..65535", port);
  errno = 0;
  int bound = port;
  if (port == 0) {
    bound = bind_to_any_port(host);
    if (bound <= 0) bound = -1;
  } else if (!bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0)
    fail("cannot listen on {}:{}: {}", host, port, errno ? std::strerror(errno) : "the address could not be bound");
  // Linux lets listen() on a listening socket change its backlog.
  ::listen(svr_sock_.load(), limits_.listen_backlog);
  return bound;
}

void HttpServer::serve() {
  const bool ok = listen_after_bind();
  std::lock_guard lock(listen_mutex_);
  listen_returned_ = true;
  if (!ok && !draining_.load()) log_warn("http: the listening socket failed");
}

void HttpServer::stop_listening() {
  std::lock_guard lock(listen_mutex_);
  if (draining_.exchange(true) || listen_returned_) return;
  // shutdown() wakes the accept() that listen_after_bind is blocked in (it then closes the socket
  // itself). httplib's own stop() is not used: it marks the server as shutting down, which cuts
  // off streaming responses in progress instead of letting them finish.
  const socket_t sock = svr_sock_.load();
  if (sock != INVALID_SOCKET) ::shutdown(sock, SHUT_RDWR);
}

bool HttpServer::client_connected() { return t_connection == nullptr || t_connection->peer_connected(); }

void HttpServer::close_after_response() { t_close_after_response = true; }

bool HttpServer::request_over_limit() { return t_connection != nullptr && t_connection->over_limit(); }

bool HttpServer::process_and_close_socket(socket_t sock) {
  metrics_.connection_opened();
  bool ok = false;
  bool linger = false;
  {
    ConnectionStream stream(sock, limits_);
    for (int remaining = limits_.keep_alive_max_requests; remaining > 0; --remaining) {
      if (!stream.wait_for_request(draining_)) break;
      stream.start_request();
      const bool close_after = remaining == 1 || draining_.load();
      bool connection_closed = false;
      t_connection = &stream;
      t_close_after_response = false;
      try {
        ok = process_request(stream, close_after, connection_closed, nullptr);
      } catch (const std::exception& e) {
        log_error("http: request failed outside its handler: {}", e.what());
        ok = false;
      } catch (...) {
        ok = false;
      }
      t_connection = nullptr;
      linger = t_close_after_response;
      if (!ok || connection_closed || close_after || linger) break;
    }
  }
  if (linger) close_lingering(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  metrics_.connection_closed();
  return ok;
}

}  // namespace fl::server
