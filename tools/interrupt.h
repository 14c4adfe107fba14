// ^C and SIGTERM during a long file write (make-model, merge-lora): while an
// InterruptScope lives, the two signals only set a flag, which the writing loop polls
// so that it can stop cleanly (the SafetensorsWriter then removes its temporary file and
// the output path is untouched); the previous handlers come back when the scope ends.
#pragma once

#include <csignal>

namespace ls::tools {

class InterruptScope {
 public:
  InterruptScope() {
    flag() = 0;
    old_int_ = std::signal(SIGINT, on_signal);
    old_term_ = std::signal(SIGTERM, on_signal);
  }
  ~InterruptScope() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  bool interrupted() const { return flag() != 0; }

 private:
  static volatile std::sig_atomic_t& flag() {
    static volatile std::sig_atomic_t f = 0;
    return f;
  }
  static void on_signal(int) { flag() = 1; }
  void (*old_int_)(int) = nullptr;
  void (*old_term_)(int) = nullptr;
};

}  // namespace ls::tools
