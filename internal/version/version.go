// Package version says which ipfence this is.
package version

import "runtime/debug"

// Version is set at link time by make build and make package
// (-ldflags "-X github.com/ipfence/ipfence/internal/version.Version=...").
var Version string

// String is Version when set, else the module version the binary was
// built from ("(devel)" for a build from a work tree; "dev" without build
// info).
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}
