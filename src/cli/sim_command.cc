#include "cli/commands.h"

namespace kvrelay::cli {

// The simulator arrives with its own issue; until then `sim` is not offered.
void RegisterSim(CLI::App&) {}

}  // namespace kvrelay::cli
