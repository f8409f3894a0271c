package policy

import (
	"errors"
	"strings"
	"testing"
)

// secretPolicy holds credentials in every place a policy can: an inline
// api_key, a password, a lone user name (a token), query values, an
// alias of a URL and a comment.
const secretPolicy = `# fleet policy
sources:
  # old key: SECRET-COMMENT
  cs: {format: crowdsec, url: "http://127.0.0.1:8080/", api_key: SECRET-KEY}
  feeds:
    format: list
    url: &u "https://user:SECRET-PASS@feeds.example/drop.txt?token=SECRET-TOKEN&fmt=txt"
    urls:
      - https://SECRET-USER@feeds.example/more.txt
      - https://SECRET-EMPTY:@feeds.example/empty.txt
      - https://feeds.example/plain.txt
  again: {format: list, urls: [*u]}
protect: [203.0.113.7]
rules:
  - {name: feeds, action: drop, match: {sources: [feeds, again]}}  # SECRET-LINE
`

var secrets = []string{"SECRET-COMMENT", "SECRET-KEY", "SECRET-PASS", "SECRET-TOKEN", "SECRET-USER", "SECRET-EMPTY", "SECRET-LINE"}

// TestRedact: a redacted policy holds none of the credentials and is
// still the same policy, minus them.
func TestRedact(t *testing.T) {
	if _, err := Parse([]byte(secretPolicy), "p.yaml"); err != nil {
		t.Fatal(err)
	}
	got, err := Redact(secretPolicy)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(got, s) {
			t.Errorf("redacted policy shows %s:\n%s", s, got)
		}
	}
	p, err := Parse([]byte(got), "p.yaml")
	if err != nil {
		t.Fatalf("redacted policy: %v\n%s", err, got)
	}
	if len(p.Rules) != 1 || p.Rules[0].Name != "feeds" || len(p.Protect) != 1 || len(p.CrowdSec) != 1 || p.CrowdSec[0].APIKey != RedactedKey {
		t.Errorf("redacted policy reads differently: %+v\n%s", p, got)
	}
	for _, want := range []string{
		"https://user:xxxxx@feeds.example/drop.txt?fmt=xxxxx&token=xxxxx",
		"https://xxxxx@feeds.example/more.txt",
		"https://xxxxx@feeds.example/empty.txt",
		"https://feeds.example/plain.txt",
		"http://127.0.0.1:8080/",
		"*u",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("redacted policy lacks %s:\n%s", want, got)
		}
	}
	if got, err := Redact(""); got != "" || err != nil {
		t.Errorf("empty policy: %q, %v", got, err)
	}
	if got, err := Redact("api_key: [SECRET-KEY\n"); got != "" || !errors.Is(err, ErrRedact) {
		t.Errorf("malformed policy: %q, %v", got, err)
	}
}
