package policy

import (
	"bytes"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/ipfence/ipfence/internal/source"
)

// RedactedKey replaces api_key values in a redacted policy.
const RedactedKey = "REDACTED (not in bundles)"

// ErrRedact is returned when a policy's text cannot be redacted.
var ErrRedact = errors.New("cannot redact the policy text")

// Redact returns a policy's text without its credentials, for a record
// that leaves the host (a fleet bundle): every api_key value becomes
// RedactedKey, every url and urls value loses its password, a user name
// without password and its query values (source.RedactURL), and
// comments, which may hold a commented-out key, are dropped. The rest
// is re-encoded as YAML. On error the caller must keep no text at all.
func Redact(text string) (string, error) {
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(text), &root); err != nil {
		return "", fmt.Errorf("%w: %w", ErrRedact, err)
	}
	if root.Kind == 0 { // empty or only comments
		return "", nil
	}
	redactNode(&root)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return "", fmt.Errorf("%w: %w", ErrRedact, err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("%w: %w", ErrRedact, err)
	}
	// What was written must read back (an alias whose anchor went would
	// not).
	if err := yaml.Unmarshal(buf.Bytes(), new(yaml.Node)); err != nil {
		return "", fmt.Errorf("%w: re-reading: %w", ErrRedact, err)
	}
	return buf.String(), nil
}

// redactNode drops n's comments and redacts the credentials under it.
func redactNode(n *yaml.Node) {
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			switch k.Value {
			case "api_key":
				redactValue(n.Content[i+1], func(string) string { return RedactedKey })
			case "url", "urls":
				redactValue(n.Content[i+1], source.RedactURL)
			}
		}
	}
	for _, c := range n.Content {
		redactNode(c)
	}
}

// redactValue passes the scalars of v (a scalar, a list or an alias of
// one) through f; anything else becomes f("").
func redactValue(v *yaml.Node, f func(string) string) {
	switch v.Kind {
	case yaml.ScalarNode:
		v.Value, v.Tag = f(v.Value), "!!str"
	case yaml.SequenceNode:
		for _, c := range v.Content {
			redactValue(c, f)
		}
	case yaml.AliasNode:
		if v.Alias != nil && (v.Alias.Kind == yaml.ScalarNode || v.Alias.Kind == yaml.SequenceNode) {
			redactValue(v.Alias, f)
			return
		}
		fallthrough
	default:
		*v = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f(""), Anchor: v.Anchor}
	}
}
