// The bench's Go swarm of simulated agents (bench/agent_fanin.py --swarm go builds it). It
// requires the stubs from this checkout by replace, as tests/go/client does.
module gitea.mynodes.xyz/ilker/llmgw/bench/swarm

go 1.26.0

require (
	gitea.mynodes.xyz/ilker/llmgw/gen/go v0.0.0
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.85.0
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace gitea.mynodes.xyz/ilker/llmgw/gen/go => ../../gen/go
