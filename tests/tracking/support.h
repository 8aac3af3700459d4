// Shared by the tracking tests: a real `mlflow server`, free ports, and reading runs back with
// MLflow's own Python client (tests/tracking/read_runs.py, in the venv of pinned peers).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace dtrain::test {

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The HTTP status of GET path on 127.0.0.1:port (0 when nothing answers within 5 s).
inline int http_get_status(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  int status = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req =
        "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[64] = {};
      ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
      if (n > 12 && std::string(buf, 5) == "HTTP/") status = std::atoi(buf + 9);
    }
  }
  ::close(fd);
  return status;
}

// `mlflow server` on 127.0.0.1:port with a sqlite backend and proxied artifacts under dir.
class MlflowServer {
 public:
  MlflowServer(std::filesystem::path dir, int port) : dir_(std::move(dir)), port_(port) {}
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  // Returns an error text, empty when the server answers.
  std::string start() {
    std::filesystem::create_directories(dir_);
    // The server's output goes to a file, not to pipes: nothing reads a pipe between start()
    // and stop(), and a server whose access log filled one (64 KiB, a few hundred requests)
    // blocked in write() and answered nothing more (every later request timed out, and
    // Chromium's --dump-dom of the UI waited for it for ever).
    proc_.emplace(Process::start(
        {"/bin/sh", "-c", "log=$1; shift; exec \"$@\" >\"$log\" 2>&1", "sh", log_path(),
         DTRAIN_VENV_PYTHON, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
         std::to_string(port_), "--backend-store-uri", "sqlite:///" + (dir_ / "mlflow.db").string(),
         "--artifacts-destination", (dir_ / "artifacts").string(), "--workers", "1"},
        // No job runner: MLflow 3's server would make it a store directory in /dev/shm that
        // it never removes (one left per server started).
        {.env = {"PYTHONUNBUFFERED=1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"},
         .timeout = std::chrono::seconds(600)}));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      proc_->pump(std::chrono::milliseconds(200));
      if (proc_->exited()) {
        return "mlflow server exited at start (is mlflow installed in the venv? "
               "scripts/requirements.txt): " +
               log_tail();
      }
      if (http_get_status(port_, "/health") == 200) return "";
    }
    return "mlflow server did not answer on " + url() + " within 120 s: " + log_tail();
  }

  std::string log_path() const { return (dir_ / "server.log").string(); }
  // The last 3000 bytes of the server's output.
  std::string log_tail() const {
    std::ifstream in(log_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
  }

  void stop() {
    if (!proc_) return;
    ::kill(-proc_->pid(), SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (!proc_->exited() && std::chrono::steady_clock::now() < deadline)
      proc_->pump(std::chrono::milliseconds(100));
    proc_->kill_group();
    // uvicorn's workers are in the group too; wait until nothing listens.
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (port_open(port_) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    proc_.reset();
  }

  ~MlflowServer() { stop(); }

 private:
  std::filesystem::path dir_;
  int port_;
  std::optional<Process> proc_;
};

// One `mlflow server` for a whole test binary: a gtest global environment that starts it before
// the first test on a free loopback port, in a fresh temporary directory named `prefix` + pid,
// and stops it and removes the directory after the last. A test asserts `error` is empty
// first, so a server that did not start fails every test instead of skipping it.
class MlflowServerEnvironment : public ::testing::Environment {
 public:
  explicit MlflowServerEnvironment(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / (prefix_ + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    server = std::make_unique<MlflowServer>(dir / "server", free_port());
    error = server->start();
  }
  void TearDown() override {
    server.reset();
    std::filesystem::remove_all(dir);
  }
  // Registers one with gtest (which owns it) and returns it.
  static MlflowServerEnvironment* add(std::string prefix) {
    auto* env = new MlflowServerEnvironment(std::move(prefix));
    ::testing::AddGlobalTestEnvironment(env);
    return env;
  }

  std::filesystem::path dir;
  std::unique_ptr<MlflowServer> server;
  std::string error = "the server was not started";

 private:
  std::string prefix_;
};

// Runs read_runs.py; fails the test (and returns {"runs": []}) when it fails.
inline nlohmann::json read_runs(const std::string& uri, const std::string& experiment) {
  auto r = run_command(
      {DTRAIN_VENV_PYTHON, std::string(DTRAIN_SOURCE_DIR) + "/tests/tracking/read_runs.py", uri,
       experiment},
      {.timeout = std::chrono::seconds(120)});
  if (r.exit_code != 0) {
    ADD_FAILURE() << "read_runs.py failed (" << r.exit_code << "): " << r.err;
    return {{"runs", nlohmann::json::array()}};
  }
  auto last_brace = r.out.rfind("{\"runs\"");
  return nlohmann::json::parse(r.out.substr(last_brace));
}

}  // namespace dtrain::test
