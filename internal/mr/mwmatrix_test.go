package mr

import (
	"errors"
	"testing"
)

// TestMWAccessMatrix: for both window types, every valid access-flag combination of the
// underlying MR (all with MW_BIND) x every window access combination (the 6 defined bits) x
// every access kind. Bind follows IBTA 10.6.7.2.2 / rxe_mw.c (window rights only
// REMOTE_READ/WRITE/ATOMIC and ZERO_BASED, the last for type 2 windows only, IBTA o10-36.2.2;
// remote write or atomic needs LOCAL_WRITE on the MR); Check through the window's rkey grants
// exactly the window's remote rights, never a local access (a window has no L_Key, IBTA
// 10.6.7.2), and returns the window's bytes.
func TestMWAccessMatrix(t *testing.T) {
	const iova, off, wlen = 0x8000, 16, 32
	remote := AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic
	for _, typ := range []MWType{MWType1, MWType2} {
		tb := NewTable(TableOptions{})
		pd := newPD(t, tb)
		w, err := tb.AllocMW(pd, typ)
		if err != nil {
			t.Fatal(err)
		}
		const qpn = 9
		binds, checks := 0, 0
		for mracc := Access(0); mracc < 64; mracc++ {
			if !mracc.Valid() || mracc&AccessMWBind == 0 {
				continue
			}
			buf := make([]byte, 128)
			for i := range buf {
				buf[i] = byte(i)
			}
			m := reg(t, tb, pd, buf, iova, mracc)
			base := m.IOVA() // 0 for a zero-based MR
			for wacc := Access(0); wacc < 64; wacc++ {
				var wantBind error
				switch {
				case wacc&^(remote|AccessZeroBased) != 0:
					wantBind = ErrInvalidArg
				case typ == MWType1 && wacc&AccessZeroBased != 0: // IBTA o10-36.2.2
					wantBind = ErrInvalidArg
				case wacc&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && mracc&AccessLocalWrite == 0:
					wantBind = ErrAccess
				}
				o := BindOptions{MR: m, Addr: base + off, Length: wlen, Access: wacc}
				if typ == MWType2 {
					o.PD, o.QPN, o.Key = pd, qpn, KeyByte(w.RKey())+1
				}
				k, err := w.Bind(o)
				if wantBind != nil {
					if !errors.Is(err, wantBind) {
						t.Fatalf("type %d mr %#x window %#x: bind %v, want %v", typ, mracc, wacc, err, wantBind)
					}
					continue
				}
				if err != nil {
					t.Fatalf("type %d mr %#x window %#x: bind refused: %v", typ, mracc, wacc, err)
				}
				binds++
				wva := base + off // the window's first byte in its own addressing
				if wacc&AccessZeroBased != 0 {
					wva = 0
				}
				for op := OpLocalRead; op <= OpRemoteAtomic; op++ {
					var b []byte
					var done func()
					var err error
					if op == OpRemoteAtomic {
						b, done, err = tb.CheckAtomicQP(pd, qpn, k, wva+8)
					} else {
						b, done, err = tb.CheckQP(pd, qpn, k, wva+8, 8, op)
					}
					checks++
					var want error
					switch {
					case !op.remote():
						want = ErrBadKey
					case wacc&op.need() == 0:
						want = ErrAccess
					}
					if want != nil {
						if !errors.Is(err, want) || b != nil {
							t.Fatalf("type %d mr %#x window %#x op %v: %v, want %v", typ, mracc, wacc, op, err, want)
						}
						continue
					}
					if err != nil || len(b) != 8 || &b[0] != &buf[off+8] {
						t.Fatalf("type %d mr %#x window %#x op %v: %v (len %d)", typ, mracc, wacc, op, err, len(b))
					}
					done()
				}
				// The window's bounds: one byte before and after it are refused.
				if wacc&AccessRemoteRead != 0 {
					for _, c := range []struct {
						va uint64
						n  uint32
					}{{wva - 1, 1}, {wva + wlen, 1}, {wva, wlen + 1}} {
						if wacc&AccessZeroBased != 0 && c.va == ^uint64(0) {
							continue // va -1 of a zero-based window wraps: the overflow case
						}
						if _, _, err := tb.CheckQP(pd, qpn, k, c.va, c.n, OpRemoteRead); !errors.Is(err, ErrBounds) {
							t.Fatalf("type %d window %#x: %#x+%d: %v, want ErrBounds", typ, wacc, c.va, c.n, err)
						}
					}
				}
				// Return the window to Free for the next combination.
				if typ == MWType2 {
					if err := tb.InvalidateQP(pd, qpn, k); err != nil {
						t.Fatal(err)
					}
				} else if _, err := w.Bind(BindOptions{MR: m}); err != nil {
					t.Fatal(err)
				}
				if _, _, err := tb.CheckQP(pd, qpn, k, wva, 1, OpRemoteRead); err == nil {
					t.Fatalf("type %d: key %#x still valid after unbind/invalidate", typ, k)
				}
			}
			if err := m.Dereg(); err != nil {
				t.Fatal(err)
			}
		}
		// 20 valid MR flag sets carry MW_BIND: 16 with LOCAL_WRITE accept all 16 window sets,
		// 4 without (REMOTE_READ, ZERO_BASED free) accept the 4 without write/atomic; 5 ops each.
		// A type 1 window takes only the half without ZERO_BASED.
		want := 16*16 + 4*4
		if typ == MWType1 {
			want /= 2
		}
		if binds != want || checks != 5*binds {
			t.Fatalf("type %d: %d binds, %d checks", typ, binds, checks)
		}
	}
}
