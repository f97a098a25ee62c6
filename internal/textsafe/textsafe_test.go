package textsafe

import "testing"

func TestTerminal(t *testing.T) {
	for in, want := range map[string]string{
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 mtu 1355": "table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 mtu 1355",
		"dev \x1b[31menp\x07": `dev \x1b[31menp\a`,
		"\x1b]0;owned\x07":    `\x1b]0;owned\a`,
		"tab\there\r\n":       `tab\there\r\n`,
		"del\x7f c1\u0085":    `del\x7f c1\u0085`,
		"zero\u200bwidth":     `zero\u200bwidth`,
		"bad \xff utf8":       `bad \xff utf8`,
		`back\slash`:          `back\\slash`,
		`say "hi"`:            `say \"hi\"`,
		"wlan-ü 网络":           "wlan-ü 网络",
		"":                    "",
	} {
		if got := Terminal(in); got != want {
			t.Errorf("Terminal(%q) = %q, want %q", in, got, want)
		}
	}
}
