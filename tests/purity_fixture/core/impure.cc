// A planted violation: purity_check.sh must reject this tree (test
// purity_check_bites expects it to fail). Never compiled.
#include <chrono>
long Now() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
