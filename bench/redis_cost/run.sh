#!/usr/bin/env bash
# Instructions redis-server executes per decision (valgrind's callgrind, user space:
# syscalls are not counted), for tollgate's GCRA batch script (group commit: 50 decisions an
# EVALSHA, as batch.rs sends them), redis-cell's CL.THROTTLE and (a), one EVALSHA of
# INCR + PEXPIRE a decision: a measure of Redis's side that a busy machine does not move.
#
#   bench/redis_cost/run.sh                 # needs valgrind, redis-server, redis-cli, python3
#   REDIS_CELL=target/peers/redis-cell/target/release/libredis_cell.so bench/redis_cost/run.sh
#
# Workload: 10,000 decisions over 1,000 keys (seed 7), 100 per 60 s with a burst of 100 (the
# peers bench's W1 quota), the server's own clock; each figure is (a run with the workload
# − a run without it) ÷ 10,000. redis-cli sends one command at a time: the unbatched rows
# carry a command's whole handling each, the batch row a fiftieth of it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scripts=$here/../../src/store/redis/scripts
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$scripts"/floordiv.lua "$scripts"/single_now.lua "$scripts"/tat_single.lua "$scripts"/gcra_single.lua \
  "$scripts"/batch_main.lua > "$work/gcra_batch.lua"
python3 - "$work" <<'PY'
import random, sys
work = sys.argv[1]
random.seed(7)
n = 50
with open(f'{work}/gcra.txt', 'w') as f:
    for _ in range(200):
        keys = ' '.join(f'g:{random.randrange(1000)}' for _ in range(n))
        # ARGV: now ('' for TIME), mode, each decision's offset of its rule's 8 arguments,
        # then the rule: tag, L, W µs, B, T µs, cost, max delay, block (scripts/lib.lua).
        args = ' '.join(['""', 'c'] + [str(2 + n)] * n + ['gcra', '100', '60000000', '100', '600000', '1', '0', '0'])
        f.write(f'EVALSHA @SHA@ {n} {keys} {args}\n')
with open(f'{work}/a.txt', 'w') as f:
    for _ in range(10000):
        f.write(f'EVALSHA @SHA@ 1 a:{random.randrange(1000)} 60000\n')
with open(f'{work}/cell.txt', 'w') as f:
    for _ in range(10000):
        f.write(f'CL.THROTTLE c:{random.randrange(1000)} 99 100 60 1\n')
open(f'{work}/none.txt', 'w').close()
PY
trivial="local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n"
# instructions <commands> <script to load as SHA> [redis-server args...]
instructions() {
  local cmds=$1 script=$2; shift 2
  local port=$((20000 + RANDOM % 20000))
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.$port" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no "$@" > "$work/log.$port" 2>&1 &
  local pid=$!
  for _ in $(seq 1 150); do redis-cli -p "$port" ping > /dev/null 2>&1 && break; sleep 0.2; done
  local sha
  sha=$(redis-cli -p "$port" script load "$script" 2>/dev/null)
  sed "s/@SHA@/$sha/" "$cmds" | redis-cli -p "$port" > "$work/out.$port"
  if grep -q ERR "$work/out.$port"; then
    echo "redis answered an error: $(grep -m1 ERR "$work/out.$port")" >&2
    touch "$work/failed"
  fi
  # Its callgrind file is written when it exits: shut down, else stopped (SIGTERM).
  redis-cli -p "$port" shutdown nosave > /dev/null 2>&1 || kill "$pid" 2> /dev/null || true
  wait "$pid" || true
  grep -m1 '^summary:\|^totals:' "$work/cg.$port" | awk '{print $2}'
}
per() {
  if [ -e "$work/failed" ]; then echo "failed (see above)"; exit 1; fi
  echo $(( ($1 - $2) / 10000 ))
}
none=$(instructions "$work/none.txt" "$trivial")
echo "tollgate GCRA, batch script (50 a call): $(per "$(instructions "$work/gcra.txt" "$(cat "$work/gcra_batch.lua")")" "$none") instructions a decision"
echo "(a) EVALSHA INCR+PEXPIRE, one a call:    $(per "$(instructions "$work/a.txt" "$trivial")" "$none") instructions a decision"
cell=${REDIS_CELL:-target/peers/redis-cell/target/release/libredis_cell.so}
if [ -f "$cell" ]; then
  cell=$(cd "$(dirname "$cell")" && pwd)/$(basename "$cell")
  none_cell=$(instructions "$work/none.txt" "$trivial" --loadmodule "$cell")
  echo "redis-cell CL.THROTTLE, one a call:     $(per "$(instructions "$work/cell.txt" "$trivial" --loadmodule "$cell")" "$none_cell") instructions a decision"
else
  echo "redis-cell: skipped, no $cell (the peers bench builds it: cargo run --release -p tollgate-bench --example peers)"
fi
