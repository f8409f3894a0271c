package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newGeoCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "geo", RunE: func(*cobra.Command, []string) error { return errors.New("not implemented yet") }}
}
