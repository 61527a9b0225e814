#!/usr/bin/env bash
# What each Redis program costs the server next to its floor: a script with the same
# redis.calls and reply shape and no decision around them (floors/), given the same ARGV.
# Both run on a private redis-server, alternating, in one run; the figure is Redis's own
# usec_per_call of EVALSHA (INFO commandstats after CONFIG RESETSTAT), so the load
# generator's cost is not in it. Every run starts from an empty database (FLUSHALL) and
# calls on random keys of a RANGE-key space, so most calls allow (GET finds nothing, SET
# writes), the program's dearest path.
#
# The load is drive.py, not redis-benchmark: the programs take their arguments packed in
# one binary string with NUL bytes, which redis-benchmark cannot send (its arguments are C
# strings). A Python client is slower than redis-benchmark; the figure, measured by Redis
# itself, does not include it. drive.py fails the run on any error reply or on a decision
# other than ALLOWED or DENIED.
#
# The floors of the rate programs and the multi program keep an existing key's expiry
# (floors/single-keep.lua, multi-3.lua) as the programs do while a key's deadline stays; the
# charge's floor sets it (settle-1.lua).
#
# Prints one line per program and round, then per program the median over rounds of
# program/floor, and for the multi program (three token-bucket members) its cost against
# three single token-bucket calls (goals: <= 1.25x the floor; multi <= 0.6x three singles).
# `charge` is the settlement program charging one token-bucket member after the work.
#
# BASE=<git revision> also runs each program as that revision has it, in the same rounds,
# and prints program/base (a change's effect, side by side). ONLY="fixed-window multi"
# measures just those (names as in the table; the multi line needs token-bucket too).
#
#   bench/lua-programs/floor.sh    # N=200000 ROUNDS=3 CLIENTS=16 PIPELINE=4 RANGE=1000000
#   ROUNDS=5 N=400000 bench/lua-programs/floor.sh
#   BASE=HEAD~1 ONLY=fixed-window RANGE=20000 bench/lua-programs/floor.sh
set -euo pipefail
# A failed drive.py run inside $(measure ...) stops the script.
shopt -s inherit_errexit
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
N=${N:-200000}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-16}
PIPELINE=${PIPELINE:-4}
RANGE=${RANGE:-1000000}
PORT=${PORT:-7391}
# shellcheck source=../rl-bench/redis-servers.sh
. "$root/bench/rl-bench/redis-servers.sh"
start_redis "$PORT"
cli() { redis-cli -p "$PORT" "$@"; }
lua="$root/crates/adapter-redis/lua"

# One policy per algorithm, 100 per minute, allowing at cost 1 (docs/lua-programs.md), as
# drive.py packs it (struct format=values): cost, revision, max_clock_regression_ms,
# cleanup_grace_ms (2 s and 60 s, the defaults, which cap a bucket's expiry quantum), then the
# parameters.
declare -A args=(
  [fixed-window]="<I7I4I5I5I7I5=1,1,2000,60000,100,60000"
  [sliding-counter]="<I7I4I5I5I5I5=1,1,2000,60000,100,60000"
  [token-bucket]="<I7I4I5I5I7I5I7=1,1,2000,60000,100,600,1"
  [gcra]="<I7I4I5I5I7I5I7=1,1,2000,60000,100,600,1"
  [sliding-log]="<I7I4I5I5I2I5=1,1,2000,60000,100,60000"
)
programs=(fixed-window sliding-counter token-bucket gcra sliding-log)
tb=${args[token-bucket]}
# Three token-bucket members (algorithm 3), no evaluation id: the header (n, replay window),
# then per member its algorithm code and packed argument.
multi_args=("<I1I4=3,0" 3 "$tb" 3 "$tb" 3 "$tb")
# The settlement program charging one token-bucket member after the work (operation 0): a
# settlement of 1 against a hold of nothing, the token bucket's arguments then the hold
# (estimate 0, at 0).
charge_args=("<I1I1=1,0" settle 3 "<I7I4I5I5I7I5I7I7I6=1,1,2000,60000,100,600,1,0,0")

single_floor=$(cli SCRIPT LOAD "$(cat "$here/floors/single.lua")")
multi_floor=$(cli SCRIPT LOAD "$(cat "$here/floors/multi-3.lua")")
declare -A sha
for p in "${programs[@]}"; do
  sha[$p]=$(cli SCRIPT LOAD "$(cat "$lua/rate-$p-v2.lua")")
  sha[$p-floor]=$single_floor
done
# The fixed window, sliding counter, token bucket and GCRA keep an existing key's expiry
# while its deadline stays, so their floors do.
keep_floor=$(cli SCRIPT LOAD "$(cat "$here/floors/single-keep.lua")")
for p in fixed-window sliding-counter token-bucket gcra sliding-log; do sha[$p-floor]=$keep_floor; done
sha[multi]=$(cli SCRIPT LOAD "$(cat "$lua/rate-multi-v2.lua")")
sha[multi-floor]=$multi_floor
sha[charge]=$(cli SCRIPT LOAD "$(cat "$lua/rate-settle-v1.lua")")
sha[charge-floor]=$(cli SCRIPT LOAD "$(cat "$here/floors/settle-1.lua")")
BASE=${BASE:-}
if [ -n "$BASE" ]; then
  base() { git -C "$root" show "$BASE:crates/adapter-redis/lua/$1"; }
  for p in "${programs[@]}"; do
    sha[$p-base]=$(cli SCRIPT LOAD "$(base "rate-$p-v2.lua")")
  done
  sha[multi-base]=$(cli SCRIPT LOAD "$(base rate-multi-v2.lua)")
  sha[charge-base]=$(cli SCRIPT LOAD "$(base rate-settle-v1.lua)")
fi
ONLY=${ONLY:-${programs[*]} multi charge}
read -r -a measured <<<"$ONLY"

# drive.py's arguments for a script: its sha, keys and ARGV.
call() {
  local p=${1%-floor}
  p=${p%-base}
  if [ "$p" = multi ]; then
    drive --sha "${sha[$1]}" --key 'rl:a:{__rand_int__}' --key 'rl:b:{__rand_int__}' \
      --key 'rl:c:{__rand_int__}' "${@:2}" -- "${multi_args[@]}"
  elif [ "$p" = charge ]; then
    drive --sha "${sha[$1]}" --key 'rl:{__rand_int__}' "${@:2}" -- "${charge_args[@]}"
  else
    drive --sha "${sha[$1]}" --key 'rl:{__rand_int__}' "${@:2}" -- "${args[$p]}"
  fi
}
drive() { python3 "$here/drive.py" --port "$PORT" "$@"; }
names=()
for p in "${measured[@]}"; do
  names+=("$p" "$p-floor")
  if [ -n "$BASE" ]; then names+=("$p-base"); fi
done

# Each script must answer ALLOWED on a fresh key: a program refusing its arguments
# (INVALID) would measure its cheapest path.
for name in "${names[@]}"; do
  status=$(call "$name" --check "check-$name")
  [ "$status" = ALLOWED ] || { echo "$name answers $status, not ALLOWED" >&2; exit 1; }
done

# usec_per_call of one drive.py run of a script, from an empty database.
measure() {
  cli FLUSHALL SYNC >/dev/null
  cli CONFIG RESETSTAT >/dev/null
  call "$1" -n "$N" -c "$CLIENTS" -P "$PIPELINE" -r "$RANGE" >/dev/null
  cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '/^cmdstat_evalsha:/ {
    for (i = 2; i < NF; i += 2) if ($i == "usec_per_call") print $(i + 1)
    for (i = 2; i < NF; i += 2) if ($i == "failed_calls" && $(i + 1) > 0) print "failed" > "/dev/stderr"
  }'
}

out="$DIR/figures"
echo "redis $(redis-server --version | awk '{sub("v=", "", $3); print $3}'); N=$N ROUNDS=$ROUNDS c=$CLIENTS P=$PIPELINE r=$RANGE"
printf '%-16s %5s %10s %10s %7s %10s\n' program round usec floor ratio base
for round in $(seq 1 "$ROUNDS"); do
  for p in "${measured[@]}"; do
    u=$(measure "$p")
    f=$(measure "$p-floor")
    b=-
    if [ -n "$BASE" ]; then b=$(measure "$p-base"); fi
    ratio=$(awk -v u="$u" -v f="$f" 'BEGIN { printf "%.2f", u / f }')
    printf '%-16s %5s %10s %10s %7s %10s\n' "$p" "$round" "$u" "$f" "$ratio" "$b"
    echo "$p $round $u $f $b" >>"$out"
  done
done

echo
echo "median over rounds:"
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for p in "${measured[@]}"; do
  r=$(awk -v p="$p" '$1 == p { printf "%.4f\n", $3 / $4 }' "$out" | median)
  printf '%-16s program/floor %.2f' "$p" "$r"
  if [ -n "$BASE" ]; then
    r=$(awk -v p="$p" '$1 == p { printf "%.4f\n", $3 / $5 }' "$out" | median)
    printf '  program/base %.2f' "$r"
  fi
  echo
done
# The multi program against three single token-bucket calls of the same round.
case " ${measured[*]} " in *" multi "*" token-bucket "* | *" token-bucket "*" multi "*)
  r=$(awk '$1 == "token-bucket" { tb[$2] = $3 } $1 == "multi" { m[$2] = $3 }
    END { for (k in m) printf "%.4f\n", m[k] / (3 * tb[k]) }' "$out" | median)
  printf '%-16s multi/(3 x token-bucket) %.2f\n' multi "$r"
  ;;
esac
