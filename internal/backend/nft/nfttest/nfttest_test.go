package nfttest

import (
	"encoding/json"
	"testing"
)

func TestElem(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`"10.0.0.1"`, "10.0.0.1"},
		{`{"prefix": {"addr": "10.0.0.0", "len": 8}}`, "10.0.0.0/8"},
		{`{"elem": {"val": "2001:db8::1", "timeout": 3600, "expires": 3599}}`, "2001:db8::1 timeout 3600s"},
		{`{"concat": [536936450, 65535]}`, "0x20010002 . 0xffff"},
		{`[{"prefix": {"addr": "10.0.0.0", "len": 8}}, {"jump": {"target": "c"}}]`, "10.0.0.0/8 : jump c"},
		{`["10.0.0.1", {"drop": null}]`, "10.0.0.1 : drop"},
	} {
		var e any
		if err := json.Unmarshal([]byte(tc.json), &e); err != nil {
			t.Fatal(err)
		}
		if got := Elem(e); got != tc.want {
			t.Errorf("Elem(%s) = %q, want %q", tc.json, got, tc.want)
		}
	}
}

func TestDropKeys(t *testing.T) {
	var body map[string]any
	if err := json.Unmarshal([]byte(`{"handle": 3, "elem": [{"elem": {"val": "10.0.0.1", "expires": 5}}]}`), &body); err != nil {
		t.Fatal(err)
	}
	dropKeys(body, []string{"handle", "expires"})
	if got, _ := json.Marshal(body); string(got) != `{"elem":[{"elem":{"val":"10.0.0.1"}}]}` {
		t.Errorf("after dropKeys: %s", got)
	}
}
