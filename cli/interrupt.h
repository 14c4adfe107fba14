// ^C (SIGINT) and SIGTERM in the commands that write files (issue 28, item 5: no
// temporary file left behind, and never `-o` and `--json` from different runs).
//
// InterruptScope (make-model, merge-lora: one long streamed write): while it lives, the
// two signals only set a flag, which the writing loop polls so that it can stop cleanly
// (the SafetensorsWriter then removes its temporary file and the output path is
// untouched); the previous handlers come back when the scope ends.
//
// RunInterrupt (forward, generate: minutes of compute, then a few small writes): before
// the outputs are written a signal ends the process at once (a line on stderr, exit
// 128 + the signal's number) -- no file of this run exists yet. While a
// RunInterrupt::Writing section lives (the outputs staged to temporary files and
// published together, io::StagedOutputs) a signal only sets a flag: the writer checks
// pending() after each file and stops, and the staged files are removed; a signal that
// comes during publishing is honoured after it (every output then is this run's).
// The hand-over between the two states is one atomic exchange, so a signal can never
// find a temporary file it does not know about.
#pragma once

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace ls::cli {

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

class RunInterrupt {
 public:
  // `command` names the command in the line printed on a signal ("layerstream forward");
  // it must outlive the object (a string literal).
  explicit RunInterrupt(const char* command) {
    static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");
    command_() = command;
    state().store(kComputing);
    pending_().store(0);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~RunInterrupt() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  RunInterrupt(const RunInterrupt&) = delete;
  RunInterrupt& operator=(const RunInterrupt&) = delete;

  // The signal received while writing (0: none).
  int pending() const { return pending_().load(); }
  // The exit code for a pending signal (128 + its number, as a shell reports a kill).
  int exit_code() const { return 128 + pending(); }

  class Writing {
   public:
    Writing() {
      int expected = kComputing;
      // The handler may be ending the process right now (kExiting): wait for it.
      while (!state().compare_exchange_strong(expected, kWriting)) {
        if (expected == kExiting)
          for (;;) pause();
        expected = kComputing;
      }
    }
    ~Writing() { state().store(kComputing); }
    Writing(const Writing&) = delete;
    Writing& operator=(const Writing&) = delete;
  };

 private:
  static constexpr int kComputing = 0, kWriting = 1, kExiting = 2;
  static std::atomic<int>& state() {
    static std::atomic<int> s{kComputing};
    return s;
  }
  static std::atomic<int>& pending_() {
    static std::atomic<int> p{0};
    return p;
  }
  static const char*& command_() {
    static const char* c = "layerstream";
    return c;
  }
  static void say(const char* s) {
    ssize_t r = ::write(2, s, std::strlen(s));
    (void)r;
  }
  static void on_signal(int sig) {
    int expected = kComputing;
    if (state().compare_exchange_strong(expected, kExiting)) {
      // Nothing of this run has been written: end now (async-signal-safe calls only).
      say("\n");
      say(command_());
      say(sig == SIGINT ? ": interrupted (SIGINT); nothing was written\n"
                        : ": terminated (SIGTERM); nothing was written\n");
      _exit(128 + sig);
    }
    int none = 0;
    pending_().compare_exchange_strong(none, sig);
  }
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace ls::cli
