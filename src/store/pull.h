#pragma once
// `fireline pull`: downloads a model into the store (store/model_store.h) from an http(s) URL or
// a registry entry (store/registry.h), such that a model appears under its final name only when
// it is complete, verified and opens as a model.
//
//   1. The bytes go to FAMILY/TAG.fire.partial (locked, so two pulls of one name cannot interleave).
//      Its source URL is kept next to it; a partial file from another URL is started over.
//   2. A partial file left by an interrupted pull is resumed with `Range: bytes=N-`. A server that
//      answers 200 (ignoring the range) is read from the start again; a 416 means the partial file
//      is already whole (when the sizes agree) or unusable (started over).
//   3. Then: size against the registry's (or the server's), sha256 against the expected one (a
//      mismatch removes the partial file), the file must open as a model (io open_model_source),
//      fsync, atomic rename to TAG.fire, and the manifest (TAG.json) written the same way.
// A network failure keeps the partial file for the next pull to resume, and says so.
#include <cstdint>
#include <functional>
#include <string>

#include "store/http_client.h"
#include "store/model_store.h"

namespace fl {

struct PullRequest {
  std::string source;    // a model name (looked up in the registry) or an http(s) URL
  std::string name;      // the store name; empty: the source's name, or one made from the URL's file name
  std::string sha256;    // expected sha256; empty: the registry's (a URL without it is not checked)
  std::string registry;  // registry file or URL; empty: the store's registry.json, or none
};

// What a pull will do, resolved before any download.
struct PullPlan {
  ModelName name;
  std::string url;
  std::string sha256;          // empty: not checked (recorded in the manifest after download)
  uint64_t expected_size = 0;  // 0: unknown
};

struct PullResult {
  ModelName name;
  std::string path;
  std::string sha256;
  uint64_t size = 0;
  uint64_t resumed_from = 0;    // bytes of an earlier partial download that were kept
  bool already_present = false;  // the store already held this exact file; nothing was downloaded
};

// Download progress: bytes of the file present so far, and its total (0 when unknown).
using PullProgress = std::function<void(uint64_t done, uint64_t total)>;

struct PullOptions {
  PullProgress progress;
  HttpTimeouts timeouts;
};

// Resolves the name, URL and expected checksum; fl::Error for an invalid name, a name the
// registry does not list, or a conflicting --sha256.
PullPlan plan_pull(const ModelStore& store, const PullRequest& request);
PullResult run_pull(const ModelStore& store, const PullPlan& plan, const PullOptions& options = {});
inline PullResult pull_model(const ModelStore& store, const PullRequest& request, const PullOptions& options = {}) {
  return run_pull(store, plan_pull(store, request), options);
}

// The store name a URL's file name suggests: ".../Gemma-4-E2B.fire?x" -> gemma-4-e2b:latest;
// fl::Error (asking for --name) when it makes no valid name.
ModelName model_name_from_url(const std::string& url);

}  // namespace fl
