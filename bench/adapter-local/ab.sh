#!/bin/sh
# Two builds of the local-provider bench (or one build against governor) taking turns in
# short loops, for changes smaller than this machine's drift over minutes:
#
#   bench/adapter-local/ab.sh A B [profile] [rounds] [secs]
#
# A and B are bench executables (cargo bench -p adapter-local --bench local --no-run prints
# the path; copy it aside before rebuilding). profile is ADAPTER_LOCAL_BENCH_PROFILE (hot,
# many, hot,2, ...; B may be the same executable with ",governor" appended via B_PROFILE).
# Prints each round's decisions/s of both and B/A, then the median of the ratios.
set -eu
A=$1 B=$2 P=${3:-hot} N=${4:-10} S=${5:-2}
BP=${B_PROFILE:-$P}
ratios=""
i=0
while [ "$i" -lt "$N" ]; do
  a=$(ADAPTER_LOCAL_BENCH_SECS=$S ADAPTER_LOCAL_BENCH_PROFILE=$P "$A" | awk '{print $(NF-1)}')
  b=$(ADAPTER_LOCAL_BENCH_SECS=$S ADAPTER_LOCAL_BENCH_PROFILE=$BP "$B" | awk '{print $(NF-1)}')
  r=$(python3 -c "print(f'{$b/$a:.3f}')")
  echo "round $i: A $a  B $b  B/A $r"
  ratios="$ratios $r"
  i=$((i + 1))
done
python3 -c "import statistics,sys; v=sorted(map(float,sys.argv[1:])); print(f'median B/A {statistics.median(v):.3f} (min {v[0]:.3f}, max {v[-1]:.3f}, {len(v)} rounds)')" $ratios
