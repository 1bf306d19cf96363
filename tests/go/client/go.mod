// A gateway-shaped module: it requires the stubs (and their client package) from this
// checkout by replace, as a gateway team's module requires them from the repository, and the
// newest grpc-go. tests/integration/test_go_client.py builds it.
module gitea.mynodes.xyz/ilker/llmgw/tests/go/client

go 1.26.0

require (
	gitea.mynodes.xyz/ilker/llmgw/gen/go v0.0.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
)

replace gitea.mynodes.xyz/ilker/llmgw/gen/go => ../../../gen/go
