package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"

	"github.com/ipfence/ipfence/internal/netns"
)

// ApplyOptions tell Apply, ApplyUpdate and Flush where their table is,
// and whether it may lack ipfence's mark.
type ApplyOptions struct {
	// NetNS is the network namespace to load into: "" for the current
	// one, a name as `ip netns add` creates (opened at /run/netns/NAME),
	// or an absolute path to a namespace file such as /proc/PID/ns/net.
	NetNS string
	// Adopt takes an existing table of the name without ipfence's mark
	// (see Mark) as ipfence's: Apply replaces it (and so marks it),
	// Flush deletes it, ApplyUpdate changes it. Set it only when
	// ipfence's own record says it loaded that table there before it
	// marked its tables (statedir.Applied.Vouches); without it such a
	// table is refused (ErrNotOwned).
	Adopt bool
}

// ApplyResult says what Apply loaded and how long it took.
type ApplyResult struct {
	Table string
	// Sets counts named sets and maps; Elements their elements as the
	// Program has them (prefixes, not the interval endpoints sent).
	Sets     int
	Elements int
	Chains   int
	Rules    int
	// GenID is the ruleset generation the transaction was checked against.
	GenID uint32
	// Build is the time to validate the Program, open the namespace,
	// resolve interfaces, read the generation and encode the batch; Flush
	// the time to send it and have the kernel commit it.
	Build time.Duration
	Flush time.Duration
}

// ConcurrentChangeError is returned by Apply when the nftables ruleset of
// the namespace changed between reading its generation and committing the
// batch: the kernel refused the whole transaction and nothing changed.
// Applying again (the Program is still valid) is the usual remedy.
type ConcurrentChangeError struct {
	Table string
	// GenID is the generation Apply read before building its batch; Now
	// the generation it found after the kernel refused the batch (0 if
	// it could not be read).
	GenID, Now uint32
}

func (e *ConcurrentChangeError) Error() string {
	return fmt.Sprintf("loading table %s: the nftables ruleset changed while the batch was built (generation %d, now %d); nothing was loaded, apply again",
		e.Table, e.GenID, e.Now)
}

// testHookBeforeFlush, when set by a test, runs after the batch is built
// and before it is sent.
var testHookBeforeFlush func()

// Apply replaces the inet table p.Table in the target namespace with p, in
// one netlink transaction checked against the ruleset generation: the
// table is added (if absent), deleted and created again, with ipfence's
// mark (Mark), its chains, sets, elements and rules, and base chains are
// hooked in only when the transaction commits. An existing table without
// the mark is refused (ErrNotOwned, see ApplyOptions.Adopt); it is read
// after the generation, so that a table swapped in before the commit
// makes the transaction fail. If the kernel rejects any part nothing
// changes and the error says which message failed; if another process
// changed the ruleset meanwhile, the error is a *ConcurrentChangeError.
// An invalid Program fails Validate (ErrInvalidProgram) before the kernel
// is asked.
//
// ctx is checked before each step; a flush in progress is not interrupted
// (the kernel commits or rejects it as a whole either way).
func Apply(ctx context.Context, p *Program, opts ApplyOptions) (ApplyResult, error) {
	return apply(ctx, p, opts, true)
}

// apply is Apply; tests turn validate off to hand the kernel a batch it
// must reject.
func apply(ctx context.Context, p *Program, opts ApplyOptions, validate bool) (ApplyResult, error) {
	res := ApplyResult{Table: p.Table}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	start := time.Now()
	if validate {
		if err := p.Validate(); err != nil {
			return res, err
		}
	}
	c, closeConn, nsfd, err := dial(opts.NetNS)
	if err != nil {
		return res, fmt.Errorf("loading table %s: %w", p.Table, err)
	}
	defer closeConn()

	idx, err := ifindexes(iifNames(p), nsfd, opts.NetNS)
	if err != nil {
		return res, fmt.Errorf("loading table %s: %w", p.Table, err)
	}
	gen, err := c.GetGen()
	if err != nil {
		return res, fmt.Errorf("loading table %s: reading ruleset generation: %w", p.Table, err)
	}
	res.GenID = gen.ID
	if _, err := checkOwner(c, p.Table, opts); err != nil {
		return res, fmt.Errorf("loading table %s: %w", p.Table, err)
	}
	b := &batch{c: c, ifindex: idx, res: &res}
	if err := b.queue(p); err != nil {
		return res, fmt.Errorf("loading table %s: %w", p.Table, err)
	}
	res.Build = time.Since(start)

	if testHookBeforeFlush != nil {
		testHookBeforeFlush()
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	start = time.Now()
	err = c.FlushWithGenID(gen.ID)
	res.Flush = time.Since(start)
	switch {
	case errors.Is(err, unix.ERESTART):
		ce := &ConcurrentChangeError{Table: p.Table, GenID: gen.ID}
		if now, err := c.GetGen(); err == nil {
			ce.Now = now.ID
		}
		return res, ce
	case err != nil:
		return res, fmt.Errorf("loading table %s: kernel rejected the transaction, nothing was changed%s: %w",
			p.Table, kernelHint(err), err)
	}
	return res, nil
}

// kernelHint says in words what an errno from a rejected batch usually
// means for the objects Apply sends.
func kernelHint(err error) string {
	for _, h := range []struct {
		errno unix.Errno
		hint  string
	}{
		{unix.ENOENT, "a rule or element refers to a set or chain that does not exist"},
		{unix.EEXIST, "an object is defined twice, or an element conflicts with another"},
		{unix.EBUSY, "a set or chain to delete is still in use: a rule looks it up, or a rule or element jumps to it"},
		{unix.EMLINK, "a jump loop, or jumps nested deeper than the kernel allows"},
		{unix.ELOOP, "a jump loop"},
		{unix.ENFILE, "a set holds more elements than its declared size"},
		{unix.EOPNOTSUPP, "an expression or hook this kernel does not support here"},
		{unix.ENOMEM, "the kernel ran out of memory"},
		{unix.EPERM, "not permitted: CAP_NET_ADMIN is needed in the target namespace"},
	} {
		if errors.Is(err, h.errno) {
			return " (" + h.hint + ")"
		}
	}
	return ""
}

// Flush deletes the inet table named table from the target namespace (see
// ApplyOptions), leaving every other table alone. existed reports whether
// there was a table to delete; a missing table is not an error. A table
// without ipfence's mark is refused (ErrNotOwned, see ApplyOptions.Adopt)
// and stays. The deletion is one transaction checked against the
// generation the table was read at; if the ruleset changed in between,
// Flush reads it again (3 times at most).
func Flush(ctx context.Context, table string, opts ApplyOptions) (existed bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, closeConn, _, err := dial(opts.NetNS)
	if err != nil {
		return false, fmt.Errorf("deleting table %s: %w", table, err)
	}
	defer closeConn()
	for try := 1; ; try++ {
		existed, err = flushTable(c, table, opts)
		if !errors.Is(err, unix.ERESTART) || try == 3 {
			break
		}
	}
	if err != nil {
		return false, fmt.Errorf("deleting table %s: %w", table, err)
	}
	return existed, nil
}

// flushTable is one try of Flush.
func flushTable(c *nftables.Conn, table string, opts ApplyOptions) (existed bool, err error) {
	gen, err := c.GetGen()
	if err != nil {
		return false, fmt.Errorf("reading ruleset generation: %w", err)
	}
	if exists, err := checkOwner(c, table, opts); err != nil || !exists {
		return false, err
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	switch err := c.FlushWithGenID(gen.ID); {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// testDial, when set by a test, stands in for the kernel on every
// connection dial opens (nftables.WithTestDial): it sees each netlink
// request and returns the replies.
var testDial nltest.Func

// dial opens a lasting nftables connection in the namespace ns. The
// returned fd (-1 for the current namespace) stays valid until closeConn.
func dial(ns string) (c *nftables.Conn, closeConn func(), nsfd int, err error) {
	nsfd = -1
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if testDial != nil {
		opts = append(opts, nftables.WithTestDial(testDial))
	}
	var f *os.File
	if ns != "" {
		if f, err = netns.Open(ns); err != nil {
			return nil, nil, -1, err
		}
		nsfd = int(f.Fd())
		opts = append(opts, nftables.WithNetNSFd(nsfd))
	}
	c, err = nftables.New(opts...)
	if err != nil {
		if f != nil {
			f.Close()
		}
		return nil, nil, -1, fmt.Errorf("connecting to nftables: %w", err)
	}
	return c, func() {
		_ = c.CloseLasting()
		if f != nil {
			f.Close()
		}
	}, nsfd, nil
}

func iifNames(p *Program) []string {
	var names []string
	for _, c := range p.Chains {
		for _, r := range c.Rules {
			if r.Iif != "" && !slices.Contains(names, r.Iif) {
				names = append(names, r.Iif)
			}
		}
	}
	return names
}

// ifindexes resolves interface names to indexes in the namespace nsfd
// (-1: current) with RTM_GETLINK, as nft resolves `iif "lo"` where it runs.
func ifindexes(names []string, nsfd int, netns string) (map[string]uint32, error) {
	if len(names) == 0 {
		return nil, nil
	}
	cfg := &netlink.Config{}
	if nsfd >= 0 {
		cfg.NetNS = nsfd
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return nil, fmt.Errorf("resolving interfaces: %w", err)
	}
	defer c.Close()
	idx := make(map[string]uint32, len(names))
	for _, name := range names {
		attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.IFLA_IFNAME, Data: append([]byte(name), 0)},
		})
		if err != nil {
			return nil, fmt.Errorf("resolving interface %q: %w", name, err)
		}
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request},
			Data:   append(make([]byte, unix.SizeofIfInfomsg), attrs...),
		})
		if errors.Is(err, unix.ENODEV) {
			where := "the current network namespace"
			if netns != "" {
				where = "network namespace " + netns
			}
			return nil, fmt.Errorf("interface %q (iif) does not exist in %s", name, where)
		}
		if err != nil {
			return nil, fmt.Errorf("resolving interface %q: %w", name, err)
		}
		if len(msgs) == 0 || len(msgs[0].Data) < unix.SizeofIfInfomsg {
			return nil, fmt.Errorf("resolving interface %q: short RTM_NEWLINK reply", name)
		}
		// struct ifinfomsg: family, pad, type (u16), index (s32), ...
		idx[name] = binary.NativeEndian.Uint32(msgs[0].Data[4:8])
	}
	return idx, nil
}
