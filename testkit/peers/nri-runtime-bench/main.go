// nri-runtime-bench drives NRI plugins through the official runtime-side library
// (github.com/containerd/nri/pkg/adaptation at the version it is built for: v0.6.1 is what
// containerd 1.7 runs, v0.12 containerd 2.3's line), so a plugin's hook round trip is measured
// exactly as the runtime sees it, without runc or snapshot noise.
//
// It listens on -socket, hands -sync-pods pods (one container each) to every plugin at Synchronize,
// waits until a plugin has synchronized, warms up, pauses -settle (the plugin finishes taking a
// large node in: its steady state is what is timed), then times -n
// CreateContainer calls (BE and LS pods alternating) and prints one JSON line of figures (its
// quantiles, and each call's time in call order). With
// -pod-updates it then sends that many UpdatePodSandbox events (runtimes of NRI v0.10 and later).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/log"
	"github.com/sirupsen/logrus"
)

func pod(i int, qos string) *api.PodSandbox {
	uid := fmt.Sprintf("0000%04d-aaaa-bbbb-cccc-%012d", i, i)
	parent := "/kubepods/burstable/pod" + uid
	if qos == "BE" {
		parent = "/kubepods/besteffort/pod" + uid
	}
	labels := map[string]string{
		"app": fmt.Sprintf("svc-%d", i%17), "io.kubernetes.pod.name": fmt.Sprintf("pod-%d", i),
		"io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": uid,
		"koordinator.sh/qosClass": qos, "pod-template-hash": "7d9f8c6b5",
	}
	ann := map[string]string{
		"kubernetes.io/config.seen": "2026-11-29T08:00:00.000000000Z", "kubernetes.io/config.source": "api",
		"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
	}
	if qos == "BE" {
		// Koordinator's batch resources, as its webhook writes them for the node side.
		ann["node.koordinator.sh/extended-resource-spec"] = `{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"},"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"}}}}`
	}
	return &api.PodSandbox{
		Id: fmt.Sprintf("%064d", i), Name: fmt.Sprintf("pod-%d", i), Uid: uid, Namespace: "default",
		Labels: labels, Annotations: ann, RuntimeHandler: "",
		Linux: &api.LinuxPodSandbox{CgroupParent: parent, CgroupsPath: parent + "/" + fmt.Sprintf("%064d", i)},
	}
}

func container(i int, p *api.PodSandbox, qos string) *api.Container {
	shares, quota, mem := uint64(1024), int64(200000), int64(512<<20)
	if qos == "BE" {
		shares, quota, mem = 2, 0, 0
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + p.Name}
	for k := 0; k < 12; k++ {
		env = append(env, fmt.Sprintf("SERVICE_%d_PORT=tcp://10.96.0.%d:80", k, k))
	}
	mounts := []*api.Mount{}
	for _, m := range []string{"/etc/hosts", "/dev/termination-log", "/etc/hostname", "/etc/resolv.conf", "/var/run/secrets/kubernetes.io/serviceaccount"} {
		mounts = append(mounts, &api.Mount{Destination: m, Type: "bind", Source: "/var/lib/kubelet/pods/" + p.Uid + m, Options: []string{"rbind", "rprivate", "rw"}})
	}
	r := &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: api.UInt64(shares), Period: api.UInt64(uint64(100000))}, Memory: &api.LinuxMemory{}}
	if quota > 0 {
		r.Cpu.Quota = api.Int64(quota)
	}
	if mem > 0 {
		r.Memory.Limit = api.Int64(mem)
	}
	id := fmt.Sprintf("c%063d", i)
	return &api.Container{
		Id: id, PodSandboxId: p.Id, Name: "main", State: api.ContainerState_CONTAINER_RUNNING,
		Labels:      map[string]string{"io.kubernetes.container.name": "main", "io.kubernetes.pod.uid": p.Uid},
		Annotations: map[string]string{"io.kubernetes.container.hash": "3d7c6f1a", "io.kubernetes.container.restartCount": "0"},
		Args:        []string{"/bin/server", "--port=8080", "--log-level=info"}, Env: env, Mounts: mounts,
		Linux: &api.LinuxContainer{Resources: r, CgroupsPath: p.Linux.CgroupParent + "/" + id, OomScoreAdj: api.Int(1000)},
	}
}

func pct(d []float64, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return d[int(float64(len(d)-1)*p)]
}

func main() {
	sock := flag.String("socket", "/tmp/nri-bench/nri.sock", "socket to listen on")
	n := flag.Int("n", 2000, "CreateContainer calls to time")
	syncPods := flag.Int("sync-pods", 20, "pods (one container each) handed over at Synchronize")
	wait := flag.Duration("wait", 20*time.Second, "how long to wait for a plugin to answer")
	verbose := flag.Bool("v", false, "runtime library logs")
	settle := flag.Duration("settle", 0, "pause after the warm-up, before the timed calls")
	podUpdates := flag.Int("pod-updates", 0, "UpdatePodSandbox events to send after the timed calls")
	flag.Parse()
	if !*verbose {
		logrus.SetLevel(logrus.WarnLevel)
	}
	_ = log.Get()
	os.Remove(*sock)
	pods, ctrs := []*api.PodSandbox{}, []*api.Container{}
	for i := 0; i < *syncPods; i++ {
		q := []string{"LS", "BE", "LSR"}[i%3]
		p := pod(100000+i, q)
		pods, ctrs = append(pods, p), append(ctrs, container(100000+i, p, q))
	}
	syncDur := time.Duration(0)
	syncErr := ""
	syncUpdates := 0
	synced := make(chan struct{}, 16)
	var starting atomic.Bool // NRI v0.12's Start synchronizes the plugins it launched itself (none here)
	starting.Store(true)
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		if starting.Load() {
			_, err := cb(ctx, nil, nil)
			return err
		}
		defer func() { synced <- struct{}{} }()
		t0 := time.Now()
		u, err := cb(ctx, pods, ctrs)
		syncDur = time.Since(t0)
		syncUpdates = len(u)
		if err != nil {
			syncErr = err.Error()
		}
		return err
	}
	updateFn := func(ctx context.Context, u []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	dir, _ := os.MkdirTemp("", "nri-bench-plugins")
	r, err := adaptation.New("nri-runtime-bench", "0.1", syncFn, updateFn, adaptation.WithSocketPath(*sock),
		adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := r.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	starting.Store(false)
	fmt.Fprintln(os.Stderr, "listening on", *sock)
	ctx := context.Background()
	ready := false
	select {
	case <-synced:
		ready = syncErr == ""
	case <-time.After(*wait):
	}
	// Warm-up: a plugin may finish its own start-up right after Synchronize.
	for i := 0; ready && i < 50; i++ {
		p := pod(900000+i, "BE")
		r.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: p, Container: container(900000+i, p, "BE")})
	}
	if ready && *settle > 0 {
		time.Sleep(*settle)
	}
	out := map[string]interface{}{"nri": nriVersion, "ready": ready, "sync_pods": *syncPods, "sync_ms": float64(syncDur.Microseconds()) / 1000,
		"sync_error": syncErr, "sync_updates": syncUpdates}
	if ready {
		lat := []float64{}
		errs, beAdj, lsAdj := 0, 0, 0
		for i := 0; i < *n; i++ {
			q := "LS"
			if i%2 == 0 {
				q = "BE"
			}
			p := pod(i, q)
			c := container(i, p, q)
			t0 := time.Now()
			resp, err := r.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: p, Container: c})
			lat = append(lat, float64(time.Since(t0).Nanoseconds())/1000)
			if err != nil {
				errs++
				continue
			}
			if q == "BE" && resp.GetAdjust().GetLinux().GetResources().GetCpu().GetShares() != nil {
				beAdj++
			}
			if q == "LS" && resp.GetAdjust() != nil && resp.GetAdjust().String() != "" {
				lsAdj++
			}
		}
		// In call order, for a caller that counts what was answered within a bound (as the SLO does).
		out["latencies_us"] = append([]float64(nil), lat...)
		sort.Float64s(lat)
		out["n"], out["errors"], out["be_adjusted"], out["ls_adjusted"] = *n, errs, beAdj, lsAdj
		out["p50_us"], out["p90_us"], out["p99_us"], out["max_us"] = pct(lat, .5), pct(lat, .9), pct(lat, .99), pct(lat, 1)
	}
	if ready && *podUpdates > 0 {
		sent, failed := 0, 0
		for i := 0; i < *podUpdates; i++ {
			ok, err := updatePod(ctx, r, pod(i, "BE"))
			if err != nil {
				failed++
			} else if ok {
				sent++
			}
		}
		out["pod_updates"], out["pod_update_errors"] = sent, failed
	}
	b, _ := json.Marshal(out)
	fmt.Println(strings.TrimSpace(string(b)))
	r.Stop()
	os.RemoveAll(dir)
}
