#!/bin/sh
# exit_with_parent.sh KVRELAY LOGS — a cluster command killed with SIGKILL
# (no chance to stop its children) leaves no engine or router behind: each
# was started with `kvrelay --exit-with-parent` and gets SIGTERM from the
# kernel when its parent goes.
set -u
kvrelay=$1
logs=$2
rm -rf "$logs"
"$kvrelay" demo -n 1000000 -c 4 --logs "$logs" > "$logs.out" 2>&1 &
demo=$!
children() { pgrep -P "$demo" | tr '\n' ' '; }
i=0
while [ "$(children | wc -w)" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
kids=$(children)
if [ "$(echo $kids | wc -w)" -lt 3 ]; then
  echo "FAIL: the demo started $(echo $kids | wc -w) of its 3 children in 30 s"
  kill -9 "$demo"; cat "$logs.out"; exit 1
fi
sleep 1   # under load
kill -9 "$demo"
echo "killed the demo ($demo) with SIGKILL; its children: $kids"
i=0
while [ $i -lt 300 ]; do
  left=""
  for k in $kids; do kill -0 "$k" 2>/dev/null && left="$left $k"; done
  if [ -z "$left" ]; then echo "PASS: every child exited within $((i / 10)).$((i % 10)) s"; exit 0; fi
  sleep 0.1; i=$((i + 1))
done
echo "FAIL: children still running 30 s after their parent died:$left"
kill -9 $left 2>/dev/null
exit 1
