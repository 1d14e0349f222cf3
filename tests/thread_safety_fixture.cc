// A planted lock bug for the thread_safety_bites test: it must NOT compile
// under clang -Wthread-safety -Werror (the test expects the diagnostic).
#include "base/mutex.h"

namespace kvrelay {

class Planted {
 public:
  int Read() { return value_; }   // no lock held: the analysis must object
 private:
  Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

int Use() { return Planted().Read(); }

}  // namespace kvrelay
