package faultproxy

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// waitAcked polls, until limit passes, for the peer to acknowledge every
// byte written to c (SIOCOUTQ: bytes sent but unacknowledged or unsent).
func waitAcked(c *net.TCPConn, limit time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(limit)
	for {
		queued := 0
		cerr := raw.Control(func(fd uintptr) {
			queued, err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		})
		if cerr != nil || err != nil || queued == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond) // polling the kernel's send queue
	}
}
