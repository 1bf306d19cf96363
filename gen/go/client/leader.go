package client

// Finding the leading fleet, as a gateway given several fleet addresses does
// (docs/gateway.md, "Finding the leader").
//
// Fleets sharing one PostgreSQL elect one leader. A follower answers reads and watches, and
// refuses every change (and ListNodes, and the agents' Connect) with UNAVAILABLE, reason
// NOT_LEADER and the leader's address in metadata leader_address ("" during an election),
// having done nothing: the call may be sent again to that address at once.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

const (
	// maxAddresses bounds the addresses kept, given and sent to (as llmgw/clients/leader.py).
	maxAddresses = 16
	// MaxRetryDelay bounds the wait a RetryInfo may ask for: a server cannot park a caller
	// longer (the caller's deadline bounds it too).
	MaxRetryDelay = 10 * time.Second
)

// DialFunc opens a connection to one fleet without waiting for it (grpc.NewClient, with
// LeaderDialOptions among its options).
type DialFunc func(target string) (*grpc.ClientConn, error)

// Redirect is one call a follower sent on to the leader.
type Redirect struct {
	Method string `json:"method"`
	From   string `json:"from"`
	To     string `json:"to"`
}

// Leader is a grpc.ClientConnInterface (fleetv1.NewFleetServiceClient(leader)) that sends each
// call to the fleet it believes leads, among the addresses it was given and those it was sent
// to.
//
// A unary call goes to the current fleet. Told NOT_LEADER with an address, Leader dials that
// address (connections are kept by address), makes it current and sends the call there once
// more. Told UNAVAILABLE otherwise (an election, a fleet down, a store down), it moves to the
// next address and, when the call is safe to retry (the service config names its method and
// it is a read, or a write whose request_id is set), tries again after the config's backoff or
// the RetryInfo delay the server sent, whichever is longer (at most MaxRetryDelay), as long as
// the context allows. Streams (WatchReplicas, WatchRollout) open on the current fleet without
// redirection: every fleet serves them.
type Leader struct {
	mu        sync.Mutex
	dial      DialFunc
	policies  map[string]*RetryPolicy
	addresses []string
	conns     map[string]*grpc.ClientConn
	current   string
	redirects []Redirect
	retries   int
}

// NewLeader connects to the first of addresses that answers within connectTimeout each (or
// ctx's end), and calls there first. The retry policies are the published service config's.
func NewLeader(ctx context.Context, addresses []string, dial DialFunc, connectTimeout time.Duration) (*Leader, error) {
	if len(addresses) == 0 {
		return nil, fmt.Errorf("no fleet address given")
	}
	if len(addresses) > maxAddresses {
		addresses = addresses[:maxAddresses]
	}
	l := &Leader{dial: dial, policies: publishedPolicies, addresses: append([]string(nil), addresses...),
		conns: map[string]*grpc.ClientConn{}}
	var errs []string
	for _, at := range l.addresses {
		conn, err := dial(at)
		if err == nil {
			if err = Connected(ctx, conn, connectTimeout); err == nil {
				l.conns[at], l.current = conn, at
				return l, nil
			}
			conn.Close()
		}
		errs = append(errs, fmt.Sprintf("%s: %v", at, err))
	}
	return nil, fmt.Errorf("no fleet answered: %s", strings.Join(errs, "; "))
}

// Connected waits until conn is READY, fails (TRANSIENT_FAILURE) or the timeout passes.
func Connected(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("connection %s", s)
		}
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("not connected within %s (%s)", timeout, s)
		}
	}
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

// Retries is how many calls were tried again after an UNAVAILABLE (redirects not counted).
func (l *Leader) Retries() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.retries
}

// Close closes every connection it opened.
func (l *Leader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for at, c := range l.conns {
		c.Close()
		delete(l.conns, at)
	}
	return nil
}

// conn is the current fleet's connection (dialled now if it has none yet).
func (l *Leader) conn() (*grpc.ClientConn, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.conns[l.current]; ok {
		return c, l.current, nil
	}
	c, err := l.dial(l.current)
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

// LeaderOf is the address a NOT_LEADER refusal names: ("", false) for any other error.
func LeaderOf(err error) (string, bool) {
	e := Decode(err)
	if e == nil || e.Code != codes.Unavailable || e.Reason != ReasonNotLeader {
		return "", false
	}
	return e.Metadata[MetaLeaderAddress], true
}

// safeToRetry: a request with a request_id field (a fleet write) only when it is set; any
// other request is a read.
func safeToRetry(args any) bool {
	m, ok := args.(proto.Message)
	if !ok {
		return false
	}
	r := m.ProtoReflect()
	f := r.Descriptor().Fields().ByName("request_id")
	if f == nil {
		return true
	}
	return f.Kind() == protoreflect.StringKind && r.Get(f).String() != ""
}

// Invoke sends a unary call to the leader (see Leader).
func (l *Leader) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	policy := policyFor(l.policies, method)
	retry := policy != nil && safeToRetry(args)
	for attempt := 0; ; attempt++ {
		conn, at, err := l.conn()
		if err != nil {
			return err
		}
		err = conn.Invoke(ctx, method, args, reply, opts...)
		if err == nil {
			return nil
		}
		if to, notLeader := LeaderOf(err); notLeader && to != "" && to != at {
			l.moveTo(to)
			l.mu.Lock()
			l.redirects = append(l.redirects, Redirect{Method: method, From: at, To: to})
			l.mu.Unlock()
			next, _, derr := l.conn()
			if derr != nil {
				return err // the refusal as it came
			}
			if err = next.Invoke(ctx, method, args, reply, opts...); err == nil {
				return nil
			}
			at = to
		}
		e := Decode(err)
		if e.Code == codes.Unavailable {
			l.moveOn(at)
		}
		if !retry || !policy.Codes[e.Code] || attempt+1 >= policy.MaxAttempts {
			return err
		}
		wait := policy.Backoff(attempt)
		if e.HasRetryDelay {
			wait = max(wait, min(e.RetryDelay, MaxRetryDelay))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
		l.mu.Lock()
		l.retries++
		l.mu.Unlock()
	}
}

// NewStream opens a stream on the current fleet: every fleet serves the watches.
func (l *Leader) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	conn, _, err := l.conn()
	if err != nil {
		return nil, err
	}
	return conn.NewStream(ctx, desc, method, opts...)
}

// FleetAddresses is the fleets a --fleet value names, as llmgw/clients/leader.py reads it:
// HOST:PORT entries separated by commas (each once, in order); a lone entry whose host is a
// name resolving to several addresses (a Kubernetes headless Service) stands for each of
// them. lookup is net.LookupHost, or a stand-in.
func FleetAddresses(spec string, lookup func(string) ([]string, error)) ([]string, error) {
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
