package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/ipfence/ipfence/internal/version"
)

// newGendocsCmd writes the man pages and shell completions from the
// command tree itself (make package ships them), so they never drift
// from the CLI.
func newGendocsCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:    "gendocs --out DIR",
		Short:  "Write man pages (DIR/man) and bash, zsh and fish completions (DIR/completion)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			root := cmd.Root()
			man := filepath.Join(out, "man")
			comp := filepath.Join(out, "completion")
			for _, d := range []string{man, comp} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			hdr := &doc.GenManHeader{Title: "IPFENCE", Section: "1", Source: "ipfence " + version.String(), Manual: "ipfence manual"}
			if err := doc.GenManTree(root, hdr, man); err != nil {
				return fmt.Errorf("writing man pages: %w", err)
			}
			for name, gen := range map[string]func(f *os.File) error{
				"ipfence.bash": func(f *os.File) error { return root.GenBashCompletionV2(f, true) },
				"_ipfence":     func(f *os.File) error { return root.GenZshCompletion(f) },
				"ipfence.fish": func(f *os.File) error { return root.GenFishCompletion(f, true) },
			} {
				if err := writeWith(filepath.Join(comp, name), gen); err != nil {
					return fmt.Errorf("writing completion %s: %w", name, err)
				}
			}
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "output folder")
	_ = c.MarkFlagRequired("out")
	return c
}

// writeWith creates path and fills it with gen.
func writeWith(path string, gen func(f *os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := gen(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
