//go:build !linux

package faultproxy

import (
	"net"
	"time"
)

// waitAcked cannot look at the send queue here; a reset may discard bytes
// the client has not received yet.
func waitAcked(*net.TCPConn, time.Duration) {}
