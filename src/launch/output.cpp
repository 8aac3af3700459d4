#include "launch/output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "dtrain/error.h"

namespace dtrain::launch {
namespace {

// Who left each console in the middle of a line (0: nobody, the console is at a line start),
// by the console's file: stdout and stderr on one terminal are one console.
std::mutex g_console_mu;
std::map<std::uint64_t, std::uint64_t> g_mid_line;  // guarded by g_console_mu
std::atomic<std::uint64_t> g_next_stream_id{1};

std::uint64_t console_key(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return static_cast<std::uint64_t>(fd) + 1;
  return (static_cast<std::uint64_t>(st.st_dev) << 40) ^ static_cast<std::uint64_t>(st.st_ino);
}

}  // namespace

void say(const std::string& msg) { say_block("dtrain: " + msg + "\n"); }

void say_block(const std::string& text) {
  if (text.empty()) return;
  std::lock_guard<std::mutex> lk(g_console_mu);
  std::uint64_t& mid = g_mid_line[console_key(STDERR_FILENO)];
  write_all(STDERR_FILENO, mid != 0 ? "\n" + text : text);
  mid = 0;
}

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking console: wait for room, briefly
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 1000) <= 0) return;
        continue;
      }
      return;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

FilteredLog::FilteredLog(const std::string& path, std::vector<std::string> needles)
    : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644)),
      needles_(std::move(needles)) {
  if (fd_ < 0) throw Error("cannot create log file " + path + ": " + std::strerror(errno));
}

FilteredLog::~FilteredLog() { ::close(fd_); }

bool FilteredLog::matches(std::string_view line) const {
  for (const auto& n : needles_)
    if (line.find(n) != std::string_view::npos) return true;
  return false;
}

OutputStream::OutputStream(std::string prefix, int console_fd, int file_fd, int tail_lines,
                           std::shared_ptr<FilteredLog> filtered)
    : prefix_(std::move(prefix)),
      console_fd_(console_fd),
      id_(g_next_stream_id++),
      console_key_(console_key(console_fd)),
      file_fd_(file_fd),
      tail_lines_(static_cast<size_t>(tail_lines)),
      filtered_(std::move(filtered)) {}

OutputStream::OutputStream(OutputStream&& o) noexcept
    : prefix_(std::move(o.prefix_)),
      console_fd_(o.console_fd_),
      id_(o.id_),
      console_key_(o.console_key_),
      file_fd_(o.file_fd_),
      tail_lines_(o.tail_lines_),
      partial_(std::move(o.partial_)),
      live_(o.live_),
      at_start_(o.at_start_),
      cr_to_write_(o.cr_to_write_),
      cr_at_end_(o.cr_at_end_),
      last_data_(o.last_data_),
      tail_(std::move(o.tail_)),
      filtered_(std::move(o.filtered_)) {
  o.file_fd_ = -1;
  o.console_fd_ = -1;
}

OutputStream::~OutputStream() {
  if (file_fd_ >= 0) ::close(file_fd_);
}

void OutputStream::write(std::string_view bytes) {
  if (file_fd_ >= 0) write_all(file_fd_, bytes);
  if (bytes.empty()) return;
  last_data_ = Clock::now();
  if (cr_at_end_) {
    cr_at_end_ = false;
    if (bytes.front() == '\n') {
      add_text("\r");  // "\r\n" split between two reads: part of the line, as a whole one
    } else {
      carriage_return();
    }
  }
  size_t start = 0;
  while (true) {
    const size_t end = bytes.find_first_of("\r\n", start);
    if (end == std::string_view::npos) {
      add_text(bytes.substr(start));
      return;
    }
    if (bytes[end] == '\n') {
      if (!live_ && partial_.empty()) {
        emit_line(bytes.substr(start, end - start));  // the common case: no copy
      } else {
        add_text(bytes.substr(start, end - start));
        end_line();
      }
    } else if (end + 1 == bytes.size()) {
      add_text(bytes.substr(start, end - start));
      cr_at_end_ = true;
    } else if (bytes[end + 1] == '\n') {
      add_text(bytes.substr(start, end + 1 - start));  // "\r\n": the '\r' stays in the line
    } else {
      add_text(bytes.substr(start, end - start));
      carriage_return();
    }
    start = end + 1;
    if (start == bytes.size()) return;
  }
}

void OutputStream::add_text(std::string_view text) {
  if (text.empty()) return;
  partial_.append(text);
  if (!live_ || console_fd_ < 0) return;
  to_console(cr_to_write_ ? Start::Redraw : at_start_ ? Start::NewLine : Start::Continue, text);
  cr_to_write_ = false;
  at_start_ = false;
}

void OutputStream::to_console(Start start, std::string_view text) {
  std::lock_guard<std::mutex> lk(g_console_mu);
  std::uint64_t& mid = g_mid_line[console_key_];
  std::string out;
  switch (start) {
    case Start::Redraw:  // over whatever the console's line holds
      out.push_back('\r');
      out.append(prefix_);
      break;
    case Start::NewLine:
      if (mid != 0 && mid != id_) out.push_back('\n');
      out.append(prefix_);
      break;
    case Start::Continue:  // where this stream left the console, unless another wrote since
      if (mid != id_) {
        if (mid != 0) out.push_back('\n');
        out.append(prefix_);
      }
      break;
  }
  out.append(text);
  if (out.empty()) return;
  write_all(console_fd_, out);
  mid = out.back() == '\n' ? 0 : id_;
}

void OutputStream::go_live() {
  if (live_) return;
  live_ = true;
  at_start_ = true;
  if (!partial_.empty() && console_fd_ >= 0) {
    to_console(Start::NewLine, partial_);
    at_start_ = false;
  }
}

std::optional<OutputStream::Clock::time_point> OutputStream::flush_due() const {
  if (console_fd_ < 0) return std::nullopt;
  if (cr_at_end_ || (!live_ && !partial_.empty())) return last_data_ + kIdleFlush;
  return std::nullopt;
}

void OutputStream::flush_idle(Clock::time_point now) {
  auto due = flush_due();
  if (!due || now < *due) return;
  if (cr_at_end_) {  // no '\n' came after it: a carriage return of its own
    cr_at_end_ = false;
    carriage_return();
    return;
  }
  go_live();
}

void OutputStream::carriage_return() {
  go_live();
  // The next text redraws the console's line: "\r", the prefix, the text, in one write.
  if (!at_start_) cr_to_write_ = true;
  at_start_ = true;
  partial_.clear();  // what the line shows from here on
}

void OutputStream::end_line() {
  if (!live_) {
    std::string line = std::move(partial_);
    partial_.clear();
    emit_line(line);
    return;
  }
  if (console_fd_ >= 0) {
    if (at_start_ && !cr_to_write_) {
      to_console(Start::NewLine, "\n");  // a live line never written: as an empty one
    } else {
      std::lock_guard<std::mutex> lk(g_console_mu);
      std::uint64_t& mid = g_mid_line[console_key_];
      if (mid != 0) write_all(console_fd_, "\n");  // none when another line ended it already
      mid = 0;
    }
    if (filtered_ && filtered_->matches(partial_))
      write_all(filtered_->fd(), prefix_ + partial_ + "\n");
  }
  if (tail_lines_ > 0) {
    tail_.emplace_back(partial_);
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
  partial_.clear();
  live_ = false;
  at_start_ = true;
  cr_to_write_ = false;
}

void OutputStream::emit_line(std::string_view line) {
  if (console_fd_ >= 0) {
    std::string out;
    out.reserve(line.size() + 1);
    out.append(line).push_back('\n');
    to_console(Start::NewLine, out);
    if (filtered_ && filtered_->matches(line)) write_all(filtered_->fd(), prefix_ + out);
  }
  if (tail_lines_ > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
}

void OutputStream::close() {
  if (cr_at_end_) {
    cr_at_end_ = false;
    add_text("\r");
  }
  if (!partial_.empty() || live_) end_line();
  if (file_fd_ >= 0) {
    ::close(file_fd_);
    file_fd_ = -1;
  }
  filtered_.reset();
}

std::deque<std::string> OutputStream::tail() const {
  std::deque<std::string> t = tail_;
  if (!partial_.empty()) {
    t.push_back(partial_);
    if (t.size() > tail_lines_ && !t.empty()) t.pop_front();
  }
  return t;
}

}  // namespace dtrain::launch
