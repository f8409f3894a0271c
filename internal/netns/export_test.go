package netns

// ForgetForTest closes the lab's namespace files without removing the
// namespaces, as a crash would leave them.
func ForgetForTest(l *Lab) {
	l.fwNS.Close()
	l.genNS.Close()
	l.mu.Lock()
	l.closed, l.fwNS, l.genNS = true, nil, nil
	l.mu.Unlock()
}

// NSFSMounts is nsfsMounts, for tests.
var NSFSMounts = nsfsMounts
