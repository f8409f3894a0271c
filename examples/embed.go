// Package examples holds the example policies shipped with ipfence; the
// demo runs europe.yaml from here.
package examples

import _ "embed"

// Europe is examples/europe.yaml: allow only the 52 European country
// codes of data/geo/README.md, from the bundled data.
//
//go:embed europe.yaml
var Europe []byte
