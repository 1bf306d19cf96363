package main

// The leader run: two fleets on one PostgreSQL, the client given every address with the
// follower first. It decodes the follower's NOT_LEADER refusals, makes changes through a
// client.Leader (gen/go/client) that the follower sends on to the leader, and routes from a
// WatchReplicas stream and follows the rollout with WatchRollout on the follower.

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"gitea.mynodes.xyz/ilker/llmgw/gen/go/client"
	agentv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/agent/v1"
	commonv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/common/v1"
	fleetv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
)

// notLeaderNames checks a NOT_LEADER refusal names the leader the test started.
func notLeaderNames(cfg *Config, name string, err error) {
	refused(name, err, codes.Unavailable, string(client.ReasonNotLeader))
	_, _, info := errorInfo(err)
	if info.Metadata[client.MetaLeaderAddress] != cfg.Leader || info.Metadata["leader"] == "" {
		fail("%s: NOT_LEADER names %q at %q, want the leader at %s", name,
			info.Metadata["leader"], info.Metadata[client.MetaLeaderAddress], cfg.Leader)
	}
}

func reportRedirects(gateway string, l *client.Leader) {
	report(map[string]interface{}{
		"kind": "redirects", "gateway": gateway, "redirects": l.Redirects(), "current": l.Current(),
	})
}

func gatewayOn(cfg *Config) *client.Leader {
	fleets, err := client.FleetAddresses(cfg.Fleets, net.LookupHost)
	must(err, "the fleets")
	l, err := client.NewLeader(context.Background(), fleets, func(target string) (*grpc.ClientConn, error) {
		return dialTLS(cfg, target, "admin", false)
	}, 20*time.Second)
	must(err, "find the leader among "+cfg.Follower)
	return l
}

func followLeader(cfg *Config) {
	model := &commonv1.Model{}
	unmarshal(cfg.Model, model, "model")

	// What the follower answers a change and ListNodes.
	followerConn := dial(cfg, cfg.Follower, "admin")
	defer followerConn.Close()
	onFollower := fleetv1.NewFleetServiceClient(followerConn)
	ctx, cancel := deadline()
	_, err := onFollower.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: model, RequestId: "go-led-direct"})
	notLeaderNames(cfg, "CreateModel on a follower", err)
	_, err = onFollower.ListNodes(ctx, &fleetv1.ListNodesRequest{})
	notLeaderNames(cfg, "ListNodes on a follower", err)
	cancel()
	// An agent's stream is served on the follower too (its reports reach the leader through
	// the store): its Hello is welcomed. The node has no cards, so nothing is placed on it.
	nodeConn := dial(cfg, cfg.Follower, "node")
	actx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	stream, err := agentv1.NewAgentServiceClient(nodeConn).Connect(actx)
	must(err, "Connect on a follower")
	must(stream.Send(hello(cfg.Node)), "Connect send on a follower")
	welcome, err := stream.Recv()
	must(err, "Connect on a follower: its first answer")
	if welcome.GetWelcome() == nil {
		fail("Connect on a follower: %v, not a Welcome", welcome)
	}
	report(map[string]interface{}{"kind": "served", "case": "Connect on a follower"})
	stop()
	nodeConn.Close()

	// Routing from the follower's WatchReplicas (every model: the model is not there yet).
	router := newRouter()
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := onFollower.WatchReplicas(wctx, &fleetv1.WatchReplicasRequest{})
	must(err, "WatchReplicas on the follower")
	go router.run(watch)

	// A gateway given every fleet, the follower first: its change reaches the leader.
	first := gatewayOn(cfg)
	defer first.Close()
	fleet := fleetv1.NewFleetServiceClient(first)
	ctx, cancel = deadline()
	created, err := fleet.CreateModel(ctx, &fleetv1.CreateModelRequest{Model: model, RequestId: "go-led-create"})
	cancel()
	must(err, "CreateModel through the follower")
	if created.Model.Revision != 1 || first.Current() != cfg.Leader {
		fail("CreateModel through the follower: revision %d, calling %s", created.Model.Revision, first.Current())
	}
	ready := router.await(model.Name, "one endpoint on the follower", func(eps []*fleetv1.Endpoint) bool {
		return len(eps) == 1 && eps[0].Address != ""
	})
	report(map[string]interface{}{"kind": "route", "model": model.Name, "addresses": addresses(ready), "revision": ready[0].Revision})
	// ListNodes, the leader's alone, now that its agent runs the replica.
	ctx, cancel = deadline()
	nodes, err := fleet.ListNodes(ctx, &fleetv1.ListNodesRequest{})
	cancel()
	must(err, "ListNodes at the leader")
	if len(nodes.Nodes) == 0 {
		fail("the leader lists no node, its replica on %s", ready[0].Node)
	}
	reportRedirects("first", first)

	// A second gateway, the same list: a context change through the follower, retried with
	// its request_id (the first answer again, nothing started twice).
	second := gatewayOn(cfg)
	defer second.Close()
	fleet = fleetv1.NewFleetServiceClient(second)
	ask := &fleetv1.SetContextRequest{Name: model.Name, Tokens: 16384, RequestId: "go-led-context"}
	ctx, cancel = deadline()
	sc, err := fleet.SetContext(ctx, ask)
	must(err, "SetContext through the follower")
	again, err := fleet.SetContext(ctx, ask)
	must(err, "SetContext retried")
	cancel()
	if again.RolloutId != sc.RolloutId {
		fail("a retried SetContext started rollout %s after %s", again.RolloutId, sc.RolloutId)
	}
	reportRedirects("second", second)

	// The rollout and its routing, read on the follower.
	rollout := getRollout(onFollower, sc.RolloutId)
	kinds, final := follow(onFollower, sc.RolloutId)
	reportRollout("context on the follower", rollout, kinds, final)
	if final != fleetv1.RolloutState_ROLLOUT_STATE_SUCCEEDED {
		fail("SetContext rollout ended %s", final)
	}
	after := router.await(model.Name, "the context revision on the follower", func(eps []*fleetv1.Endpoint) bool {
		return len(eps) == 1 && eps[0].Revision == rollout.ToRevision
	})
	report(map[string]interface{}{
		"kind": "route", "model": model.Name, "addresses": addresses(after), "revision": after[0].Revision,
		"context_tokens": after[0].ContextTokens,
	})
}
