// Command coloc: the workloads of bench/colocation.py in one static binary.
//
//	coloc calibrate -us N            iterations of the LS work that take N µs here, alone
//	coloc serve -addr A -iters N     the LS service: HTTP, N iterations of work per request
//	coloc load -url U -rate R -seconds S
//	                                 open-loop constant-rate load on U; one line per request
//	coloc cpu -threads T -out F      BE: CPU-bound loop, bogo-ops counter written to F
//	coloc mem -mib M -out F          BE: random cache-line read-modify-writes over M MiB
//
// The LS work is a dependent chain of loads from a 1 MiB table (an xorshift index), so a
// request needs the CPU and keeps a cache footprint: a BE neighbour that thrashes the
// last-level cache slows it as it would slow a real service.
//
// load is open-loop: request i is due at start + i/rate and is sent then (from its own
// goroutine) whether or not earlier ones have returned; its latency is measured from the time it
// was due, so a stalled server or a late sender shows in the latency (no coordinated omission).
// It prints "start <unix ns>" at once, then at the end one line per request:
// "<due ns> <sent ns> <done ns> <ok 0|1>", times relative to start.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const tableWords = 1 << 17 // 1 MiB of uint64

var table = func() []uint64 {
	t := make([]uint64, tableWords)
	x := uint64(88172645463325252)
	for i := range t {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		t[i] = x
	}
	return t
}()

// work runs n steps of the LS request's work and returns a value that depends on all of them.
func work(n int, seed uint64) uint64 {
	x := seed | 1
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		x += table[x&(tableWords-1)]
	}
	return x
}

func calibrate(args []string) {
	fs := flag.NewFlagSet("calibrate", flag.ExitOnError)
	us := fs.Int("us", 1000, "target microseconds of work")
	fs.Parse(args)
	n, best := 100000, time.Duration(1<<62)
	for r := 0; r < 30; r++ { // the fastest of 30 runs: the machine's own speed, not its noise
		t := time.Now()
		work(n, uint64(r))
		if d := time.Since(t); d < best {
			best = d
		}
	}
	fmt.Println(int(float64(n) * float64(*us) * 1e3 / float64(best.Nanoseconds())))
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	iters := fs.Int("iters", 100000, "work per request")
	fs.Parse(args)
	var seq atomic.Uint64
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%x\n", work(*iters, seq.Add(1)))
	})
	srv := &http.Server{Addr: *addr, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type result struct{ due, sent, done time.Duration; ok bool }

func load(args []string) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8080/", "target")
	rate := fs.Float64("rate", 100, "requests per second")
	seconds := fs.Float64("seconds", 10, "length of the schedule")
	timeout := fs.Duration("timeout", 5*time.Second, "a request not answered by then is an error")
	fs.Parse(args)
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true},
	}
	n := int(*rate * *seconds)
	res := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now()
	fmt.Printf("start %d\n", start.UnixNano())
	os.Stdout.Sync()
	for i := 0; i < n; i++ {
		due := time.Duration(float64(i) * 1e9 / *rate)
		if d := due - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func(i int, due time.Duration) {
			defer wg.Done()
			sent := time.Since(start)
			resp, err := client.Get(*url)
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok = ok && err == nil
			}
			res[i] = result{due, sent, time.Since(start), ok}
		}(i, due)
	}
	wg.Wait()
	out := bufio.NewWriter(os.Stdout)
	for _, r := range res {
		ok := 0
		if r.ok {
			ok = 1
		}
		fmt.Fprintf(out, "%d %d %d %d\n", r.due, r.sent, r.done, ok)
	}
	out.Flush()
}

// report writes "<ops> <unix ns>" to path every 100 ms (write and rename: never a torn read).
func report(path string, ops *atomic.Uint64) {
	tmp := path + ".tmp"
	for {
		line := strconv.FormatUint(ops.Load(), 10) + " " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
		if err := os.WriteFile(tmp, []byte(line), 0o644); err == nil {
			os.Rename(tmp, path)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cpu(args []string) {
	fs := flag.NewFlagSet("cpu", flag.ExitOnError)
	threads := fs.Int("threads", 2, "spinning goroutines")
	out := fs.String("out", "/out/cpu", "counter file")
	fs.Parse(args)
	var ops atomic.Uint64
	for t := 0; t < *threads; t++ {
		go func(seed uint64) {
			x := seed
			for {
				for i := 0; i < 100000; i++ { // one bogo-op: 1e5 xorshift steps in registers
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
				}
				if x == 0 {
					x = 1
				}
				ops.Add(1)
			}
		}(uint64(t) + 1)
	}
	report(*out, &ops)
}

func mem(args []string) {
	fs := flag.NewFlagSet("mem", flag.ExitOnError)
	mib := fs.Int("mib", 64, "buffer size, well above the last-level cache")
	threads := fs.Int("threads", 1, "goroutines")
	out := fs.String("out", "/out/mem", "counter file")
	fs.Parse(args)
	words := uint64(*mib) << 17
	buf := make([]uint64, words)
	for i := range buf {
		buf[i] = uint64(i)
	}
	var ops atomic.Uint64
	for t := 0; t < *threads; t++ {
		go func(seed uint64) {
			x := seed
			for {
				for i := 0; i < 4096; i++ { // one bogo-op: 4096 random cache-line read-modify-writes
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
					j := (x % words) &^ 7
					buf[j] += x
				}
				ops.Add(1)
			}
		}(uint64(t) + 7)
	}
	report(*out, &ops)
}

func main() {
	cmds := map[string]func([]string){"calibrate": calibrate, "serve": serve, "load": load, "cpu": cpu, "mem": mem}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: coloc calibrate|serve|load|cpu|mem [flags]")
		os.Exit(2)
	}
	cmds[os.Args[1]](os.Args[2:])
}
