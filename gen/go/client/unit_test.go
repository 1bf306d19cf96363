package client

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	fleetv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
)

// TestFleetAddresses reads --fleet values as llmgw/clients/leader.py does.
func TestFleetAddresses(t *testing.T) {
	service := func(host string) ([]string, error) {
		switch host {
		case "fleet-instances":
			return []string{"10.0.0.7", "10.0.0.8", "fd00::9"}, nil
		case "one":
			return []string{"10.0.0.1"}, nil
		}
		return nil, errors.New("no such host")
	}
	for _, c := range []struct {
		spec string
		want []string
	}{
		{"a:1, b:2,a:1,", []string{"a:1", "b:2"}},
		{"fleet-instances:50052", []string{"10.0.0.7:50052", "10.0.0.8:50052", "[fd00::9]:50052"}},
		{"one:50052", []string{"one:50052"}},
		{"unknown:50052", []string{"unknown:50052"}},
		{"10.0.0.1:50052", []string{"10.0.0.1:50052"}},
		{"[::1]:50052", []string{"[::1]:50052"}},
	} {
		got, err := FleetAddresses(c.spec, service)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("FleetAddresses(%q) = %v, %v; want %v", c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"", " , ", "a", "a:", ":1", "a:port", "a:70000"} {
		if got, err := FleetAddresses(bad, service); err == nil {
			t.Errorf("FleetAddresses(%q) = %v, want an error", bad, got)
		}
	}
}

// TestPublishedPolicies: the published config retries reads and writes on UNAVAILABLE only,
// and the watches not at all (a stream is resumed by its caller, not replayed).
func TestPublishedPolicies(t *testing.T) {
	for _, m := range []string{
		"/llmgw.planner.v1.PlannerService/SizeContext", "/llmgw.fleet.v1.FleetService/ListModels",
		"/llmgw.fleet.v1.FleetService/CreateModel", "/llmgw.fleet.v1.FleetService/SetContext",
	} {
		p := policyFor(publishedPolicies, m)
		if p == nil || !p.Codes[codes.Unavailable] || len(p.Codes) != 1 || p.MaxAttempts != 3 {
			t.Errorf("%s: policy %+v", m, p)
		}
	}
	for _, m := range []string{"/llmgw.fleet.v1.FleetService/WatchReplicas", "/llmgw.fleet.v1.FleetService/WatchRollout", "/llmgw.agent.v1.AgentService/Connect"} {
		if p := policyFor(publishedPolicies, m); p != nil {
			t.Errorf("%s is retried: %+v", m, p)
		}
	}
	p := policyFor(publishedPolicies, "/llmgw.fleet.v1.FleetService/GetModel")
	if got := []time.Duration{p.Backoff(0), p.Backoff(1), p.Backoff(5)}; !reflect.DeepEqual(got,
		[]time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}) {
		t.Errorf("backoffs %v", got)
	}
	for _, bad := range []string{`{`, `{"methodConfig":[{"name":[{"service":"s"}],"retryPolicy":{"maxAttempts":1,"initialBackoff":"1s","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`,
		`{"methodConfig":[{"name":[{"service":"s"}],"retryPolicy":{"maxAttempts":2,"initialBackoff":"1","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`,
		`{"methodConfig":[{"name":[{"service":"s"}],"retryPolicy":{"maxAttempts":2,"initialBackoff":"1s","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["NOPE"]}}]}`} {
		if _, err := Policies(bad); err == nil {
			t.Errorf("Policies(%s) took it", bad)
		}
	}
}

// TestDecode reads ErrorInfo and RetryInfo from a status, and nothing from a bare one.
func TestDecode(t *testing.T) {
	st, err := status.New(codes.Unavailable, "not the leader").WithDetails(
		&errdetails.ErrorInfo{Reason: "NOT_LEADER", Domain: "fleet.llmgw.dev", Metadata: map[string]string{MetaLeaderAddress: "10.0.0.2:50052"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)},
	)
	if err != nil {
		t.Fatal(err)
	}
	e := Decode(st.Err())
	if e.Code != codes.Unavailable || e.Reason != ReasonNotLeader || e.Domain != "fleet.llmgw.dev" ||
		!e.HasRetryDelay || e.RetryDelay != 1500*time.Millisecond || status.Code(e) != codes.Unavailable {
		t.Errorf("Decode: %+v", e)
	}
	if at, ok := LeaderOf(st.Err()); !ok || at != "10.0.0.2:50052" {
		t.Errorf("LeaderOf: %q %v", at, ok)
	}
	bare := Decode(status.Error(codes.Unavailable, "connection refused"))
	if bare.Reason != "" || bare.HasRetryDelay {
		t.Errorf("a bare status decoded as %+v", bare)
	}
	if Decode(nil) != nil || ReasonOf(nil) != "" {
		t.Error("nil decoded")
	}
	// A negative delay (a hostile server) is no wait, not a negative one.
	neg, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(-time.Second)})
	if e := Decode(neg.Err()); !e.HasRetryDelay || e.RetryDelay != 0 {
		t.Errorf("a negative RetryInfo decoded as %v", e.RetryDelay)
	}
}

func event(kind fleetv1.WatchReplicasResponse_Kind, seq int64, id string, phase fleetv1.ReplicaPhase) *fleetv1.WatchReplicasResponse {
	ev := &fleetv1.WatchReplicasResponse{Kind: kind, Seq: seq, Epoch: "e1"}
	if id != "" {
		ev.Endpoint = &fleetv1.Endpoint{ReplicaId: id, Model: "m", Address: "127.0.0.1:9", Phase: phase}
	}
	return ev
}

func ids(t *Table) []string {
	var out []string
	for _, ep := range t.Endpoints("m") {
		out = append(out, ep.ReplicaId)
	}
	return out
}

// TestTableRules: held until SYNCED, a snapshot replaces, a resume applies, NOT_READY phases
// are dropped, a gap on an every-model stream asks for a snapshot.
func TestTableRules(t *testing.T) {
	const (
		added   = fleetv1.WatchReplicasResponse_KIND_ADDED
		removed = fleetv1.WatchReplicasResponse_KIND_REMOVED
		synced  = fleetv1.WatchReplicasResponse_KIND_SYNCED
		ready   = fleetv1.ReplicaPhase_REPLICA_PHASE_READY
	)
	tab := NewTable("")
	tab.Upsert(&fleetv1.Endpoint{ReplicaId: "stale", Model: "m", Address: "127.0.0.1:1", Phase: ready})
	tab.open()
	for _, ev := range []*fleetv1.WatchReplicasResponse{
		event(added, 5, "a", ready), event(added, 5, "b", fleetv1.ReplicaPhase_REPLICA_PHASE_STARTING), event(added, 5, "c", ready),
	} {
		if err := tab.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	if got := ids(tab); !reflect.DeepEqual(got, []string{"stale"}) || tab.Synced() {
		t.Fatalf("before SYNCED the table changed: %v", got)
	}
	must(t, tab.Apply(event(synced, 5, "", 0)))
	if got := ids(tab); !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Fatalf("after a snapshot: %v", got)
	}
	must(t, tab.Apply(event(removed, 6, "a", fleetv1.ReplicaPhase_REPLICA_PHASE_DRAINING)))
	if got := ids(tab); !reflect.DeepEqual(got, []string{"c"}) {
		t.Fatalf("after REMOVED: %v", got)
	}
	// A resume: the missed event is applied at SYNCED resumed=true, the rest kept.
	tab.open()
	must(t, tab.Apply(event(added, 7, "d", ready)))
	resume := event(synced, 7, "", 0)
	resume.Resumed = true
	must(t, tab.Apply(resume))
	if got := ids(tab); !reflect.DeepEqual(got, []string{"c", "d"}) {
		t.Fatalf("after a resume: %v", got)
	}
	if seq, epoch := tab.Position(); seq != 7 || epoch != "e1" {
		t.Fatalf("position %d %q", seq, epoch)
	}
	// seq 9 after 7: a gap.
	if err := tab.Apply(event(added, 9, "e", ready)); !errors.Is(err, errGap) {
		t.Fatalf("a gap answered %v", err)
	}
	if seq, _ := tab.Position(); seq != 0 {
		t.Fatalf("after a gap the next stream resumes from %d, not a snapshot", seq)
	}
	if s, r, g := tab.Counts(); s != 1 || r != 1 || g != 1 {
		t.Fatalf("counts %d %d %d", s, r, g)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestSafeToRetry: a fleet write only with its request id; a read always; not a message never.
func TestSafeToRetry(t *testing.T) {
	for _, c := range []struct {
		args any
		want bool
	}{
		{&fleetv1.SetContextRequest{Name: "m", Tokens: 8192}, false},
		{&fleetv1.SetContextRequest{Name: "m", Tokens: 8192, RequestId: "r1"}, true},
		{&fleetv1.DeleteModelRequest{Name: "m"}, false},
		{&fleetv1.GetModelRequest{Name: "m"}, true},
		{"not a message", false},
	} {
		if got := safeToRetry(c.args); got != c.want {
			t.Errorf("safeToRetry(%T %v) = %v", c.args, c.args, got)
		}
	}
}

// TestLeaderServiceConfig: a Leader's connections keep the load balancing and lose the retry
// policies (Leader runs them itself).
func TestLeaderServiceConfig(t *testing.T) {
	p, err := Policies(leaderServiceConfig)
	if err != nil || len(p) != 0 {
		t.Fatalf("the leader's config retries %v (%v)", p, err)
	}
	if !strings.Contains(leaderServiceConfig, `"round_robin"`) {
		t.Fatalf("the leader's config lost its load balancing: %s", leaderServiceConfig)
	}
}
