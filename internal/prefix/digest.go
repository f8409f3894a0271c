package prefix

import (
	"crypto/sha256"
	"encoding/hex"

	"go4.org/netipx"
)

// Digest names the addresses of one family of s (is4: IPv4, else IPv6):
// "sha256-" and the hex SHA-256 of its maximal ranges, each as its first
// and last address in 16 bytes. Two sets have the same digest for a
// family exactly when they hold the same addresses of it, however they
// were built. A nil s is empty.
func Digest(s *netipx.IPSet, is4 bool) string {
	h := sha256.New()
	var buf [32]byte
	for _, r := range rangesOf(s) {
		if r.From().Is4() != is4 {
			continue
		}
		lo, hi := r.From().As16(), r.To().As16()
		copy(buf[:16], lo[:])
		copy(buf[16:], hi[:])
		h.Write(buf[:])
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}
