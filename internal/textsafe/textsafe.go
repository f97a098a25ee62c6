// Package textsafe escapes what a terminal would act on in text that others
// name: a link's or a process's name, a socket's path.
package textsafe

import "strconv"

// Terminal returns s with every character a terminal would act on
// written as a Go escape, as strconv quotes a string for a terminal: C0
// and C1 controls (ESC as \x1b, BEL as \a), DEL, other non-graphic runes
// (\u200b), and bytes that are not UTF-8 (\xff); a backslash or a double
// quote is escaped too, so that the escapes are unambiguous. A link or
// process name the kernel accepts can thus not move the cursor, ring the
// bell or retitle the window of whoever reads the output; ordinary text
// comes back unchanged. (examples/watch, which stands outside the module's
// internal packages, does the same.)
func Terminal(s string) string {
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}
