package client

import (
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reason is the ErrorInfo reason of a refusal: one of the constants below (docs/errors.md
// lists what each means and which metadata keys it carries; a test checks this list against
// the services' status tables), or a reason newer than this package.
type Reason string

// The reasons llmgw's services answer with.
const (
	// The intake, before any service reads the message.
	ReasonMalformedMessage Reason = "MALFORMED_MESSAGE"
	ReasonMessageTooLarge  Reason = "MESSAGE_TOO_LARGE"

	// The planner (domain planner.llmgw.dev); INVALID_SOURCE, LIMIT_EXCEEDED and REFUSED
	// are the fleet's too.
	ReasonCardsTooSmall       Reason = "CARDS_TOO_SMALL"
	ReasonContextOverLimit    Reason = "CONTEXT_OVER_LIMIT"
	ReasonContextOverTrained  Reason = "CONTEXT_OVER_TRAINED"
	ReasonContextTooShort     Reason = "CONTEXT_TOO_SHORT"
	ReasonEngineNoContext     Reason = "ENGINE_NO_CONTEXT"
	ReasonEngineRefuses       Reason = "ENGINE_REFUSES"
	ReasonEngineSingleCard    Reason = "ENGINE_SINGLE_CARD"
	ReasonEngineSingleNode    Reason = "ENGINE_SINGLE_NODE"
	ReasonGPUCountOutOfRange  Reason = "GPU_COUNT_OUT_OF_RANGE"
	ReasonGPUCountUnavailable Reason = "GPU_COUNT_UNAVAILABLE"
	ReasonHeadsNotDivisible   Reason = "HEADS_NOT_DIVISIBLE"
	ReasonInvalidRequest      Reason = "INVALID_REQUEST"
	ReasonInvalidShape        Reason = "INVALID_SHAPE"
	ReasonInvalidSource       Reason = "INVALID_SOURCE"
	ReasonLimitExceeded       Reason = "LIMIT_EXCEEDED"
	ReasonMemoryOutOfRange    Reason = "MEMORY_OUT_OF_RANGE"
	ReasonNoGPUProfile        Reason = "NO_GPU_PROFILE"
	ReasonProfileNotFound     Reason = "PROFILE_NOT_FOUND"
	ReasonProfileOnCPU        Reason = "PROFILE_ON_CPU"
	ReasonRefused             Reason = "REFUSED"
	ReasonResolutionsBusy     Reason = "RESOLUTIONS_BUSY"
	ReasonSlotsOutOfRange     Reason = "SLOTS_OUT_OF_RANGE"
	ReasonSourceNotAllowed    Reason = "SOURCE_NOT_ALLOWED"
	ReasonSourceUnreachable   Reason = "SOURCE_UNREACHABLE"
	ReasonUnknownEngine       Reason = "UNKNOWN_ENGINE"

	// The fleet (domain fleet.llmgw.dev).
	ReasonCanaryAnalysisFailed Reason = "CANARY_ANALYSIS_FAILED" // a failed canary's Rollout.failure
	ReasonCannotUndo           Reason = "CANNOT_UNDO"
	ReasonInvalidModel         Reason = "INVALID_MODEL"
	ReasonModelDeclared        Reason = "MODEL_DECLARED"
	ReasonModelExists          Reason = "MODEL_EXISTS"
	ReasonModelNotFound        Reason = "MODEL_NOT_FOUND"
	ReasonNodeIdentityMismatch Reason = "NODE_IDENTITY_MISMATCH"
	ReasonNotLeader            Reason = "NOT_LEADER"
	ReasonNoHello              Reason = "NO_HELLO"
	ReasonNoRoomBeside         Reason = "NO_ROOM_BESIDE"
	ReasonNoRoomInPlace        Reason = "NO_ROOM_IN_PLACE"
	ReasonNotCanary            Reason = "NOT_CANARY"
	ReasonPlanNotChecked       Reason = "PLAN_NOT_CHECKED"
	ReasonPlannerFailed        Reason = "PLANNER_FAILED"
	ReasonPlannerUnavailable   Reason = "PLANNER_UNAVAILABLE"
	ReasonRequestIDReused      Reason = "REQUEST_ID_REUSED"
	ReasonRoleRequired         Reason = "ROLE_REQUIRED"
	ReasonRolloutInProgress    Reason = "ROLLOUT_IN_PROGRESS"
	ReasonRolloutNotFound      Reason = "ROLLOUT_NOT_FOUND"
	ReasonStaleRevision        Reason = "STALE_REVISION"
	ReasonStoreDamaged         Reason = "STORE_DAMAGED"
	ReasonStoreUnavailable     Reason = "STORE_UNAVAILABLE"
	ReasonStreamReplaced       Reason = "STREAM_REPLACED"
	ReasonTooManyCalls         Reason = "TOO_MANY_CALLS"
	ReasonUnauthenticated      Reason = "UNAUTHENTICATED"
	ReasonWatcherTooSlow       Reason = "WATCHER_TOO_SLOW"
)

// MetaLeaderAddress is the NOT_LEADER metadata key naming where the leader answers ("" while
// an election is under way); MetaLeader names the leader's id.
const (
	MetaLeaderAddress = "leader_address"
	MetaLeader        = "leader"
)

// Error is a refusal as a gateway reads it.
type Error struct {
	Code     codes.Code
	Message  string
	Reason   Reason // "" when the status carries no ErrorInfo (a proxy's, a transport's)
	Domain   string // planner.llmgw.dev, fleet.llmgw.dev
	Metadata map[string]string
	// RetryDelay is RetryInfo's retry_delay; HasRetryDelay says whether RetryInfo was sent.
	RetryDelay    time.Duration
	HasRetryDelay bool
	// Status is the status itself, for the details this type does not read (BadRequest,
	// PreconditionFailure, ResourceInfo).
	Status *status.Status
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s %s: %s", e.Code, e.Reason, e.Message)
}

// GRPCStatus lets status.FromError and status.Code read an *Error as the status it came from.
func (e *Error) GRPCStatus() *status.Status { return e.Status }

// Decode reads err's status, ErrorInfo and RetryInfo: nil for a nil error. An error that is
// not a gRPC status (a context's) is decoded as status.Convert reads it (codes.Unknown, or
// the context's code).
func Decode(err error) *Error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	out := &Error{Code: st.Code(), Message: st.Message(), Status: st, Metadata: map[string]string{}}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if out.Reason == "" {
				out.Reason, out.Domain = Reason(d.GetReason()), d.GetDomain()
				for k, v := range d.GetMetadata() {
					out.Metadata[k] = v
				}
			}
		case *errdetails.RetryInfo:
			if delay := d.GetRetryDelay(); delay != nil && delay.CheckValid() == nil {
				out.RetryDelay, out.HasRetryDelay = max(delay.AsDuration(), 0), true
			}
		}
	}
	return out
}

// ReasonOf is err's ErrorInfo reason ("" for nil or a status without ErrorInfo).
func ReasonOf(err error) Reason {
	if e := Decode(err); e != nil {
		return e.Reason
	}
	return ""
}
