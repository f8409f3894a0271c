#!/usr/bin/env bash
# Installs the system packages ipfence's tests, demo and benchmarks need.
# Idempotent: does nothing when everything is present. Needs root for apt.
#
# fail2ban and crowdsec are installed for the integration tests, which run
# their own instances (own configuration, sockets and ports); no service
# is started here (policy-rc.d), and crowdsec is kept from registering with
# its Central API (the tests need none, and CI has no route to it).
set -euo pipefail
need=()
for pair in nft:nftables ipset:ipset iptables:iptables ip:iproute2 iprange:iprange jq:jq /usr/bin/time:time \
  fail2ban-server:fail2ban cscli:crowdsec rpmbuild:rpm; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  # A non-empty credentials file tells crowdsec's postinst not to register
  # with the Central API (see its README.Debian).
  if [ ! -s /etc/crowdsec/online_api_credentials.yaml ]; then
    mkdir -p /etc/crowdsec
    echo '# ipfence tests: no Central API registration' >/etc/crowdsec/online_api_credentials.yaml
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
