//go:build tools

// The command kind/build.sh builds, so that `go mod tidy` keeps what it needs.
package tools

import (
	_ "github.com/koordinator-sh/koordinator/cmd/koord-manager"
)
