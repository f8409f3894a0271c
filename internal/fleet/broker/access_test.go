package broker_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ipfence/ipfence/internal/fleet"
	"github.com/ipfence/ipfence/internal/fleet/broker"
	"github.com/ipfence/ipfence/internal/fleet/broker/brokertest"
)

// fleetServer runs a server from a folder `server init` wrote, and
// issues credentials of each role.
type fleetServer struct {
	url, dir string
}

func startFleetServer(t *testing.T) *fleetServer {
	t.Helper()
	dir := t.TempDir()
	if err := broker.Init(broker.InitConfig{Dir: dir, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := broker.Init(broker.InitConfig{Dir: dir, Now: time.Now()}); !errors.Is(err, broker.ErrInitDone) {
		t.Fatalf("a second init: %v, want ErrInitDone", err)
	}
	for name, mode := range map[string]os.FileMode{broker.ConfFile: 0o600, broker.AccountFile: 0o600, broker.PublisherCreds: 0o600, broker.CAFile: 0o644} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, want mode %v", name, err, mode)
		}
	}
	srv := brokertest.StartWith(t, broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:-1",
		ConfigFile: filepath.Join(dir, broker.ConfFile), Creds: filepath.Join(dir, broker.ServerCreds)})
	return &fleetServer{url: strings.Replace(srv.URL, "nats://", "tls://", 1), dir: dir}
}

// creds issues credentials of role for name.
func (s *fleetServer) creds(t *testing.T, role broker.Role, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".creds")
	if err := broker.IssueFile(s.dir, role, name, out, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *fleetServer) hub(t *testing.T, creds string) *broker.Hub {
	t.Helper()
	h, err := broker.Connect(broker.Options{URL: s.url, Creds: creds, CA: filepath.Join(s.dir, broker.CAFile), Timeout: 2 * time.Second}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// raw is a plain NATS connection with creds, for what ipfence's own
// client would never send.
func (s *fleetServer) raw(t *testing.T, creds string) *nats.Conn {
	t.Helper()
	upub, err := broker.CredsUser(creds)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.url, nats.UserCredentials(creds), nats.RootCAs(filepath.Join(s.dir, broker.CAFile)), nats.CustomInboxPrefix(broker.Inbox(upub)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestAccess: on a server `server init` configured, each role does its
// work, and a client without credentials, an agent and a ban writer try
// the attacks on the fleet (forge pointers, statuses, bans and bundles,
// copy one stream into another with a consumer, delete or purge, read
// others' replies); none changes what the publisher reads back.
func TestAccess(t *testing.T) {
	s := startFleetServer(t)
	ctx := context.Background()
	priv := key(t)
	pub := priv.Public().(ed25519.PublicKey)

	// Without credentials, or without the CA: no connection.
	if _, err := nats.Connect(s.url, nats.RootCAs(filepath.Join(s.dir, broker.CAFile))); err == nil {
		t.Error("connected without credentials")
	}
	if _, err := nats.Connect(s.url, nats.UserCredentials(filepath.Join(s.dir, broker.PublisherCreds))); err == nil {
		t.Error("connected without checking the server's certificate")
	}

	publisher := s.hub(t, filepath.Join(s.dir, broker.PublisherCreds))
	bundle := []byte("bundle of web")
	p, err := publisher.Publish(ctx, "web", bundle, priv, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ban := &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.0.9/32"), Created: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := publisher.PublishBan(ctx, ban, priv); err != nil {
		t.Fatal(err)
	}

	// An agent does its work: pointer, bundle, bans, its own status.
	agentCreds := s.creds(t, broker.Agent, "web1")
	agent := s.hub(t, agentCreds)
	data, err := agent.Pointer(ctx, "web")
	if got, verr := fleet.Verify(data, "web", pub); err != nil || verr != nil || got.Seq != p.Seq {
		t.Fatalf("agent reading the pointer: %v %v", err, verr)
	}
	if got, err := agent.Bundle(ctx, p.Digest, p.Size); err != nil || string(got) != string(bundle) {
		t.Fatalf("agent reading the bundle: %q %v", got, err)
	}
	if _, err := agent.Bundle(ctx, p.Digest, p.Size+1); !errors.Is(err, broker.ErrBundleSize) {
		t.Errorf("a bundle of another size than the pointer's: %v", err)
	}
	if err := agent.PutStatus(ctx, &fleet.Status{Host: "web1", Group: "web", Seq: p.Seq}); err != nil {
		t.Fatalf("agent writing its status: %v", err)
	}
	bans := make(chan []byte, 4)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go agent.FollowBans(fctx, 100*time.Millisecond, func(d []byte) { bans <- d }, func(err error) { t.Log(err) })
	select {
	case d := <-bans:
		if _, err := fleet.VerifyBan(d, pub); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent: no fleet ban")
	}
	watched := make(chan []byte, 4)
	go func() { _ = agent.WatchPointer(fctx, "web", 100*time.Millisecond, func(d []byte) { watched <- d }) }()
	select {
	case <-watched: // the current one
	case <-time.After(10 * time.Second):
		t.Fatal("agent: the pointer was not watched")
	}
	p2, err := publisher.Publish(ctx, "web", []byte("bundle 2"), priv, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-watched:
		if got, err := fleet.Verify(d, "web", pub); err != nil || got.Seq != p2.Seq {
			t.Fatalf("watched pointer %v %v, want seq %d", got, err, p2.Seq)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent: the new pointer was not seen")
	}

	// A ban writer publishes bans, with the key, and unbans.
	bansCreds := s.creds(t, broker.Bans, "fail2ban-web1")
	writer := s.hub(t, bansCreds)
	// Headers a writer stores never reach agents: they would end the
	// agents' reading (a status) or move it far ahead (a sequence).
	smuggler := s.raw(t, bansCreds)
	junk := nats.NewMsg("ipfence.bans.junk")
	junk.Header.Set("Status", "404")
	junk.Header.Set("Nats-Sequence", "1000000000")
	junk.Header.Set("Nats-Last-Sequence", "1000000000")
	junk.Data = []byte("junk")
	if _, err := smuggler.RequestMsg(junk, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// Nor do an agent's on its status confuse the publisher's listing.
	fake := nats.NewMsg("$KV.ipfence_status.host.web1")
	fake.Header.Set("Status", "100")
	fake.Header.Set("Description", "Idle Heartbeat")
	if _, err := s.raw(t, agentCreds).RequestMsg(fake, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := publisher.Statuses(ctx); err != nil || len(st) != 1 || st[0].Unreadable == "" {
		t.Fatalf("statuses after a status with a heartbeat's headers: %+v, %v", st, err)
	}
	if err := agent.PutStatus(ctx, &fleet.Status{Host: "web1", Group: "web", Seq: p.Seq}); err != nil {
		t.Fatal(err)
	}
	ban2 := &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.0.10/32"), Created: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := writer.PublishBan(ctx, ban2, priv); err != nil {
		t.Fatalf("ban writer: %v", err)
	}
	if err := writer.PublishBan(ctx, &fleet.Ban{Prefix: ban2.Prefix, Created: time.Now(), Unban: true}, priv); err != nil {
		t.Fatalf("ban writer unbanning: %v", err)
	}
	// The unban reaches the agent following the bans (the ban too, unless
	// the unban replaced it in the stream before the agent's next read).
	for done := false; !done; {
		select {
		case d := <-bans:
			b, err := fleet.VerifyBan(d, pub)
			if err != nil {
				continue // the junk, which agents refuse
			}
			if b.Prefix != ban2.Prefix {
				t.Fatalf("agent following bans: %+v; want %v's", b, ban2.Prefix)
			}
			done = b.Unban
		case <-time.After(10 * time.Second):
			t.Fatal("agent: the ban writer's unban did not arrive")
		}
	}

	// What the publisher reads back before and after the attacks.
	snapshot := func() string {
		t.Helper()
		js, err := jetstream.New(s.raw(t, filepath.Join(s.dir, broker.PublisherCreds)))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, name := range []string{"KV_" + broker.PolicyBucket, "KV_" + broker.StatusBucket, "OBJ_" + broker.BundleStore, broker.BanStream} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
			i := st.CachedInfo()
			names := st.ConsumerNames(ctx)
			n := 0
			for range names.Name() {
				n++
			}
			last := i.State.LastSeq
			if name == "KV_"+broker.StatusBucket {
				last = 0 // the agent writes its own status (below, with replies aimed elsewhere)
			}
			b.WriteString(name + ":" + fmt.Sprintf("%d/%d/%d", i.State.Msgs, last, n) + " ")
		}
		names := js.StreamNames(ctx)
		for n := range names.Name() {
			b.WriteString(n + " ")
		}
		return b.String()
	}
	if err := publisher.PutStatus(ctx, &fleet.Status{Host: "web9", Group: "web"}); err != nil {
		t.Fatal(err)
	}
	before := snapshot()

	for _, who := range []struct {
		name  string
		creds string
	}{{"agent", agentCreds}, {"ban writer", bansCreds}} {
		nc := s.raw(t, who.creds)
		forged, _ := fleet.Sign(&fleet.Pointer{Group: "web", Seq: 99, Digest: "sha256-00", Size: 1}, key(t))
		attacks := []struct {
			subject string
			data    string
		}{
			{"$KV.ipfence_policy.group.web", string(forged)},
			{"$KV.ipfence_status.host.web2", `{"host":"web2","seq":99}`},
			{"$O.ipfence_bundles.C.x", "chunk"},
			{"$JS.API.CONSUMER.CREATE.KV_ipfence_policy.evil", `{"stream_name":"KV_ipfence_policy","config":{"durable_name":"evil","deliver_subject":"ipfence.bans.x","ack_policy":"none"}}`},
			{"$JS.API.CONSUMER.CREATE." + broker.BanStream, `{"stream_name":"IPFENCE_BANS","config":{"durable_name":"evil","ack_policy":"none"}}`},
			{"$JS.API.STREAM.PURGE.KV_ipfence_policy", ""},
			{"$JS.API.STREAM.DELETE." + broker.BanStream, ""},
			{"$JS.API.STREAM.UPDATE.KV_ipfence_status", `{"name":"KV_ipfence_status","subjects":["$KV.ipfence_status.>"],"max_msgs":1}`},
			{"$JS.API.STREAM.MSG.DELETE.KV_ipfence_policy", `{"seq":1}`},
			{"$JS.API.STREAM.CREATE.EVIL", `{"name":"EVIL","subjects":["evil.>"]}`},
		}
		if who.name == "ban writer" {
			attacks = append(attacks, struct{ subject, data string }{"$KV.ipfence_status.host.web1", `{"host":"web1"}`})
		} else {
			// A ban writer may publish on a ban's subject (NATS cannot check
			// the signature: agents do); an agent may not.
			attacks = append(attacks, struct{ subject, data string }{"ipfence.bans." + fleet.BanToken(ban.Prefix), "not a ban"})
		}
		for _, a := range attacks {
			if m, err := nc.Request(a.subject, []byte(a.data), 300*time.Millisecond); err == nil && !strings.Contains(string(m.Data), `"error"`) {
				t.Errorf("%s: %s answered %s", who.name, a.subject, m.Data)
			}
		}
		// A rollup on its own status key would purge every host's.
		m := nats.NewMsg("$KV.ipfence_status.host.web1")
		m.Header.Set("Nats-Rollup", "all")
		m.Data = []byte(`{"host":"web1"}`)
		if _, err := nc.RequestMsg(m, 300*time.Millisecond); err == nil && who.name == "agent" {
			// Allowed to write the key; the stream must refuse the rollup.
		}
		// Others' replies: only its own inbox may be read.
		if _, err := nc.SubscribeSync("_INBOX.>"); err == nil {
			_ = nc.Flush()
			if err := nc.LastError(); err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s subscribing to every inbox: %v", who.name, err)
			}
		}
	}
	// The agent's status is its own; the publisher sees it.
	st, err := publisher.Statuses(ctx)
	if err != nil || len(st) != 2 || st[0].Host != "web1" || st[1].Host != "web9" {
		t.Errorf("statuses %+v %v, want web1's and web9's", st, err)
	}

	// JetStream answers on the reply subject a request names: aimed at
	// the fleet's streams or its API, the answer must never get there
	// (agents and ban writers reach the streams through imports, and an
	// import's answers go back to the importing account).
	targets := []string{"$JS.API.STREAM.DELETE.KV_ipfence_policy", "$JS.API.STREAM.PURGE.KV_ipfence_policy", "$JS.API.STREAM.DELETE.IPFENCE_BANS",
		"$JS.API.STREAM.CREATE.EVIL", "$KV.ipfence_policy.group.web", "$KV.ipfence_status.host.web9", "$O.ipfence_bundles.C.x", "ipfence.bans." + fleet.BanToken(ban.Prefix)}
	read := func(stream, next, last string) string {
		return fmt.Sprintf(`{"stream":%q,"next_by_subj":%q,"last_by_subj":%q}`, stream, next, last)
	}
	bansRead := read("IPFENCE_BANS", "ipfence.bans.>", "")
	for _, who := range []struct {
		creds    string
		requests [][2]string // subject, body
	}{
		{agentCreds, [][2]string{{"ipfence.read", bansRead}, {"ipfence.read", read("KV_ipfence_policy", "", "$KV.ipfence_policy.group.web")},
			{"ipfence.read", read("OBJ_ipfence_bundles", "$O.ipfence_bundles.C.x", "")}, {"$KV.ipfence_status.host.web1", "{}"}}},
		{bansCreds, [][2]string{{"ipfence.read", bansRead}, {"ipfence.read", read("IPFENCE_BANS", "", broker.BanSubject(ban.Prefix))}}},
	} {
		nc := s.raw(t, who.creds)
		for _, req := range who.requests {
			for _, to := range targets {
				if err := nc.PublishRequest(req[0], to, []byte(req[1])); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// The relay reads the fleet's subjects only, in bounded batches: a
	// direct get of one's own (a batch of a million, a GiB: the server
	// loads each batch into memory) is no longer possible, and neither
	// is a read of another stream, of a wildcard, or for a ban writer of
	// anything but bans.
	for _, tc := range []struct {
		creds, subject, body string
	}{
		{agentCreds, "ipfence.js.DIRECT.GET.OBJ_ipfence_bundles", `{"seq":1,"batch":1000000,"max_bytes":1073741824}`},
		{agentCreds, "ipfence.read", read("OBJ_ipfence_bundles", "$O.ipfence_bundles.C.>", "")},
		{agentCreds, "ipfence.read", read("KV_ipfence_status", "$KV.ipfence_status.>", "")},
		{agentCreds, "ipfence.read", read("KV_ipfence_policy", "", "$KV.ipfence_policy.>")},
		{agentCreds, "ipfence.read", `{"stream":"IPFENCE_BANS","next_by_subj":"ipfence.bans.>","batch":1000000}`},
		{bansCreds, "ipfence.read", read("OBJ_ipfence_bundles", "$O.ipfence_bundles.C.x", "")},
		{bansCreds, "ipfence.read", read("KV_ipfence_policy", "", "$KV.ipfence_policy.group.web")},
	} {
		m, err := s.raw(t, tc.creds).Request(tc.subject, []byte(tc.body), time.Second)
		ok := err == nil && m.Header.Get("Status") == ""
		if strings.Contains(tc.body, "1000000") && tc.subject == "ipfence.read" {
			// Batch is not the reader's to say: the relay's own applies.
			ok = err != nil || m.Header.Get("Status") != "" && m.Header.Get("Status") != "204" && m.Header.Get("Status") != "404"
		}
		if ok {
			t.Errorf("%s %s: answered %v", tc.subject, tc.body, m.Header)
		}
	}
	time.Sleep(time.Second)
	if after := snapshot(); after != before {
		t.Errorf("the attacks changed the streams:\n before %s\n after  %s", before, after)
	}
	// A ban writer reads no bundle, pointer or status.
	if _, err := writer.Bundle(ctx, p.Digest, p.Size); err == nil {
		t.Error("ban writer read a bundle")
	}
	if _, err := writer.Pointer(ctx, "web"); err == nil {
		t.Error("ban writer read a pointer")
	}

	// The bans stream made again (its sequences start over): the agent
	// following it reads it from the start, and misses no ban.
	js, err := jetstream.New(s.raw(t, filepath.Join(s.dir, broker.PublisherCreds)))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, broker.BanStream); err != nil {
		t.Fatal(err)
	}
	if err := publisher.Setup(ctx, 1); err != nil {
		t.Fatal(err)
	}
	ban3 := &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.0.11/32"), Created: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := writer.PublishBan(ctx, ban3, priv); err != nil {
		t.Fatal(err)
	}
	for deadline, done := time.After(10*time.Second), false; !done; {
		select {
		case d := <-bans:
			b, err := fleet.VerifyBan(d, pub)
			done = err == nil && b.Prefix == ban3.Prefix
		case <-deadline:
			t.Fatal("agent: a ban on the stream made again did not arrive")
		}
	}
	// A new ban is read once: the reader goes on from where it was, it
	// does not read the stream again.
	ban4 := &fleet.Ban{Prefix: netip.MustParsePrefix("198.18.0.12/32"), Created: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := writer.PublishBan(ctx, ban4, priv); err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for quiet := time.After(3 * time.Second); ; {
		select {
		case d := <-bans:
			if b, err := fleet.VerifyBan(d, pub); err == nil {
				got = append(got, b.Prefix)
			}
			continue
		case <-quiet:
		}
		break
	}
	if len(got) != 1 || got[0] != ban4.Prefix {
		t.Errorf("after a new ban the agent read %v, want %v once", got, ban4.Prefix)
	}
}

// TestRevoke: a revoked user can no longer connect once the server has
// started again; other users of its role still can.
func TestRevoke(t *testing.T) {
	dir, data := t.TempDir(), t.TempDir()
	if err := broker.Init(broker.InitConfig{Dir: dir, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	fs := &fleetServer{dir: dir}
	lost, kept := fs.creds(t, broker.Agent, "web1"), fs.creds(t, broker.Agent, "web2")
	bans := fs.creds(t, broker.Bans, "f2b")
	start := func() *brokertest.Server {
		srv := brokertest.StartWith(t, broker.ServerConfig{DataDir: data, Listen: "127.0.0.1:-1",
			ConfigFile: filepath.Join(dir, broker.ConfFile), Creds: filepath.Join(dir, broker.ServerCreds)})
		fs.url = strings.Replace(srv.URL, "nats://", "tls://", 1)
		return srv
	}
	connect := func(creds string) error {
		h, err := broker.Connect(broker.Options{URL: fs.url, Creds: creds, CA: filepath.Join(dir, broker.CAFile), Timeout: 2 * time.Second}, false)
		if err == nil {
			h.Close()
		}
		return err
	}
	srv := start()
	if err := connect(lost); err != nil {
		t.Fatal(err)
	}
	if _, r, err := broker.Revoke(dir, lost, time.Now()); err != nil || r != broker.Agent {
		t.Fatalf("revoke: %v, %v", r, err)
	}
	if _, _, err := broker.Revoke(t.TempDir(), lost, time.Now()); err == nil {
		t.Error("revoked with another fleet's folder")
	}
	srv.Stop()
	start()
	if err := connect(lost); err == nil {
		t.Error("the revoked user connected")
	}
	for _, c := range []string{kept, bans, filepath.Join(dir, broker.PublisherCreds)} {
		if err := connect(c); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
}
