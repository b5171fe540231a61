#include "coordinator/rank_monitor.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hyserve::coordinator {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// State and parent of a process from /proc/PID/stat ('?' when it cannot be read).
bool read_stat(pid_t pid, char& state, pid_t& ppid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 4 > stat.size()) return false;
  std::istringstream rest(stat.substr(close + 2));
  long parent = 0;
  rest >> state >> parent;
  ppid = static_cast<pid_t>(parent);
  return static_cast<bool>(rest);
}

int world_rank_of(pid_t pid) {
  const std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  static constexpr std::string_view kKey = "OMPI_COMM_WORLD_RANK=";
  size_t pos = 0;
  while (pos < env.size()) {
    const size_t end = env.find('\0', pos);
    const std::string_view kv(env.data() + pos, (end == std::string::npos ? env.size() : end) - pos);
    if (kv.starts_with(kKey)) return std::atoi(std::string(kv.substr(kKey.size())).c_str());
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return -1;
}

}  // namespace

rank_monitor::rank_monitor(int first_rank, int last_rank) {
  const pid_t parent = ::getppid();
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0 || pid == self) continue;
    char state = '?';
    pid_t ppid = 0;
    if (!read_stat(static_cast<pid_t>(pid), state, ppid) || ppid != parent) continue;
    const int rank = world_rank_of(static_cast<pid_t>(pid));
    if (rank >= first_rank && rank <= last_rank) ranks_.push_back({rank, static_cast<pid_t>(pid)});
  }
  ::closedir(d);
}

std::optional<rank_monitor::rank_process> rank_monitor::lost() const {
  for (const rank_process& r : ranks_) {
    char state = '?';
    pid_t ppid = 0;
    if (::kill(r.pid, 0) != 0 && errno == ESRCH) return r;
    if (!read_stat(r.pid, state, ppid) || state == 'Z' || state == 'X') return r;
  }
  return std::nullopt;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

}  // namespace hyserve::coordinator
