// The pod sandbox's pause process for the kind node image (kind/build.sh), standing in for
// registry.k8s.io/pause, which cannot be pulled here: it holds the pod's namespaces, reaps the
// zombies of a shared PID namespace and exits 0 on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	go func() {
		for range children {
			for {
				var ws syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}()
	<-stop
	os.Exit(0)
}
