// Fan-in of worker output: one OutputStream per (rank, stdout|stderr).
//
// Bytes arrive in arbitrary chunks; complete lines go to the console with the rank prefix in
// one write() each (so lines of different ranks never interleave mid-line), the raw bytes go
// to the rank's log file unchanged, and the last lines are kept for the failure summary.
// Lines are never cut: a partial line waits for its newline, or for close().
#pragma once

#include <deque>
#include <string>
#include <string_view>

namespace dtrain::launch {

class OutputStream {
 public:
  // console_fd: where prefixed lines go (-1: nowhere); file_fd: raw copy (-1: none; owned
  // and closed by this object); tail_lines: how many complete lines to keep.
  OutputStream(std::string prefix, int console_fd, int file_fd, int tail_lines);
  ~OutputStream();
  OutputStream(OutputStream&&) noexcept;
  OutputStream& operator=(OutputStream&&) = delete;
  OutputStream(const OutputStream&) = delete;

  void write(std::string_view bytes);
  // Flushes a trailing partial line (with a newline added on the console) and closes the file.
  void close();
  // The last lines seen (a trailing partial line included), oldest first.
  std::deque<std::string> tail() const;

 private:
  void emit_line(std::string_view line);
  std::string prefix_;
  int console_fd_;
  int file_fd_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// write(2) of all bytes, retrying on EINTR/partial writes; errors (a closed console) are
// ignored: losing the console must not stop the job.
void write_all(int fd, std::string_view bytes);
// "dtrain: MSG" and a newline on stderr, in one write (the agent's own messages).
void say(const std::string& msg);

}  // namespace dtrain::launch
