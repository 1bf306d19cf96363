// Package vectors checks the Go runtime against the shared test vectors in ../testdata/vectors
// (written by tests/support/vectors.py; tests/unit/test_vectors.py checks the Python runtime
// against the same files): each decodes from its binary and its JSON to the same message, and
// encodes again to the same bytes.
package vectors

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	_ "google.golang.org/genproto/googleapis/rpc/errdetails"
	_ "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/agent/v1"
	_ "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/common/v1"
	_ "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/fleet/v1"
	_ "gitea.mynodes.xyz/ilker/llmgw/gen/go/llmgw/planner/v1"
)

const folder = "../testdata/vectors"

type vector struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(folder, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestVectorsRoundTripByteForByte(t *testing.T) {
	var index []vector
	if err := json.Unmarshal(read(t, "index.json"), &index); err != nil {
		t.Fatal(err)
	}
	if len(index) < 50 {
		t.Fatalf("index.json lists %d vectors", len(index))
	}
	for _, v := range index {
		t.Run(v.Name, func(t *testing.T) {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(v.Type))
			if err != nil {
				t.Fatalf("type %s: %v", v.Type, err)
			}
			wantBin, wantJSON := read(t, v.Name+".binpb"), read(t, v.Name+".json")

			fromBin := mt.New().Interface()
			if err := proto.Unmarshal(wantBin, fromBin); err != nil {
				t.Fatal(err)
			}
			if len(fromBin.ProtoReflect().GetUnknown()) != 0 {
				t.Fatal("fields this runtime does not know")
			}
			gotBin, err := proto.MarshalOptions{Deterministic: true}.Marshal(fromBin)
			if err != nil || !bytes.Equal(gotBin, wantBin) {
				t.Fatalf("binary again: %x (%v), want %x", gotBin, err, wantBin)
			}

			fromJSON := mt.New().Interface()
			if err := protojson.Unmarshal(wantJSON, fromJSON); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(fromJSON, fromBin) {
				t.Fatalf("the JSON decodes to %v, the binary to %v", fromJSON, fromBin)
			}
			out, err := protojson.Marshal(fromBin)
			if err != nil {
				t.Fatal(err)
			}
			// protojson varies its whitespace on purpose; the vectors hold none.
			var compact bytes.Buffer
			if err := json.Compact(&compact, out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(compact.Bytes(), wantJSON) {
				t.Fatalf("JSON again:\n%s\nwant\n%s", compact.Bytes(), wantJSON)
			}
		})
	}
}
