// go-nri-refplugin is a plugin on the official Go stub (github.com/containerd/nri/pkg/stub),
// built against each NRI version testkit/peers/build.sh is asked for. It subscribes to the events
// a QoS plugin needs and answers CreateContainer with a small adjustment (BE pods: CPU shares 2;
// LS pods: an annotation), so its round trip is the floor of the official Go plugin stack.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct{}

func (p *plugin) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) error { return nil }

func (p *plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	switch qos := pod.Labels["koordinator.sh/qosClass"]; qos {
	case "BE":
		adj.SetLinuxCPUShares(2)
	case "LS", "LSR", "LSE":
		adj.AddAnnotation("nri.example/qos", qos)
	}
	return adj, nil, nil
}

func (p *plugin) UpdateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, r *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

func (p *plugin) StopContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

func main() {
	name := flag.String("name", "refplugin", "plugin name")
	idx := flag.String("idx", "10", "plugin index (two digits)")
	sock := flag.String("socket", "", "NRI socket path (default: the runtime's default)")
	flag.Parse()
	opts := []stub.Option{stub.WithPluginName(*name), stub.WithPluginIdx(*idx)}
	if *sock != "" {
		opts = append(opts, stub.WithSocketPath(*sock))
	}
	s, err := stub.New(&plugin{}, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stub:", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		os.Exit(2)
	}
}
