#pragma once
// Process plumbing for `fireline serve`: detaching into the background (`-d`), the pid file that
// `fireline stop` reads, and turning SIGTERM/SIGINT into a graceful shutdown.
//
// The pid file is also a lock: the daemon holds an exclusive flock on it for as long as it runs,
// so "is a server running?" never trusts a stale pid, and `stop` knows the server has exited when
// the lock is free again.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

namespace fl::server {

struct DaemonPaths {
  std::filesystem::path pid_file;  // <home>/serve.pid
  std::filesystem::path log_file;  // <home>/serve.log (appended to)
  static DaemonPaths under(const std::filesystem::path& home);
};

// The background side of `serve -d`, after detach().
class Daemon {
 public:
  Daemon() = default;
  Daemon(Daemon&& other) noexcept;
  Daemon& operator=(Daemon&&) = delete;
  ~Daemon();  // removes the pid file

  // Tells the waiting `serve -d` command that the server is up (it prints `message`, exits 0) or
  // could not start (it prints `message` as the error, exits 1). Only the first call counts.
  void report_ready(const std::string& message);
  void report_failure(const std::string& message);  // also removes the pid file

 private:
  void release_pid_file();
  friend Daemon detach(const DaemonPaths& paths);
  void report(char status, const std::string& message);
  int status_fd_ = -1;  // pipe to the waiting command
  int lock_fd_ = -1;    // the locked pid file
  std::filesystem::path pid_file_;
};

// Must be called before any thread exists. Refuses (fl::Error) when a server already holds the
// pid file. In the command the user ran, waits for the daemon's report, prints it and exits the
// process; only the daemon returns. Its stdin is /dev/null and stdout/stderr go to the log file.
Daemon detach(const DaemonPaths& paths);

struct StopResult {
  bool was_running = false;
  int pid = 0;
};
// Sends SIGTERM to the server holding the pid file and waits up to `timeout` for it to exit.
// Throws fl::Error when it does not exit in time. A stale pid file is removed.
StopResult stop_daemon(const DaemonPaths& paths, std::chrono::milliseconds timeout);

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (call before creating threads, so every
// thread inherits the mask) and ignores SIGPIPE. A watcher thread then waits for them: the first
// calls `on_first`, a second one calls `on_second` (e.g. drain, then stop at once).
class SignalWatcher {
 public:
  SignalWatcher();
  ~SignalWatcher();
  void start(std::function<void(int signal)> on_first, std::function<void(int signal)> on_second);
  void stop();  // ends the watcher thread (signals stay blocked)

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fl::server
