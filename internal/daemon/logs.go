package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter rate-limits a warning a client can provoke at will (a bad post record, a
// dropped event, an accept failure): at most logBurst lines per key in each logWindow; the
// next line after a quiet spell says how many were suppressed.
type logLimiter struct {
	mu   sync.Mutex
	keys map[string]*logKey
}

type logKey struct {
	start      time.Time
	n          int
	suppressed int
}

const (
	logWindow = 10 * time.Second
	logBurst  = 5
	// connLogBurst: connects and disconnects are an audit trail, logged more freely.
	connLogBurst = 100
)

// allow reports whether a line for key may be logged now (at most burst per logWindow), and
// how many lines were suppressed since the last one that was.
func (l *logLimiter) allow(key string, burst int, now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[string]*logKey{}
	}
	k := l.keys[key]
	if k == nil {
		if len(l.keys) >= 1024 { // keys are a fixed set; a bound all the same
			clear(l.keys)
		}
		k = &logKey{start: now}
		l.keys[key] = k
	}
	if now.Sub(k.start) >= logWindow {
		k.start, k.n = now, 0
	}
	if k.n >= burst {
		k.suppressed++
		return false, 0
	}
	k.n++
	suppressed, k.suppressed = k.suppressed, 0
	return true, suppressed
}

// limitedLog logs a warning under key's rate limit (logBurst lines per logWindow).
func (s *Server) limitedLog(key, msg string, args ...any) {
	s.limitedLogLevel(key, slog.LevelWarn, logBurst, msg, args...)
}

// limitedLogLevel logs at level under key's rate limit of burst lines per logWindow.
func (s *Server) limitedLogLevel(key string, level slog.Level, burst int, msg string, args ...any) {
	ok, n := s.logs.allow(key, burst, time.Now())
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	s.log.Log(context.Background(), level, msg, args...)
}
