#!/usr/bin/env bash
# Installs the system packages ipfence's tests, demo and benchmarks need.
# Idempotent: does nothing when everything is present. Needs root for apt.
set -euo pipefail
need=()
for pair in nft:nftables ipset:ipset iptables:iptables ip:iproute2 iprange:iprange jq:jq /usr/bin/time:time; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
