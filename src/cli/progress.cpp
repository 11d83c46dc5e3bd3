#include "cli/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "core/log.h"

namespace fl::cli {

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string human_duration(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), start_(Clock::now()), last_draw_(start_) {
  enabled_ = log_level() <= LogLevel::info;
  tty_ = ::isatty(STDERR_FILENO) == 1;
}

ProgressBar::~ProgressBar() {
  if (line_open_) std::fputc('\n', stderr);
}

void ProgressBar::update(uint64_t done, uint64_t total, std::string_view detail) {
  if (!enabled_) return;
  done_ = done;
  total_ = total;
  detail_ = std::string(detail);
  if (tty_) {
    const auto now = Clock::now();
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw();
  } else {
    // Plain lines at 10% steps, and none for a job shorter than a second (a tiny model would only
    // add noise to the log).
    const int decile = total > 0 ? static_cast<int>(done * 10 / total) : 10;
    const auto now = Clock::now();
    if (decile == last_decile_ || now - last_draw_ < std::chrono::seconds(1)) return;
    last_decile_ = decile;
    last_draw_ = now;
    draw();
  }
}

void ProgressBar::finish() {
  if (!enabled_) return;
  if (tty_) {
    draw();
    std::fputc('\n', stderr);
    line_open_ = false;
  } else if (last_decile_ >= 0 && last_decile_ != 10) {
    last_decile_ = 10;
    draw();
  }
}

void ProgressBar::draw() {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double fraction = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const std::string eta = done_ > 0 && rate > 0 ? human_duration(static_cast<double>(total_ - done_) / rate) : "?";
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    std::string detail = detail_.size() > 48 ? "..." + detail_.substr(detail_.size() - 45) : detail_;
    std::string line = fmt::format("{} [{}] {:3.0f}% {} / {}  {}/s  ETA {}  {}", label_, bar, fraction * 100,
                                   human_bytes(done_), human_bytes(total_), human_bytes(static_cast<uint64_t>(rate)),
                                   eta, detail);
    // A line wider than the terminal would wrap, and \r would then redraw only its last part.
    struct winsize ws {};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && line.size() >= ws.ws_col)
      line.resize(ws.ws_col - 1);
    line = "\r" + line + "\x1b[K";
    std::fputs(line.c_str(), stderr);
    line_open_ = true;
  } else {
    std::string line = fmt::format("{}: {:3.0f}% ({} / {}), ETA {}\n", label_, fraction * 100, human_bytes(done_),
                                   human_bytes(total_), eta);
    std::fputs(line.c_str(), stderr);
  }
  std::fflush(stderr);
}

}  // namespace fl::cli
