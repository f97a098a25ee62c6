module github.com/marksplit/marksplit/bench

go 1.26.0

replace github.com/marksplit/marksplit => ../

require (
	github.com/jsimonetti/rtnetlink/v2 v2.3.0
	github.com/marksplit/marksplit v0.0.0-00010101000000-000000000000
	github.com/mdlayher/netlink v1.11.2
	github.com/vishvananda/netlink v1.3.1
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.6.0 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
