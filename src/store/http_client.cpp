#include "store/http_client.h"

#include <exception>

#include <httplib.h>

#include "core/error.h"

namespace fl {
namespace {

constexpr const char* kUserAgent = "fireline/0.1.0";

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

std::optional<uint64_t> parse_decimal_u64(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

std::string HttpUrl::origin() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return scheme + "://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool is_http_url(std::string_view text) {
  const std::string lower = lowercase(text.substr(0, 8));
  return lower.rfind("http://", 0) == 0 || lower.rfind("https://", 0) == 0;
}

HttpUrl parse_http_url(std::string_view url) {
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      fail("invalid URL '{}': spaces and control characters must be percent-encoded", url.substr(0, 200));
  HttpUrl out;
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) fail("invalid URL '{}': expected http://... or https://...", url.substr(0, 200));
  out.scheme = lowercase(url.substr(0, scheme_end));
  if (out.scheme != "http" && out.scheme != "https")
    fail("invalid URL '{}': only http and https are supported", url.substr(0, 200));
  std::string_view rest = url.substr(scheme_end + 3);
  rest = rest.substr(0, rest.find('#'));
  const size_t path_start = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, path_start);
  out.target = path_start == std::string_view::npos ? "/" : std::string(rest.substr(path_start));
  if (out.target.front() == '?') out.target.insert(out.target.begin(), '/');
  if (authority.find('@') != std::string_view::npos)
    fail("invalid URL '{}': user names and passwords in URLs are not supported", url.substr(0, 200));
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) fail("invalid URL '{}': unclosed '[' in the host", url.substr(0, 200));
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') fail("invalid URL '{}': unexpected text after the host", url.substr(0, 200));
      port_text = after.substr(1);
      if (port_text.empty()) fail("invalid URL '{}': empty port", url.substr(0, 200));
    }
  } else {
    const size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) fail("invalid URL '{}': empty port", url.substr(0, 200));
    }
  }
  if (out.host.empty()) fail("invalid URL '{}': no host", url.substr(0, 200));
  out.port = out.scheme == "https" ? 443 : 80;
  if (!port_text.empty()) {
    std::optional<uint64_t> port = parse_decimal_u64(port_text);
    if (!port || *port == 0 || *port > 65535) fail("invalid URL '{}': bad port '{}'", url.substr(0, 200), port_text);
    out.port = static_cast<int>(*port);
  }
  return out;
}

HttpGetResult http_get(const std::string& url, const std::vector<std::pair<std::string, std::string>>& headers,
                       const std::function<bool(const HttpResponseStart&)>& on_start,
                       const std::function<bool(const char* data, size_t size)>& on_data,
                       const HttpTimeouts& timeouts) {
  const HttpUrl parsed = parse_http_url(url);
  httplib::Client client(parsed.origin());
  if (!client.is_valid()) fail("cannot make an HTTP client for '{}'", url);
  client.set_follow_location(true);
  client.set_decompress(false);
  client.set_connection_timeout(timeouts.connect_seconds);
  client.set_read_timeout(timeouts.read_seconds);

  httplib::Headers request_headers{{"User-Agent", kUserAgent}, {"Accept-Encoding", "identity"}};
  for (const auto& [key, value] : headers) request_headers.emplace(key, value);

  HttpGetResult result;
  // cpp-httplib is not written for exceptions thrown through it: keep the callbacks' exceptions
  // here and rethrow them once the connection is closed.
  std::exception_ptr pending;
  auto response_handler = [&](const httplib::Response& response) {
    result.status = response.status;
    try {
      HttpResponseStart start;
      start.status = response.status;
      if (response.has_header("Content-Length"))
        start.content_length = parse_decimal_u64(response.get_header_value("Content-Length"));
      start.content_range = response.get_header_value("Content-Range");
      start.content_encoding = response.get_header_value("Content-Encoding");
      if (!on_start(start)) {
        result.stopped = true;
        return false;
      }
      return true;
    } catch (...) {
      pending = std::current_exception();
      return false;
    }
  };
  auto content_receiver = [&](const char* data, size_t size) {
    try {
      if (!on_data(data, size)) {
        result.stopped = true;
        return false;
      }
      return true;
    } catch (...) {
      pending = std::current_exception();
      return false;
    }
  };
  httplib::Result response = client.Get(parsed.target, request_headers, response_handler, content_receiver);
  if (pending) std::rethrow_exception(pending);
  if (response) {
    result.status = response->status;
    result.complete = true;
  } else if (result.stopped) {
    result.complete = true;
  } else {
    result.error = httplib::to_string(response.error());
  }
  return result;
}

std::string http_get_text(const std::string& url, size_t max_bytes, const HttpTimeouts& timeouts) {
  std::string body;
  bool too_big = false;
  HttpGetResult result = http_get(
      url, {}, [](const HttpResponseStart& start) { return start.status >= 200 && start.status < 300; },
      [&](const char* data, size_t size) {
        if (body.size() + size > max_bytes) {
          too_big = true;
          return false;
        }
        body.append(data, size);
        return true;
      },
      timeouts);
  if (!result.complete) fail("cannot fetch {}: {} error", url, result.error);
  if (result.status < 200 || result.status >= 300) fail("cannot fetch {}: HTTP {}", url, http_status_text(result.status));
  if (too_big) fail("cannot fetch {}: the document is larger than {} bytes", url, max_bytes);
  return body;
}

std::string http_status_text(int status) {
  const char* reason = "";
  switch (status) {
    case 200: reason = "OK"; break;
    case 206: reason = "Partial Content"; break;
    case 301: reason = "Moved Permanently"; break;
    case 302: reason = "Found"; break;
    case 304: reason = "Not Modified"; break;
    case 400: reason = "Bad Request"; break;
    case 401: reason = "Unauthorized"; break;
    case 403: reason = "Forbidden"; break;
    case 404: reason = "Not Found"; break;
    case 410: reason = "Gone"; break;
    case 416: reason = "Range Not Satisfiable"; break;
    case 429: reason = "Too Many Requests"; break;
    case 500: reason = "Internal Server Error"; break;
    case 502: reason = "Bad Gateway"; break;
    case 503: reason = "Service Unavailable"; break;
    case 504: reason = "Gateway Timeout"; break;
    default: return std::to_string(status);
  }
  return std::to_string(status) + " " + reason;
}

}  // namespace fl
