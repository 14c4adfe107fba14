// Progress display for long CLI runs, on stderr.
//
// On a terminal (isatty): one bar redrawn in place with '\r', at most every 100 ms:
//   sliced  [##########..........]  8/16 block passes  step 2/4  sigma 0.972973  1.2 s
// Otherwise (logs, pipes, CI): plain lines, one whenever another quarter of the work
// is done or 10 s have passed since the last line, so a log stays short:
//   sliced: 50% (8/16 block passes), step 2/4, sigma 0.972973, 1.2 s
// Other output goes through line() so it never lands in the middle of a bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ls::tools {

class Progress {
 public:
  // `unit` names what is counted ("block passes"); `total` > 0.
  Progress(std::string label, std::string unit, int64_t total, std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Free text shown after the count ("step 2/4  sigma 0.972973").
  void set_detail(std::string detail);
  void advance(int64_t n = 1);
  // Prints a whole line of other output (clears the bar first on a terminal).
  void line(const std::string& text);
  // Final state (100 % line / bar completed with a newline). Idempotent.
  void finish();
  bool on_terminal() const { return tty_; }

 private:
  void draw(bool force);
  double elapsed() const;
  std::string label_, unit_, detail_;
  int64_t total_ = 1, done_ = 0;
  std::FILE* out_;
  bool tty_ = false, finished_ = false, bar_visible_ = false;
  int last_quarter_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace ls::tools
