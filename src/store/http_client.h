#pragma once
// The little HTTP the store needs, over cpp-httplib's client (the only file that includes
// httplib.h, so the rest of fireline needs none of its compile definitions): parsing http(s) URLs,
// fetching a small document (a registry), and a streaming GET that hands the status and headers
// to the caller before the body, so a download can decide what to do with a 200, 206 or 416.
//
// Redirects are followed (model hosts redirect to CDNs). Responses are requested uncompressed
// (Accept-Encoding: identity) because byte ranges must count the bytes of the file itself.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fl {

struct HttpUrl {
  std::string scheme;  // "http" or "https"
  std::string host;
  int port = 0;
  std::string target;  // path and query, at least "/"
  std::string origin() const;  // scheme://host:port
};

bool is_http_url(std::string_view text);  // starts with http:// or https://
// A header's or URL's decimal number: digits only, at most 19 of them (so it fits); else nullopt.
std::optional<uint64_t> parse_decimal_u64(std::string_view text);
HttpUrl parse_http_url(std::string_view url);  // throws fl::Error naming the URL

// How long to wait; defaults suit a download over the internet, tests shorten them.
struct HttpTimeouts {
  int connect_seconds = 15;
  int read_seconds = 60;  // longest silence in the middle of a body
};

// What the server answered, before any body byte.
struct HttpResponseStart {
  int status = 0;
  std::optional<uint64_t> content_length;
  std::string content_range;     // empty when absent
  std::string content_encoding;  // empty when absent
};

struct HttpGetResult {
  int status = 0;      // 0 when no response arrived
  bool complete = false;  // the whole body arrived (or the caller stopped it on purpose: see `stopped`)
  bool stopped = false;   // on_start or on_data returned false
  std::string error;      // transport failure ("Connection", "Read", ...) when not complete
};

// GET `url` with extra `headers`. `on_start` sees the status and headers of the final response
// (after redirects) and returns false to skip the body; `on_data` receives the body in pieces and
// returns false to stop. Never throws for HTTP or network failures (they are in the result);
// throws fl::Error for a malformed URL, and lets the callbacks' exceptions through.
HttpGetResult http_get(const std::string& url, const std::vector<std::pair<std::string, std::string>>& headers,
                       const std::function<bool(const HttpResponseStart&)>& on_start,
                       const std::function<bool(const char* data, size_t size)>& on_data,
                       const HttpTimeouts& timeouts = {});

// The body of a small document at `url`; fl::Error for a non-2xx status, a network failure, or a
// body over `max_bytes`.
std::string http_get_text(const std::string& url, size_t max_bytes, const HttpTimeouts& timeouts = {});

// "404 Not Found", "416 Range Not Satisfiable", ...
std::string http_status_text(int status);

}  // namespace fl
