package main

// The agents' stream refusals. A gateway never opens AgentService.Connect; this client does,
// with a spare node's pair, only to decode the stream's own refusals as a Go agent would.

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/agent/v1"
)

func connect(ctx context.Context, agent agentv1.AgentServiceClient, first *agentv1.ConnectRequest) agentv1.AgentService_ConnectClient {
	stream, err := agent.Connect(ctx)
	must(err, "Connect")
	must(stream.Send(first), "Connect send")
	return stream
}

func hello(node string) *agentv1.ConnectRequest {
	return &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Hello{Hello: &agentv1.Hello{
		NodeName: node, Engines: []string{"vllm"}, MemoryBytes: 1 << 34, MemoryFreeBytes: 1 << 34,
	}}}
}

// firstError reads a stream until it fails.
func firstError(stream agentv1.AgentService_ConnectClient) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
}

func agentRefusals(cfg *Config) {
	conn := dial(cfg, cfg.Fleet, "node")
	defer conn.Close()
	agent := agentv1.NewAgentServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	beat := &agentv1.ConnectRequest{Msg: &agentv1.ConnectRequest_Heartbeat{Heartbeat: &agentv1.Heartbeat{Seq: 1}}}
	refused("Connect opening with a heartbeat", firstError(connect(ctx, agent, beat)), codes.InvalidArgument, "NO_HELLO")

	refused("Connect naming another node than the certificate's",
		firstError(connect(ctx, agent, hello(cfg.Node+"-not"))), codes.PermissionDenied, "NODE_IDENTITY_MISMATCH")

	// A second stream of the same node replaces the first (an agent that reconnected).
	first := connect(ctx, agent, hello(cfg.Node))
	welcome, err := first.Recv()
	must(err, "Connect welcome")
	if welcome.GetWelcome() == nil {
		fail("Connect opened with %v, not Welcome", welcome)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	second := connect(sctx, agent, hello(cfg.Node))
	if _, err := second.Recv(); err != nil {
		fail("the second stream of node %s: %v", cfg.Node, err)
	}
	refused("the first stream of a node that connected again", firstError(first), codes.Aborted, "STREAM_REPLACED")
	called("agent", "Connect")
}
