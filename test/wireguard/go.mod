module github.com/marksplit/marksplit/test/wireguard

go 1.26.0

require golang.org/x/sys v0.50.0

require github.com/marksplit/marksplit v0.0.0

// The tests serve CiliumNodes with the repository's stand-in API server
// (internal/apitest) and answer path-MTU probes with its responder
// (internal/pathprobe): the library itself, never a published version.
replace github.com/marksplit/marksplit => ../..
