package client

// Against live services: tests/integration/test_go_client_pkg.py starts a planner, two fleets
// on one PostgreSQL (a leader with a scripted agent, a follower) and a fleet whose planner is
// down, all over mutual TLS, and runs `go test -run TestLive` here with LLMGW_GO_LIVE naming a
// JSON file of their addresses and the certificate pairs. Without it these tests skip, saying
// so (`make go-test` runs the rest).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"

	commonv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/common/v1"
	fleetv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
	plannerv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/planner/v1"
)

type liveConfig struct {
	CA      string `json:"ca"`
	Cert    string `json:"cert"`
	Key     string `json:"key"`
	Planner string `json:"planner"`
	Fleets  string `json:"fleets"` // a dead address, the follower, the leader
	Leader  string `json:"leader"`
	// A fleet whose planner does not answer: its SetContext is UNAVAILABLE PLANNER_UNAVAILABLE.
	Orphaned string          `json:"orphaned"`
	Model    json.RawMessage `json:"model"`
}

func live(t *testing.T) (*liveConfig, credentials.TransportCredentials) {
	path := os.Getenv("LLMGW_GO_LIVE")
	if path == "" {
		t.Skip("LLMGW_GO_LIVE is not set: tests/integration/test_go_client_pkg.py runs this against live services")
	}
	raw, err := os.ReadFile(path)
	must(t, err)
	var cfg liveConfig
	must(t, json.Unmarshal(raw, &cfg))
	pem, err := os.ReadFile(cfg.CA)
	must(t, err)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", cfg.CA)
	}
	pair, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
	must(t, err)
	return &cfg, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12})
}

func leaderOver(t *testing.T, spec string, creds credentials.TransportCredentials) *Leader {
	addresses, err := FleetAddresses(spec, net.LookupHost)
	must(t, err)
	l, err := NewLeader(context.Background(), addresses, func(target string) (*grpc.ClientConn, error) {
		return grpc.NewClient(target, append(LeaderDialOptions(), grpc.WithTransportCredentials(creds))...)
	}, 5*time.Second)
	must(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLive(t *testing.T) {
	cfg, creds := live(t)
	model := &commonv1.Model{}
	must(t, protojson.Unmarshal(cfg.Model, model))
	l := leaderOver(t, cfg.Fleets, creds)
	fleet := fleetv1.NewFleetServiceClient(l)

	t.Run("writes reach the leader through the follower's NOT_LEADER", func(t *testing.T) {
		if l.Current() == cfg.Leader {
			t.Fatalf("the first fleet that answered is the leader: the list %s puts the follower first", cfg.Fleets)
		}
		ask := &fleetv1.CreateModelRequest{Model: model, RequestId: "go-pkg-create"}
		created, err := fleet.CreateModel(deadline(t), ask)
		must(t, err)
		again, err := fleet.CreateModel(deadline(t), ask)
		must(t, err)
		if created.Model.Revision != 1 || again.Model.Etag != created.Model.Etag {
			t.Fatalf("created revision %d etag %q, the retry %q", created.Model.Revision, created.Model.Etag, again.Model.Etag)
		}
		got := l.Redirects()
		if l.Current() != cfg.Leader || len(got) != 1 || got[0].To != cfg.Leader ||
			got[0].Method != "/llmgw.fleet.v1.FleetService/CreateModel" {
			t.Fatalf("calling %s after redirects %+v", l.Current(), got)
		}
	})

	t.Run("a follower's refusal decodes as NOT_LEADER with the leader and RetryInfo", func(t *testing.T) {
		addresses, _ := FleetAddresses(cfg.Fleets, net.LookupHost)
		follower := addresses[1]
		conn, err := Dial(follower, creds)
		must(t, err)
		defer conn.Close()
		_, err = fleetv1.NewFleetServiceClient(conn).DeleteModel(deadline(t), &fleetv1.DeleteModelRequest{Name: model.Name, RequestId: "go-pkg-direct"})
		e := Decode(err)
		if e == nil || e.Code != codes.Unavailable || e.Reason != ReasonNotLeader || e.Domain != "fleet.llmgw.dev" ||
			e.Metadata[MetaLeaderAddress] != cfg.Leader || e.Metadata[MetaLeader] == "" || !e.HasRetryDelay {
			t.Fatalf("the follower answered %+v", e)
		}
		_, err = fleet.GetModel(deadline(t), &fleetv1.GetModelRequest{Name: "no-such-model"})
		if e := Decode(err); e == nil || e.Code != codes.NotFound || e.Reason != ReasonModelNotFound {
			t.Fatalf("GetModel of no model answered %+v", e)
		}
	})

	t.Run("the planner over the published service config decodes its reasons", func(t *testing.T) {
		conn, err := Dial(cfg.Planner, creds)
		must(t, err)
		defer conn.Close()
		_, err = plannerv1.NewPlannerServiceClient(conn).SizeContext(deadline(t), &plannerv1.SizeContextRequest{Model: model, Tokens: 16})
		e := Decode(err)
		if e == nil || e.Code != codes.InvalidArgument || e.Reason != ReasonContextTooShort || e.Domain != "planner.llmgw.dev" ||
			e.Metadata["minimum"] == "" || e.HasRetryDelay {
			t.Fatalf("SizeContext at 16 tokens answered %+v", e)
		}
	})

	t.Run("the routing table resumes, and takes a snapshot after another epoch", func(t *testing.T) {
		tab := NewTable("")
		ready := func() bool {
			for _, ep := range tab.Endpoints(model.Name) {
				if ep.Address != "" && ep.Phase == fleetv1.ReplicaPhase_REPLICA_PHASE_READY {
					return true
				}
			}
			return false
		}
		watch := func(until func() bool, what string) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tab.Watch(ctx, fleet) }()
			for !(tab.Synced() && until()) {
				select {
				case <-tab.Changed():
				case err := <-done:
					t.Fatalf("%s: the watch ended: %v", what, err)
				}
			}
			cancel()
			<-done
		}
		watch(ready, "a ready endpoint of "+model.Name)
		seq, epoch := tab.Position()
		if seq == 0 || epoch == "" {
			t.Fatalf("position %d %q after SYNCED", seq, epoch)
		}
		// A second stream from the same position: the fleet resumes it.
		watch(func() bool { _, r, _ := tab.Counts(); return r == 1 }, "a resume")
		if !ready() {
			t.Fatalf("a resume lost the endpoint of %s", model.Name)
		}
		// Another epoch (a restarted fleet's): a fresh snapshot, which replaces a stale row.
		tab.SetPosition(seq, "another-epoch")
		tab.Upsert(&fleetv1.Endpoint{ReplicaId: "gone", Model: model.Name, Address: "127.0.0.1:1", Phase: fleetv1.ReplicaPhase_REPLICA_PHASE_READY})
		watch(func() bool { s, _, _ := tab.Counts(); return s == 2 }, "a snapshot")
		for _, ep := range tab.Endpoints(model.Name) {
			if ep.ReplicaId == "gone" {
				t.Fatal("the snapshot kept an endpoint the fleet never sent")
			}
		}
		if !ready() {
			t.Fatalf("the snapshot lacks the endpoint of %s", model.Name)
		}
	})

	t.Run("a write with a request id is retried after RetryInfo, one without is not", func(t *testing.T) {
		orphaned := leaderOver(t, cfg.Orphaned, creds)
		onIt := fleetv1.NewFleetServiceClient(orphaned)
		_, err := onIt.CreateModel(deadline(t), &fleetv1.CreateModelRequest{Model: model, RequestId: "go-pkg-orphan"})
		must(t, err)
		_, err = onIt.SetContext(deadline(t), &fleetv1.SetContextRequest{Name: model.Name, Tokens: 16384})
		if e := Decode(err); e.Reason != ReasonPlannerUnavailable || !e.HasRetryDelay || orphaned.Retries() != 0 {
			t.Fatalf("SetContext without a request id: %+v after %d retries", e, orphaned.Retries())
		}
		_, err = onIt.SetContext(deadline(t), &fleetv1.SetContextRequest{Name: model.Name, Tokens: 16384, RequestId: "go-pkg-ctx"})
		attempts := policyFor(publishedPolicies, "/llmgw.fleet.v1.FleetService/SetContext").MaxAttempts
		if e := Decode(err); e.Reason != ReasonPlannerUnavailable || orphaned.Retries() != attempts-1 {
			t.Fatalf("SetContext with a request id: %+v after %d retries, want %d", e, orphaned.Retries(), attempts-1)
		}
	})
}
