package prefix

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"go4.org/netipx"
)

// maxLine bounds the length of one line Read accepts (comments included).
const maxLine = 1 << 20

// Read parses every line of r (see the package documentation for the
// syntax) and calls add with each entry and its 1-based line number, in
// order. file names r in errors.
//
// Read stops at the first line it cannot parse, or longer than 1 MiB,
// and returns a *ParseError naming file and line; entries before it have
// been passed to add. An error reading r is returned wrapped, naming file.
func Read(r io.Reader, file string, add func(rng netipx.IPRange, line int)) error {
	return read(r, file, func(e entry, line int) { add(e.ipRange(), line) })
}

func read(r io.Reader, file string, add func(e entry, line int)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if line == 1 {
			b = bytes.TrimPrefix(b, []byte("\uFEFF"))
		}
		e, ok, err := parseLine(b)
		if err != nil {
			pe := err.(*ParseError)
			pe.File, pe.Line = file, line
			return pe
		}
		if ok {
			add(e, line)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &ParseError{File: file, Line: line + 1, Text: "…", Err: fmt.Errorf("line is longer than %d bytes", maxLine)}
		}
		return fmt.Errorf("reading %s: %w", file, err)
	}
	return nil
}

// ReadSet reads r like Read and returns the union of its entries. On error
// it returns no set.
func ReadSet(r io.Reader, file string) (*Set, error) {
	var b Builder
	if err := b.Read(r, file); err != nil {
		return nil, err
	}
	return b.Build()
}

// Read adds every entry of r to b, failing like the package-level Read
// (entries before a bad line are added), but without making a
// netipx.IPRange of each.
func (b *Builder) Read(r io.Reader, file string) error {
	return read(r, file, func(e entry, _ int) {
		if e.is4 {
			b.in4 = append(b.in4, e.lo.Lo<<32|e.hi.Lo)
		} else {
			b.in6 = append(b.in6, e.span)
		}
	})
}
