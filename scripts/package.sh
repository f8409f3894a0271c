#!/usr/bin/env bash
# Builds ipfence's .deb and .rpm: the static binary, the systemd units
# (pointing at /usr/bin/ipfence), the sample policy and blocklist
# (/etc/ipfence, config files), the fail2ban action, man pages and bash,
# zsh and fish completions generated from the CLI, README and the data's
# attribution.
#
#   scripts/package.sh [--out DIR] [--version V] [--no-rpm]
#
# Needs go, dpkg-deb and (for the .rpm) rpmbuild. Nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist/packages
version=""
rpm=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --no-rpm) rpm=0; shift ;;
    *) echo "usage: $0 [--out DIR] [--version V] [--no-rpm]" >&2; exit 2 ;;
  esac
done
if [ -z "$version" ]; then
  base=$(cat VERSION)
  if git rev-parse --git-dir >/dev/null 2>&1; then
    version="$base+git$(date -u -d "@$(git log -1 --format=%ct)" +%Y%m%d).$(git rev-parse --short=8 HEAD)"
  else
    version=$base
  fi
fi
case $version in [0-9]*) ;; *) echo "version $version must start with a digit" >&2; exit 2 ;; esac

goarch=$(go env GOARCH)
case $goarch in
  amd64) debarch=amd64 rpmarch=x86_64 ;;
  arm64) debarch=arm64 rpmarch=aarch64 ;;
  *) echo "no package architecture for GOARCH=$goarch" >&2; exit 1 ;;
esac

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

# The tree both packages install.
CGO_ENABLED=0 go build -ldflags "-s -w -X github.com/ipfence/ipfence/internal/version.Version=$version" \
  -o "$root/usr/bin/ipfence" ./cmd/ipfence
"$root/usr/bin/ipfence" gendocs --out "$work/gen"
install -d "$root/usr/share/man/man1"
for m in "$work"/gen/man/*.1; do
  gzip -9n <"$m" >"$root/usr/share/man/man1/$(basename "$m").gz"
done
install -D -m 0644 "$work/gen/completion/ipfence.bash" "$root/usr/share/bash-completion/completions/ipfence"
install -D -m 0644 "$work/gen/completion/_ipfence" "$root/usr/share/zsh/vendor-completions/_ipfence"
install -D -m 0644 "$work/gen/completion/ipfence.fish" "$root/usr/share/fish/vendor_completions.d/ipfence.fish"
install -d "$root/lib/systemd/system"
for u in dist/systemd/*.service; do
  sed 's,/usr/local/bin/ipfence,/usr/bin/ipfence,g' "$u" >"$root/lib/systemd/system/$(basename "$u")"
done
install -D -m 0644 dist/ipfence/policy.yaml "$root/etc/ipfence/policy.yaml"
install -D -m 0644 dist/ipfence/blocklist.txt "$root/etc/ipfence/blocklist.txt"
install -d -m 0700 "$root/etc/ipfence/nats"
install -D -m 0644 dist/fail2ban/ipfence.conf "$root/etc/fail2ban/action.d/ipfence.conf"
install -D -m 0644 README.md "$root/usr/share/doc/ipfence/README.md"
install -D -m 0644 data/geo/LICENSE-NRO "$root/usr/share/doc/ipfence/LICENSE-NRO"
cat >"$root/usr/share/doc/ipfence/copyright" <<'EOF'
ipfence: https://github.com/ipfence/ipfence

The built-in country data comes from the Regional Internet Registries'
delegation files: (c) Number Resource Organization (nro.net), CC BY 4.0
(see LICENSE-NRO); the compilation (ip-location-db geo-whois-asn-country)
is CC0.
EOF
conffiles="/etc/ipfence/policy.yaml /etc/ipfence/blocklist.txt /etc/fail2ban/action.d/ipfence.conf"
summary="IP block and allow lists, bans and feeds compiled into nftables, ipset or XDP"
description="ipfence manages very large IP block and allow lists (threat feeds,
country data, bans; 10k to 1M prefixes, IPv4 and IPv6) and compiles them
into the cheapest per-packet kernel structure: nftables hash verdict maps,
ipset/iptables on older hosts, or XDP. Loads are atomic, bans take
microseconds; fail2ban and CrowdSec plug in. The services are installed
but not enabled: edit /etc/ipfence/policy.yaml first."

# Maintainer scripts: reload systemd's view of the units; never enable or
# start a firewall with a sample policy. DPKG_ROOT is set when installing
# into another root (dpkg --root).
scripts=$work/scripts
mkdir -p "$scripts"
cat >"$scripts/postinst" <<'EOF'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
EOF
cp "$scripts/postinst" "$scripts/postrm"
chmod 0755 "$scripts/postinst" "$scripts/postrm"

# .deb
deb=$work/deb
cp -a "$root" "$deb"
install -d "$deb/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$deb" | cut -f1)
cat >"$deb/DEBIAN/control" <<EOF
Package: ipfence
Version: $version
Architecture: $debarch
Maintainer: ipfence developers <dev@ipfence.invalid>
Installed-Size: $size
Section: net
Priority: optional
Recommends: nftables
Suggests: ipset, iptables, fail2ban, crowdsec
Homepage: https://github.com/ipfence/ipfence
Description: $summary
$(echo "$description" | sed 's/^/ /')
EOF
for f in $conffiles; do echo "$f"; done >"$deb/DEBIAN/conffiles"
cp "$scripts/postinst" "$scripts/postrm" "$deb/DEBIAN/"
debfile=$out/ipfence_${version}_${debarch}.deb
dpkg-deb --root-owner-group -Zgzip --build "$deb" "$debfile" >/dev/null
echo "$debfile"

# .rpm
if [ "$rpm" = 1 ]; then
  top=$work/rpm
  mkdir -p "$top"/{SPECS,RPMS,BUILD,BUILDROOT}
  rpmversion=${version//-/_}
  {
    cat <<EOF
Name: ipfence
Version: $rpmversion
Release: 1
Summary: $summary
License: see /usr/share/doc/ipfence/copyright
URL: https://github.com/ipfence/ipfence
Recommends: nftables
AutoReqProv: no

%description
$description

%install
cp -a $root/. %{buildroot}/

%post
$(sed '1,2d' "$scripts/postinst")

%postun
$(sed '1,2d' "$scripts/postrm")

%files
EOF
    echo "%dir /etc/ipfence"
    echo "%dir /usr/share/doc/ipfence"
    (cd "$root" && find . -type f -o -type l | sed 's,^\.,,' | sort) | while read -r f; do
      case " $conffiles " in
        *" $f "*) echo "%config(noreplace) $f" ;;
        *) echo "$f" ;;
      esac
    done
  } >"$top/SPECS/ipfence.spec"
  rpmbuild -bb --quiet --define "_topdir $top" --define "_build_id_links none" --define "__os_install_post %{nil}" \
    --target "$rpmarch" "$top/SPECS/ipfence.spec" >/dev/null
  rpmfile=$out/ipfence-${rpmversion}-1.${rpmarch}.rpm
  cp "$top/RPMS/$rpmarch/"*.rpm "$rpmfile"
  echo "$rpmfile"
fi
