#!/bin/bash
# bench/lab-probe-guest.sh: runs INSIDE the rxe lab guest (bench/lab-probe.sh copies it, the
# static softroce binary, bench/probe (Go) and bench/cprobe (C, static) into the share).
# Evidence for docs/lab.md "What the guest costs": the guest's timekeeping, what a clock read, a
# short sleep and an 8-byte UDP round trip cost in C and in Go, and softroce's 8-byte WRITE
# latency next to kernel rxe's, for every clocksource the guest offers (CLOCKSOURCES, or all);
# PROBE_TRACE=0 skips the strace/schedtrace runs, PROBE_MICRO=0 the C/Go micro-benchmarks,
# PROBE_LAT=0 the latency rows; PROBE_BW=1 adds 64 KiB WRITE bandwidth rows and CPU profiles;
# PROBE_PROF=1 a CPU-profiled busy-poll latency run (PROBE_XDP=1: with the AF_XDP link).
# usage: lab-probe-guest.sh DIR N_LAT
set -u
D=$1 NLAT=${2:-300}
for f in softroce probe pingpong; do cp "$D/$f" /tmp/$f && chmod +x /tmp/$f; done
SR=/tmp/softroce P=/tmp/probe C=/tmp/pingpong
say() { echo "== $*"; }
CS=/sys/devices/system/clocksource/clocksource0
say "kernel $(uname -r), $(nproc) CPUs; cmdline: $(cat /proc/cmdline)"
say "clocksource current=$(cat $CS/current_clocksource) available=$(cat $CS/available_clocksource)"
say "clockevent $(cat /sys/devices/system/clockevents/clockevent0/current_device 2>/dev/null)"
dmesg | grep -iE "clocksource|tsc|hpet|hrtimer|clockevent|Switched to|lapic|timer" | head -30 | sed 's/^/   dmesg: /'
grep -E "^(flags|model name)" /proc/cpuinfo | head -2 | cut -c1-400 | sed 's/^/   cpuinfo: /'
grep -E "^Tick Device|^Clock Event Device|event_handler|^ *mode:" /proc/timer_list | head -12 | sed 's/^/   timer_list: /'

# netns pa 198.19.22.1 <-> pb 198.19.22.2 on a veth pair (what softroce<->softroce uses)
ip netns add pa; ip netns add pb
ip link add vpa type veth peer name vpb
ip link set vpa netns pa; ip link set vpb netns pb
ip -n pa addr add 198.19.22.1/24 dev vpa; ip -n pb addr add 198.19.22.2/24 dev vpb
for n in pa pb; do ip -n $n link set lo up; done
ip -n pa link set vpa mtu 9000 up; ip -n pb link set vpb mtu 9000 up
A="ip netns exec pa" B="ip netns exec pb"
rxelab-dual up > /dev/null 2>&1
G1=$(rxelab-gid rxe1 198.19.0.1) G2=$(rxelab-gid rxe2 198.19.0.2)

PORT=21000
# srvcli SRV CLI: server in pb, client in pa (both commands get their own flags)
srvcli() {
  PORT=$((PORT + 1))
  timeout 120 $B $1 > /tmp/srv.out 2>&1 &
  local sp=$!
  sleep 1.5
  timeout 120 $A $2 2>&1
  wait $sp 2>/dev/null
}
lat() { awk '/#bytes/ {getline; printf "t_min %s t_typical %s t_avg %s 99%% %s\n", $3, $5, $6, $7; exit}'; }

probe_all() {
  local cs=$1
  say "---- clocksource $cs"
  [ "${PROBE_MICRO:-1}" = 1 ] && micro
  [ "${PROBE_LAT:-1}" = 1 ] && softroce_rows
  [ "${PROBE_BW:-0}" = 1 ] && bw_rows
  [ "${PROBE_PROF:-0}" = 1 ] && prof_rows
}

# A CPU-profiled polled 8-byte WRITE latency run (server on CPU 1, client on CPU 0, as
# bench/lab.sh pins); PROBE_XDP=1 adds the AF_XDP link (--xdp, -m 2048).
prof_rows() {
  PORT=$((PORT + 1))
  local m=4096 x=""
  [ "${PROBE_XDP:-0}" = 1 ] && m=2048 x=--xdp
  f="perf write --lat -s 8 -n ${PROF_N:-2000} -m $m -F -p $PORT --timeout 60s --run-timeout 100s --busy-poll $x"
  echo "softroce<->softroce write_lat 8 B --busy-poll $x GOMAXPROCS=1, profiled: $(srvcli "taskset -c 1 env GOMAXPROCS=1 $SR $f --cpuprofile $D/prof.lat.srv -d 198.19.22.2" "taskset -c 0 env GOMAXPROCS=1 $SR $f --cpuprofile $D/prof.lat.cli -d 198.19.22.1 198.19.22.2" | lat)"
}

bwres() { awk '/#bytes/ {getline; print $4; exit}'; }
# 64 KiB WRITE bandwidth: rxe, softroce (variants), and CPU profiles of softroce (to $D)
bw_rows() {
  $P crc 65536 200; GODEBUG=cpu.pclmulqdq=off $P crc 65536 200; $P copy 65536 200
  PORT=$((PORT + 1))
  timeout 120 ib_write_bw -d rxe2 -x "$G2" -s 65536 -n 1000 -F -p $PORT --report_gbits > /tmp/srv.out 2>&1 &
  sleep 1.5
  echo "rxe<->rxe write_bw 64 KiB: $(timeout 120 ib_write_bw -d rxe1 -x "$G1" -s 65536 -n 1000 -F -p $PORT --report_gbits 198.19.0.2 2>&1 | bwres) Gbit/s"
  wait
  for v in "GOMAXPROCS=1" "GOMAXPROCS=1 GODEBUG=cpu.pclmulqdq=off" "GOMAXPROCS=2" "GOMAXPROCS=1 BP" "GOMAXPROCS=1 PROF"; do
    PORT=$((PORT + 1))
    local e=${v% BP}; e=${e% PROF} x=""
    [ "${v% BP}" != "$v" ] && x=--busy-poll
    f="perf write -s 65536 -n 1000 -m 4096 -F -p $PORT --report_gbits --timeout 60s --run-timeout 100s $x"
    if [ "${v% PROF}" != "$v" ]; then
      echo "softroce<->softroce write_bw 64 KiB $v: $(srvcli "env $e $SR $f --cpuprofile $D/prof.bw.srv -d 198.19.22.2" "env $e $SR $f --cpuprofile $D/prof.bw.cli -d 198.19.22.1 198.19.22.2" | bwres) Gbit/s"
    else
      echo "softroce<->softroce write_bw 64 KiB $v: $(srvcli "env $e $SR $f -d 198.19.22.2" "env $e $SR $f -d 198.19.22.1 198.19.22.2" | bwres) Gbit/s"
    fi
  done
}

micro() {
  $C clock 200000
  $P clock 200000
  GOMAXPROCS=1 $P clock 200000
  $C sleep 200 50
  $P sleep 200 50
  $C sleep 100 1000
  for m in "" spin; do
    PORT=$((PORT + 1)); timeout 60 $B $C server 198.19.22.2 $PORT $m & sleep 1
    timeout 60 $A $C client 198.19.22.2 $PORT 2000 $m; wait
  done
  for g in 1 2; do
    for m in netpoll block spin; do
      sm=netpoll; [ $m = spin ] && sm=spin
      PORT=$((PORT + 1)); timeout 60 $B env GOMAXPROCS=$g $P server -mode $sm 198.19.22.2 $PORT & sleep 1
      timeout 60 $A env GOMAXPROCS=$g $P client -mode $m 198.19.22.2 $PORT 2000; wait
    done
  done
}

softroce_rows() {
  # kernel rxe <-> rxe (init_net, --dual veth) and softroce <-> softroce: 8-byte WRITE latency
  PORT=$((PORT + 1))
  timeout 120 ib_write_lat -d rxe2 -x "$G2" -s 8 -n $NLAT -F -p $PORT > /tmp/srv.out 2>&1 &
  sleep 1.5
  echo "rxe<->rxe ib_write_lat 8 B: $(timeout 120 ib_write_lat -d rxe1 -x "$G1" -s 8 -n $NLAT -F -p $PORT 198.19.0.2 2>&1 | lat)"
  wait
  for g in 1 2; do
    PORT=$((PORT + 1))
    f="perf write --lat -s 8 -n $NLAT -m 4096 -F -p $PORT --timeout 60s --run-timeout 100s"
    echo "softroce<->softroce write_lat 8 B GOMAXPROCS=$g: $(srvcli "env GOMAXPROCS=$g $SR $f -d 198.19.22.2" "env GOMAXPROCS=$g $SR $f -d 198.19.22.1 198.19.22.2" | lat)"
  done
  for g in 1 2; do
    PORT=$((PORT + 1))
    f="perf write --lat -s 8 -n $NLAT -m 4096 -F -p $PORT --timeout 60s --run-timeout 100s --busy-poll"
    echo "softroce<->softroce write_lat 8 B --busy-poll GOMAXPROCS=$g: $(srvcli "env GOMAXPROCS=$g $SR $f -d 198.19.22.2" "env GOMAXPROCS=$g $SR $f -d 198.19.22.1 198.19.22.2" | lat)"
  done
  [ "${PROBE_TRACE:-1}" = 1 ] || return 0
  # system calls of one softroce latency run (server side; strace slows it, counts matter)
  for bp in "" --busy-poll; do
    PORT=$((PORT + 1))
    f="perf write --lat -s 8 -n 200 -m 4096 -F -p $PORT --timeout 60s --run-timeout 100s $bp"
    timeout 120 $B strace -f -c -o /tmp/strace.srv env GOMAXPROCS=1 $SR $f -d 198.19.22.2 > /dev/null 2>&1 &
    sleep 2.5
    timeout 120 $A env GOMAXPROCS=1 $SR $f -d 198.19.22.1 198.19.22.2 > /dev/null 2>&1
    wait
    echo "strace -c -f of the softroce server, 200 x 8 B WRITE ping-pong (GOMAXPROCS=1) $bp:"
    head -14 /tmp/strace.srv | sed 's/^/   /'
  done
  # scheduler view of one run
  PORT=$((PORT + 1))
  f="perf write --lat -s 8 -n $NLAT -m 4096 -F -p $PORT --timeout 60s --run-timeout 100s"
  timeout 120 $B env GOMAXPROCS=1 GODEBUG=schedtrace=1000 $SR $f -d 198.19.22.2 > /tmp/srv.out 2>&1 &
  sleep 1.5
  timeout 120 $A env GOMAXPROCS=1 $SR $f -d 198.19.22.1 198.19.22.2 > /dev/null 2>&1
  wait
  grep SCHED /tmp/srv.out | tail -3 | sed 's/^/   schedtrace: /'
}

for cs in ${CLOCKSOURCES:-$(cat $CS/available_clocksource)}; do
  echo "$cs" > $CS/current_clocksource 2>/dev/null || { say "cannot select $cs"; continue; }
  [ "$(cat $CS/current_clocksource)" = "$cs" ] || { say "clocksource $cs not taken"; continue; }
  probe_all "$cs"
done
say "clocksource at the end: $(cat $CS/current_clocksource); dmesg:"
dmesg | grep -iE "clocksource|tsc" | tail -5 | sed 's/^/   dmesg: /'
