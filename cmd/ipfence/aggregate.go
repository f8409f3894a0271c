package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newAggregateCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "aggregate [FILE...]", RunE: func(*cobra.Command, []string) error { return errors.New("not implemented yet") }}
}
