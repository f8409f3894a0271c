#!/usr/bin/env bash
# Times `ipfence aggregate` against FireHOL's `iprange` on the same IPv4
# lists, after checking that both print the same thing:
#   country  the 334k "first-last" ranges of data/geo/country-ipv4.csv.gz
#   1m       a synthetic 1M-line block list (addresses, prefixes with and
#            without host bits, dotted netmasks, ranges, comments)
# The two commands run alternately (ABBA order), RUNS times each, so that
# load from anything else on the machine hits both alike; it prints the
# median wall-clock time, CPU time (user+sys) and peak RSS of each, and
# the ratio. With hyperfine installed and HYPERFINE=1 it also runs hyperfine
# (which does not interleave) for its own statistics.
#
# Usage: scripts/bench-aggregate.sh [country|1m]...   (default: both)
# Env:   RUNS (default 15), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-15}
inputs=("$@")
[ ${#inputs[@]} -gt 0 ] || inputs=(country 1m)

command -v iprange >/dev/null || { echo "bench-aggregate: iprange not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench-aggregate: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }

work=$(mktemp -d)
if [ "${KEEP:-}" = 1 ]; then echo "work directory: $work" >&2; else trap 'rm -rf "$work"' EXIT; fi

echo "building ipfence..." >&2
CGO_ENABLED=0 go build -o "$work/ipfence" ./cmd/ipfence

make_input() {
  case $1 in
  country)
    zcat data/geo/country-ipv4.csv.gz | awk -F, '{ print $1 "-" $2 }' ;;
  1m)
    awk -v n=1000000 -v seed=1 '
      function ip(x) { return int(x / 16777216) "." int(x / 65536) % 256 "." int(x / 256) % 256 "." x % 256 }
      BEGIN {
        srand(seed)
        for (i = 0; i < n; i++) {
          a = int(rand() * 4294967296)
          if (rand() < 0.25) a = 167772160 + int(rand() * 1048576)   # 10.0.0.0/12: overlaps
          k = rand() * 100
          if (k < 60) print ip(a)
          else if (k < 80) print ip(a) "/" (32 - int(rand() * (1 + int(rand() * 17))))
          else if (k < 83) { b = 32 - int(rand() * (1 + int(rand() * 17))); print ip(a) "/" ip(4294967296 - 2 ^ (32 - b)) }
          else if (k < 95) { l = a + int(rand() * 2 ^ (1 + int(rand() * 14))); if (l > 4294967295) l = 4294967295
                             print ip(a) (rand() < 0.33 ? " - " : "-") ip(l) }
          else if (k < 98) print ip(a) " # comment " i
          else print "# a comment line"
        }
      }' ;;
  *)
    echo "bench-aggregate: unknown input $1 (country, 1m)" >&2; exit 2 ;;
  esac
}

# run LABEL CMD...: one timed run, output to /dev/null; appends
# "wall_ms cpu_ms rss_kb" to $work/LABEL.times.
run() {
  local label=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  /usr/bin/time -f '%U %S %M' -o "$work/time.out" "$@" >/dev/null
  t1=$(date +%s%N)
  read -r user sys rss <"$work/time.out"
  echo "$(( (t1 - t0) / 1000000 )) $(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%d", (u + s) * 1000 }') $rss" >>"$work/$label.times"
}

median() { # column number; reads numbers on stdin
  awk -v c="$1" '{ print $c }' | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

printf '%-8s %8s %-9s %10s %10s %9s\n' input lines tool wall_ms cpu_ms rss_MB
for in in "${inputs[@]}"; do
  f=$work/$in.txt
  make_input "$in" >"$f"
  lines=$(wc -l <"$f")
  ours=("$work/ipfence" aggregate "$f")
  theirs=(iprange --print-suffix-ips /32 "$f")

  # Same output, or the timing means nothing.
  "${ours[@]}" >"$work/ours.out"
  "${theirs[@]}" >"$work/theirs.out"
  if ! cmp -s "$work/ours.out" "$work/theirs.out"; then
    echo "bench-aggregate: $in: ipfence and iprange outputs differ:" >&2
    diff "$work/ours.out" "$work/theirs.out" | head >&2
    exit 1
  fi

  rm -f "$work/ours.times" "$work/iprange.times"
  run ours "${ours[@]}"; run iprange "${theirs[@]}" # warm-up, discarded
  rm -f "$work/ours.times" "$work/iprange.times"
  for ((i = 0; i < RUNS; i++)); do
    if ((i % 2 == 0)); then
      run ours "${ours[@]}"; run iprange "${theirs[@]}"
    else
      run iprange "${theirs[@]}"; run ours "${ours[@]}"
    fi
  done
  for tool in ours iprange; do
    name=ipfence; [ "$tool" = iprange ] && name=iprange
    printf '%-8s %8d %-9s %10d %10d %9d\n' "$in" "$lines" "$name" \
      "$(median 1 <"$work/$tool.times")" "$(median 2 <"$work/$tool.times")" "$(( $(median 3 <"$work/$tool.times") / 1024 ))"
  done
  awk -v a="$(median 1 <"$work/ours.times")" -v b="$(median 1 <"$work/iprange.times")" \
    -v c="$(median 2 <"$work/ours.times")" -v d="$(median 2 <"$work/iprange.times")" \
    'BEGIN { printf "%-8s %8s %-9s %9.2fx %9.2fx   (iprange / ipfence, >1: ipfence faster; %d output lines)\n", "", "", "speedup", b / a, d / c, '"$(wc -l <"$work/ours.out")"' }'

  if [ "${HYPERFINE:-}" = 1 ] && command -v hyperfine >/dev/null; then
    hyperfine -N --warmup 2 --runs "$RUNS" --output=null \
      -n ipfence "${ours[*]}" -n iprange "${theirs[*]}" >&2
  fi
done
echo "($RUNS interleaved runs each, medians; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
