#!/usr/bin/env bash
# Every command refuses a bad flag value before it starts anything: each
# line below runs kvrelay with one bad value and must exit non-zero within
# the guard, with the expected words in its output, and without having
# started a process (no "did not come up", no cluster line). Without the
# parse-time checks, most of these started engines first and failed late
# (or ran: sim ignored --kv-mode outside --matrix/--scenario). A word that
# names no command is named, with the commands there.
# Usage: bad_flags.sh KVRELAY
set -u
kvrelay="${1:?usage: bad_flags.sh KVRELAY}"
guard_s=20
failed=0
checked=0
# What the cluster commands print once they start something.
started='did not come up|starting P and D|1P1D on loopback|cases; each a fresh'

# expect WORDS ARGS...: kvrelay ARGS must fail, printing WORDS (a grep -E
# pattern), and start nothing.
expect() {
  local words="$1"
  shift
  local out rc
  out=$(timeout "$guard_s" "$kvrelay" "$@" 2>&1)
  rc=$?
  checked=$((checked + 1))
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL (exit $rc): kvrelay $*"
  elif ! grep -qE -- "$words" <<<"$out"; then
    echo "FAIL (no '$words'): kvrelay $*"
  elif grep -qE "$started" <<<"$out"; then
    echo "FAIL (started something first): kvrelay $*"
  else
    return 0
  fi
  echo "$out" | head -5 | sed 's/^/    /'
  failed=$((failed + 1))
}

expect '--transport: foo not in \{shm,tcp,ucx\}' demo --transport foo
expect '--model-shape: foo not in' demo --model-shape foo
expect '--p-tp: 3 not in \{1,2,4\}' demo --p-tp 3
expect '--concurrency: 0 is not above 0' demo -c 0
expect '--requests: 0 is not above 0' demo -n 0
expect "--prompt-tokens-min \(50\) must be from 1 to --prompt-tokens-max \(10\)" \
  demo --prompt-tokens-min 50 --prompt-tokens-max 10
expect "--control: --control 'bogus'" demo --control bogus
expect '--auth-token-file /nonexistent/token: No such file' demo \
  --auth-token-file /nonexistent/token
expect '--transport: foo not in' matrix --cases 1 --transport foo
expect '--model-shape: foo not in' matrix --cases 1 --model-shape foo
expect '--engine: foo not in \{emulated,llama\}' matrix --cases 1 --engine foo
expect '--d-tp: 0 not in' matrix --cases 1 --d-tp 0
expect '--requests: 0 is not above 0' matrix --cases 1 --requests 0
expect '--call-order: sideways not in' matrix --cases 1 --call-order sideways
expect "--stream-chunks is a push-mode hand-off" matrix --stream-chunks --kv-mode read
expect '--transport: foo not in' chaos --case kill-p --transport foo
expect '--engine: foo not in' chaos --case kill-p --engine foo
expect '--concurrency: 0 is not above 0' chaos --case kill-p --concurrency 0
expect '--fail-probability: Value 2 not in range' chaos --case kill-p --fail-probability 2
expect '--fault-at-s \(2.00\) must land before the load ends' chaos --case kill-p --load-s 1
expect "no case 'kill-everything'" chaos --case kill-everything
expect '--role: foo not in' serve --port 0 --role foo
expect '--tp: 3 not in \{1,2,4\}' serve --port 0 --tp 3
expect '--load-failure-policy: foo not in' serve --port 0 --load-failure-policy foo
expect '--kv-mode: foo not in \{push,read\}' serve --port 0 --kv-mode foo
expect "--stream-chunks is a push-mode hand-off" serve --port 0 --stream-chunks --kv-mode read
expect '--num-workers: 0 is not above 0' serve --port 0 --num-workers 0
expect '--abort-timeout-s: 0 is not above 0' serve --port 0 --abort-timeout-s 0
expect '--giveup-grace-s: -5 is below 0' serve --port 0 --giveup-grace-s -5
expect '--ctrl-port: Value 70000 not in range 1 to 65535' serve --port 0 --ctrl-port 70000
expect '--port: Value 70000 not in range' serve --port 70000
expect '--tcp-streams: 0 is not above 0' serve --port 0 --tcp-streams 0
expect '--step-base-us: -3 is below 0' serve --port 0 --step-base-us -3
expect '--debug-fail-writes-probability: Value 3 not in range' serve --port 0 \
  --debug-fail-writes-probability 3
expect '--threads: 0 is not above 0' serve --port 0 --engine llama --threads 0
expect '--abort-timeout-s: inf is not a number' serve --port 0 --abort-timeout-s inf
expect '--peer-dead-after-s: 1e12 is above 1000000000' serve --port 0 --peer-dead-after-s 1e12
expect 'control ports 65535..65536 \(--ctrl-port \+ rank, tp 2\) go past 65535' serve --tp 2 \
  --ctrl-port 65535
expect 'control ports 65600..65600 \(--port \+ 1000' serve --port 64600
expect '--step-per-token-us: -1 is below 0' demo --step-per-token-us -1
expect '--tcp-streams: 0 is not above 0' bench transfer --tcp-streams 0
expect '--max-connections: 0 is not above 0' router --prefill http://127.0.0.1:1 \
  --decode http://127.0.0.1:2 --discovery-timeout-s 1 --max-connections 0
expect '--kv-mode: foo not in' router --prefill http://127.0.0.1:1 --decode http://127.0.0.1:2 \
  --discovery-timeout-s 1 --kv-mode foo
expect '--transports: foo not in' bench transfer --transports shm foo
expect '--latency-shape: foo not in' bench transfer --latency-shape foo
expect '--model-shape: foo not in' bench ttft --model-shape foo
expect '--engine: foo not in' bench ttft --engine foo
expect '--requests: 0 is not above 0' bench load -n 0
expect '--kv-mode: foo not in' sim --matrix --kv-mode foo
expect '--kv-mode applies to --matrix and --scenario only' sim --kv-mode read --seeds 1..2
expect '--stream-chunks applies to --matrix and --scenario only' sim --stream-chunks on
expect '--jobs: -1 is below 0' sim --jobs -1
expect "kvrelay: 'serv' is not a command; the commands are bench, sim, serve" serv --port 0
expect "kvrelay bench: 'lod' is not a command; the commands are core, load" bench lod

echo "bad_flags: $checked command lines, $failed not refused as they should be"
[ "$failed" -eq 0 ]
