#!/bin/bash
# A/B of the traced ioctl's cost in the kernel: two `keling` builds, interleaved,
# each under `keling run` while `keling-workload rmctl` makes RM_CONTROLs on a
# plain file the agent takes for nvidiactl; per round, the calls' time and the
# mean run time of sys_enter_ioctl and sys_exit_ioctl from kernel.bpf_stats.
#
#   sudo xtask/scripts/ab-ioctl.sh KELING_A KELING_B [ROUNDS] [CALLS]
#
# Build each side with `cargo xtask build --release` and copy target/release/keling
# away. Needs root, bpftool and python3; restores kernel.bpf_stats_enabled.
set -eu
[ $# -ge 2 ] || { sed -n 2,10p "$0"; exit 2; }
A=$1 B=$2 ROUNDS=${3:-6} CALLS=${4:-900000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WL=$ROOT/target/release/keling-workload
command -v bpftool >/dev/null || { echo "needs bpftool (apt-get install bpftool)"; exit 1; }
[ -x "$WL" ] || { echo "needs $WL: cargo xtask build --release"; exit 1; }
DIR=$(mktemp -d)
: > "$DIR/nvidiactl"
WAS=$(sysctl -n kernel.bpf_stats_enabled)
AGENT=
cleanup() {
  [ -n "$AGENT" ] && kill -TERM "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
  sysctl -q kernel.bpf_stats_enabled="$WAS"
  rm -rf "$DIR"
}
trap cleanup EXIT
sysctl -q kernel.bpf_stats_enabled=1
for round in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$A; [ $side = B ] && bin=$B
    "$bin" run --status-interval 0 --metrics-addr off --dev-dir "$DIR" --lock "$DIR/lock" \
      --socket "$DIR/sock" > "$DIR/agent.log" 2>&1 &
    AGENT=$!
    for _ in $(seq 200); do grep -q "ready" "$DIR/agent.log" && break; sleep 0.05; done
    grep -q "ready" "$DIR/agent.log" || { cat "$DIR/agent.log"; exit 1; }
    ns=$("$WL" rmctl "$DIR" "$CALLS")
    stats=$(bpftool -j prog show)
    AGENT_PID=$AGENT
    kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=
    echo "$stats" | python3 -c "
import json, sys
ours = lambda p: all(x.get('pid') == $AGENT_PID for x in p.get('pids', [{'pid': $AGENT_PID}]))
d = {p['name']: p for p in json.load(sys.stdin) if p.get('name') in ('sys_enter_ioctl', 'sys_exit_ioctl') and ours(p)}
run = lambda n: d[n]['run_time_ns'] / max(d[n]['run_cnt'], 1) if n in d else float('nan')
print('round $round $side: call $ns ns; sys_enter_ioctl %.0f ns, sys_exit_ioctl %.0f ns a run' % (run('sys_enter_ioctl'), run('sys_exit_ioctl')))"
  done
done
