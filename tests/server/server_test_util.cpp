#include "server_test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace fl::test {

TestServer::TestServer(server::ServeConfig config, server::FakeEngineConfig fake) {
  config.host = "127.0.0.1";
  config.port = 0;
  auto engine = std::make_unique<server::FakeEngine>(fake);
  counters_ = engine->counters();
  server_ = std::make_unique<server::Server>(config, std::move(engine), std::make_unique<server::FakePromptFrontend>());
  port_ = server_->bind();
  thread_ = std::thread([this] { server_->run(); });
}

TestServer::~TestServer() {
  server_->shutdown(/*cancel_now=*/true);
  thread_.join();
  server_.reset();
}

httplib::Client TestServer::client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(30, 0);
  c.set_connection_timeout(5, 0);
  return c;
}

nlohmann::json TestServer::Reply::json() const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << body;
  return j;
}

TestServer::Reply TestServer::post(const std::string& path, const std::string& body,
                                   const httplib::Headers& headers) const {
  auto c = client();
  Reply r;
  if (auto res = c.Post(path.c_str(), headers, body, "application/json")) {
    r.status = res->status;
    r.body = res->body;
    r.headers = res->headers;
  }
  return r;
}

TestServer::Reply TestServer::get(const std::string& path, const httplib::Headers& headers) const {
  auto c = client();
  Reply r;
  if (auto res = c.Get(path.c_str(), headers)) {
    r.status = res->status;
    r.body = res->body;
    r.headers = res->headers;
  }
  return r;
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

int connect_local(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string read_until_closed(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[8192];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool closed_within(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

nlohmann::json chat_body(const std::string& user_text, bool stream) {
  nlohmann::json body = {{"model", "fireline-fake"},
                         {"messages", nlohmann::json::array({{{"role", "user"}, {"content", user_text}}})}};
  if (stream) body["stream"] = true;
  return body;
}

}  // namespace fl::test
