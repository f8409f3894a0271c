// Package nfttest reads back what nft lists in a network namespace, from
// its JSON output (`nft -j list ...`), for tests that compare a ruleset
// with another one or with what they loaded. Every function fails the
// test when nft fails or when its output does not decode.
package nfttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Object is one object of nft's JSON listing: its Kind ("table", "chain",
// "set", "map", "rule", "metainfo", ...) and its fields.
type Object struct {
	Kind string
	Body map[string]any
}

// String is the object as indented JSON after its kind, so that a line
// diff of two listings shows the fields that differ.
func (o Object) String() string {
	b, err := json.MarshalIndent(o.Body, "", " ")
	if err != nil { // decoded from JSON: cannot happen
		return fmt.Sprintf("%s %v", o.Kind, err)
	}
	return o.Kind + " " + string(b)
}

// List runs `nft -j list what...` in namespace ns and returns the objects
// listed, in nft's order.
func List(t testing.TB, ns string, what ...string) []Object {
	t.Helper()
	args := append([]string{"netns", "exec", ns, "nft", "-j", "list"}, what...)
	cmd := exec.Command("ip", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nft -j list %s in %s: %v\n%s", strings.Join(what, " "), ns, err, stderr.String())
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("decoding nft -j list %s in %s: %v", strings.Join(what, " "), ns, err)
	}
	var objs []Object
	for _, o := range doc.Nftables {
		for kind, body := range o {
			objs = append(objs, Object{kind, body})
		}
	}
	return objs
}

// Ruleset is `nft -j list ruleset` of namespace ns, normalized so that two
// listings of the same ruleset compare equal: the elements of each set
// and map sorted (a hash set lists them in hash order, which differs
// between namespaces), and the keys named in drop and "expires" (which
// counts down) removed from every object at any depth.
func Ruleset(t testing.TB, ns string, drop ...string) []Object {
	t.Helper()
	objs := List(t, ns, "ruleset")
	drop = append(drop, "expires")
	for _, o := range objs {
		dropKeys(o.Body, drop)
		if elems, ok := o.Body["elem"].([]any); ok {
			slices.SortFunc(elems, func(a, b any) int {
				ja, _ := json.Marshal(a)
				jb, _ := json.Marshal(b)
				return bytes.Compare(ja, jb)
			})
		}
	}
	return objs
}

// Text is the objects' Strings, one after the other.
func Text(objs []Object) string {
	var b strings.Builder
	for _, o := range objs {
		b.WriteString(o.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// dropKeys deletes the keys named from every object nested in v.
func dropKeys(v any, names []string) {
	switch x := v.(type) {
	case map[string]any:
		for _, n := range names {
			delete(x, n)
		}
		for _, y := range x {
			dropKeys(y, names)
		}
	case []any:
		for _, y := range x {
			dropKeys(y, names)
		}
	}
}

// Elements lists what (`set inet ipfence s`, `map inet ipfence m`) in
// namespace ns and returns the elements of the sets and maps listed, each
// as text (see Elem), sorted.
func Elements(t testing.TB, ns string, what ...string) []string {
	t.Helper()
	var elems []string
	for _, o := range List(t, ns, what...) {
		if o.Kind != "set" && o.Kind != "map" {
			continue
		}
		list, _ := o.Body["elem"].([]any)
		for _, e := range list {
			elems = append(elems, Elem(e))
		}
	}
	slices.Sort(elems)
	return elems
}

// Elem turns an element of nft's JSON listing back into nft's text:
// "10.0.0.0", "10.0.0.0/8", "0x20010002" (a word of a concatenated key),
// "a . b" (a concatenation), "10.0.0.0 timeout 3600s" (an element with a
// timeout) or "10.0.0.0 : jump c" (a map's element).
func Elem(e any) string {
	switch v := e.(type) {
	case string:
		return v
	case float64:
		if v != float64(uint64(v)) {
			return fmt.Sprint(v)
		}
		return fmt.Sprintf("0x%x", uint64(v))
	case map[string]any:
		if p, ok := v["prefix"].(map[string]any); ok {
			return fmt.Sprintf("%v/%v", p["addr"], p["len"])
		}
		if el, ok := v["elem"].(map[string]any); ok {
			return fmt.Sprintf("%s timeout %vs", Elem(el["val"]), el["timeout"])
		}
		if ws, ok := v["concat"].([]any); ok {
			parts := make([]string, len(ws))
			for i, w := range ws {
				parts[i] = Elem(w)
			}
			return strings.Join(parts, " . ")
		}
	case []any: // a map's element: [key, verdict]
		if len(v) != 2 {
			break
		}
		verdict := ""
		if m, ok := v[1].(map[string]any); ok {
			for k, arg := range m {
				verdict = k
				if a, ok := arg.(map[string]any); ok {
					verdict += " " + fmt.Sprint(a["target"])
				}
			}
		}
		return Elem(v[0]) + " : " + verdict
	}
	return fmt.Sprint(e)
}
