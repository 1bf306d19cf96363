// Command swarm runs N lean simulated node agents against one fleet or several, each a real
// AgentService.Connect stream, as bench/agent_fanin.py's LeanAgent does in Python: Hello with
// one card, heartbeats on the Welcome's interval, an Ack for every Desired, a HEALTHY report for
// every replica of a set at once and STOPPED for every replica that leaves it. Given several
// fleet addresses (-fleet A,B,C), agent i connects to address i mod their number, as
// bench/leader_agents.py's agents_over spreads them. Each address's streams are spread over
// connections of at most -per-conn streams each (an HTTP/2 peer caps concurrent streams per
// connection, commonly at 100); with -tls-dir every agent has a connection of its own and
// presents its node's certificate. With -max-joining K at most K agents are between opening
// their stream and their first Desired at once (the rest wait their turn), so that thousands of
// Connects do not reach a fleet in one burst.
//
// bench/agent_fanin.py and bench/fleet_spread.py (`--swarm go`) build and run it, so that the
// agents' CPU is a process of its own and not the bench's. For every Desired it answers it writes one JSON line to
// stdout: the agent's index, the set's version, whether the set holds a replica of -model,
// how many replicas the agent runs after it, and t_ns, CLOCK_MONOTONIC in nanoseconds right
// after the Ack was sent. CLOCK_MONOTONIC is the clock of Python's time.perf_counter and
// time.monotonic on Linux, so the bench subtracts its own stamps from t_ns. It runs until stdin
// closes or it is sent SIGTERM or SIGINT; a stream that ends before then (or fails to open) is
// logged to stderr, written to stdout as a line with "ended": true, and not opened again, as
// agent_fanin's Python agent does.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/agent/v1"
	commonv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/common/v1"
)

// cardBytes is one H100-80GB card's memory, as bench/agent_fanin.py's CARD_BYTES.
const cardBytes = 81559 << 20

// event is one answered Desired, a line on stdout.
type event struct {
	Agent   int   `json:"agent"`
	Version int64 `json:"version"`
	Watched bool  `json:"watched"`
	Running int   `json:"running"`
	TNs     int64 `json:"t_ns"`
	Ended   bool  `json:"ended,omitempty"` // the agent's stream ended (no Desired answered)
}

// monotonicNs is CLOCK_MONOTONIC in nanoseconds (time.Now's monotonic reading has no fixed
// origin another process could share).
func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		log.Fatalf("clock_gettime(CLOCK_MONOTONIC): %v", err)
	}
	return ts.Nano()
}

func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// spread is a stable number in [0, n) for a node: where in the interval its heartbeats fall and
// the port it reports (the Python agent uses hash(node) for both).
func spread(node string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(node))
	return h.Sum32() % n
}

// agent is one simulated node on a shared connection.
type agent struct {
	index  int
	node   string
	client agentv1.AgentServiceClient
	model  string
	events chan<- event
	// joining, when not nil, holds a token from before Connect until the first Desired (or
	// the stream's end): it caps how many agents are joining at once.
	joining chan struct{}

	mu      sync.Mutex // one Send in flight per stream (grpc-go streams allow one sender)
	stream  agentv1.AgentService_ConnectClient
	running map[string]*agentv1.ReplicaSpec
	joined  func() // gives the joining token back; nil without -max-joining
}

func (a *agent) send(msg *agentv1.ConnectRequest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// A stream the fleet ended takes no more; the receiving loop sees the end and stops.
	_ = a.stream.Send(msg)
}

func (a *agent) observed(spec *agentv1.ReplicaSpec, phase agentv1.ProcessPhase) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Update{Update: &agentv1.ReplicaUpdate{
		Replica: &agentv1.ObservedReplica{
			ReplicaId: spec.ReplicaId,
			Revision:  spec.Revision,
			Phase:     phase,
			Address:   fmt.Sprintf("127.0.0.1:%d", 20000+spread(a.node, 20000)),
			Gpus:      spec.Gpus,
			Model:     spec.Model,
		},
	}}}
}

// run says Hello, then answers until the stream ends.
func (a *agent) run(ctx context.Context) {
	if a.joining != nil {
		select {
		case a.joining <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var once sync.Once
		a.joined = func() { once.Do(func() { <-a.joining }) }
		defer a.joined()
	}
	stream, err := a.client.Connect(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Printf("%s: Connect: %v", a.node, err)
			a.events <- event{Agent: a.index, Ended: true, TNs: monotonicNs()}
		}
		return
	}
	a.stream = stream
	a.running = map[string]*agentv1.ReplicaSpec{}
	a.send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: a.node,
		Cards: []*commonv1.Card{{
			Index: 0, Uuid: a.node + "-gpu0", Model: "H100-80GB", MemoryTotalBytes: cardBytes,
		}},
		Engines:         []string{"vllm"},
		MemoryBytes:     64 << 30,
		MemoryFreeBytes: 64 << 30,
	}}})
	beating := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("%s: stream ended: %v", a.node, err)
				a.events <- event{Agent: a.index, Ended: true, TNs: monotonicNs()}
			}
			return
		}
		switch m := msg.Msg.(type) {
		case *agentv1.ConnectResponse_Welcome:
			if !beating {
				beating = true
				go a.beat(ctx, interval(m.Welcome))
			}
		case *agentv1.ConnectResponse_Desired:
			a.apply(m.Desired)
			if a.joined != nil {
				a.joined()
			}
		}
	}
}

// interval is the heartbeat interval a Welcome asks for (its milliseconds when given), as
// llmgw/testing/scripted_agent.py's welcome_interval_s reads it.
func interval(w *agentv1.Welcome) time.Duration {
	if w.HeartbeatIntervalMs > 0 {
		return time.Duration(w.HeartbeatIntervalMs) * time.Millisecond
	}
	return time.Duration(w.HeartbeatIntervalS) * time.Second
}

func (a *agent) apply(desired *agentv1.Desired) {
	a.send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Ack{Ack: &agentv1.Ack{Version: desired.Version}}})
	ackedNs := monotonicNs()
	wanted := make(map[string]*agentv1.ReplicaSpec, len(desired.Replicas))
	watched := false
	for _, spec := range desired.Replicas {
		wanted[spec.ReplicaId] = spec
		watched = watched || (a.model != "" && spec.Model == a.model)
	}
	for id, spec := range a.running {
		if _, ok := wanted[id]; !ok {
			delete(a.running, id)
			a.send(a.observed(spec, agentv1.ProcessPhase_PROCESS_PHASE_STOPPED))
		}
	}
	for _, spec := range desired.Replicas {
		if _, ok := a.running[spec.ReplicaId]; !ok {
			a.running[spec.ReplicaId] = spec
			a.send(a.observed(spec, agentv1.ProcessPhase_PROCESS_PHASE_HEALTHY))
		}
	}
	a.events <- event{Agent: a.index, Version: desired.Version, Watched: watched, Running: len(a.running), TNs: ackedNs}
}

// beat sends heartbeats every interval, starting at the node's own point of the first one so
// that N agents do not beat in step.
func (a *agent) beat(ctx context.Context, every time.Duration) {
	first := time.NewTimer(every * time.Duration(spread(a.node, 1000)) / 1000)
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for seq := int64(1); ; seq++ {
		a.send(&agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{Seq: seq}}})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// writeEvents writes each event as a JSON line, flushing whenever no more are waiting, so a
// burst of a thousand Acks is a few writes.
func writeEvents(events <-chan event, done chan<- struct{}) {
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	enc := json.NewEncoder(out)
	for ev := range events {
		if err := enc.Encode(ev); err != nil {
			log.Fatalf("stdout: %v", err)
		}
		if len(events) == 0 {
			if err := out.Flush(); err != nil {
				log.Fatalf("stdout: %v", err)
			}
		}
	}
	_ = out.Flush()
	close(done)
}

// connPlan is one connection: its address and the agents whose streams it carries.
type connPlan struct {
	address string
	agents  []int
}

// plan gives agent i to address i mod len(addresses) and groups each address's agents, in the
// order of their indexes, into connections of at most perConn streams.
func plan(agents int, addresses []string, perConn int) []connPlan {
	var out []connPlan
	for at, address := range addresses {
		for i := at; i < agents; i += len(addresses) {
			if n := len(out); n == 0 || out[n-1].address != address || len(out[n-1].agents) == perConn {
				out = append(out, connPlan{address: address})
			}
			out[len(out)-1].agents = append(out[len(out)-1].agents, i)
		}
	}
	return out
}

// nodeCredentials is mutual TLS with node's pair from dir (llmgw/certs.py's make_local_tls
// names them node-NAME.crt and node-NAME.key).
func nodeCredentials(roots *x509.CertPool, dir, node string) credentials.TransportCredentials {
	stem := filepath.Join(dir, "node-"+node)
	pair, err := tls.LoadX509KeyPair(stem+".crt", stem+".key")
	if err != nil {
		log.Fatalf("node %s's pair: %v", node, err)
	}
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12,
	})
}

func main() {
	fleet := flag.String("fleet", "", "the fleet's address, HOST:PORT, or several, comma-separated (agent i: the (i mod n)th)")
	agents := flag.Int("agents", 1, "how many agents (nodes node-0000, node-0001, ...)")
	perConn := flag.Int("per-conn", 50, "streams per connection (1: a connection per agent)")
	model := flag.String("model", "fan", "report whether each desired set holds a replica of this model")
	tlsCA := flag.String("tls-ca", "", "the fleet's CA certificate (mutual TLS, with -tls-dir)")
	maxJoining := flag.Int("max-joining", 0, "at most this many agents between Connect and their first Desired (0: no cap)")
	tlsDir := flag.String("tls-dir", "", "the folder of the nodes' pairs, node-NAME.crt/.key")
	flag.Parse()
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("swarm: ")
	addresses := strings.Split(*fleet, ",")
	if slices.Contains(addresses, "") || *agents < 1 || *perConn < 1 || *maxJoining < 0 || (*tlsCA == "") != (*tlsDir == "") {
		log.Fatal("give -fleet HOST:PORT[,HOST:PORT...], -agents >= 1, -per-conn >= 1, and -tls-ca with -tls-dir or neither")
	}
	var roots *x509.CertPool
	if *tlsCA != "" {
		pem, err := os.ReadFile(*tlsCA)
		if err != nil {
			log.Fatalf("the CA: %v", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			log.Fatalf("no certificate in %s", *tlsCA)
		}
		*perConn = 1 // a node's identity is its connection's certificate
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() { // the bench closing stdin (or going away) ends the run
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	events := make(chan event, 4096)
	written := make(chan struct{})
	go writeEvents(events, written)

	var joining chan struct{}
	if *maxJoining > 0 {
		joining = make(chan struct{}, *maxJoining)
	}
	var conns []*grpc.ClientConn
	var wg sync.WaitGroup
	for _, c := range plan(*agents, addresses, *perConn) {
		creds := insecure.NewCredentials()
		if roots != nil {
			creds = nodeCredentials(roots, *tlsDir, nodeName(c.agents[0]))
		}
		conn, err := grpc.NewClient(c.address, grpc.WithTransportCredentials(creds))
		if err != nil {
			log.Fatalf("dial %s: %v", c.address, err)
		}
		conns = append(conns, conn)
		client := agentv1.NewAgentServiceClient(conn)
		for _, i := range c.agents {
			a := &agent{index: i, node: nodeName(i), client: client, model: *model, events: events, joining: joining}
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.run(ctx)
			}()
		}
	}
	<-ctx.Done()
	for _, conn := range conns {
		_ = conn.Close()
	}
	wg.Wait()
	close(events)
	<-written
}
