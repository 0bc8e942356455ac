// The seconds and count of each kind of work a device's queue ran, by name: what every
// DeviceRuntime's kernel_times() reports. Its own lock, so the queue may add to it while holding
// its own, and kernel_times() reads it without that one.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace kiln {

class KernelTimes {
 public:
  using Map = std::map<std::string, std::pair<double, uint64_t>>;

  // One more `what`, which took `elapsed`.
  void add(const std::string& what, std::chrono::steady_clock::duration elapsed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& [seconds, count] = times_[what];
    seconds += std::chrono::duration<double>(elapsed).count();
    ++count;
  }
  // One more `what`, untimed (a copy: the device moves the bytes after the host has returned).
  void count(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++times_[what].second;
  }
  Map snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    times_.clear();
  }

 private:
  mutable std::mutex mu_;
  Map times_;
};

}  // namespace kiln
