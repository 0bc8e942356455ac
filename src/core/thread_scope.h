// ThreadScope<T>: while an object of T is alive it is in scope on the thread that made it, so
// code far below (a weight load, a checkpoint open) finds it without it being passed through
// every call. Scopes nest: current() is the innermost, all() every one, outermost first; a
// scope ends with its object, and the one around it is current again. Not copyable or movable:
// the object is its scope.
#pragma once
#include <vector>

namespace kiln {

template <typename T>
class ThreadScope {
 public:
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

  // The innermost live T of this thread, or nullptr.
  static T* current() { return stack().empty() ? nullptr : static_cast<T*>(stack().back()); }
  // Calls f on every live T of this thread, outermost first.
  template <typename F>
  static void for_each(F&& f) {
    for (ThreadScope* s : stack()) f(*static_cast<T*>(s));
  }

 protected:
  ThreadScope() { stack().push_back(this); }
  ~ThreadScope() { stack().pop_back(); }

 private:
  // Held as the base: T is converted to only once it is fully built (current, for_each).
  static std::vector<ThreadScope*>& stack() {
    thread_local std::vector<ThreadScope*> s;
    return s;
  }
};

}  // namespace kiln
