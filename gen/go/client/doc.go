// Package client is what every gateway of llmgw's fleet and planner would otherwise write
// itself, tested against the real services (tests/integration/test_go_client_pkg.py runs this
// package's live tests against a planner and two fleets on one PostgreSQL, over mutual TLS):
//
//   - Leader, a grpc.ClientConnInterface over several fleet addresses that finds the leading
//     fleet, follows NOT_LEADER, and retries what is safe to retry (reads, and writes carrying
//     a request id) as long as RetryInfo says, moving on to the next fleet when one is down;
//   - Table, the routing table kept from WatchReplicas: resumed by after_seq and epoch,
//     replaced by a snapshot after a gap, holding only READY endpoints;
//   - Decode, a refusal's google.rpc.ErrorInfo as a typed Reason with its metadata and
//     RetryInfo delay;
//   - ServiceConfig, the service config the repository publishes (round_robin and the retry
//     policy), for the grpc.ClientConn a gateway dials to the planner.
//
// docs/go.md says how a gateway uses it; docs/gateway.md is the contract it implements.
package client
