// Package textsafe escapes what a terminal would act on in text that others
// name: a link's or a process's name, a socket's path.
package textsafe

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Terminal returns s with every character a terminal would act on
// written as a Go escape: C0 and C1 controls (ESC as \x1b, BEL as \a),
// DEL, other non-printable runes (\u200b), and bytes that are not UTF-8
// (\xff); a backslash is doubled, so that the escapes are unambiguous.
// A link or process name the kernel accepts can thus not move the
// cursor, ring the bell or retitle the window of whoever reads the output;
// ordinary text comes back unchanged.
func Terminal(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
