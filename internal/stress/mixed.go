package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go4.org/netipx"

	"github.com/ipfence/ipfence/internal/backend/nft"
	"github.com/ipfence/ipfence/internal/ban"
	"github.com/ipfence/ipfence/internal/daemon/api"
)

// model is what the workers banned: exact prefixes. Workers ban in
// ranges of their own, so the final state does not depend on timing.
type model struct {
	mu      sync.Mutex
	m       map[netip.Prefix]bool
	removed map[netip.Prefix]bool // unbanned, not banned again
}

func newModel() *model { return &model{m: map[netip.Prefix]bool{}, removed: map[netip.Prefix]bool{}} }

func (m *model) ban(p netip.Prefix) {
	m.mu.Lock()
	m.m[p.Masked()] = true
	delete(m.removed, p.Masked())
	m.mu.Unlock()
}

func (m *model) unban(p netip.Prefix) {
	m.mu.Lock()
	delete(m.m, p.Masked())
	m.removed[p.Masked()] = true
	m.mu.Unlock()
}

func (m *model) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}

// roles of the mixed run's workers, assigned in this order.
var roles = []string{"ban", "ban", "ban", "ban", "ban-prefix", "ban-prefix", "bulk", "count", "list", "metrics", "refresh", "status", "ban"}

// fullReadMax is the most addresses the end check reads back whole.
const fullReadMax = 200000

// mixed runs o.Workers workers for o.Duration, then checks the daemon
// against the model and the kernel against the daemon.
func mixed(ctx context.Context, cl *api.Client, d *daemonProc, dir, ns string, o Options, m *model) (*MixedResult, error) {
	res := &MixedResult{Workers: o.Workers, Ops: map[string]int{}}
	var mu sync.Mutex
	record := func(role string, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Ops[role]++
		if err != nil {
			if res.Errors++; res.FirstError == "" {
				res.FirstError = role + ": " + err.Error()
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range o.Workers {
		role := roles[w%len(roles)]
		r := rand.New(rand.NewPCG(uint64(w), 99))
		base := uint32(140+w) << 24 // 140.0.0.0/8 up: clear of protected and other workers' ranges
		wg.Go(func() {
			var mine []netip.Prefix
			for wctx.Err() == nil {
				var err error
				switch role {
				case "ban", "ban-prefix", "bulk":
					// ctx, not wctx: a change under way completes, so that
					// the record matches what the daemon did.
					mine, err = banWork(ctx, cl, role, r, base, mine, m)
				case "count":
					_, err = cl.Count(wctx)
				case "list":
					_, err = cl.List(wctx, api.ListOptions{Offset: r.IntN(1000), Limit: 100})
				case "metrics":
					err = scrape(wctx, "http://"+d.metrics+"/metrics")
				case "refresh":
					if err = writeFeed(dir, r.IntN(1000)); err == nil {
						_, err = cl.Reload(wctx)
					}
					sleep(wctx, 2*time.Second)
				case "status":
					if _, err = cl.Status(wctx); err == nil {
						_, err = cl.Explain(wctx, addr(base+uint32(r.IntN(1<<16))).String(), "tcp", 22)
					}
				}
				if wctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
					return // a call the end of the run interrupted is not an error
				}
				record(role, err)
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(t0).Seconds()

	// The daemon against the workers.
	var daemonBans []ban.Ban
	for off := 0; ; off += 100000 {
		l, err := cl.List(ctx, api.ListOptions{Offset: off, Limit: 100000})
		if err != nil {
			return nil, fmt.Errorf("listing bans: %w", err)
		}
		daemonBans = append(daemonBans, l.Bans...)
		if len(l.Bans) < 100000 {
			break
		}
	}
	res.BansAtEnd = len(daemonBans)
	set := ban.NewSet()
	m.mu.Lock()
	seen := map[netip.Prefix]bool{}
	for _, b := range daemonBans {
		set.Put(b)
		seen[b.Prefix] = true
		if !m.m[b.Prefix] {
			res.Phantom++
		}
	}
	for p := range m.m {
		if !seen[p] {
			res.Lost++
		}
	}
	m.mu.Unlock()

	// The kernel against the daemon: addresses compared as sorted lists
	// (set algebra on millions of ranges is too slow), prefixes as sets.
	t1 := time.Now()
	addrs, nets := set.Elements(time.Now())
	var want []netip.Addr
	for _, e := range addrs {
		want = append(want, e.Prefix.Addr())
	}
	if len(want) <= fullReadMax {
		rs, err := readSets(ctx, ns, nft.BanAddrs4, nft.BanAddrs6)
		if err != nil {
			return nil, err
		}
		res.KernelRanges += len(rs)
		got := make([]netip.Addr, len(rs))
		for i, r := range rs {
			got[i] = r.From()
		}
		slices.SortFunc(want, netip.Addr.Compare)
		slices.SortFunc(got, netip.Addr.Compare)
		lost, phantom := mergeDiff(want, got)
		res.Lost += lost
		res.Phantom += phantom
	} else {
		// Too big to dump (the kernel's set dump is quadratic): ask for
		// every address that must be there, and every single address
		// the workers unbanned, which must not.
		m.mu.Lock()
		var gone []netip.Addr
		for p := range m.removed {
			if p.IsSingleIP() {
				gone = append(gone, p.Addr())
			}
		}
		m.mu.Unlock()
		for _, probe := range []struct {
			keys []netip.Addr
			want bool
		}{{want, true}, {gone, false}} {
			for _, fam := range []bool{true, false} {
				var keys []netip.Addr
				for _, a := range probe.keys {
					if a.Is4() == fam {
						keys = append(keys, a)
					}
				}
				name := map[bool]string{true: nft.BanAddrs4, false: nft.BanAddrs6}[fam]
				present, err := nft.Present(ctx, "ipfence", ns, name, keys)
				if err != nil {
					return nil, err
				}
				res.KernelProbed += len(keys)
				for _, p := range present {
					switch {
					case p == probe.want:
					case probe.want:
						res.Lost++
					default:
						res.Phantom++
					}
				}
			}
		}
	}

	var wantNets, gotNets netipx.IPSetBuilder
	for _, e := range nets {
		wantNets.AddPrefix(e.Prefix)
	}
	rs, err := readSets(ctx, ns, nft.BanNets4, nft.BanNets6)
	if err != nil {
		return nil, err
	}
	res.KernelRanges += len(rs)
	for _, r := range rs {
		gotNets.AddRange(r)
	}
	g, _ := gotNets.IPSet()
	w, _ := wantNets.IPSet()
	if !g.Equal(w) {
		res.Lost += len(w.Ranges())
		res.Phantom += len(g.Ranges())
	}
	res.ReadBackSecs = time.Since(t1).Seconds()
	return res, nil
}

// readSets reads the named sets of ipfence's table in ns back whole.
func readSets(ctx context.Context, ns string, names ...string) ([]netipx.IPRange, error) {
	var out []netipx.IPRange
	for _, name := range names {
		rs, err := nft.ReadSet(ctx, "ipfence", ns, name)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// banWork does one step of a banning worker in its own /8: ban (an
// address, a /20 or /24, or 1000 addresses at once) or, one time in
// three, unban one of its bans.
func banWork(ctx context.Context, cl *api.Client, role string, r *rand.Rand, base uint32, mine []netip.Prefix, m *model) ([]netip.Prefix, error) {
	if len(mine) > 0 && r.IntN(3) == 0 {
		i := r.IntN(len(mine))
		p := mine[i]
		if _, err := cl.Unban(ctx, p.String(), ""); err != nil {
			return mine, err
		}
		m.unban(p)
		mine[i] = mine[len(mine)-1]
		return mine[:len(mine)-1], nil
	}
	var ps []netip.Prefix
	switch role {
	case "ban":
		ps = append(ps, netip.PrefixFrom(addr(base+uint32(r.IntN(1<<24))), 32))
	case "ban-prefix":
		ps = append(ps, netip.PrefixFrom(addr(base+uint32(r.IntN(1<<24))), []int{20, 24, 28}[r.IntN(3)]).Masked())
	case "bulk":
		for range 1000 {
			ps = append(ps, netip.PrefixFrom(addr(base+uint32(r.IntN(1<<24))), 32))
		}
	}
	req := api.BanRequest{TTL: "2h", Origin: role}
	for _, p := range ps {
		req.Prefixes = append(req.Prefixes, p.String())
	}
	if _, err := cl.Ban(ctx, req); err != nil {
		return mine, err
	}
	for _, p := range ps {
		m.ban(p)
	}
	if role != "bulk" {
		mine = append(mine, ps...)
	}
	return mine, nil
}

// mergeDiff counts the addresses only in want (lost) and only in got
// (phantom), both sorted.
func mergeDiff(want, got []netip.Addr) (lost, phantom int) {
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i].Less(got[j])):
			lost++
			i++
		case i == len(want) || got[j].Less(want[i]):
			phantom++
			j++
		default:
			i++
			j++
		}
	}
	return lost, phantom
}

func scrape(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics: %s", resp.Status)
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
