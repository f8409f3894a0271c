# ipfence — build, test, demo. `make test` is what CI runs (.ci/run).
GO ?= go
BIN := bin/ipfence
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.6.1

.PHONY: build deps test unit lint demo bench package clean

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/ipfence

# System packages (nftables, ipset, iptables, iproute2, iprange) and Go modules.
deps:
	./scripts/install-deps.sh
	$(GO) mod download

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# The pure tier: no root, no kernel, no network namespace (every kernel
# test skips under -short: netnstest.Kernel). Passes as any user.
unit:
	$(GO) test -short -count=1 ./...
	$(GO) -C third_party/nftables test -short -count=1 .

# Everything: lint, pure tests, kernel tests (in throw-away network namespaces; root).
test: deps lint
	$(GO) test -count=1 -timeout 14m ./...
	$(GO) -C third_party/nftables test -count=1 .

demo: deps build
	./$(BIN) demo

bench: deps build
	./scripts/bench.sh

# .deb and .rpm in dist/packages (binary, systemd units, sample policy,
# fail2ban action, man pages, shell completions).
package: deps
	./scripts/package.sh --out dist/packages

clean:
	rm -rf bin dist/packages
