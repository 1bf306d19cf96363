package main

import (
	"errors"
	"reflect"
	"testing"
)

// TestFleetAddresses reads --fleet values as llmgw/clients/leader.py does.
func TestFleetAddresses(t *testing.T) {
	service := func(host string) ([]string, error) {
		switch host {
		case "fleet-instances":
			return []string{"10.0.0.7", "10.0.0.8", "fd00::9"}, nil
		case "one":
			return []string{"10.0.0.1"}, nil
		}
		return nil, errors.New("no such host")
	}
	for _, c := range []struct {
		spec string
		want []string
	}{
		{"a:1, b:2,a:1,", []string{"a:1", "b:2"}},
		{"fleet-instances:50052", []string{"10.0.0.7:50052", "10.0.0.8:50052", "[fd00::9]:50052"}},
		{"one:50052", []string{"one:50052"}},
		{"unknown:50052", []string{"unknown:50052"}},
		{"10.0.0.1:50052", []string{"10.0.0.1:50052"}},
		{"[::1]:50052", []string{"[::1]:50052"}},
	} {
		got, err := fleetAddresses(c.spec, service)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("fleetAddresses(%q) = %v, %v; want %v", c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"", " , ", "a", "a:", ":1", "a:port", "a:70000"} {
		if got, err := fleetAddresses(bad, service); err == nil {
			t.Errorf("fleetAddresses(%q) = %v, want an error", bad, got)
		}
	}
}
