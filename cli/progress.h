// Progress display for long CLI runs (forward, generate), on stderr.
//
// On a terminal (isatty): one bar redrawn in place with '\r', at most every 100 ms:
//   sliced [############............] 8/16 block passes  3.1/s  ETA 2.6 s  step 2/4  sigma 0.972973  2.6 s
// Otherwise (logs, pipes, CI): plain lines, one whenever another tenth of the work is
// done or 10 s have passed since the last line, so a log stays short:
//   sliced: 50% (8/16 block passes), 3.1/s, ETA 2.6 s, step 2/4, sigma 0.972973, 2.6 s
// The rate is units per second since the display was made; the ETA is what is left at
// that rate (shown once something is done). Other output goes through line() so it never
// lands in the middle of a bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ls::cli {

class Progress {
 public:
  // `unit` names what is counted ("block passes", "blocks"); `total` > 0.
  Progress(std::string label, std::string unit, int64_t total, std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Free text shown after the count ("step 2/4  sigma 0.972973").
  void set_detail(std::string detail);
  void advance(int64_t n = 1);
  // Absolute position (never moves back): what EngineOptions::progress reports.
  void set_done(int64_t done);
  // Prints a whole line of other output (clears the bar first on a terminal).
  void line(const std::string& text);
  // Final state (100 % line / bar completed with a newline). Idempotent.
  void finish();
  // Stops without claiming 100 % (a failed run): clears the bar. Idempotent.
  void abandon();
  bool on_terminal() const { return tty_; }
  int64_t done() const { return done_; }

 private:
  void draw(bool force);
  double elapsed() const;
  std::string rate_eta(const char* sep) const;
  std::string label_, unit_, detail_;
  int64_t total_ = 1, done_ = 0;
  std::FILE* out_;
  bool tty_ = false, finished_ = false, bar_visible_ = false;
  int last_tenth_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "0.4 s", "42 s", "3 min 20 s", "2 h 05 min".
std::string format_duration(double seconds);

}  // namespace ls::cli
