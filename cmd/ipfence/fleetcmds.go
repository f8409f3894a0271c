package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ipfence/ipfence/internal/fleet"
)

func newKeygenCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "keygen --out DIR",
		Short: "Make the ed25519 key pair that signs a fleet's policies",
		Long: `Keygen writes DIR/ipfence.key (the private key, mode 0600: it stays with
whoever publishes policies) and DIR/ipfence.pub (the public key every agent is
given with --pubkey). It never overwrites a key: agents that trust the old
public key would stop following the fleet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pubPath, keyPath, err := fleet.GenerateKey(out)
			if err != nil {
				return err
			}
			pub, err := fleet.LoadPublicKey(pubPath)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"private_key": keyPath, "public_key": pubPath, "key_id": fleet.KeyID(pub)})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (private: keep it with the publisher) and %s (public: give it to every agent); key id %s\n", keyPath, pubPath, fleet.KeyID(pub))
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "folder to write ipfence.key and ipfence.pub into")
	_ = c.MarkFlagRequired("out")
	return c
}
