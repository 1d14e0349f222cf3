// kvrelay — one binary, subcommands.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"kvrelay: KV-cache hand-off for disaggregated prefill/decode"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
