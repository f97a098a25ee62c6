package mtupolicy

// Walks reports how many times c walked the main table.
func (c *PeerCache) Walks() int { return c.walks }
