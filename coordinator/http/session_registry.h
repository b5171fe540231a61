#pragma once
// The live sessions of a server, so that a graceful stop can drain them and wait for them.
// Thread-safe; sessions remove themselves on destruction.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace hyserve::coordinator::http {

class session;

class session_registry {
 public:
  void add(const std::shared_ptr<session>& s) {
    std::lock_guard lock(mutex_);
    sessions_[s.get()] = s;
  }

  void remove(const session* s) {
    std::lock_guard lock(mutex_);
    sessions_.erase(s);
    if (sessions_.empty()) empty_.notify_all();
  }

  // Calls `fn` on every live session, outside the lock.
  void for_each(const std::function<void(session&)>& fn) {
    std::vector<std::shared_ptr<session>> live;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [key, weak] : sessions_) {
        if (auto s = weak.lock()) live.push_back(std::move(s));
      }
    }
    for (const auto& s : live) fn(*s);
  }

  // true when no session is left by `deadline`.
  bool wait_empty_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    return empty_.wait_until(lock, deadline, [&] { return sessions_.empty(); });
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return sessions_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable empty_;
  std::unordered_map<const session*, std::weak_ptr<session>> sessions_;
};

}  // namespace hyserve::coordinator::http
