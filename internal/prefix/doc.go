// Package prefix reads, aggregates and writes sets of IP addresses of both
// families: the "prefix set" stage of ipfence's data path
// (source → prefix set → plan → backend).
//
// Everything here is pure and deterministic. The currency is *Set, an
// immutable set packed without pointers (8 bytes an IPv4 range), which
// converts to and from netipx's IPSet for code written against it.
// ParseLine and Read turn list files into ranges; Builder
// (or ReadSet) makes a set of millions of them, several times faster than
// netipx.IPSetBuilder; Union, Subtract, Intersect, Family, Complement,
// Count and NumAddrs compute on sets, in one pass over their ranges; and
// WriteCIDRs, WriteRanges and WriteJSON print a set's minimal exact cover,
// for IPv4 exactly as FireHOL's iprange does.
//
// # Input syntax
//
// One entry per line, in any mix of families:
//
//	192.0.2.7                    one address
//	192.0.2.0/24                 a CIDR prefix
//	192.0.2.0/255.255.255.0      an IPv4 prefix with a dotted netmask (contiguous)
//	192.0.2.10-192.0.2.20        an inclusive range, spaces around '-' allowed
//	192.0.2.0/24 - 192.0.4.0/24  a range of prefixes: first address of the
//	                             left one to last address of the right one
//	2001:db8::/32                and the same for IPv6
//	2001:db8::1 - 2001:db8::9
//
// Text after '#' or ';' is a comment, wherever it starts; blank lines, a
// UTF-8 byte order mark and CR line ends are ignored. This reads FireHOL
// netsets and iprange input. A prefix with host bits set (192.0.2.7/24)
// stands for its whole network (192.0.2.0/24), as in iprange.
//
// Rejected, with a *ParseError: anything that is not an address, prefix or
// range of the same family in ascending order; hostnames (nothing is
// resolved); IPv6 zones (fe80::1%eth0); IPv4 octets with leading zeros
// (010.0.0.1, which iprange reads as octal 8.0.0.1 and others as decimal
// 10.0.0.1) and the short or integer forms inet_aton accepts (10.1,
// 167772161); netmasks for IPv6 and non-contiguous IPv4 netmasks.
// IPv4-mapped IPv6 addresses (::ffff:192.0.2.7) are IPv6 addresses here,
// as in netip.
package prefix
