#pragma once
// A progress display on stderr for long passes over model data (quantize, verify). On a terminal
// it redraws one line, at most ten times a second: a bar, bytes done / total, rate and ETA. When
// stderr is not a terminal (a log file, CI) it prints a plain line at 10% steps instead, at most
// one a second and none for a job that ends within its first second, so logs stay readable.
// Nothing is printed with --quiet.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace fl::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // ends a terminal line left open

  void update(uint64_t done, uint64_t total, std::string_view detail = {});
  void finish();  // the final state and a newline (terminal only)

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  bool enabled_ = false;
  bool tty_ = false;
  bool line_open_ = false;
  Clock::time_point start_;
  Clock::time_point last_draw_;
  int last_decile_ = -1;
  uint64_t done_ = 0, total_ = 0;
  std::string detail_;
  void draw();
};

// "1.2 GB", "340.5 MB", "17 B" (decimal units, as disks are sold).
std::string human_bytes(uint64_t bytes);
// "1:02:03" or "2:03".
std::string human_duration(double seconds);

}  // namespace fl::cli
