#include "cli/progress.h"

#include <algorithm>
#include <cmath>
#include <unistd.h>

namespace ls::cli {

std::string format_duration(double s) {
  char buf[48];
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  if (s < 10) std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 60) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  return buf;
}

Progress::Progress(std::string label, std::string unit, int64_t total, std::FILE* out)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(total, 1)), out_(out) {
  tty_ = isatty(fileno(out_)) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::rate_eta(const char* sep) const {
  const double t = elapsed();
  if (done_ <= 0 || t <= 0) return "";
  const double rate = static_cast<double>(done_) / t;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g/s", rate);
  std::string s = buf;
  if (done_ < total_) s += std::string(sep) + "ETA " + format_duration(static_cast<double>(total_ - done_) / rate);
  return s;
}

void Progress::set_detail(std::string detail) {
  detail_ = std::move(detail);
  if (tty_) draw(false);
}

void Progress::advance(int64_t n) { set_done(done_ + n); }

void Progress::set_done(int64_t done) {
  done = std::min(total_, done);
  if (done <= done_) return;
  done_ = done;
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

void Progress::abandon() {
  if (finished_) return;
  if (tty_ && bar_visible_) std::fprintf(out_, "\n");
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
    const std::string re = rate_eta("  ");
    std::fprintf(out_, "\r\033[K%s [%s] %lld/%lld %s%s%s  %s  %s", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), re.empty() ? "" : "  ",
                 re.c_str(), detail_.c_str(), format_duration(t).c_str());
    bar_visible_ = true;
    last_draw_ = now;
    std::fflush(out_);
    return;
  }
  const int tenth = static_cast<int>(10 * done_ / total_);
  const bool periodic = now - last_draw_ >= std::chrono::seconds(10);
  if (tenth <= last_tenth_ && !periodic && (!force || done_ == total_)) return;  // 100 % is printed once
  if (tenth <= last_tenth_ && done_ == total_ && last_tenth_ == 10) return;
  last_tenth_ = tenth;
  last_draw_ = now;
  const std::string re = rate_eta(", ");
  std::fprintf(out_, "%s: %lld%% (%lld/%lld %s)%s%s%s%s, %s\n", label_.c_str(),
               static_cast<long long>(100 * done_ / total_), static_cast<long long>(done_),
               static_cast<long long>(total_), unit_.c_str(), re.empty() ? "" : ", ", re.c_str(),
               detail_.empty() ? "" : ", ", detail_.c_str(), format_duration(t).c_str());
  std::fflush(out_);
}

}  // namespace ls::cli
