# Shared by run.sh and callgrind.sh (sourced, not run): the private redis-server, the app's
# configuration for each mode, and starting and stopping the app.
#   off     rate limiting disabled: the demo route alone
#   local   the middleware with the local provider
#   redis   the middleware with the redis provider (also serves the sidecar /v1/evaluate)
# Every limited mode uses a token bucket that admits everything, so the figures are the cost of
# evaluating, not of answering 429. Expects BIN, HPORT, RPORT and TMP to be set.
SECRET="bench-subject-secret-of-at-least-32-bytes"
APID=

start_redis() {
  redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
  RPID=$!
  sleep 0.5
}

policy='[rate_limit.policies.api]
algorithm = "token_bucket"
capacity = 1000000000
refill_amount = 1000000000
refill_interval = "1s"'
routes='[[routes]]
path_prefix = "/api"
policy = "api"
subject = "header:x-api-key"'

write_config() { # $1 = mode
  case $1 in
    off) printf '[http]\nbind = "127.0.0.1:%s"\n\n[[routes]]\npath_prefix = "/api"\nsubject = "header:x-api-key"\n' "$HPORT" ;;
    local) printf '[http]\nbind = "127.0.0.1:%s"\n\n[rate_limit]\nenabled = true\nprovider = "local"\ndefault_policy = "api"\n\n%s\n\n%s\n' "$HPORT" "$policy" "$routes" ;;
    redis) printf '[http]\nbind = "127.0.0.1:%s"\n\n[rate_limit]\nenabled = true\nprovider = "redis"\ndefault_policy = "api"\nsubject_secret = "%s"\n\n[rate_limit.redis]\nrole = "coordination"\nurl = "redis://127.0.0.1:%s/0"\ncommand_timeout = "1s"\n\n%s\n\n%s\n' "$HPORT" "$SECRET" "$RPORT" "$policy" "$routes" ;;
  esac > "$TMP/$1.toml"
}

start() { # $1 = mode, then an optional command prefix (e.g. valgrind ...)
  mode=$1; shift
  write_config "$mode"
  RUST_LOG=warn "$@" "$BIN" --config "$TMP/$mode.toml" 2>"$TMP/app.log" &
  APID=$!
  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$HPORT/healthz" >/dev/null && return; sleep 0.1; done
  echo "app did not start"; cat "$TMP/app.log"; exit 1
}
stop() { kill -TERM "$APID"; wait "$APID" || true; APID=; }
