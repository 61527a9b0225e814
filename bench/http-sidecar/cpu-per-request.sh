#!/bin/sh
# CPU time of the app per request, for runs on a shared machine where req/s is noisy:
#   cpu-per-request.sh PID URL [wrk args...]   (prints µs of app CPU per completed request)
PID=$1; URL=$2; shift 2
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
before=$(cpu)
out=$(wrk "$@" "$URL")
after=$(cpu)
reqs=$(echo "$out" | awk '/requests in/ {print $1}')
rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
echo "$out" | grep -q "Non-2xx" && echo "$out" | grep "Non-2xx"
awk -v b="$before" -v a="$after" -v r="$reqs" -v t="$tick" -v rps="$rps" -v p99="$p99" \
  'BEGIN { printf "req/s %s  p99 %s  app CPU per request %.1f us\n", rps, p99, (a - b) / t / r * 1e6 }'
