// exit_code.cc — the exit code the subcommand that ran chose (commands.h):
// shared by the kvrelay binary and kvrelay_sim_cli (src/CMakeLists.txt).
#include "cli/commands.h"

namespace kvrelay::cli {

namespace {
int g_exit_code = 0;
}  // namespace

int ExitCode() { return g_exit_code; }
void SetExitCode(int code) { g_exit_code = code; }

}  // namespace kvrelay::cli
