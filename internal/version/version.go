// Package version says which ipfence this is.
package version

import "runtime/debug"

// String is the module version the binary was built from ("(devel)" for a
// build from a work tree, "dev" when the binary carries no build info).
func String() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}
