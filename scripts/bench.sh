#!/usr/bin/env bash
# Reproduces the figures in docs/benchmarks.md, in throw-away network
# namespaces only (never the host's firewall):
#   apply     compile and load time, elements, ipfence's peak RSS and the
#             kernel memory the table takes, for real block lists of ~100k
#             and ~200k prefixes (everything outside Europe: IPv4, then
#             IPv4+IPv6) and a synthetic 400k-entry threat feed
#   perpacket `ipfence demo`: per-packet cost of the compiled layout against
#             a plain nft interval set, legitimate and random sources,
#             IPv4 and IPv6, medians of interleaved rounds
#   aggregate scripts/bench-aggregate.sh: ipfence aggregate vs iprange
#
# Usage: scripts/bench.sh [apply|perpacket|aggregate]...   (default: all)
# Env:   RUNS (apply repetitions, default 5), ROUNDS (default 8),
#        PACKETS (default 300000).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench: needs root (it creates network namespaces)" >&2; exit 1; }
RUNS=${RUNS:-5}
ROUNDS=${ROUNDS:-8}
PACKETS=${PACKETS:-300000}
what=("$@")
[ ${#what[@]} -gt 0 ] || what=(apply perpacket aggregate)

work=$(mktemp -d)
ns=ipf-bench-$$
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT INT TERM
CGO_ENABLED=0 go build -o "$work/ipfence" ./cmd/ipfence
ipf="$work/ipfence"
EU=AD,AL,AT,AX,BA,BE,BG,BY,CH,CY,CZ,DE,DK,EE,ES,FI,FO,FR,GB,GG,GI,GR,HR,HU,IE,IM,IS,IT,JE,LI,LT,LU,LV,MC,MD,ME,MK,MT,NL,NO,PL,PT,RO,RS,RU,SE,SI,SK,SM,UA,VA,XK

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
slab_kb() { awk '/^Slab:/ {print $2}' /proc/meminfo; }

bench_apply() {
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  "$ipf" geo --countries "$EU" --invert | grep -v : > "$work/out4.txt"
  "$ipf" geo --countries "$EU" --invert > "$work/out46.txt"
  # A threat-feed-like list: 300k single addresses and 100k /24s, random.
  awk 'BEGIN { srand(4); for (i = 0; i < 400000; i++) {
         a = int(rand()*223)+1; b = int(rand()*256); c = int(rand()*256); d = int(rand()*256)
         if (i % 4 == 0) print a "." b "." c ".0/24"; else print a "." b "." c "." d } }' > "$work/feed400k.txt"
  echo "| input | prefixes | elements | compile (ms) | load (ms) | ipfence peak RSS (MiB) | kernel slab (MiB) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for f in out4 out46 feed400k; do
    cat > "$work/$f.yaml" <<EOF
sources: {feed: {format: list, paths: [$f.txt]}}
rules: [{name: feed, action: drop, match: {source: feed}}]
EOF
    local loads=() compiles=() rss=() slab=()
    for _ in $(seq "$RUNS"); do
      "$ipf" flush --netns "$ns" --state "$work/state" >/dev/null
      sync; echo 2 > /proc/sys/vm/drop_caches
      s0=$(slab_kb)
      /usr/bin/time -f %M -o "$work/rss" "$ipf" apply --policy "$work/$f.yaml" --netns "$ns" --state "$work/state" --json > "$work/apply.json"
      s1=$(slab_kb)
      loads+=("$(jq .load_ms "$work/apply.json")"); compiles+=("$(jq .compile_ms "$work/apply.json")")
      rss+=("$(cat "$work/rss")"); slab+=("$((s1 - s0))")
    done
    prefixes=$("$ipf" aggregate --count --json "$work/$f.txt" | jq '.ipv4.prefixes + .ipv6.prefixes')
    printf '| %s | %s | %s | %s | %s | %.0f | %.0f |\n' "$f" "$prefixes" "$(jq .nft_elements "$work/apply.json")" \
      "$(printf '%s\n' "${compiles[@]}" | median)" "$(printf '%s\n' "${loads[@]}" | median)" \
      "$(printf '%s\n' "${rss[@]}" | median | awk '{print $1/1024}')" "$(printf '%s\n' "${slab[@]}" | median | awk '{print $1/1024}')"
  done
  "$ipf" flush --netns "$ns" --state "$work/state" >/dev/null
  ip netns del "$ns"
}

for w in "${what[@]}"; do
  case $w in
  apply) echo "## apply (median of $RUNS)"; bench_apply ;;
  perpacket) echo "## per-packet"; "$ipf" demo --rounds "$ROUNDS" --packets "$PACKETS" ;;
  aggregate) echo "## aggregate"; ./scripts/bench-aggregate.sh ;;
  *) echo "bench: unknown part $w (apply, perpacket, aggregate)" >&2; exit 2 ;;
  esac
done
