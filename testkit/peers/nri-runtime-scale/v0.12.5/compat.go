// What differs in containerd/nri v0.12.5's runtime API (containerd 2.3's line): a request type
// per event, and UpdatePodSandbox.
package main

import (
	"context"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

const nriVersion = "v0.12.5"

func removeContainer(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox, c *api.Container) error {
	return r.RemoveContainer(ctx, &adaptation.RemoveContainerRequest{Pod: p, Container: c})
}

func removePod(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox) error {
	return r.RemovePodSandbox(ctx, &adaptation.RemovePodSandboxRequest{Pod: p})
}

func updatePod(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox) (bool, error) {
	_, err := r.UpdatePodSandbox(ctx, &adaptation.UpdatePodSandboxRequest{Pod: p, LinuxResources: p.GetLinux().GetPodResources()})
	return true, err
}
