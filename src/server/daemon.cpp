#include "server/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace fl::server {
namespace {

std::string errno_text() { return std::strerror(errno); }

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int read_pid(int fd) {
  ::lseek(fd, 0, SEEK_SET);
  const std::string text = read_all(fd);
  return std::atoi(text.c_str());
}

// Opens (creating) the pid file and tries to lock it. Returns the fd and whether the lock was taken.
int open_pid_file(const std::filesystem::path& path, bool& locked) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) fail("cannot create {}: {}", path.parent_path().string(), ec.message());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open {}: {}", path.string(), errno_text());
  locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  return fd;
}

}  // namespace

DaemonPaths DaemonPaths::under(const std::filesystem::path& home) { return {home / "serve.pid", home / "serve.log"}; }

Daemon::Daemon(Daemon&& other) noexcept
    : status_fd_(other.status_fd_), lock_fd_(other.lock_fd_), pid_file_(std::move(other.pid_file_)) {
  other.status_fd_ = other.lock_fd_ = -1;
}

Daemon::~Daemon() {
  if (status_fd_ >= 0) report_failure("the server exited before it was ready");
  release_pid_file();
}

void Daemon::release_pid_file() {
  if (lock_fd_ < 0) return;
  // Unlink while still holding the lock, so no other process sees an unlocked, stale file.
  std::error_code ec;
  std::filesystem::remove(pid_file_, ec);
  ::close(lock_fd_);
  lock_fd_ = -1;
}

void Daemon::report(char status, const std::string& message) {
  if (status_fd_ < 0) return;
  write_all(status_fd_, std::string(1, status) + message);
  ::close(status_fd_);
  status_fd_ = -1;
}

void Daemon::report_ready(const std::string& message) { report('+', message); }
void Daemon::report_failure(const std::string& message) {
  // A daemon that failed is on its way out: its pid file goes first, so that the `serve -d` that
  // reports the failure never leaves one behind (the process may take a moment more to exit).
  release_pid_file();
  report('-', message);
}

Daemon detach(const DaemonPaths& paths) {
  bool locked = false;
  const int lock_fd = open_pid_file(paths.pid_file, locked);
  if (!locked) {
    const int pid = read_pid(lock_fd);
    ::close(lock_fd);
    fail("a fireline server is already running (pid {}, {}); `fireline stop` ends it", pid, paths.pid_file.string());
  }
  const int log_fd = ::open(paths.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) fail("cannot open the log file {}: {}", paths.log_file.string(), errno_text());
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) fail("cannot create a pipe: {}", errno_text());

  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) fail("cannot fork: {}", errno_text());
  if (child > 0) {
    // The command the user ran: wait for the daemon's report.
    ::close(status_pipe[1]);
    ::close(log_fd);
    ::close(lock_fd);  // the daemon keeps the lock through its own descriptor
    int status = 0;
    ::waitpid(child, &status, 0);  // the intermediate process exits at once
    const std::string report = read_all(status_pipe[0]);
    if (report.empty() || report[0] != '+') {
      std::fprintf(stderr, "fireline: error: %s (log: %s)\n",
                   report.empty() ? "the server exited before it was ready" : report.c_str() + 1,
                   paths.log_file.c_str());
      std::exit(1);
    }
    std::printf("%s\n", report.c_str() + 1);
    std::fflush(stdout);
    std::exit(0);
  }

  // Intermediate process: a new session, then fork again so the daemon is not a session leader
  // and can never acquire a controlling terminal.
  ::close(status_pipe[0]);
  ::setsid();
  const pid_t daemon_pid = ::fork();
  if (daemon_pid < 0) _exit(1);
  if (daemon_pid > 0) _exit(0);

  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO), ::close(null_fd);
  ::dup2(log_fd, STDOUT_FILENO);
  ::dup2(log_fd, STDERR_FILENO);
  ::close(log_fd);
  setvbuf(stdout, nullptr, _IOLBF, 0);

  const std::string pid_text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd, 0) != 0 || ::lseek(lock_fd, 0, SEEK_SET) != 0 || !write_all(lock_fd, pid_text))
    std::fprintf(stderr, "fireline: warning: cannot write the pid file %s\n", paths.pid_file.c_str());

  Daemon d;
  d.status_fd_ = status_pipe[1];
  d.lock_fd_ = lock_fd;
  d.pid_file_ = paths.pid_file;
  return d;
}

StopResult stop_daemon(const DaemonPaths& paths, std::chrono::milliseconds timeout) {
  StopResult result;
  if (!std::filesystem::exists(paths.pid_file)) return result;
  bool locked = false;
  const int fd = open_pid_file(paths.pid_file, locked);
  if (locked) {
    // Nobody holds it: left behind by a server that was killed. Remove it.
    std::error_code ec;
    std::filesystem::remove(paths.pid_file, ec);
    ::close(fd);
    return result;
  }
  result.was_running = true;
  result.pid = read_pid(fd);
  if (result.pid <= 1) {
    ::close(fd);
    fail("the pid file {} is locked but holds no valid pid", paths.pid_file.string());
  }
  if (::kill(result.pid, SIGTERM) != 0 && errno != ESRCH) {
    const std::string why = errno_text();
    ::close(fd);
    fail("cannot signal the server (pid {}): {}", result.pid, why);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      fail(
          "the server (pid {}) is still draining after {} ms; run `fireline stop` again to wait longer, "
          "or kill -9 {}",
          result.pid, timeout.count(), result.pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::close(fd);
  return result;
}

SignalWatcher::SignalWatcher() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

SignalWatcher::~SignalWatcher() { stop(); }

void SignalWatcher::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void SignalWatcher::start(std::function<void(int)> on_first, std::function<void(int)> on_second) {
  thread_ = std::thread([this, on_first = std::move(on_first), on_second = std::move(on_second)] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    int received = 0;
    while (!stop_.load()) {
      timespec wait{0, 200 * 1000 * 1000};
      const int sig = ::sigtimedwait(&set, nullptr, &wait);
      if (sig <= 0) continue;
      (received++ == 0 ? on_first : on_second)(sig);
    }
  });
}

}  // namespace fl::server
