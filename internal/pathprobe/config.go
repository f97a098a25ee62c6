package pathprobe

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Defaults, with their reasons.
const (
	// DefaultPort is the responder's UDP port on every node: next to the
	// agent's metrics ports (9184 plain, 9185 TLS).
	DefaultPort = 9186
	// DefaultRate is the node-wide probe rate in packets per second,
	// whatever the number of peers: 20 packets of at most the underlay MTU
	// are about 30 KB/s, nothing next to user traffic.
	DefaultRate = 20
	// DefaultSources is the number of source ports (one socket each) a size
	// is probed from, so that ECMP legs hashed on ports are sampled: with 4,
	// a leg taking half of the flows is missed with probability 1/16 per
	// search, and the periodic searches sample new ports each time.
	DefaultSources = 4
	// DefaultTries is how many rounds a size gets before it fails: a size
	// fails only when every one of them lost a probe of that size while
	// their base-size probe was answered, so one lost packet does not lower
	// a path.
	DefaultTries = 2
	// DefaultTimeout is how long a round waits for its answers: far above
	// any round trip between nodes of one cluster, even across clouds.
	DefaultTimeout = time.Second
	// DefaultBase4 and DefaultBase6 are the base sizes: RFC 8899's
	// BASE_PLPMTU for IPv4, and IPv6's minimum link MTU, which every IPv6
	// path carries.
	DefaultBase4 = 1200
	DefaultBase6 = 1280
	// DefaultStep is the binary search's resolution: WireGuard pads to 16
	// bytes, so finer does not change the inner MTU.
	DefaultStep = 16
	// DefaultOffset4 and DefaultOffset6 place the search's grid on the
	// sizes where floor16(P − overhead) changes: WireGuard's overhead on an
	// IPv4 (60 bytes) and IPv6 (80 bytes) underlay. The size found, F, then
	// gives the same inner MTU as the path's true size P:
	// floor16(F − 60) = floor16(P − 60).
	DefaultOffset4 = 60
	DefaultOffset6 = 80
)

// DefaultLadder is the sizes tried, smallest first, after the largest size
// worth trying (max) failed and before the binary search: the path sizes
// met between clouds (cilium#47176: 1296, 1368, 1400).
var DefaultLadder = []int{1296, 1368, 1400}

// Config configures a Prober. The zero value probes with the defaults
// above, without a mark and without the ICMP echo fallback.
type Config struct {
	// Mark is the SO_MARK every probe carries (setting it needs
	// CAP_NET_ADMIN): the tunnel's mark (0xe00 with Cilium), so that probes
	// take WireGuard's route (the main route), not the split table's. 0
	// sends unmarked probes.
	Mark uint32
	// Port is the responder's UDP port on every peer (DefaultPort).
	Port uint16
	// Rate is the node-wide probe rate in packets per second (DefaultRate),
	// shared by every Search of this Prober, whatever the number of peers.
	Rate float64
	// ICMPEcho falls back to ICMP echo where a peer's responder does not
	// answer (an operator's choice: the peer's kernel answers, so the
	// reverse path must carry the size too). It needs ping sockets
	// (net.ipv4.ping_group_range including the process's group).
	ICMPEcho bool
	// Logger receives debug lines about searches (default: discard).
	Logger *slog.Logger

	// Sources is the number of source ports each size is probed from
	// (DefaultSources).
	Sources int
	// SourcePorts, when set, are the source ports themselves (its length
	// overrides Sources); by default the kernel picks ephemeral ports.
	SourcePorts []uint16
	// Base4 and Base6 are the base sizes, in bytes of IP packet, probed in
	// every round to tell a lost size from a peer that does not answer
	// (DefaultBase4, DefaultBase6). A path smaller than the base is
	// reported unreachable.
	Base4, Base6 int
	// Ladder is the sizes tried after max, smallest first, up to the first
	// that fails (DefaultLadder); sizes at or above max or at or below the
	// base are skipped.
	Ladder []int
	// Step is the binary search's resolution in bytes (DefaultStep).
	Step int
	// Offset4 and Offset6 place the binary search's grid: it tries sizes
	// Offset + k·Step (DefaultOffset4, DefaultOffset6).
	Offset4, Offset6 int
	// Tries is the number of rounds a size gets before it fails
	// (DefaultTries).
	Tries int
	// Timeout is how long a round waits for its answers (DefaultTimeout).
	Timeout time.Duration
}

// ErrConfig is matched (errors.Is) by every error about a Config.
var ErrConfig = errors.New("pathprobe: bad config")

// withDefaults returns cfg with every unset field set to its default, or
// an error wrapping ErrConfig.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if len(cfg.SourcePorts) > 0 {
		cfg.Sources = len(cfg.SourcePorts)
	}
	if cfg.Sources == 0 {
		cfg.Sources = DefaultSources
	}
	if cfg.Base4 == 0 {
		cfg.Base4 = DefaultBase4
	}
	if cfg.Base6 == 0 {
		cfg.Base6 = DefaultBase6
	}
	if cfg.Ladder == nil {
		cfg.Ladder = DefaultLadder
	}
	cfg.Ladder = slices.Clone(cfg.Ladder)
	slices.Sort(cfg.Ladder)
	if cfg.Step == 0 {
		cfg.Step = DefaultStep
	}
	if cfg.Offset4 == 0 {
		cfg.Offset4 = DefaultOffset4
	}
	if cfg.Offset6 == 0 {
		cfg.Offset6 = DefaultOffset6
	}
	if cfg.Tries == 0 {
		cfg.Tries = DefaultTries
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Rate < 0:
		return cfg, fmt.Errorf("%w: Rate %v is negative", ErrConfig, cfg.Rate)
	case cfg.Sources < 1 || cfg.Sources > 64:
		return cfg, fmt.Errorf("%w: Sources %d: want 1 to 64", ErrConfig, cfg.Sources)
	case cfg.Base4 < minSize4 || cfg.Base6 < minSize6:
		return cfg, fmt.Errorf("%w: base sizes %d, %d: want at least %d and %d", ErrConfig, cfg.Base4, cfg.Base6, minSize4, minSize6)
	case cfg.Step < 1:
		return cfg, fmt.Errorf("%w: Step %d: want at least 1", ErrConfig, cfg.Step)
	case cfg.Tries < 1:
		return cfg, fmt.Errorf("%w: Tries %d: want at least 1", ErrConfig, cfg.Tries)
	case cfg.Timeout < 0:
		return cfg, fmt.Errorf("%w: Timeout %v is negative", ErrConfig, cfg.Timeout)
	}
	return cfg, nil
}
