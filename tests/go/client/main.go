// A gateway-shaped Go client of the planner and the fleet, a module of its own that requires
// gen/go by replace on the newest grpc-go (tests/integration/test_go_client.py builds and runs
// it). It calls every RPC of
// both services over mutual TLS, follows rollouts with WatchRollout, routes from
// WatchReplicas, and decodes google.rpc.ErrorInfo from every refusal it provokes. It writes
// one JSON object a line to stdout (what it saw, for the test to check) and exits 1 at the
// first thing that is not as a gateway expects.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"gitea.mynodes.xyz/ilker/llmgw/gen/go/client"
	commonv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/common/v1"
	fleetv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
	plannerv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/planner/v1"
)

// Pair is a certificate and its key, as files.
type Pair struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// Refusal is one request the services must refuse, and how.
type Refusal struct {
	Name     string            `json:"name"`
	Service  string            `json:"service"` // planner, fleet or dead_fleet
	As       string            `json:"as"`      // whose pair: admin, viewer, gateway
	Method   string            `json:"method"`
	Request  json.RawMessage   `json:"request"`
	Metadata map[string]string `json:"metadata"`
	Code     string            `json:"code"`
	Reason   string            `json:"reason"`
}

// Config is what the test gives: addresses, pairs, the models to work with, the refusals.
type Config struct {
	Planner    string          `json:"planner"`
	Fleet      string          `json:"fleet"`
	DeadFleet  string          `json:"dead_fleet"`
	CA         string          `json:"ca"`
	Pairs      map[string]Pair `json:"pairs"`
	Node       string          `json:"node"`
	Model      json.RawMessage `json:"model"`
	Stuck      json.RawMessage `json:"stuck_model"`
	Small      json.RawMessage `json:"small_model"`
	Neighbour  json.RawMessage `json:"neighbour_model"`
	Inventory  json.RawMessage `json:"inventory"`
	GGUFURL    string          `json:"gguf_url"`
	Refusals   []Refusal       `json:"refusals"`
	CallerMeta string          `json:"caller_key"`
	// The leader run (leader.go, followLeader): "leader" runs it instead of the rest.
	Scenario string `json:"scenario"`
	Fleets   string `json:"fleets"`   // every fleet, as --fleet names them: the follower first
	Follower string `json:"follower"` // where watches are read
	Leader   string `json:"leader"`   // what NOT_LEADER must name
}

var out = json.NewEncoder(os.Stdout)

func report(v map[string]interface{}) {
	if err := out.Encode(v); err != nil {
		panic(err)
	}
}

func fail(format string, args ...interface{}) {
	report(map[string]interface{}{"kind": "failure", "message": fmt.Sprintf(format, args...)})
	os.Exit(1)
}

func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

// called notes that an RPC answered (the test checks every RPC of both services is here).
func called(service, method string) {
	report(map[string]interface{}{"kind": "rpc", "service": service, "method": method})
}

func dial(cfg *Config, target, who string) *grpc.ClientConn {
	conn, err := dialTLS(cfg, target, who, true)
	must(err, "dial "+target+" as "+who)
	return conn
}

// dialTLS dials target over mutual TLS with who's pair: blocking until connected (or refused,
// or 20 s passed) when block is set, else connecting on the first call.
func dialTLS(cfg *Config, target, who string, block bool) (*grpc.ClientConn, error) {
	pem, err := os.ReadFile(cfg.CA)
	must(err, "read CA")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fail("no certificate in %s", cfg.CA)
	}
	pair, ok := cfg.Pairs[who]
	if !ok {
		fail("no pair %q", who)
	}
	cert, err := tls.LoadX509KeyPair(pair.Cert, pair.Key)
	must(err, "load pair "+who)
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      roots,
		MinVersion:   tls.VersionTLS12,
	})
	conn, err := grpc.NewClient(target, append(client.LeaderDialOptions(), grpc.WithTransportCredentials(creds))...)
	if err != nil || !block {
		return conn, err
	}
	if err := client.Connected(context.Background(), conn, 20*time.Second); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func deadline() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func unmarshal(raw json.RawMessage, m proto.Message, what string) {
	must(protojson.Unmarshal(raw, m), "decode "+what)
}

// errorInfo is a refusal as a gateway reads it (the client package's Decode): code, message,
// and google.rpc.ErrorInfo's reason, domain and metadata (nil without ErrorInfo).
func errorInfo(err error) (codes.Code, string, *client.Error) {
	e := client.Decode(err)
	if e.Reason == "" {
		return e.Code, e.Message, nil
	}
	return e.Code, e.Message, e
}

// refused checks that err is the refusal wanted and reports what it carried.
func refused(name string, err error, wantCode codes.Code, wantReason string) {
	if err == nil {
		fail("%s: answered OK, want %s %s", name, wantCode, wantReason)
	}
	code, message, info := errorInfo(err)
	if info == nil {
		fail("%s: %s %q carries no ErrorInfo", name, code, message)
	}
	if code != wantCode || info.Reason != client.Reason(wantReason) {
		fail("%s: got %s %s (%q), want %s %s", name, code, info.Reason, message, wantCode, wantReason)
	}
	if !strings.HasSuffix(info.Domain, ".llmgw.dev") {
		fail("%s: ErrorInfo domain %q", name, info.Domain)
	}
	report(map[string]interface{}{
		"kind": "refusal", "case": name, "code": code.String(), "reason": info.Reason,
		"domain": info.Domain, "metadata": info.Metadata, "message": message,
	})
}

// -- routing from WatchReplicas ---------------------------------------------------------

// Router keeps, per model, the endpoints WatchReplicas says are routable.
type Router struct {
	mu        sync.Mutex
	endpoints map[string]map[string]*fleetv1.Endpoint // model -> replica id -> endpoint
	synced    bool
	changed   chan struct{}
	minReady  map[string]int // lowest count seen per model since track() (after sync)
	err       error
}

func newRouter() *Router {
	return &Router{
		endpoints: map[string]map[string]*fleetv1.Endpoint{},
		changed:   make(chan struct{}, 1),
		minReady:  map[string]int{},
	}
}

func (r *Router) run(stream fleetv1.FleetService_WatchReplicasClient) {
	for {
		ev, err := stream.Recv()
		r.mu.Lock()
		if err != nil {
			r.err = err
			r.mu.Unlock()
			r.poke()
			return
		}
		switch ev.Kind {
		case fleetv1.WatchReplicasResponse_KIND_SYNCED:
			r.synced = true
		case fleetv1.WatchReplicasResponse_KIND_REMOVED:
			if ep := ev.Endpoint; ep != nil {
				delete(r.endpoints[ep.Model], ep.ReplicaId)
			}
		default:
			// ADDED, and any kind newer than this client that carries an endpoint: the
			// endpoint as given replaces what was known of that replica (upsert).
			if ep := ev.Endpoint; ep != nil {
				if r.endpoints[ep.Model] == nil {
					r.endpoints[ep.Model] = map[string]*fleetv1.Endpoint{}
				}
				r.endpoints[ep.Model][ep.ReplicaId] = ep
			}
		}
		if r.synced {
			for model, low := range r.minReady {
				if n := len(r.endpoints[model]); n < low {
					r.minReady[model] = n
				}
			}
		}
		r.mu.Unlock()
		r.poke()
	}
}

func (r *Router) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// track starts recording the fewest endpoints model has from now on.
func (r *Router) track(model string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.minReady[model] = len(r.endpoints[model])
}

func (r *Router) fewest(model string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.minReady[model]
}

// route is where a request for model goes now: the endpoints' addresses, sorted.
func (r *Router) route(model string) []*fleetv1.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	var eps []*fleetv1.Endpoint
	for _, ep := range r.endpoints[model] {
		eps = append(eps, ep)
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].ReplicaId < eps[j].ReplicaId })
	return eps
}

// await waits until ok holds of model's endpoints (bounded: convergence, not speed).
func (r *Router) await(model string, what string, ok func([]*fleetv1.Endpoint) bool) []*fleetv1.Endpoint {
	limit := time.After(60 * time.Second)
	for {
		r.mu.Lock()
		synced, err := r.synced, r.err
		r.mu.Unlock()
		if err != nil {
			fail("WatchReplicas ended: %v", err)
		}
		if eps := r.route(model); synced && ok(eps) {
			return eps
		}
		select {
		case <-r.changed:
		case <-limit:
			fail("routing: %s never held for %s (endpoints %v)", what, model, r.route(model))
		}
	}
}

// -- rollouts -------------------------------------------------------------------------------

// follow watches a rollout to its end, dropping the stream after its first event and resuming
// from the last seq received, as a gateway does after a reconnect. It returns the event kinds
// and the final state.
func follow(fleet fleetv1.FleetServiceClient, id string) ([]string, fleetv1.RolloutState) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var kinds []string
	var last int64
	state := fleetv1.RolloutState_ROLLOUT_STATE_UNSPECIFIED
	for attempt := 0; ; attempt++ {
		sctx, stop := context.WithCancel(ctx)
		stream, err := fleet.WatchRollout(sctx, &fleetv1.WatchRolloutRequest{Id: id, AfterSeq: last})
		must(err, "WatchRollout")
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				stop()
				return kinds, state
			}
			must(err, "WatchRollout recv")
			if ev.Seq != last+1 {
				fail("rollout %s: event seq %d after %d (resumed from %d)", id, ev.Seq, last, last)
			}
			if ev.RolloutId != id {
				fail("rollout %s: event of rollout %s", id, ev.RolloutId)
			}
			last = ev.Seq
			kinds = append(kinds, strings.ToLower(strings.TrimPrefix(ev.Kind.String(), "ROLLOUT_EVENT_KIND_")))
			state = ev.State
			if attempt == 0 {
				break // drop the stream after one event, resume from its seq
			}
		}
		stop()
	}
}

func terminal(s fleetv1.RolloutState) bool {
	return s == fleetv1.RolloutState_ROLLOUT_STATE_SUCCEEDED ||
		s == fleetv1.RolloutState_ROLLOUT_STATE_FAILED ||
		s == fleetv1.RolloutState_ROLLOUT_STATE_CANCELLED
}

func reportRollout(what string, r *fleetv1.Rollout, kinds []string, final fleetv1.RolloutState) {
	report(map[string]interface{}{
		"kind": "rollout", "what": what, "id": r.Id, "model": r.Model, "events": kinds,
		"state": final.String(), "from_revision": r.FromRevision, "to_revision": r.ToRevision,
	})
}

// -- the scenario ---------------------------------------------------------------------------

func main() {
	path := flag.String("config", "", "the test's JSON config")
	flag.Parse()
	raw, err := os.ReadFile(*path)
	must(err, "read config")
	var cfg Config
	must(json.Unmarshal(raw, &cfg), "decode config")
	if cfg.Scenario == "leader" {
		followLeader(&cfg)
		report(map[string]interface{}{"kind": "done"})
		return
	}

	plannerConn := dial(&cfg, cfg.Planner, "admin")
	fleetConn := dial(&cfg, cfg.Fleet, "admin")
	planner := plannerv1.NewPlannerServiceClient(plannerConn)
	fleet := fleetv1.NewFleetServiceClient(fleetConn)

	model := &commonv1.Model{}
	unmarshal(cfg.Model, model, "model")
	inventory := &commonv1.Inventory{}
	unmarshal(cfg.Inventory, inventory, "inventory")

	plannerCalls(planner, model, inventory, cfg.GGUFURL)
	catalogCalls(fleet, model)

	// Route from WatchReplicas (every model) for the rest of the run.
	router := newRouter()
	wctx, stopWatch := context.WithCancel(context.Background())
	watch, err := fleet.WatchReplicas(wctx, &fleetv1.WatchReplicasRequest{})
	must(err, "WatchReplicas")
	go router.run(watch)
	called("fleet", "WatchReplicas")

	first := router.await(model.Name, "one ready endpoint", func(eps []*fleetv1.Endpoint) bool {
		return len(eps) == 1 && eps[0].Address != ""
	})
	report(map[string]interface{}{"kind": "route", "model": model.Name, "addresses": addresses(first), "revision": first[0].Revision})
	nodesAndReplicas(fleet, model.Name, first)

	// A beside rollout of the card count: never fewer endpoints than before it started.
	router.track(model.Name)
	ctx, cancel := deadline()
	gpus, err := fleet.SetGPUs(ctx, &fleetv1.SetGPUsRequest{
		Name: model.Name, Gpus: 2, Strategy: fleetv1.Strategy_STRATEGY_BESIDE, RequestId: "go-gpus-1",
	})
	cancel()
	must(err, "SetGPUs")
	called("fleet", "SetGPUs")
	gpusRollout := getRollout(fleet, gpus.RolloutId)
	kinds, final := follow(fleet, gpus.RolloutId)
	called("fleet", "WatchRollout")
	reportRollout("gpus", gpusRollout, kinds, final)
	if final != fleetv1.RolloutState_ROLLOUT_STATE_SUCCEEDED {
		fail("SetGPUs rollout ended %s", final)
	}
	after := router.await(model.Name, "one endpoint of the new revision", func(eps []*fleetv1.Endpoint) bool {
		return len(eps) == 1 && eps[0].Revision == gpusRollout.ToRevision
	})
	report(map[string]interface{}{
		"kind": "route", "model": model.Name, "addresses": addresses(after),
		"revision": after[0].Revision, "fewest_during_rollout": router.fewest(model.Name),
	})
	if router.fewest(model.Name) < 1 {
		fail("a beside rollout left %s with no endpoint to route to", model.Name)
	}

	// A context rollout, then undo it (a dry run first).
	ctx, cancel = deadline()
	sc, err := fleet.SetContext(ctx, &fleetv1.SetContextRequest{Name: model.Name, Tokens: 16384, RequestId: "go-context-1"})
	cancel()
	must(err, "SetContext")
	called("fleet", "SetContext")
	if sc.Change.GetAfter() != 16384 {
		fail("SetContext change after = %d", sc.Change.GetAfter())
	}
	scRollout := getRollout(fleet, sc.RolloutId)
	kinds, final = follow(fleet, sc.RolloutId)
	reportRollout("context", scRollout, kinds, final)
	if final != fleetv1.RolloutState_ROLLOUT_STATE_SUCCEEDED {
		fail("SetContext rollout ended %s", final)
	}
	router.await(model.Name, "the context revision", func(eps []*fleetv1.Endpoint) bool {
		return len(eps) == 1 && eps[0].Revision == scRollout.ToRevision
	})
	ctx, cancel = deadline()
	dry, err := fleet.UndoRollout(ctx, &fleetv1.UndoRolloutRequest{Id: sc.RolloutId, DryRun: true})
	cancel()
	must(err, "UndoRollout dry run")
	if dry.Model.GetModel().GetContextLength() == 16384 {
		fail("UndoRollout dry run keeps the context it undoes")
	}
	ctx, cancel = deadline()
	undo, err := fleet.UndoRollout(ctx, &fleetv1.UndoRolloutRequest{Id: sc.RolloutId, RequestId: "go-undo-1"})
	cancel()
	must(err, "UndoRollout")
	called("fleet", "UndoRollout")
	kinds, final = follow(fleet, undo.Rollout.Id)
	reportRollout("undo", undo.Rollout, kinds, final)
	if final != fleetv1.RolloutState_ROLLOUT_STATE_SUCCEEDED || undo.Rollout.UndoOf != sc.RolloutId {
		fail("undo of %s: %s, undo_of %q", sc.RolloutId, final, undo.Rollout.UndoOf)
	}
	ctx, cancel = deadline()
	listed, err := fleet.ListRollouts(ctx, &fleetv1.ListRolloutsRequest{Model: model.Name})
	cancel()
	must(err, "ListRollouts")
	called("fleet", "ListRollouts")
	ids := map[string]bool{}
	for _, r := range listed.Rollouts {
		ids[r.Id] = r.Model == model.Name
	}
	if len(listed.Rollouts) == 0 || listed.Rollouts[0].Id != undo.Rollout.Id ||
		!ids[gpus.RolloutId] || !ids[sc.RolloutId] {
		fail("ListRollouts of %s: %v (newest first, with %s, %s and %s)", model.Name,
			listed.Rollouts, undo.Rollout.Id, sc.RolloutId, gpus.RolloutId)
	}

	canaryCalls(&cfg, fleet, undo.Rollout.Id, model.Name)
	statefulRefusals(&cfg, fleet, model.Name)
	for _, c := range cfg.Refusals {
		runRefusal(&cfg, c)
	}
	agentRefusals(&cfg)

	// The end of a model: its endpoints leave the routing table.
	ctx, cancel = deadline()
	got, err := fleet.GetModel(ctx, &fleetv1.GetModelRequest{Name: model.Name})
	cancel()
	must(err, "GetModel")
	ctx, cancel = deadline()
	_, err = fleet.DeleteModel(ctx, &fleetv1.DeleteModelRequest{Name: model.Name, Etag: got.Model.Etag, RequestId: "go-delete-1"})
	cancel()
	must(err, "DeleteModel")
	called("fleet", "DeleteModel")
	router.await(model.Name, "no endpoint after DeleteModel", func(eps []*fleetv1.Endpoint) bool { return len(eps) == 0 })
	stopWatch()
	report(map[string]interface{}{"kind": "done"})
}

func addresses(eps []*fleetv1.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.Address)
	}
	return out
}

func getRollout(fleet fleetv1.FleetServiceClient, id string) *fleetv1.Rollout {
	ctx, cancel := deadline()
	defer cancel()
	got, err := fleet.GetRollout(ctx, &fleetv1.GetRolloutRequest{Id: id})
	must(err, "GetRollout "+id)
	called("fleet", "GetRollout")
	if got.Rollout.Id != id {
		fail("GetRollout %s answered %s", id, got.Rollout.Id)
	}
	return got.Rollout
}

func plannerCalls(planner plannerv1.PlannerServiceClient, model *commonv1.Model, inventory *commonv1.Inventory, gguf string) {
	ctx, cancel := deadline()
	defer cancel()
	described, err := planner.DescribeModel(ctx, &plannerv1.DescribeModelRequest{Source: gguf})
	must(err, "DescribeModel")
	called("planner", "DescribeModel")
	if described.Shape.GetLayers() < 1 || described.Shape.GetFormat() != "gguf" {
		fail("DescribeModel: shape %v", described.Shape)
	}
	sized, err := planner.SizeContext(ctx, &plannerv1.SizeContextRequest{Model: model, Tokens: 8192, Inventory: inventory})
	must(err, "SizeContext")
	called("planner", "SizeContext")
	if sized.Change.GetAfter() != 8192 || len(sized.Change.GetProfiles()) != 1 ||
		sized.Change.Profiles[0].Memory.GetPerCardBytes() <= 0 {
		fail("SizeContext: %v", sized.Change)
	}
	planned, err := planner.PlanGPUs(ctx, &plannerv1.PlanGPUsRequest{Model: model, Gpus: 2, Inventory: inventory})
	must(err, "PlanGPUs")
	called("planner", "PlanGPUs")
	if planned.Change.GetGpus() != 2 || planned.Change.Profiles[0].Memory.GetCards() != 2 {
		fail("PlanGPUs: %v", planned.Change)
	}
	report(map[string]interface{}{
		"kind": "plan", "layers": described.Shape.GetLayers(),
		"per_card_bytes_8k": sized.Change.Profiles[0].Memory.GetPerCardBytes(),
		"cards":             planned.Change.Profiles[0].Memory.GetCards(),
	})
}

func catalogCalls(fleet fleetv1.FleetServiceClient, model *commonv1.Model) {
	ctx, cancel := deadline()
	defer cancel()
	created, err := fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: model, RequestId: "go-create-1"})
	must(err, "CreateModel")
	called("fleet", "CreateModel")
	// A retry with the same request id answers the first answer.
	again, err := fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: model, RequestId: "go-create-1"})
	must(err, "CreateModel retried")
	if again.Model.Revision != created.Model.Revision || again.Model.Etag != created.Model.Etag {
		fail("a retried CreateModel answered revision %d, first %d", again.Model.Revision, created.Model.Revision)
	}
	got, err := fleet.GetModel(ctx, &fleetv1.GetModelRequest{Name: model.Name})
	must(err, "GetModel")
	called("fleet", "GetModel")
	if got.Model.Model.Name != model.Name || got.Model.Etag == "" {
		fail("GetModel: %v", got.Model)
	}
	all, err := fleet.ListModels(ctx, &fleetv1.ListModelsRequest{})
	must(err, "ListModels")
	called("fleet", "ListModels")
	found := false
	for _, m := range all.Models {
		found = found || m.Model.Name == model.Name
	}
	if !found {
		fail("ListModels lacks %s", model.Name)
	}
	changed := proto.Clone(model).(*commonv1.Model)
	changed.MaxOutput = model.MaxOutput + 1
	updated, err := fleet.UpdateModel(ctx, &fleetv1.UpdateModelRequest{Model: changed, Etag: got.Model.Etag, RequestId: "go-update-1"})
	must(err, "UpdateModel")
	called("fleet", "UpdateModel")
	if updated.Model.Model.MaxOutput != changed.MaxOutput || updated.Model.Etag == got.Model.Etag {
		fail("UpdateModel: %v (etag before %q)", updated.Model, got.Model.Etag)
	}
	revs, err := fleet.ListModelRevisions(ctx, &fleetv1.ListModelRevisionsRequest{Name: model.Name})
	must(err, "ListModelRevisions")
	called("fleet", "ListModelRevisions")
	if len(revs.Revisions) != 2 || revs.Revisions[1].Model.MaxOutput != changed.MaxOutput {
		fail("ListModelRevisions: %d revisions", len(revs.Revisions))
	}
	// STALE_REVISION: the etag read before the update.
	_, err = fleet.UpdateModel(ctx, &fleetv1.UpdateModelRequest{Model: model, Etag: got.Model.Etag, RequestId: "go-update-stale"})
	refused("UpdateModel with the etag before the last update", err, codes.Aborted, "STALE_REVISION")
	// MODEL_EXISTS: the same model again, as a new request.
	_, err = fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: model, RequestId: "go-create-2"})
	refused("CreateModel of a model in the catalog", err, codes.AlreadyExists, "MODEL_EXISTS")
	// REQUEST_ID_REUSED: CreateModel's request id on another method.
	_, err = fleet.DeleteModel(ctx, &fleetv1.DeleteModelRequest{Name: model.Name, RequestId: "go-create-1"})
	refused("DeleteModel with CreateModel's request id", err, codes.AlreadyExists, "REQUEST_ID_REUSED")
}

func nodesAndReplicas(fleet fleetv1.FleetServiceClient, name string, route []*fleetv1.Endpoint) {
	ctx, cancel := deadline()
	defer cancel()
	nodes, err := fleet.ListNodes(ctx, &fleetv1.ListNodesRequest{})
	must(err, "ListNodes")
	called("fleet", "ListNodes")
	var seen []string
	for _, n := range nodes.Nodes {
		if n.Phase != fleetv1.NodePhase_NODE_PHASE_READY || len(n.Cards) == 0 || n.Cards[0].MemoryTotalBytes <= 0 {
			fail("ListNodes: node %s is %s with %d cards", n.Name, n.Phase, len(n.Cards))
		}
		seen = append(seen, fmt.Sprintf("%s:%d", n.Name, len(n.Cards)))
	}
	replicas, err := fleet.ListReplicas(ctx, &fleetv1.ListReplicasRequest{Model: name})
	must(err, "ListReplicas")
	called("fleet", "ListReplicas")
	ready := 0
	for _, r := range replicas.Replicas {
		if r.Phase == fleetv1.ReplicaPhase_REPLICA_PHASE_READY {
			ready++
			if r.Id != route[0].ReplicaId || r.Address != route[0].Address {
				fail("ListReplicas' ready %s at %s, routed %s at %s", r.Id, r.Address, route[0].ReplicaId, route[0].Address)
			}
		}
	}
	if ready != 1 {
		fail("ListReplicas: %d ready replicas of %s", ready, name)
	}
	report(map[string]interface{}{"kind": "nodes", "nodes": seen})
}

// statefulRefusals provokes the refusals that need a state: a rollout in flight, a node too
// small to start a replica beside the old one.
func statefulRefusals(cfg *Config, fleet fleetv1.FleetServiceClient, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stuck := &commonv1.Model{}
	unmarshal(cfg.Stuck, stuck, "stuck model")
	_, err := fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: stuck, RequestId: "go-create-stuck"})
	must(err, "CreateModel stuck")
	// The agent keeps the stuck model's new revisions STARTING: its rollout stays RUNNING.
	started, err := fleet.SetGPUs(ctx, &fleetv1.SetGPUsRequest{Name: stuck.Name, Gpus: 2, Strategy: fleetv1.Strategy_STRATEGY_IN_PLACE})
	must(err, "SetGPUs stuck")
	_, err = fleet.SetGPUs(ctx, &fleetv1.SetGPUsRequest{Name: stuck.Name, Gpus: 1})
	refused("SetGPUs while a rollout runs", err, codes.Aborted, "ROLLOUT_IN_PROGRESS")
	_, err = fleet.UndoRollout(ctx, &fleetv1.UndoRolloutRequest{Id: started.RolloutId})
	refused("UndoRollout of a running rollout", err, codes.FailedPrecondition, "CANNOT_UNDO")
	cancelled, err := fleet.CancelRollout(ctx, &fleetv1.CancelRolloutRequest{Id: started.RolloutId, RequestId: "go-cancel-1"})
	must(err, "CancelRollout")
	called("fleet", "CancelRollout")
	kinds, final := follow(fleet, started.RolloutId)
	reportRollout("cancelled", cancelled.Rollout, kinds, final)
	if final != fleetv1.RolloutState_ROLLOUT_STATE_CANCELLED {
		fail("a cancelled rollout ended %s", final)
	}

	small := &commonv1.Model{}
	unmarshal(cfg.Small, small, "small model")
	_, err = fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: small, RequestId: "go-create-small"})
	must(err, "CreateModel small")
	waitReady(fleet, small.Name)
	_, err = fleet.SetGPUs(ctx, &fleetv1.SetGPUsRequest{Name: small.Name, Gpus: 2, Strategy: fleetv1.Strategy_STRATEGY_BESIDE})
	refused("SetGPUs beside on a node with no room beside", err, codes.FailedPrecondition, "NO_ROOM_BESIDE")

	// With a neighbour holding the L4 node's other card, go-small can never have two cards
	// there, even with its own replica stopped: refused before anything stops.
	neighbour := &commonv1.Model{}
	unmarshal(cfg.Neighbour, neighbour, "neighbour model")
	_, err = fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: neighbour, RequestId: "go-create-neighbour"})
	must(err, "CreateModel neighbour")
	waitReady(fleet, neighbour.Name)
	_, err = fleet.SetGPUs(ctx, &fleetv1.SetGPUsRequest{Name: small.Name, Gpus: 2, Strategy: fleetv1.Strategy_STRATEGY_IN_PLACE})
	refused("SetGPUs in place where no node could ever free the cards", err, codes.FailedPrecondition, "NO_ROOM_IN_PLACE")
}

func waitReady(fleet fleetv1.FleetServiceClient, name string) {
	limit := time.Now().Add(60 * time.Second)
	for time.Now().Before(limit) {
		ctx, cancel := deadline()
		replicas, err := fleet.ListReplicas(ctx, &fleetv1.ListReplicasRequest{Model: name})
		cancel()
		must(err, "ListReplicas "+name)
		for _, r := range replicas.Replicas {
			if r.Phase == fleetv1.ReplicaPhase_REPLICA_PHASE_READY {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	fail("%s never had a ready replica", name)
}

// -- refusals the test lists -----------------------------------------------------------------

type invoke func(ctx context.Context, conn *grpc.ClientConn, raw json.RawMessage) error

func unary[Req proto.Message, Resp any](newReq func() Req, method func(*grpc.ClientConn) func(context.Context, Req, ...grpc.CallOption) (Resp, error)) invoke {
	return func(ctx context.Context, conn *grpc.ClientConn, raw json.RawMessage) error {
		req := newReq()
		unmarshal(raw, req, "request")
		_, err := method(conn)(ctx, req)
		return err
	}
}

// streamed reads a server stream to its end: a refusal arrives as the stream's status.
func streamed[Req proto.Message, S interface{ RecvMsg(interface{}) error }](newReq func() Req, method func(*grpc.ClientConn) func(context.Context, Req, ...grpc.CallOption) (S, error), newResp func() proto.Message) invoke {
	return func(ctx context.Context, conn *grpc.ClientConn, raw json.RawMessage) error {
		req := newReq()
		unmarshal(raw, req, "request")
		stream, err := method(conn)(ctx, req)
		if err != nil {
			return err
		}
		for {
			if err := stream.RecvMsg(newResp()); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
}

func fleetOf(conn *grpc.ClientConn) fleetv1.FleetServiceClient {
	return fleetv1.NewFleetServiceClient(conn)
}
func plannerOf(conn *grpc.ClientConn) plannerv1.PlannerServiceClient {
	return plannerv1.NewPlannerServiceClient(conn)
}

var methods = map[string]invoke{
	"planner.SizeContext": unary(func() *plannerv1.SizeContextRequest { return &plannerv1.SizeContextRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *plannerv1.SizeContextRequest, ...grpc.CallOption) (*plannerv1.SizeContextResponse, error) {
			return plannerOf(c).SizeContext
		}),
	"planner.PlanGPUs": unary(func() *plannerv1.PlanGPUsRequest { return &plannerv1.PlanGPUsRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *plannerv1.PlanGPUsRequest, ...grpc.CallOption) (*plannerv1.PlanGPUsResponse, error) {
			return plannerOf(c).PlanGPUs
		}),
	"planner.DescribeModel": unary(func() *plannerv1.DescribeModelRequest { return &plannerv1.DescribeModelRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *plannerv1.DescribeModelRequest, ...grpc.CallOption) (*plannerv1.DescribeModelResponse, error) {
			return plannerOf(c).DescribeModel
		}),
	"fleet.CreateModel": unary(func() *fleetv1.CreateModelRequest { return &fleetv1.CreateModelRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.CreateModelRequest, ...grpc.CallOption) (*fleetv1.CreateModelResponse, error) {
			return fleetOf(c).CreateModel
		}),
	"fleet.GetModel": unary(func() *fleetv1.GetModelRequest { return &fleetv1.GetModelRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.GetModelRequest, ...grpc.CallOption) (*fleetv1.GetModelResponse, error) {
			return fleetOf(c).GetModel
		}),
	"fleet.UpdateModel": unary(func() *fleetv1.UpdateModelRequest { return &fleetv1.UpdateModelRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.UpdateModelRequest, ...grpc.CallOption) (*fleetv1.UpdateModelResponse, error) {
			return fleetOf(c).UpdateModel
		}),
	"fleet.DeleteModel": unary(func() *fleetv1.DeleteModelRequest { return &fleetv1.DeleteModelRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.DeleteModelRequest, ...grpc.CallOption) (*fleetv1.DeleteModelResponse, error) {
			return fleetOf(c).DeleteModel
		}),
	"fleet.ListModels": unary(func() *fleetv1.ListModelsRequest { return &fleetv1.ListModelsRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.ListModelsRequest, ...grpc.CallOption) (*fleetv1.ListModelsResponse, error) {
			return fleetOf(c).ListModels
		}),
	"fleet.SetContext": unary(func() *fleetv1.SetContextRequest { return &fleetv1.SetContextRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.SetContextRequest, ...grpc.CallOption) (*fleetv1.SetContextResponse, error) {
			return fleetOf(c).SetContext
		}),
	"fleet.SetGPUs": unary(func() *fleetv1.SetGPUsRequest { return &fleetv1.SetGPUsRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.SetGPUsRequest, ...grpc.CallOption) (*fleetv1.SetGPUsResponse, error) {
			return fleetOf(c).SetGPUs
		}),
	"fleet.GetRollout": unary(func() *fleetv1.GetRolloutRequest { return &fleetv1.GetRolloutRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.GetRolloutRequest, ...grpc.CallOption) (*fleetv1.GetRolloutResponse, error) {
			return fleetOf(c).GetRollout
		}),
	"fleet.CancelRollout": unary(func() *fleetv1.CancelRolloutRequest { return &fleetv1.CancelRolloutRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.CancelRolloutRequest, ...grpc.CallOption) (*fleetv1.CancelRolloutResponse, error) {
			return fleetOf(c).CancelRollout
		}),
	"fleet.UndoRollout": unary(func() *fleetv1.UndoRolloutRequest { return &fleetv1.UndoRolloutRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.UndoRolloutRequest, ...grpc.CallOption) (*fleetv1.UndoRolloutResponse, error) {
			return fleetOf(c).UndoRollout
		}),
	"fleet.WatchRollout": streamed(func() *fleetv1.WatchRolloutRequest { return &fleetv1.WatchRolloutRequest{} },
		func(c *grpc.ClientConn) func(context.Context, *fleetv1.WatchRolloutRequest, ...grpc.CallOption) (fleetv1.FleetService_WatchRolloutClient, error) {
			return fleetOf(c).WatchRollout
		}, func() proto.Message { return &fleetv1.WatchRolloutResponse{} }),
}

func runRefusal(cfg *Config, c Refusal) {
	target := map[string]string{"planner": cfg.Planner, "fleet": cfg.Fleet, "dead_fleet": cfg.DeadFleet}[c.Service]
	if target == "" {
		fail("%s: no service %q", c.Name, c.Service)
	}
	call, ok := methods[c.Service+"."+c.Method]
	if !ok {
		call, ok = methods[strings.TrimPrefix(c.Service, "dead_")+"."+c.Method]
	}
	if !ok {
		fail("%s: no method %s.%s", c.Name, c.Service, c.Method)
	}
	conn := dial(cfg, target, c.As)
	defer conn.Close()
	ctx, cancel := deadline()
	defer cancel()
	if len(c.Metadata) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.Metadata))
	}
	code, ok := codeByName[c.Code]
	if !ok {
		fail("%s: unknown code %q", c.Name, c.Code)
	}
	refused(c.Name, call(ctx, conn, c.Request), code, c.Reason)
}

var codeByName = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[strings.ToUpper(snake(c.String()))] = c
	}
	return m
}()

// snake turns grpc-go's code names (FailedPrecondition) into the canonical ones
// (FAILED_PRECONDITION).
func snake(s string) string {
	var b strings.Builder
	prev := rune(0)
	for _, r := range s {
		if prev >= 'a' && prev <= 'z' && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
		prev = r
	}
	return b.String()
}

// canaryCalls promotes a rollout that is no canary (NOT_CANARY) and reports traffic as the
// gateway identity (a repeat of the same interval is a duplicate) and as the admin, which is
// not a gateway (ROLE_REQUIRED).
func canaryCalls(cfg *Config, fleet fleetv1.FleetServiceClient, rolloutID, model string) {
	ctx, cancel := deadline()
	_, err := fleet.PromoteRollout(ctx, &fleetv1.PromoteRolloutRequest{Id: rolloutID, RequestId: "go-promote-1"})
	cancel()
	called("fleet", "PromoteRollout")
	refused("PromoteRollout of a rollout that is no canary", err, codes.FailedPrecondition, "NOT_CANARY")

	gwConn := dial(cfg, cfg.Fleet, "gateway")
	defer gwConn.Close()
	gateway := fleetv1.NewFleetServiceClient(gwConn)
	traffic := &fleetv1.ReportTrafficRequest{
		Gateway:       "go-gateway",
		IntervalStart: timestamppb.Now(),
		IntervalS:     10,
		Endpoints: []*fleetv1.EndpointTraffic{{
			ReplicaId: "r-go", Model: model, Revision: 1, Requests: 10, Errors_5Xx: 1,
			Ttft: &fleetv1.LatencyHistogram{UpperBoundsMs: []float64{50, 100}, Counts: []int64{8, 2, 0}},
		}},
	}
	ctx, cancel = deadline()
	first, err := gateway.ReportTraffic(ctx, traffic)
	cancel()
	must(err, "ReportTraffic")
	called("fleet", "ReportTraffic")
	ctx, cancel = deadline()
	again, err := gateway.ReportTraffic(ctx, traffic)
	cancel()
	must(err, "ReportTraffic again")
	if first.Duplicate || !again.Duplicate {
		fail("ReportTraffic: first duplicate=%v, repeat duplicate=%v", first.Duplicate, again.Duplicate)
	}
	ctx, cancel = deadline()
	_, err = fleet.ReportTraffic(ctx, traffic)
	cancel()
	refused("ReportTraffic by an identity not listed as a gateway", err, codes.PermissionDenied, "ROLE_REQUIRED")
}
