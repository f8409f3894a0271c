module github.com/google/nftables

go 1.23.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/mdlayher/netlink v1.8.1-0.20251028132421-dcc6cab9a6eb
	github.com/vishvananda/netlink v1.3.0
	github.com/vishvananda/netns v0.0.4
	golang.org/x/sys v0.35.0
)

require (
	github.com/mdlayher/socket v0.5.1 // indirect
	golang.org/x/net v0.43.0 // indirect
	golang.org/x/sync v0.6.0 // indirect
)
