package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/test/wireguard/tunnel"
)

// serveAPI is `wgtunnel api`: the stand-in API server of the tests
// (internal/apitest) on 127.0.0.1 in -ns, listing one CiliumNode per
// NAME=ADDR argument (each encrypting), until ctx ends. It writes the
// service account (token, ca.crt) into -dir and the environment of a pod
// that reaches it into -dir/env, one KEY=VALUE a line, then prints "ready".
func serveAPI(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	ns := fs.String("ns", "", "network namespace to serve in")
	dir := fs.String("dir", "", "directory for the service account and the env file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *ns == "" || *dir == "" || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: wgtunnel api -ns NS -dir DIR NAME=ADDR...")
		return 2
	}
	var nodes []apitest.Node
	for _, a := range fs.Args() {
		name, addr, ok := strings.Cut(a, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "wgtunnel api: %q: want NAME=ADDR\n", a)
			return 2
		}
		nodes = append(nodes, apitest.Node{Name: name, InternalIPs: []string{addr}, Key: 255})
	}
	var ln net.Listener
	if err := tunnel.In(*ns, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		fmt.Fprintln(os.Stderr, "wgtunnel api:", err)
		return 1
	}
	srv, err := apitest.Start(apitest.Options{Listener: ln})
	if err != nil {
		fmt.Fprintln(os.Stderr, "wgtunnel api:", err)
		return 1
	}
	defer srv.Close()
	for _, n := range nodes {
		if _, err := srv.Put(n); err != nil {
			fmt.Fprintln(os.Stderr, "wgtunnel api:", err)
			return 1
		}
	}
	if err := srv.WriteServiceAccount(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "wgtunnel api:", err)
		return 1
	}
	env := append(srv.Env(), "MARKSPLIT_SERVICEACCOUNT_DIR="+*dir)
	if err := os.WriteFile(filepath.Join(*dir, "env"), []byte(strings.Join(env, "\n")+"\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "wgtunnel api:", err)
		return 1
	}
	fmt.Println("ready")
	<-ctx.Done()
	return 0
}

// respond is `wgtunnel respond`: a path-MTU probe responder
// (internal/pathprobe) in -ns for -allow, as each node's agent serves it,
// until ctx ends.
func respond(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("respond", flag.ContinueOnError)
	ns := fs.String("ns", "", "network namespace to answer in")
	allow := fs.String("allow", "", "the prober's `address`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	from, err := netip.ParseAddr(*allow)
	if *ns == "" || err != nil {
		fmt.Fprintln(os.Stderr, "usage: wgtunnel respond -ns NS -allow ADDR")
		return 2
	}
	var c *net.UDPConn
	if err := tunnel.In(*ns, func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: pathprobe.DefaultPort})
		return err
	}); err != nil {
		fmt.Fprintln(os.Stderr, "wgtunnel respond:", err)
		return 1
	}
	r := &pathprobe.Responder{Allow: func(a netip.Addr) bool { return a == from }}
	r.ServeConn(ctx, c)
	return 0
}
