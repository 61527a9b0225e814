# Sourced by cluster-compare.sh, replica-ack.sh, deny-cache.sh, deny-cache-edges.sh and batch.sh (not
# run): private daemonized redis-server processes in a temporary directory, all stopped when
# the script exits.
# Sets DIR; `start_redis PORT [ARGS...]` starts one (loopback, no persistence) and waits for
# its PONG; `program_calls PORT` prints the EVALSHA and EVAL calls it has run (INFO
# commandstats, since start or CONFIG RESETSTAT).
DIR=$(mktemp -d)
cleanup() {
  for f in "$DIR"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 0.2; rm -rf "$DIR"
}
trap cleanup EXIT
start_redis() { # port [args...]
  p=$1; shift
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
    --repl-diskless-sync-delay 0 --logfile "$DIR/$p.log" --pidfile "$DIR/$p.pid" --daemonize yes "$@"
  i=0; until redis-cli -p "$p" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 200 ] && exit 1; sleep 0.05; done
}
program_calls() { # port
  redis-cli -p "$1" INFO commandstats | tr -d '\r' | awk -F'[=,:]' \
    '/^cmdstat_eval(sha)?:/ { n += $3 } END { print n + 0 }'
}
