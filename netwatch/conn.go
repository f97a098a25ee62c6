package netwatch

// ownerFinder finds the process that owns a netlink port of the dialer's
// namespace (see portOwners); an rtnl.Dialer may offer one with a method
// owners() ownerFinder.
type ownerFinder interface {
	find(port uint32) (pid int, comm string, ok bool)
}
