// What differs in containerd/nri v0.6.1's runtime API (the version containerd 1.7 vendors).
package main

import (
	"context"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

const nriVersion = "v0.6.1"

func removeContainer(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox, c *api.Container) error {
	return r.RemoveContainer(ctx, &adaptation.StateChangeEvent{Pod: p, Container: c})
}

func removePod(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox) error {
	return r.RemovePodSandbox(ctx, &adaptation.StateChangeEvent{Pod: p})
}

// updatePod: v0.6.1 has no UpdatePodSandbox event.
func updatePod(ctx context.Context, r *adaptation.Adaptation, p *api.PodSandbox) (bool, error) {
	return false, nil
}
