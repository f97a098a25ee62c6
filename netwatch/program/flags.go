package program

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// OwnerFlags defines --table, --priority and --protocol on fs, filling
// table, priority and protocol, with the help text every program shows:
// owner names the program ("the agent", "pin"). Flags defines them; a
// program that parses its own command line defines them with this.
func OwnerFlags(fs *flag.FlagSet, owner string, table *reconcile.OwnTable, priority *reconcile.OwnPriority, protocol *reconcile.OwnProtocol) {
	fs.Var(table, "table", "routing `table` owned by "+owner+", every route in it, both families: 1 to 4294967295, but not 252, 253, 254 or 255")
	fs.Var(priority, "priority", "rule `priority` owned by "+owner+", every rule at it, both families: 1 to 32765")
	fs.Var(protocol, "protocol", "rtm_protocol / FRA_PROTOCOL `value` stamped on what "+owner+" installs: 2 (kernel) or 4 to 255, or an iproute2 name such as static")
}

// flagDashes puts the two dashes every help text shows before a flag's
// name in package flag's errors, which show one.
var flagDashes = strings.NewReplacer(
	"for flag -", "for flag --",
	"not defined: -", "not defined: --",
	"needs an argument: -", "needs an argument: --",
	"\" for -", "\" for --",
)

// FlagError is the one line that says what is wrong with a command line,
// from an error of flag.FlagSet.Parse: its flags named with two dashes,
// as the help text names them.
func FlagError(err error) string {
	return strings.ReplaceAll(flagDashes.Replace(err.Error()), "\n", " ")
}

// PrintFlags writes the help text of fs's flags to w, sorted by name, in
// the one style of every program: "--name VALUE", then the help, then the
// default when it is not the zero value.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}
