package bench

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress shows what runs and what is left: each Step prints one line
// with the steps done out of the total, the time spent and an estimate of
// the time left: the steps left times the mean of the last recentSteps
// steps, since a scenario's steps differ in length from part to part (a
// run of short ones followed by long ones) while neighbours are alike.
type Progress struct {
	mu          sync.Mutex
	w           io.Writer
	done, total int
	start       time.Time
	recent      []time.Time // start times of the last recentSteps+1 steps
	now         func() time.Time
}

const recentSteps = 8

// NewProgress writes to w (nil: nowhere) and expects total steps; Add
// corrects the total as it becomes known.
func NewProgress(w io.Writer, total int) *Progress {
	if w == nil {
		w = io.Discard
	}
	return &Progress{w: w, total: total, start: time.Now(), now: time.Now}
}

// Add adds n steps to the total.
func (p *Progress) Add(n int) {
	p.mu.Lock()
	p.total += n
	p.mu.Unlock()
}

// Step counts one step as started and prints what it is.
func (p *Progress) Step(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	now := p.now()
	spent := now.Sub(p.start)
	if len(p.recent) > recentSteps {
		p.recent = p.recent[1:]
	}
	p.recent = append(p.recent, now)
	left := "?"
	if n := len(p.recent) - 1; n > 0 {
		per := now.Sub(p.recent[0]) / time.Duration(n)
		left = "~" + (per * time.Duration(max(p.total-p.done+1, 0))).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "[%d/%d, %s, %s left] %s\n", p.done, max(p.total, p.done), spent.Round(time.Second), left, what)
}

// Prefixed returns a func that reports steps with prefix before each.
func (p *Progress) Prefixed(prefix string) func(string) {
	return func(s string) { p.Step(prefix + s) }
}
