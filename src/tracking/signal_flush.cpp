// The SIGTERM/SIGINT handlers, their self-pipe and the watcher thread that runs the flushers.
#include "tracking/signal_flush.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain::mlflow::detail {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};

// Written by the handler, read by the watcher; -1 when not installed (or in a forked child).
std::atomic<int> g_pipe_read{-1};
std::atomic<int> g_pipe_write{-1};
std::atomic<pid_t> g_installer{0};

struct Registry {
  std::mutex mu;
  std::map<int, SignalFlusher> flushers;
  int next = 1;
  bool installed = false;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: the watcher may run while the process exits
  return *r;
}

extern "C" void on_stop_signal(int sig) {
  int saved = errno;
  int fd = g_pipe_write.load();
  auto byte = static_cast<unsigned char>(sig);
  if (fd < 0 || ::write(fd, &byte, 1) != 1) {
    // No watcher to hand the signal to: take the default action now.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  errno = saved;
}

bool is_ours(int sig) {
  struct sigaction cur {};
  return ::sigaction(sig, nullptr, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
         cur.sa_handler == on_stop_signal;
}

void restore_defaults() {
  for (int sig : kSignals)
    if (is_ours(sig)) ::signal(sig, SIG_DFL);
}

// A forked child (no exec) has no watcher and must not write into the parent's pipe.
void in_forked_child() {
  restore_defaults();
  int r = g_pipe_read.exchange(-1), w = g_pipe_write.exchange(-1);
  if (r >= 0) ::close(r);
  if (w >= 0) ::close(w);
}

[[noreturn]] void watch(int fd) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;  // a bounded wait; the loop lasts the process's life
    unsigned char byte = 0;
    if (::read(fd, &byte, 1) != 1) continue;
    const int sig = byte;
    restore_defaults();  // a second signal during the flush takes the default action at once
    std::vector<SignalFlusher> todo;
    {
      std::lock_guard<std::mutex> lk(registry().mu);
      for (const auto& [token, f] : registry().flushers) todo.push_back(f);
    }
    const auto signalled_at = std::chrono::steady_clock::now();
    for (const auto& f : todo) f.start();
    for (const auto& f : todo) f.finish(signalled_at);
    // The default action, delivered to this thread (unblocked here whatever the program's mask).
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);  // not reached: the default action of SIGTERM and SIGINT ends the process
  }
}

void install_locked(Registry& r) {
  if (r.installed) return;
  r.installed = true;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return;  // no flush on a signal; nothing else
  g_pipe_read = fds[0];
  g_pipe_write = fds[1];
  g_installer = ::getpid();
  ::pthread_atfork(nullptr, nullptr, in_forked_child);
  std::thread(watch, fds[0]).detach();
  for (int sig : kSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;  // the program's own
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(sig, &sa, nullptr);
  }
}

bool in_installer_or_first() {
  pid_t who = g_installer.load();
  return who == 0 || who == ::getpid();
}

}  // namespace

int register_signal_flusher(SignalFlusher flusher) {
  if (!in_installer_or_first()) return 0;
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  install_locked(r);
  int token = r.next++;
  r.flushers.emplace(token, std::move(flusher));
  return token;
}

void unregister_signal_flusher(int token) {
  if (token == 0 || !in_installer_or_first()) return;
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.flushers.erase(token);
}

}  // namespace dtrain::mlflow::detail
