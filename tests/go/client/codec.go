package main

// Why this codec exists: Debian's grpc-go (golang-google-grpc-dev 1.33.3) is built on
// github.com/golang/protobuf 1.3.5, whose proto.Marshal only knows messages of the old API
// (struct tags). The stubs in gen/go come from protoc-gen-go 1.28 (the new API), and grpc's
// default codec panics on them ("protobuf tag not enough fields in
// WatchReplicasResponse.state"). Registered under grpc's default name, "proto", this codec
// marshals every message through google.golang.org/protobuf instead. Built with modules
// (golang/protobuf 1.4 or newer forwards to the new API) a gateway needs none of this.

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

type newAPICodec struct{}

func (newAPICodec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("codec: %T is not a new-API protobuf message", v)
	}
	return proto.Marshal(m)
}

func (newAPICodec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("codec: %T is not a new-API protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

func (newAPICodec) Name() string { return "proto" }

func init() { encoding.RegisterCodec(newAPICodec{}) }
