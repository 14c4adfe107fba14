#include "tools/progress.h"

#include <algorithm>
#include <unistd.h>

namespace ls::tools {

Progress::Progress(std::string label, std::string unit, int64_t total, std::FILE* out)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(total, 1)), out_(out) {
  tty_ = isatty(fileno(out_)) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::set_detail(std::string detail) {
  detail_ = std::move(detail);
  if (tty_) draw(false);
}

void Progress::advance(int64_t n) {
  done_ = std::min(total_, done_ + n);
  draw(false);
}

void Progress::line(const std::string& text) {
  if (tty_ && bar_visible_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", text.c_str());
  bar_visible_ = false;
  if (tty_ && !finished_) draw(true);
  std::fflush(out_);
}

void Progress::finish() {
  if (finished_) return;
  done_ = total_;
  draw(true);
  if (tty_) std::fprintf(out_, "\n");
  finished_ = true;
  bar_visible_ = false;
  std::fflush(out_);
}

void Progress::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double t = elapsed();
  if (tty_) {
    if (!force && done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done_ / total_);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r\033[K%s [%s] %lld/%lld %s  %s  %.1f s", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), detail_.c_str(), t);
    bar_visible_ = true;
    last_draw_ = now;
    std::fflush(out_);
    return;
  }
  const int quarter = static_cast<int>(4 * done_ / total_);
  const bool periodic = now - last_draw_ >= std::chrono::seconds(10);
  if (quarter <= last_quarter_ && !periodic && (!force || done_ == total_)) return;  // 100 % is printed once
  last_quarter_ = quarter;
  last_draw_ = now;
  std::fprintf(out_, "%s: %lld%% (%lld/%lld %s)%s%s, %.1f s\n", label_.c_str(),
               static_cast<long long>(100 * done_ / total_), static_cast<long long>(done_),
               static_cast<long long>(total_), unit_.c_str(), detail_.empty() ? "" : ", ", detail_.c_str(), t);
  std::fflush(out_);
}

}  // namespace ls::tools
