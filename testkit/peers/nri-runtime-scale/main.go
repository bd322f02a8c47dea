// nri-runtime-scale drives one NRI plugin through the official runtime-side library
// (github.com/containerd/nri/pkg/adaptation at the version it is built for: see build.sh) on a node of
// many pods with realistic annotations, including the multi-KB
// kubectl.kubernetes.io/last-applied-configuration that real pods carry. containerd 1.7 (NRI v0.6)
// sends Synchronize in one message, so a few thousand such pods make it larger than ttrpc's 4 MiB;
// NRI v0.8 and later split such a Synchronize into parts (SynchronizeRequest.more).
//
// It listens on -socket, hands -sync-pods pods (one container each) to the plugin at
// Synchronize, counts the UpdateContainers the plugin pushes, warms up, then times -n
// CreateContainer calls (each followed by RemoveContainer and RemovePodSandbox: the node keeps its size) and
// prints one JSON line. With -linger it keeps the connection that long after printing (for
// measuring the plugin at that size). -cgroup-prefix puts every pod's cgroup under a prefix.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/log"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
)

var (
	prefix    string
	noteBytes int
)

// lastApplied is a Deployment-like manifest as kubectl writes it, padded with env entries to
// about noteBytes.
func lastApplied(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{},"labels":{"app":"svc-%d"},"name":"pod-%d","namespace":"default"},"spec":{"containers":[{"image":"registry.example.com/team/svc-%d:1.4.2","name":"main","ports":[{"containerPort":8080}],"env":[`, i%17, i, i%17)
	for k := 0; b.Len() < noteBytes-120; k++ {
		if k > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":"FEATURE_FLAG_%d","value":"enabled-for-tenant-%d"}`, k, (i+k)%97)
	}
	b.WriteString(`],"resources":{"limits":{"cpu":"2","memory":"512Mi"},"requests":{"cpu":"500m","memory":"256Mi"}}}]}}`)
	return b.String()
}

func pod(i int, qos string) *api.PodSandbox {
	uid := fmt.Sprintf("0000%04d-aaaa-bbbb-cccc-%012d", i%10000, i)
	parent := prefix + "/kubepods/burstable/pod" + uid
	if qos == "BE" {
		parent = prefix + "/kubepods/besteffort/pod" + uid
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
	if noteBytes > 0 {
		ann["kubectl.kubernetes.io/last-applied-configuration"] = lastApplied(i)
	}
	if qos == "BE" {
		ann["node.koordinator.sh/extended-resource-spec"] = `{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k","kubernetes.io/batch-memory":"512Mi"},"requests":{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"256Mi"}}}}`
	}
	return &api.PodSandbox{
		Id: fmt.Sprintf("%064d", i), Name: fmt.Sprintf("pod-%d", i), Uid: uid, Namespace: "default",
		Labels: labels, Annotations: ann,
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
	sock := flag.String("socket", "/tmp/nri-scale/nri.sock", "socket to listen on")
	n := flag.Int("n", 1000, "CreateContainer calls to time")
	syncPods := flag.Int("sync-pods", 2000, "pods (one container each) handed over at Synchronize")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for the plugin to synchronize")
	linger := flag.Duration("linger", 0, "keep the connection this long after printing the figures")
	settle := flag.Duration("settle", 0, "pause after the warm-up, before the timed calls (the plugin converges)")
	verbose := flag.Bool("v", false, "runtime library logs")
	flag.StringVar(&prefix, "cgroup-prefix", "", "cgroup path prefix of every pod (e.g. /bench-1234)")
	flag.IntVar(&noteBytes, "note-bytes", 3000, "size of each pod's last-applied-configuration (0: none)")
	flag.Parse()
	if !*verbose {
		logrus.SetLevel(logrus.WarnLevel)
	}
	_ = log.Get()
	os.Remove(*sock)
	qosOf := func(i int) string { return []string{"LS", "BE", "LSR"}[i%3] }
	pods, ctrs := []*api.PodSandbox{}, []*api.Container{}
	for i := 0; i < *syncPods; i++ {
		p := pod(100000+i, qosOf(i))
		pods, ctrs = append(pods, p), append(ctrs, container(100000+i, p, qosOf(i)))
	}
	syncBytes := proto.Size(&api.SynchronizeRequest{Pods: pods, Containers: ctrs})
	var pushed, pushCalls int64
	syncDur, syncErr, syncUpdates := time.Duration(0), "", 0
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
		syncDur, syncUpdates = time.Since(t0), len(u)
		if err != nil {
			syncErr = err.Error()
		}
		return err
	}
	updateFn := func(ctx context.Context, u []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		atomic.AddInt64(&pushed, int64(len(u)))
		atomic.AddInt64(&pushCalls, 1)
		return nil, nil
	}
	// Beside the socket: the caller's directory, removed with it (the caller may kill us while we linger).
	dir, _ := os.MkdirTemp(filepath.Dir(*sock), "plugins")
	defer os.RemoveAll(dir)
	r, err := adaptation.New("nri-runtime-scale", "0.1", syncFn, updateFn, adaptation.WithSocketPath(*sock),
		adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
	if err == nil {
		err = r.Start()
	}
	if err != nil {
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
	firstCreate, firstErr := 0.0, ""
	for i := 0; ready && i < 50; i++ { // warm-up: a plugin may finish its own start-up now
		p := pod(900000+i, "BE")
		c := container(900000+i, p, "BE")
		t0 := time.Now()
		_, err := r.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: p, Container: c})
		if i == 0 { // right after Synchronize: waits for whatever the plugin does after its answer
			firstCreate = float64(time.Since(t0).Nanoseconds()) / 1000
			if err != nil {
				firstErr = err.Error()
			}
		}
		removeContainer(ctx, r, p, c)
		removePod(ctx, r, p)
	}
	if ready {
		time.Sleep(*settle)
	}
	out := map[string]interface{}{"nri": nriVersion, "ready": ready, "sync_pods": *syncPods, "sync_bytes": syncBytes,
		"sync_ms": float64(syncDur.Microseconds()) / 1000, "sync_error": syncErr, "sync_updates": syncUpdates,
		"first_create_us": firstCreate, "first_create_error": firstErr}
	if ready {
		lat := []float64{}
		errs, beAdj := 0, 0
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
			} else if q == "BE" && resp.GetAdjust().GetLinux().GetResources().GetCpu().GetShares() != nil {
				beAdj++
			}
			if err := removeContainer(ctx, r, p, c); err != nil {
				errs++
			}
			if err := removePod(ctx, r, p); err != nil {
				errs++
			}
		}
		sort.Float64s(lat)
		out["n"], out["errors"], out["be_adjusted"] = *n, errs, beAdj
		out["p50_us"], out["p90_us"], out["p99_us"], out["max_us"] = pct(lat, .5), pct(lat, .9), pct(lat, .99), pct(lat, 1)
	}
	out["pushed_updates"], out["push_calls"] = atomic.LoadInt64(&pushed), atomic.LoadInt64(&pushCalls)
	b, _ := json.Marshal(out)
	fmt.Println(strings.TrimSpace(string(b)))
	time.Sleep(*linger)
	r.Stop()
}
