package cli

import (
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Strtol is C's strtol(s, NULL, base) for base 0 or 10, as the rdma-core examples read their
// numbers (atoi is base 10; strtoul differs only for negative values, which every caller
// refuses): leading white space and a sign, then a decimal, 0x hexadecimal or 0 octal (base 0)
// number up to the first other character; 0 when there is none ("12abc" is 12, "abc" is 0). It
// saturates where C would overflow.
func Strtol(s string, base int) int64 {
	s = strings.TrimLeft(s, " \t\n\v\f\r")
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	b := int64(10)
	if base == 0 {
		switch {
		case len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && strings.ContainsRune("0123456789abcdefABCDEF", rune(s[2])):
			b, s = 16, s[2:]
		case len(s) > 1 && s[0] == '0':
			b = 8
		}
	}
	var n int64
	for i := 0; i < len(s); i++ {
		d := int64(strings.IndexByte("0123456789abcdef", s[i]|0x20))
		if s[i] < '0' || d < 0 || d >= b {
			break
		}
		if n > (1<<62)/b {
			n = 1 << 62
			break
		}
		n = n*b + d
	}
	if neg {
		return -n
	}
	return n
}

// cInt is an int option read with Strtol: the C tools' atoi/strtol without an end check, so
// that "-S 12abc" means what it means to them.
type cInt struct {
	p    *int
	base int
}

func (v cInt) String() string     { return strconv.Itoa(*v.p) }
func (v cInt) Type() string       { return "int" }
func (v cInt) Set(s string) error { *v.p = int(Strtol(s, v.base)); return nil }

// CIntVarP defines an int option read as C's strtol(optarg, NULL, base) reads it (base 0 or
// 10; atoi is 10).
func CIntVarP(fs *pflag.FlagSet, p *int, name, short string, def, base int, usage string) {
	*p = def
	fs.VarP(cInt{p, base}, name, short, usage)
}
