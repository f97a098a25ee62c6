// Command wgtunnel is what `make demo` (scripts/demo.sh) uses to build
// wireguard-go and to drive traffic through the demo's WireGuard tunnel;
// the same code the end-to-end test in ../.. measures with (package tunnel).
//
//	wgtunnel wireguard-go DIR      build (once) and print the cached wireguard-go binary of the module in DIR
//	wgtunnel fullsize [flags]      full-size datagrams through the tunnel: answers and FragOKs
//	wgtunnel bulk [flags]          one bounded bulk TCP transfer: its throughput, MSS and FragOKs
//	wgtunnel api -ns NS -dir DIR NAME=ADDR...
//	                               serve CiliumNodes in NS (the tests' stand-in API server) until SIGTERM
//	wgtunnel respond -ns NS -allow ADDR
//	                               answer ADDR's path-MTU probes in NS until SIGTERM
//
// Both traffic commands take -from and -to (network namespace names) and
// -dst (the receiver's tunnel address and port, in -to).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/marksplit/marksplit/test/wireguard/tunnel"
)

func main() { os.Exit(run()) }

func run() int {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wgtunnel wireguard-go DIR | fullsize [flags] | bulk [flags]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code := run1(ctx, os.Args[1], os.Args[2:])
	if code != 0 && ctx.Err() != nil {
		return 130 // interrupted: say so to the demo, as a shell would
	}
	return code
}

func run1(ctx context.Context, cmd string, args []string) int {
	switch cmd {
	case "api":
		return serveAPI(ctx, args)
	case "respond":
		return respond(ctx, args)
	}
	if cmd == "wireguard-go" {
		if len(args) != 1 {
			fmt.Fprintln(os.Stderr, "usage: wgtunnel wireguard-go DIR")
			return 2
		}
		bin, err := tunnel.BuildWireGuardGo(args[0], os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel:", err)
			return 1
		}
		fmt.Println(bin)
		return 0
	}

	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	from := fs.String("from", "", "sending network namespace")
	to := fs.String("to", "", "receiving network namespace")
	dst := fs.String("dst", "", "receiver's tunnel `ADDR:PORT` in -to")
	size := fs.Int("size", 1355, "fullsize: IP packet size (the tunnel MTU fills it exactly)")
	count := fs.Int("count", 200, "fullsize: datagrams to send")
	mb := fs.Int("mb", 20, "bulk: MB (10⁶ bytes) to send")
	limit := fs.Duration("limit", 3*time.Second, "bulk: stop after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ap, err := netip.ParseAddrPort(*dst)
	if err != nil || *from == "" || *to == "" {
		fmt.Fprintf(os.Stderr, "wgtunnel %s: -from, -to and -dst ADDR:PORT are required\n", cmd)
		return 2
	}
	switch cmd {
	case "fullsize":
		r, err := tunnel.FullSize(ctx, *from, *to, ap, *size, *count)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel:", err)
			return 1
		}
		fmt.Println(r)
	case "bulk":
		before, err := tunnel.ReadFrag(*from)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel:", err)
			return 1
		}
		r, err := tunnel.Bulk(ctx, *from, *to, ap, int64(*mb)*1e6, *limit)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel:", err)
			return 1
		}
		after, err := tunnel.ReadFrag(*from)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel:", err)
			return 1
		}
		d := after.Sub(before)
		fmt.Printf("%v; MSS %d; FragOKs +%d, FragCreates +%d\n", r, r.MSS, d.OKs, d.Creates)
	default:
		fmt.Fprintf(os.Stderr, "wgtunnel: unknown command %q\n", cmd)
		return 2
	}
	return 0
}
