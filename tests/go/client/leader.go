package main

// Finding the leading fleet, as a gateway given several fleet addresses does.
//
// Fleets sharing one PostgreSQL elect one leader (docs/fleet.md, "Several fleets, one
// leader"). A follower answers reads and watches, and refuses every change (and ListNodes,
// and the agents' Connect) with UNAVAILABLE, ErrorInfo reason NOT_LEADER and the leader's
// address in metadata `leader_address` ("" during an election). It did nothing, so the call
// may be sent again to that address at once; a change also carries its request_id, so even a
// retry of a call that did reach the leader answers the first answer.
//
// Leader is a grpc.ClientConnInterface: generated stubs take it where they take a
// *grpc.ClientConn (fleetv1.NewFleetServiceClient(leader)). A unary call goes to the fleet it
// believes leads; told NOT_LEADER with an address, it dials that address (once: connections
// are kept by address), makes it current, and sends the call there once more. Told anything
// else UNAVAILABLE (NOT_LEADER with no address, or a fleet that does not answer) it returns
// the error and moves on to the next address for the next call: the caller retries with its
// backoff, as for any UNAVAILABLE. Streams (WatchReplicas, WatchRollout) go to the current
// fleet without redirection: every fleet serves them.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	reasonNotLeader = "NOT_LEADER"
	leaderAddress   = "leader_address"
	// maxAddresses bounds the addresses kept, given and sent to (as llmgw/clients/leader.py).
	maxAddresses = 16
)

// Redirect is one call a follower sent on to the leader.
type Redirect struct {
	Method string `json:"method"`
	From   string `json:"from"`
	To     string `json:"to"`
}

// Leader sends each call to the fleet that leads, among the addresses it was given and those
// it was sent to.
type Leader struct {
	mu        sync.Mutex
	dial      func(target string, block bool) (*grpc.ClientConn, error)
	addresses []string
	conns     map[string]*grpc.ClientConn
	current   string
	redirects []Redirect
}

// newLeader dials the first of addresses that accepts a connection (dial blocks until it is
// connected, refused, or its own timeout passed).
func newLeader(addresses []string, dial func(string, bool) (*grpc.ClientConn, error)) (*Leader, error) {
	l := &Leader{dial: dial, addresses: append([]string(nil), addresses...), conns: map[string]*grpc.ClientConn{}}
	var errs []string
	for _, at := range l.addresses {
		conn, err := dial(at, true)
		if err == nil {
			l.conns[at], l.current = conn, at
			return l, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", at, err))
	}
	return nil, fmt.Errorf("no fleet answered: %v", errs)
}

// Current is the address calls go to now.
func (l *Leader) Current() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current
}

// Redirects are the calls sent on to a leader so far.
func (l *Leader) Redirects() []Redirect {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Redirect(nil), l.redirects...)
}

// Close closes every connection it opened.
func (l *Leader) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// conn is the current fleet's connection (dialled without blocking if it has none yet).
func (l *Leader) conn() (*grpc.ClientConn, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.conns[l.current]; ok {
		return c, l.current, nil
	}
	c, err := l.dial(l.current, false)
	if err != nil {
		return nil, l.current, err
	}
	l.conns[l.current] = c
	return c, l.current, nil
}

// moveTo makes address current (remembering it among the addresses).
func (l *Leader) moveTo(address string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	known := false
	for _, a := range l.addresses {
		known = known || a == address
	}
	if !known {
		if len(l.addresses) >= maxAddresses {
			l.addresses = l.addresses[:len(l.addresses)-1]
		}
		l.addresses = append(l.addresses, address)
	}
	l.current = address
}

// moveOn makes the address after from current, unless another call moved already.
func (l *Leader) moveOn(from string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current != from {
		return
	}
	for i, a := range l.addresses {
		if a == from {
			l.current = l.addresses[(i+1)%len(l.addresses)]
			return
		}
	}
}

// leaderOf is the address a NOT_LEADER refusal names: ("", false) for any other error.
func leaderOf(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	code, _, info := errorInfo(err)
	if code != codes.Unavailable || info == nil || info.Reason != reasonNotLeader {
		return "", false
	}
	return info.Metadata[leaderAddress], true
}

// Invoke sends a unary call to the leader: once more to the address a NOT_LEADER names.
func (l *Leader) Invoke(ctx context.Context, method string, args, reply interface{}, opts ...grpc.CallOption) error {
	conn, at, err := l.conn()
	if err != nil {
		return err
	}
	err = conn.Invoke(ctx, method, args, reply, opts...)
	if err == nil {
		return nil
	}
	to, notLeader := leaderOf(err)
	if notLeader && to != "" && to != at {
		l.moveTo(to)
		l.mu.Lock()
		l.redirects = append(l.redirects, Redirect{Method: method, From: at, To: to})
		l.mu.Unlock()
		next, _, derr := l.conn()
		if derr != nil {
			return err // the refusal as it came: the caller retries later
		}
		if err = next.Invoke(ctx, method, args, reply, opts...); status.Code(err) == codes.Unavailable {
			l.moveOn(to)
		}
		return err
	}
	if status.Code(err) == codes.Unavailable {
		l.moveOn(at)
	}
	return err
}

// NewStream opens a stream on the current fleet: every fleet serves the watches.
func (l *Leader) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	conn, _, err := l.conn()
	if err != nil {
		return nil, err
	}
	return conn.NewStream(ctx, desc, method, opts...)
}

// fleetAddresses is the fleets a --fleet value names, as llmgw/clients/leader.py reads it:
// HOST:PORT entries separated by commas (each once, in order); a lone entry whose host is a
// name resolving to several addresses (a Kubernetes headless Service) stands for each of them.
// lookup is net.LookupHost, or a stand-in.
func fleetAddresses(spec string, lookup func(string) ([]string, error)) ([]string, error) {
	var entries []string
	seen := map[string]bool{}
	for _, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		if e == "" || seen[e] {
			continue
		}
		host, port, err := net.SplitHostPort(e)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("fleet address %q is not HOST:PORT", e)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, fmt.Errorf("fleet address %q is not HOST:PORT", e)
		}
		seen[e] = true
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("no fleet address given: HOST:PORT[,HOST:PORT...]")
	}
	if len(entries) > 1 {
		return entries, nil
	}
	host, port, _ := net.SplitHostPort(entries[0])
	if net.ParseIP(host) != nil {
		return entries, nil
	}
	ips, err := lookup(host)
	if err != nil || len(ips) < 2 {
		return entries, nil // one address (or none yet): grpc resolves the name itself
	}
	var out []string
	for _, ip := range ips {
		if at := net.JoinHostPort(ip, port); !seen[at] {
			seen[at] = true
			out = append(out, at)
		}
	}
	return out, nil
}
