package client

// The routing table a gateway keeps from WatchReplicas (docs/gateway.md, "The routing loop").

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	fleetv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
)

// errGap is a change whose seq is not the one after the last: an event was lost, so the
// table asks for a fresh snapshot.
var errGap = errors.New("WatchReplicas skipped a sequence number")

// Table holds the routable endpoints of one model (or every model) from WatchReplicas.
//
// Events of a stream are held until its SYNCED: a fresh snapshot (SYNCED resumed=false)
// replaces the table with them, a resume (resumed=true) applies them to it. ADDED and UPDATED
// upsert by replica id, REMOVED deletes; an endpoint whose phase is not READY is dropped, not
// routed. The last seq and epoch received are where the next stream resumes; a change on an
// every-model stream whose seq skips one is a gap, answered by a fresh snapshot (the stream is
// opened again from 0). Until the first SYNCED the table routes nothing.
type Table struct {
	mu        sync.Mutex
	model     string
	endpoints map[string]*fleetv1.Endpoint
	held      []*fleetv1.WatchReplicasResponse // this stream's events before its SYNCED
	holding   bool
	seq       int64
	epoch     string
	synced    bool
	snapshots int
	resumes   int
	gaps      int
	changed   chan struct{}
}

// NewTable is an empty table of model ("" for every model).
func NewTable(model string) *Table {
	return &Table{model: model, endpoints: map[string]*fleetv1.Endpoint{}, changed: make(chan struct{}, 1)}
}

// Position is where the next stream resumes: the last seq received and its epoch.
func (t *Table) Position() (int64, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq, t.epoch
}

// SetPosition makes the next stream resume after seq of epoch (a gateway restoring what it
// saved).
func (t *Table) SetPosition(seq int64, epoch string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq, t.epoch = seq, epoch
}

// Counts are the SYNCEDs that were fresh snapshots, those that were resumes, and the gaps
// seen.
func (t *Table) Counts() (snapshots, resumes, gaps int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.snapshots, t.resumes, t.gaps
}

// Synced says whether a stream's SYNCED has arrived: the table is then complete.
func (t *Table) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced
}

// Changed is signalled (without blocking, coalesced) after each event that changed the table.
func (t *Table) Changed() <-chan struct{} { return t.changed }

// Endpoints is where a request for model goes now, ordered by replica id.
func (t *Table) Endpoints(model string) []*fleetv1.Endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fleetv1.Endpoint
	for _, ep := range t.endpoints {
		if ep.GetModel() == model {
			out = append(out, ep)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetReplicaId() < out[j].GetReplicaId() })
	return out
}

// Upsert puts an endpoint into the table as if ADDED (a gateway restoring a saved table
// before it resumes).
func (t *Table) Upsert(ep *fleetv1.Endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	applyTo(t.endpoints, &fleetv1.WatchReplicasResponse{Kind: fleetv1.WatchReplicasResponse_KIND_ADDED, Endpoint: ep})
}

// open starts a new stream: its events are held until its SYNCED.
func (t *Table) open() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held, t.holding = nil, true
}

// Apply takes one event of the current stream. It returns errGap when the stream must be
// opened again from a fresh snapshot.
func (t *Table) Apply(ev *fleetv1.WatchReplicasResponse) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	change := ev.GetKind() == fleetv1.WatchReplicasResponse_KIND_ADDED ||
		ev.GetKind() == fleetv1.WatchReplicasResponse_KIND_UPDATED ||
		ev.GetKind() == fleetv1.WatchReplicasResponse_KIND_REMOVED
	if !t.holding && change && t.model == "" && ev.GetEpoch() == t.epoch && ev.GetSeq() != t.seq+1 {
		t.gaps++
		err := fmt.Errorf("%w: %d after %d", errGap, ev.GetSeq(), t.seq)
		t.seq, t.epoch = 0, ""
		return err
	}
	if ev.GetSeq() != 0 {
		t.seq, t.epoch = ev.GetSeq(), ev.GetEpoch()
	}
	if t.holding {
		if ev.GetKind() != fleetv1.WatchReplicasResponse_KIND_SYNCED {
			if change {
				t.held = append(t.held, ev)
			}
			return nil
		}
		target := t.endpoints
		if ev.GetResumed() {
			t.resumes++
		} else {
			t.snapshots++
			target = map[string]*fleetv1.Endpoint{}
		}
		for _, h := range t.held {
			applyTo(target, h)
		}
		t.endpoints, t.held, t.holding, t.synced = target, nil, false, true
		t.poke()
		return nil
	}
	if change {
		applyTo(t.endpoints, ev)
		t.poke()
	}
	return nil
}

func applyTo(table map[string]*fleetv1.Endpoint, ev *fleetv1.WatchReplicasResponse) {
	ep := ev.GetEndpoint()
	if ep == nil || ep.GetReplicaId() == "" {
		return
	}
	if ev.GetKind() == fleetv1.WatchReplicasResponse_KIND_REMOVED ||
		ep.GetPhase() != fleetv1.ReplicaPhase_REPLICA_PHASE_READY || ep.GetAddress() == "" {
		delete(table, ep.GetReplicaId())
		return
	}
	table[ep.GetReplicaId()] = ep
}

func (t *Table) poke() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Watch keeps the table from fleet's WatchReplicas until ctx ends: each stream resumes from
// Position; a stream that ends or fails is opened again after a backoff (0.1 s, doubling to
// 2 s, reset by each SYNCED). It returns ctx's error, or the refusal of a stream that cannot
// succeed by trying again (MODEL_NOT_FOUND, PERMISSION_DENIED, ...).
func (t *Table) Watch(ctx context.Context, fleet fleetv1.FleetServiceClient) error {
	backoff := 100 * time.Millisecond
	for {
		seq, epoch := t.Position()
		t.open()
		stream, err := fleet.WatchReplicas(ctx, &fleetv1.WatchReplicasRequest{Model: t.model, AfterSeq: seq, Epoch: epoch})
		for err == nil {
			var ev *fleetv1.WatchReplicasResponse
			if ev, err = stream.Recv(); err == nil {
				err = t.Apply(ev)
				if ev.GetKind() == fleetv1.WatchReplicasResponse_KIND_SYNCED {
					backoff = 100 * time.Millisecond
				}
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, errGap) {
			switch Decode(err).Code {
			case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown,
				codes.DeadlineExceeded, codes.Canceled, codes.OK:
			default:
				return err
			}
		}
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
