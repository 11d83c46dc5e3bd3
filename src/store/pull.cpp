#include "store/pull.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/sha256.h"
#include "io/model_source.h"
#include "store/registry.h"

namespace fl {

namespace fs = std::filesystem;

namespace {

constexpr size_t kWriteBufferBytes = 4u << 20;
constexpr int kMaxRestarts = 2;  // fresh starts after a server rejected a resume

// The partial download: an append-only file, locked for the whole pull.
class PartialFile {
 public:
  PartialFile(fs::path path, const ModelName& name) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot open {}: {}", path_.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) fail("another `fireline pull` of {} is running (it holds {})", name.str(), path_.string());
      fail("cannot lock {}: {}", path_.string(), std::strerror(err));
    }
    buffer_.reserve(kWriteBufferBytes);
  }
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  const fs::path& path() const { return path_; }

  uint64_t size() const {  // bytes on disk, not counting the write buffer
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("cannot stat {}: {}", path_.string(), std::strerror(errno));
    return static_cast<uint64_t>(st.st_size);
  }

  void truncate() {
    buffer_.clear();
    if (::ftruncate(fd_, 0) != 0) fail("cannot truncate {}: {}", path_.string(), std::strerror(errno));
  }

  void append(const char* data, size_t size) {
    buffer_.insert(buffer_.end(), data, data + size);
    if (buffer_.size() >= kWriteBufferBytes) flush();
  }

  void flush() {
    const uint64_t at = size();
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n = ::pwrite(fd_, buffer_.data() + done, buffer_.size() - done, static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write {}: {}", path_.string(), std::strerror(n < 0 ? errno : EIO));
      done += static_cast<size_t>(n);
    }
    buffer_.clear();
  }

  void sync() {
    flush();
    if (::fsync(fd_) != 0) fail("cannot flush {} to disk: {}", path_.string(), std::strerror(errno));
  }

  // Feeds bytes [0, size) of the file to `hasher` (the part an earlier pull downloaded).
  void hash_prefix(uint64_t size, Sha256& hasher) const {
    std::vector<char> chunk(1u << 20);
    uint64_t at = 0;
    while (at < size) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - at));
      const ssize_t n = ::pread(fd_, chunk.data(), want, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot read {}: {}", path_.string(), n < 0 ? std::strerror(errno) : "unexpected end of file");
      hasher.update(chunk.data(), static_cast<size_t>(n));
      at += static_cast<uint64_t>(n);
    }
  }

  void remove() {
    buffer_.clear();
    std::error_code ec;
    fs::remove(path_, ec);
  }

 private:
  fs::path path_;
  int fd_ = -1;
  std::vector<char> buffer_;
};

struct ContentRange {
  std::optional<uint64_t> start, end, total;
};

// "bytes 100-199/1000", "bytes 100-199/*" or "bytes */1000" (RFC 9110 §14.4).
std::optional<ContentRange> parse_content_range(std::string_view text) {
  constexpr std::string_view kUnit = "bytes ";
  if (text.substr(0, kUnit.size()) != kUnit) return std::nullopt;
  text.remove_prefix(kUnit.size());
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view range = text.substr(0, slash), total = text.substr(slash + 1);
  ContentRange out;
  if (total != "*") {
    out.total = parse_decimal_u64(total);
    if (!out.total) return std::nullopt;
  }
  if (range != "*") {
    const size_t dash = range.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    out.start = parse_decimal_u64(range.substr(0, dash));
    out.end = parse_decimal_u64(range.substr(dash + 1));
    if (!out.start || !out.end || *out.end < *out.start) return std::nullopt;
    if (out.total && *out.end >= *out.total) return std::nullopt;
  }
  return out;
}

std::string lowercase(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

void check_disk_space(const fs::path& dir, uint64_t needed) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return;  // cannot tell: let the writes find out
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
  if (needed > free_bytes)
    fail("not enough disk space in {}: the download needs {} more bytes, {} are free", dir.string(), needed, free_bytes);
}

// What the partial file's bytes come from; a different source means starting over.
std::string partial_source_json(const PullPlan& plan) {
  nlohmann::ordered_json j;
  j["url"] = plan.url;
  j["sha256"] = plan.sha256;
  return j.dump() + "\n";
}

enum class Attempt { complete, restart };

struct Download {
  const PullPlan& plan;
  const PullOptions& options;
  PartialFile& partial;
  std::unique_ptr<Sha256> hasher;
  uint64_t offset = 0;  // bytes of the file in `partial` before this request

  void start_over() {
    partial.truncate();
    hasher = std::make_unique<Sha256>();
    offset = 0;
  }

  // One GET from `offset` to the end of the file.
  Attempt attempt() {
    std::optional<uint64_t> total;  // the whole file's size, when the server says
    uint64_t received = 0;
    int refused_status = 0;
    bool restart = false, already_whole = false;
    std::vector<std::pair<std::string, std::string>> headers;
    if (offset > 0) headers.emplace_back("Range", fmt::format("bytes={}-", offset));

    auto on_start = [&](const HttpResponseStart& start) {
      if (start.status == 416 && offset > 0) {
        // The range starts at or past the end: whole already, or a partial file of something else.
        std::optional<ContentRange> range = parse_content_range(start.content_range);
        if (range && range->total && *range->total == offset) already_whole = true;
        else restart = true;
        return false;
      }
      if (start.status != 200 && start.status != 206) {
        refused_status = start.status;
        return false;
      }
      if (!start.content_encoding.empty() && lowercase(start.content_encoding) != "identity")
        fail("{} was sent with Content-Encoding '{}'; fireline needs the file's own bytes", plan.url,
             start.content_encoding);
      if (start.status == 200) {
        if (offset > 0) {
          log_info("the server ignored the request to resume at byte {}: downloading from the start", offset);
          start_over();
        }
        total = start.content_length;
      } else {
        std::optional<ContentRange> range = parse_content_range(start.content_range);
        if (!range || !range->start || *range->start != offset) {
          log_info("the server answered a resume at byte {} with the range '{}': downloading from the start", offset,
                   start.content_range);
          restart = true;
          return false;
        }
        total = range->total;
        if (!total && start.content_length) total = offset + *start.content_length;
      }
      if (plan.expected_size && total && *total != plan.expected_size)
        fail("{} is {} bytes, but {} should be {} bytes", plan.url, *total, plan.name.str(), plan.expected_size);
      if (total) check_disk_space(partial.path().parent_path(), *total - offset);
      return true;
    };
    auto on_data = [&](const char* data, size_t size) {
      const uint64_t have = offset + received + size;
      if ((total && have > *total) || (plan.expected_size && have > plan.expected_size))
        fail("{} sent more than the {} bytes the file has", plan.url, total ? *total : plan.expected_size);
      partial.append(data, size);
      hasher->update(data, size);
      received += size;
      if (options.progress) options.progress(have, total ? *total : plan.expected_size);
      return true;
    };

    const HttpGetResult result = http_get(plan.url, headers, on_start, on_data, options.timeouts);
    partial.flush();
    if (already_whole) return Attempt::complete;
    if (restart) return Attempt::restart;
    if (refused_status) {
      fail("cannot download {}: HTTP {}", plan.url, http_status_text(refused_status));
    }
    const uint64_t have = offset + received;
    if (!result.complete && result.status == 0) {  // no answer at all
      partial.sync();
      fail("cannot download {}: {} error{}", plan.url, result.error,
           have ? fmt::format("; the {} bytes downloaded before are kept for the next pull", have) : std::string());
    }
    if (!result.complete || (total && have != *total)) {
      partial.sync();  // keep what arrived for the next pull
      const std::string of_total = total ? fmt::format(" of {}", *total) : std::string();
      const std::string why = result.complete ? std::string("the connection closed early")
                                              : fmt::format("{} error", result.error);
      fail("download of {} from {} stopped after {}{} bytes ({}); run the same `fireline pull` again to resume",
           plan.name.str(), plan.url, have, of_total, why);
    }
    return Attempt::complete;
  }
};

std::optional<ModelManifest> manifest_if_readable(const ModelStore& store, const ModelName& name) {
  try {
    return store.read_manifest(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

ModelName model_name_from_url(const std::string& url) {
  const HttpUrl parsed = parse_http_url(url);
  std::string path = parsed.target.substr(0, parsed.target.find('?'));
  std::string file = path.substr(path.rfind('/') + 1);
  const std::string lower = lowercase(file);
  for (std::string_view extension : {".fire", ".gguf"})
    if (lower.size() > extension.size() && lower.ends_with(extension)) {
      file = lower.substr(0, lower.size() - extension.size());
      break;
    }
  file = lowercase(file);
  std::string why;
  std::optional<ModelName> name = try_parse_model_name(file, &why);
  if (!name)
    fail("cannot make a model name from the file name '{}' in {} ({}); give one with --name", printable_name(file),
         printable_name(url, 200), file.empty() ? "there is none" : why);
  return *name;
}

PullPlan plan_pull(const ModelStore& store, const PullRequest& request) {
  PullPlan plan;
  if (is_http_url(request.source)) {
    parse_http_url(request.source);
    plan.url = request.source;
    plan.name = request.name.empty() ? model_name_from_url(request.source) : parse_model_name(request.name);
    if (!request.sha256.empty()) plan.sha256 = normalize_sha256(request.sha256, "--sha256");
    return plan;
  }
  std::string why;
  std::optional<ModelName> source = try_parse_model_name(request.source, &why);
  if (!source)
    fail("cannot pull '{}': it is not an http(s) URL, and not a model name ({})", printable_name(request.source), why);
  Registry registry;
  if (!request.registry.empty()) {
    registry = load_registry(request.registry);
  } else if (std::error_code ec; fs::exists(store.default_registry_path(), ec)) {
    registry = load_registry(store.default_registry_path().string());
  } else {
    registry.origin = "built-in, empty";
  }
  const RegistryEntry* entry = registry.find(*source);
  if (!entry)
    fail("model '{}' is not in the registry ({}); pull an http(s) URL instead, or pass --registry FILE_OR_URL",
         source->str(), registry.origin);
  plan.name = request.name.empty() ? *source : parse_model_name(request.name);
  plan.url = entry->url;
  plan.expected_size = entry->size;
  plan.sha256 = entry->sha256;
  if (!request.sha256.empty()) {
    const std::string given = normalize_sha256(request.sha256, "--sha256");
    if (given != entry->sha256)
      fail("--sha256 {} differs from the registry's {} for {} ({})", given, entry->sha256, source->str(),
           registry.origin);
  }
  return plan;
}

// Everything of a pull after the partial file is locked: download or resume, verify, install.
static void install(const ModelStore& store, const PullPlan& plan, const PullOptions& options, PartialFile& partial,
             const fs::path& source_path, PullResult& result) {
  const fs::path final_path = store.model_path(plan.name);
  const std::string source_json = partial_source_json(plan);
  std::string recorded_source;
  if (std::error_code ec; fs::exists(source_path, ec)) {
    try {
      recorded_source = read_text_file(source_path.string());
    } catch (const Error&) {
    }
  }

  Download download{plan, options, partial, std::make_unique<Sha256>()};
  download.offset = partial.size();
  if (download.offset > 0 && recorded_source != source_json) {
    log_info("a partial download of {} from another source is in the way: starting over", plan.name.str());
    download.start_over();
  }
  if (plan.expected_size && download.offset > plan.expected_size) download.start_over();
  if (recorded_source != source_json) write_file_atomically(source_path, source_json);
  if (download.offset > 0) {
    log_info("resuming {} at byte {}", plan.name.str(), download.offset);
    partial.hash_prefix(download.offset, *download.hasher);
  }
  result.resumed_from = download.offset;

  if (!(plan.expected_size && download.offset == plan.expected_size)) {
    for (int restarts = 0;; ++restarts) {
      if (download.attempt() == Attempt::complete) break;
      if (restarts == kMaxRestarts) fail("{} keeps refusing to resume the download of {}", plan.url, plan.name.str());
      download.start_over();
    }
  }
  if (download.offset == 0) result.resumed_from = 0;  // a resume the server refused

  const uint64_t size = partial.size();
  if (plan.expected_size && size != plan.expected_size) {
    partial.remove();
    std::error_code ec;
    fs::remove(source_path, ec);
    fail("{} from {} is {} bytes, expected {}; the download was removed and nothing was installed",
         plan.name.str(), plan.url, size, plan.expected_size);
  }
  const std::string sha256 = download.hasher->hex_digest();
  if (!plan.sha256.empty() && sha256 != plan.sha256) {
    partial.remove();
    std::error_code ec;
    fs::remove(source_path, ec);
    fail("sha256 mismatch for {} from {}: expected {}, got {}; the download was removed and nothing was installed",
         plan.name.str(), plan.url, plan.sha256, sha256);
  }
  partial.sync();
  try {
    open_model_source(partial.path().string());
  } catch (const Error& e) {
    partial.remove();
    std::error_code ec;
    fs::remove(source_path, ec);
    fail("{} from {} is not a model fireline can open ({}); nothing was installed", plan.name.str(), plan.url, e.what());
  }

  if (::rename(partial.path().c_str(), final_path.c_str()) != 0)
    fail("cannot move {} to {}: {}", partial.path().string(), final_path.string(), std::strerror(errno));
  sync_directory(final_path.parent_path());
  ModelManifest manifest;
  manifest.name = plan.name.str();
  manifest.url = plan.url;
  manifest.sha256 = sha256;
  manifest.size = size;
  manifest.pulled_at = utc_timestamp(std::chrono::system_clock::now());
  write_file_atomically(store.manifest_path(plan.name), manifest.to_json());
  std::error_code ec;
  fs::remove(source_path, ec);

  result.sha256 = sha256;
  result.size = size;
}

PullResult run_pull(const ModelStore& store, const PullPlan& plan, const PullOptions& options) {
  PullResult result;
  result.name = plan.name;
  const fs::path final_path = store.model_path(plan.name);
  result.path = final_path.string();

  if (!plan.sha256.empty() && store.contains(plan.name)) {
    std::optional<ModelManifest> manifest = manifest_if_readable(store, plan.name);
    std::error_code ec;
    if (manifest && manifest->sha256 == plan.sha256 && manifest->size == fs::file_size(final_path, ec) && !ec) {
      result.sha256 = manifest->sha256;
      result.size = manifest->size;
      result.already_present = true;
      return result;
    }
  }

  store.ensure_family_dir(plan.name);
  PartialFile partial(store.partial_path(plan.name), plan.name);
  const fs::path source_path = store.partial_source_path(plan.name);
  try {
    install(store, plan, options, partial, source_path, result);
  } catch (const Error&) {
    // Keep a partial download worth resuming; leave no empty one (or a lone source record) behind.
    std::error_code ec;
    if (!fs::exists(partial.path(), ec) || partial.size() == 0) {
      partial.remove();
      fs::remove(source_path, ec);
      fs::remove(store.family_dir(plan.name), ec);  // only when nothing else is in it
    }
    throw;
  }
  return result;
}

}  // namespace fl
