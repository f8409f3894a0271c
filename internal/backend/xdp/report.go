package xdp

// Report is what loading an XDP program did (package apply swaps it).
type Report struct {
	Rules        int         `json:"rules"`
	Interfaces   []Interface `json:"interfaces,omitempty"`
	MemoryBytes  int         `json:"memory_bytes,omitempty"`
	BuildMillis  int64       `json:"build_ms"`
	LoadMillis   int64       `json:"load_ms"`
	AttachMillis int64       `json:"attach_ms"`
	// Detached: the plan has no XDP rules any more and the previous
	// program was removed.
	Detached bool `json:"detached,omitempty"`
}
