//go:build tools

// The commands built from this module, so that `go mod tidy` keeps what they need: koord-manager
// (kind/build.sh) and koordlet, the node agent run beside nriplugin as a benchmark peer
// (testkit/peers/koordlet.sh).
package tools

import (
	_ "github.com/koordinator-sh/koordinator/cmd/koord-manager"
	_ "github.com/koordinator-sh/koordinator/cmd/koordlet"
)
