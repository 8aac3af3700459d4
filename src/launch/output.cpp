#include "launch/output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain::launch {

void say(const std::string& msg) { write_all(STDERR_FILENO, "dtrain: " + msg + "\n"); }

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
      file_fd_(file_fd),
      tail_lines_(static_cast<size_t>(tail_lines)),
      filtered_(std::move(filtered)) {}

OutputStream::OutputStream(OutputStream&& o) noexcept
    : prefix_(std::move(o.prefix_)),
      console_fd_(o.console_fd_),
      file_fd_(o.file_fd_),
      tail_lines_(o.tail_lines_),
      partial_(std::move(o.partial_)),
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
  size_t start = 0;
  while (true) {
    size_t nl = bytes.find('\n', start);
    if (nl == std::string_view::npos) break;
    if (partial_.empty()) {
      emit_line(bytes.substr(start, nl - start));
    } else {
      partial_.append(bytes.substr(start, nl - start));
      emit_line(partial_);
      partial_.clear();
    }
    start = nl + 1;
  }
  partial_.append(bytes.substr(start));
}

void OutputStream::emit_line(std::string_view line) {
  if (console_fd_ >= 0) {
    std::string out;
    out.reserve(prefix_.size() + line.size() + 1);
    out.append(prefix_).append(line).push_back('\n');
    write_all(console_fd_, out);
    if (filtered_ && filtered_->matches(line)) write_all(filtered_->fd(), out);
  }
  if (tail_lines_ > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
}

void OutputStream::close() {
  if (!partial_.empty()) {
    std::string last = std::move(partial_);
    partial_.clear();
    emit_line(last);
  }
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
