package client

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
)

// ServiceConfig is the gRPC service config the repository publishes
// (llmgw/clients/service_config.json; this copy is written by `make proto` and drift-checked):
// round_robin over a name's addresses, and a retryPolicy on UNAVAILABLE for the idempotent
// reads (every planner call, the fleet's List/Get calls) and for the fleet's writes, which
// are safe to retry only because each carries a request id fixed before its first attempt.
//
//go:embed service_config.json
var ServiceConfig string

// Dial is a connection to one service over creds with the published service config: grpc-go
// itself retries what the config names (the planner's calls, say). Leader dials its fleets
// without grpc's own retries (LeaderDialOptions), since it retries itself across fleets.
func Dial(target string, creds credentials.TransportCredentials, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(ServiceConfig),
	}, opts...)
	return grpc.NewClient(target, all...)
}

// LeaderDialOptions are the options of a Leader's connections: the service config less its
// retry policies (Leader follows them itself, moving to another fleet between attempts and
// honouring RetryInfo; grpc.WithDisableRetry would also stop grpc's transparent retry of a
// call that never reached a server).
func LeaderDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultServiceConfig(leaderServiceConfig)}
}

// leaderServiceConfig is ServiceConfig without its retryPolicy entries.
var leaderServiceConfig = func() string {
	var config map[string]any
	if err := json.Unmarshal([]byte(ServiceConfig), &config); err != nil {
		panic(err)
	}
	methods, _ := config["methodConfig"].([]any)
	for _, m := range methods {
		if mc, ok := m.(map[string]any); ok {
			delete(mc, "retryPolicy")
		}
	}
	out, err := json.Marshal(config)
	if err != nil {
		panic(err)
	}
	return string(out)
}()

// RetryPolicy is one retryPolicy of the service config.
type RetryPolicy struct {
	MaxAttempts       int
	InitialBackoff    time.Duration
	MaxBackoff        time.Duration
	BackoffMultiplier float64
	Codes             map[codes.Code]bool
}

// Backoff is the wait before attempt n+1 (n counts from 0): the initial backoff times the
// multiplier to the n, at most the maximum (without grpc's jitter: the Python clients wait the
// same).
func (p *RetryPolicy) Backoff(n int) time.Duration {
	d := float64(p.InitialBackoff)
	for i := 0; i < n; i++ {
		d *= p.BackoffMultiplier
	}
	return min(time.Duration(d), p.MaxBackoff)
}

type rawConfig struct {
	MethodConfig []struct {
		Name []struct {
			Service string `json:"service"`
			Method  string `json:"method"`
		} `json:"name"`
		RetryPolicy *struct {
			MaxAttempts          int      `json:"maxAttempts"`
			InitialBackoff       string   `json:"initialBackoff"`
			MaxBackoff           string   `json:"maxBackoff"`
			BackoffMultiplier    float64  `json:"backoffMultiplier"`
			RetryableStatusCodes []string `json:"retryableStatusCodes"`
		} `json:"retryPolicy"`
	} `json:"methodConfig"`
}

// Policies reads a service config's retry policies by full method name
// ("/llmgw.fleet.v1.FleetService/CreateModel"; a name with no method stands for its whole
// service, under "/service/").
func Policies(config string) (map[string]*RetryPolicy, error) {
	var raw rawConfig
	if err := json.Unmarshal([]byte(config), &raw); err != nil {
		return nil, fmt.Errorf("service config: %w", err)
	}
	out := map[string]*RetryPolicy{}
	for _, mc := range raw.MethodConfig {
		rp := mc.RetryPolicy
		if rp == nil {
			continue
		}
		initial, err1 := seconds(rp.InitialBackoff)
		most, err2 := seconds(rp.MaxBackoff)
		if err1 != nil || err2 != nil || rp.MaxAttempts < 2 || rp.BackoffMultiplier <= 0 {
			return nil, fmt.Errorf("service config: a retryPolicy out of gRPC's rules: %+v", *rp)
		}
		p := &RetryPolicy{MaxAttempts: rp.MaxAttempts, InitialBackoff: initial, MaxBackoff: most,
			BackoffMultiplier: rp.BackoffMultiplier, Codes: map[codes.Code]bool{}}
		for _, name := range rp.RetryableStatusCodes {
			c, ok := codeNames[name]
			if !ok {
				return nil, fmt.Errorf("service config: no status code %q", name)
			}
			p.Codes[c] = true
		}
		for _, n := range mc.Name {
			out["/"+n.Service+"/"+n.Method] = p
		}
	}
	return out, nil
}

// policyFor is the policy of a full method name, or nil when the config retries it not.
func policyFor(policies map[string]*RetryPolicy, method string) *RetryPolicy {
	if p, ok := policies[method]; ok {
		return p
	}
	if i := strings.LastIndex(method, "/"); i > 0 {
		return policies[method[:i+1]]
	}
	return nil
}

// seconds reads the config's durations ("0.1s", as google.protobuf.Duration's JSON).
func seconds(s string) (time.Duration, error) {
	if !strings.HasSuffix(s, "s") {
		return 0, fmt.Errorf("duration %q lacks its s", s)
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("duration %q", s)
	}
	return time.Duration(f * float64(time.Second)), nil
}

var codeNames = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		var b strings.Builder
		prev := rune(0)
		for _, r := range c.String() { // FailedPrecondition -> FAILED_PRECONDITION
			if prev >= 'a' && prev <= 'z' && r >= 'A' && r <= 'Z' {
				b.WriteByte('_')
			}
			b.WriteRune(r)
			prev = r
		}
		m[strings.ToUpper(b.String())] = c
	}
	return m
}()

// publishedPolicies is ServiceConfig's, read once (a config that does not parse is a bug of
// this package, caught by its tests).
var publishedPolicies = func() map[string]*RetryPolicy {
	p, err := Policies(ServiceConfig)
	if err != nil {
		panic(err)
	}
	return p
}()
