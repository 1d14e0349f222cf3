#!/usr/bin/env bash
# Fails when a pure layer (src/base, src/core, src/engine) reads a clock,
# starts a thread, sleeps, reads the environment, draws hidden randomness or
# uses volatile. Tests (*_test.cc) are exempt: they may time themselves.
# Usage: purity_check.sh SRC_DIR
set -u
src="${1:?usage: purity_check.sh SRC_DIR}"
pattern='steady_clock|system_clock|high_resolution_clock|std::thread|std::jthread|pthread_create|sleep_for|sleep_until|usleep|nanosleep|getenv|random_device|[^_a-zA-Z]rand\(|srand\(|volatile|std::async|#include <random>|#include <chrono>|#include <thread>'
dirs=()
for d in base core engine; do [ -d "$src/$d" ] && dirs+=("$src/$d"); done
[ ${#dirs[@]} -gt 0 ] || { echo "purity_check: no pure layers under $src"; exit 1; }
hits=$(grep -rnE "$pattern" "${dirs[@]}" --include='*.h' --include='*.cc' \
       | grep -vE '_test\.cc:' | grep -vE ':[0-9]+:\s*//' || true)
if [ -n "$hits" ]; then
  echo "purity_check: impure constructs in pure layers:"
  echo "$hits"
  exit 1
fi
n=$(find "${dirs[@]}" -name '*.h' -o -name '*.cc' | grep -vc '_test\.cc$')
echo "purity_check: ${n} files in ${dirs[*]} are pure"
