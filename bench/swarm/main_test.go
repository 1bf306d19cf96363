package main

import (
	"reflect"
	"testing"
)

func TestPlanGivesAgentIToAddressIModN(t *testing.T) {
	got := plan(7, []string{"a", "b", "c"}, 2)
	want := []connPlan{
		{"a", []int{0, 3}}, {"a", []int{6}},
		{"b", []int{1, 4}},
		{"c", []int{2, 5}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan(7, [a b c], 2) = %v, want %v", got, want)
	}
}

func TestPlanWithOneAddressFillsConnectionsInOrder(t *testing.T) {
	got := plan(5, []string{"a"}, 2)
	want := []connPlan{{"a", []int{0, 1}}, {"a", []int{2, 3}}, {"a", []int{4}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan(5, [a], 2) = %v, want %v", got, want)
	}
}

func TestPlanWithOneStreamAConnectionGivesEachAgentItsOwn(t *testing.T) {
	for _, c := range plan(4, []string{"a", "b"}, 1) {
		if len(c.agents) != 1 {
			t.Fatalf("a connection of %d agents with -per-conn 1", len(c.agents))
		}
	}
}

func TestPlanWithMoreAddressesThanAgentsLeavesTheRestUnused(t *testing.T) {
	got := plan(2, []string{"a", "b", "c"}, 50)
	want := []connPlan{{"a", []int{0}}, {"b", []int{1}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan(2, [a b c], 50) = %v, want %v", got, want)
	}
}
