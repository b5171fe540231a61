#pragma once
// Runs the real service (`mpirun -np 1 coordinator CFG : -np W worker CFG`) as a child process
// for end-to-end tests. Every wait is bounded; the destructor kills mpirun and every rank it
// started (Open MPI puts each rank in its own process group, so the ranks are found by their
// parent and by their command line, which names this instance's unique config file).
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hyserve/common/config.h"

extern char** environ;

namespace hyserve::service_test {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string binary_dir() { return HYSERVE_BINARY_DIR; }
inline std::string coordinator_binary() { return binary_dir() + "/bin/coordinator"; }
inline std::string worker_binary() { return binary_dir() + "/bin/worker"; }
inline std::string fixture_model_dir() { return std::string(HYSERVE_SOURCE_DIR) + "/tests/fixtures/bamba-tiny"; }

// mpirun: the one CMake found, else the first on PATH.
inline std::string mpiexec_path() {
#ifdef HYSERVE_MPIEXEC
  if (std::string p = HYSERVE_MPIEXEC; !p.empty() && ::access(p.c_str(), X_OK) == 0) return p;
#endif
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = dir + "/mpirun";
    if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p;
  }
  return "mpirun";
}

struct proc_entry {
  pid_t pid = 0;
  pid_t ppid = 0;
  char state = '?';
  std::string cmdline;  // arguments joined by spaces
};

inline std::vector<proc_entry> list_processes() {
  std::vector<proc_entry> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const char* name = e->d_name;
    if (!std::all_of(name, name + std::strlen(name), [](char c) { return c >= '0' && c <= '9'; })) continue;
    proc_entry p;
    p.pid = static_cast<pid_t>(std::atoi(name));
    const std::string stat = read_text(std::string("/proc/") + name + "/stat");
    const size_t close_paren = stat.rfind(')');
    if (close_paren == std::string::npos || close_paren + 4 > stat.size()) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    long ppid = 0;
    rest >> p.state >> ppid;
    p.ppid = static_cast<pid_t>(ppid);
    std::string cmd = read_text(std::string("/proc/") + name + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    p.cmdline = std::move(cmd);
    out.push_back(std::move(p));
  }
  ::closedir(d);
  return out;
}

// One service instance: a temp dir with its config and log, and the mpirun child.
class service_process {
 public:
  // `yaml` may contain @MODEL@ (the bamba-tiny fixture) and @PORT@ (0, or a free port when the
  // config loader refuses 0). `workers` is the -np of the worker ranks.
  service_process(std::string name, std::string yaml, int workers) : name_(std::move(name)), workers_(workers) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("hyserve-svc-" + name_ + "-XXXXXX")).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) {
      failure_ = "mkdtemp failed: " + std::string(std::strerror(errno));
      return;
    }
    dir_ = buf.data();
    config_path_ = dir_ + "/config.yaml";
    log_path_ = dir_ + "/service.log";
    replace_all(yaml, "@MODEL@", fixture_model_dir());
    if (yaml.find("@PORT@") != std::string::npos) {
      replace_all(yaml, "@PORT@", "0");  // an ephemeral port, read back from the log
    }
    yaml_ = yaml;
    std::ofstream(config_path_) << yaml_;
  }

  service_process(const service_process&) = delete;
  service_process& operator=(const service_process&) = delete;

  ~service_process() {
    kill_all();
    if (!dir_.empty() && std::getenv("HYSERVE_KEEP_SERVICE_LOGS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Start through launch/serve.sh (its own process group; no install or build: the binaries of
  // this build) instead of mpirun directly. mpirun_pid() is then serve.sh's pid.
  void use_serve_script() { via_serve_script_ = true; }

  // The job starts with `signal` blocked (mpirun and its ranks inherit the mask), as under a
  // launcher that blocks it; without this call it starts with no signal blocked, whatever the
  // test runner's mask.
  void start_with_blocked(int signal) { blocked_signals_.push_back(signal); }

  // Forks mpirun. Must be called from a thread that outlives the child (the main thread):
  // the child gets SIGTERM when that thread ends, so a crashed test run leaves nothing behind.
  bool start() {
    if (!failure_.empty()) return false;
    std::vector<std::string> args = {mpiexec_path()};
    if (::geteuid() == 0) {
      args.push_back("--allow-run-as-root");
      args.push_back("--oversubscribe");
    }
    for (const std::string& a : {std::string("-np"), std::string("1"), coordinator_binary(), config_path_,
                                 std::string(":"), std::string("-np"), std::to_string(workers_), worker_binary(),
                                 config_path_})
      args.push_back(a);
    if (via_serve_script_) args = {"/bin/bash", std::string(HYSERVE_SOURCE_DIR) + "/launch/serve.sh", config_path_};
    command_.clear();
    for (const auto& a : args) command_ += (command_.empty() ? "" : " ") + a;

    // Environment: ours, without the per-job variables an enclosing launcher sets (rank, world,
    // PMIx and runtime wiring), with OMP_NUM_THREADS=1. Site and user MPI configuration
    // (OMPI_MCA_* such as plm_rsh_agent or btl choices, OMPI_ALLOW_RUN_AS_ROOT*) stays: a machine
    // whose mpirun needs it to launch locally must get it here too.
    std::vector<std::string> env;
    auto per_job = [](std::string_view kv) {
      if (kv.starts_with("PMIX_") || kv.starts_with("OMP_NUM_THREADS=")) return true;
      if (!kv.starts_with("OMPI_")) return false;
      if (kv.starts_with("OMPI_ALLOW_RUN_AS_ROOT")) return false;
      if (kv.starts_with("OMPI_MCA_"))
        return kv.starts_with("OMPI_MCA_ess") || kv.starts_with("OMPI_MCA_orte") || kv.starts_with("OMPI_MCA_pmix") ||
               kv.starts_with("OMPI_MCA_initial_wdir") || kv.starts_with("OMPI_MCA_mpi_oversubscribe");
      return true;  // OMPI_COMM_WORLD_*, OMPI_UNIVERSE_SIZE, OMPI_FIRST_RANKS, ...
    };
    for (char** e = environ; e && *e; ++e) {
      const std::string_view kv(*e);
      if (per_job(kv)) continue;
      env.emplace_back(kv);
    }
    env.emplace_back("OMP_NUM_THREADS=1");
    if (via_serve_script_) {
      env.emplace_back("HYSERVE_BUILD_DIR=" + binary_dir());
      env.emplace_back("HYSERVE_NO_BUILD=1");
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null_fd < 0) {
      failure_ = "cannot open the log file " + log_path_;
      return false;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      failure_ = "fork failed: " + std::string(std::strerror(errno));
      ::close(log_fd);
      ::close(null_fd);
      return false;
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls from here on.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(null_fd, STDIN_FILENO);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      // The job's signal mask is the test's choice, not the runner's (a runner that blocks
      // SIGUSR1 would keep mpirun from forwarding it).
      sigset_t mask;
      ::sigemptyset(&mask);
      for (const int s : blocked_signals_) ::sigaddset(&mask, s);
      ::sigprocmask(SIG_SETMASK, &mask, nullptr);
      ::execve(argv[0], argv.data(), envp.data());
      static const char msg[] = "service_process: execve of mpirun failed\n";
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also from the parent: no race with a kill before the child ran
    ::close(log_fd);
    ::close(null_fd);
    pid_ = pid;
    started_at_ = steady::now();
    return true;
  }

  // Waits for "serving on http://HOST:PORT" in the log. False (with failure()) when the job
  // exits first or the time runs out.
  bool wait_serving(std::chrono::milliseconds limit = 90s) {
    static const std::regex kServing(R"(serving on http://[0-9.]+:([0-9]+))");
    const auto until = steady::now() + limit;
    while (true) {
      const std::string text = log();
      std::smatch m;
      if (std::regex_search(text, m, kServing)) {
        port_ = static_cast<uint16_t>(std::stoi(m[1].str()));
        if (port_ == 0) {
          failure_ = "the service says it serves on port 0";
          return false;
        }
        return true;
      }
      if (poll_exit()) {
        failure_ = "the job exited before serving (" + describe_status(*status_) + ")";
        return false;
      }
      if (steady::now() > until) {
        failure_ = "no 'serving on' line within " + std::to_string(limit.count()) + " ms";
        return false;
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  // start() + wait_serving().
  bool launch(std::chrono::milliseconds limit = 90s) { return start() && wait_serving(limit); }

  // The mpirun wait status once it exited; nullopt while it runs past `limit`.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const auto until = steady::now() + limit;
    while (!poll_exit()) {
      if (steady::now() > until) return std::nullopt;
      std::this_thread::sleep_for(20ms);
    }
    return status_;
  }

  // Processes of this instance running `binary` (matched by binary path and config path).
  std::vector<pid_t> rank_pids(const std::string& binary) const {
    std::vector<pid_t> out;
    if (config_path_.empty()) return out;
    for (const proc_entry& p : list_processes()) {
      if (p.state == 'Z' || p.pid == pid_) continue;
      if (p.cmdline.starts_with(binary + " ") && p.cmdline.find(config_path_) != std::string::npos)
        out.push_back(p.pid);
    }
    return out;
  }
  std::vector<pid_t> coordinator_pids() const { return rank_pids(coordinator_binary()); }
  std::vector<pid_t> worker_pids() const { return rank_pids(worker_binary()); }

  // Waits until no coordinator or worker process of this instance is left.
  bool wait_ranks_gone(std::chrono::milliseconds limit) const {
    const auto until = steady::now() + limit;
    while (!coordinator_pids().empty() || !worker_pids().empty()) {
      if (steady::now() > until) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

  // Kills mpirun and every process it started; bounded.
  void kill_all() {
    if (pid_ <= 0) return;
    if (!status_) {
      std::set<pid_t> victims;
      collect_descendants(pid_, victims);
      for (pid_t p : coordinator_pids()) victims.insert(p);
      for (pid_t p : worker_pids()) victims.insert(p);
      for (pid_t p : victims) ::kill(p, SIGKILL);
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      wait_exit(15s);
    }
    // Ranks reparented after mpirun died (should not happen, but never leave one behind).
    const auto until = steady::now() + 5s;
    while (steady::now() < until) {
      std::vector<pid_t> left = coordinator_pids();
      for (pid_t p : worker_pids()) left.push_back(p);
      if (left.empty()) break;
      for (pid_t p : left) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(20ms);
    }
  }

  std::string log() const { return read_text(log_path_); }
  std::string log_tail(size_t n = 6000) const {
    const std::string text = log();
    return text.size() <= n ? text : "..." + text.substr(text.size() - n);
  }
  // What went wrong, with the log's tail, for assertion messages.
  std::string report() const {
    return "[" + name_ + "] " + failure_ + "\ncommand: " + command_ + "\nconfig:\n" + yaml_ + "\nlog tail:\n" +
           log_tail();
  }

  uint16_t port() const { return port_; }
  pid_t mpirun_pid() const { return pid_; }
  const std::string& failure() const { return failure_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& name() const { return name_; }
  double seconds_since_start() const { return std::chrono::duration<double>(steady::now() - started_at_).count(); }

  static std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "wait status " + std::to_string(status);
  }

 private:
  static void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
      s.replace(pos, from.size(), to);
  }

  static void collect_descendants(pid_t root, std::set<pid_t>& out) {
    const std::vector<proc_entry> all = list_processes();
    std::vector<pid_t> frontier = {root};
    while (!frontier.empty()) {
      const pid_t parent = frontier.back();
      frontier.pop_back();
      for (const proc_entry& p : all) {
        if (p.ppid == parent && out.insert(p.pid).second) frontier.push_back(p.pid);
      }
    }
  }

  bool poll_exit() {
    if (status_) return true;
    if (pid_ <= 0) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      return true;
    }
    if (r < 0 && errno == ECHILD) {
      status_ = -1;
      return true;
    }
    return false;
  }

  std::string name_;
  int workers_ = 0;
  bool via_serve_script_ = false;
  std::vector<int> blocked_signals_;
  std::string dir_, config_path_, log_path_, yaml_, command_;
  std::string failure_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  uint16_t port_ = 0;
  steady::time_point started_at_ = steady::now();
};

}  // namespace hyserve::service_test
