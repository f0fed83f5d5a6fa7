#!/bin/bash
# bench/lab-guest.sh: runs INSIDE the rxe lab guest (bench/lab.sh copies it and a static
# softroce binary into the share). Three pairings, each on its own veth pair in the guest,
# same flags, perftest output; prints one "ROW|pair|test|bytes|mtu|value" line per figure.
#   rxe<->rxe:            rxe1 (veth1 198.19.0.1) <-> rxe2 (veth2 198.19.0.2), `--dual`
#   softroce<->softroce:  netns sa 198.19.20.1 <-> netns sb 198.19.20.2 (veth, UDP 4791 free there:
#                         rdma_rxe 6.1 holds 4791 in init_net only)
#   softroce<->rxe:       netns sc 198.19.21.1 (softroce) <-> init_net vr 198.19.21.2 (rxe3)
# usage: lab-guest.sh SOFTROCE_BIN N_BW N_LAT MTU
set -u
SR=$1 NBW=${2:-2000} NLAT=${3:-1000} MTU=${4:-4096}
cp "$SR" /tmp/softroce && chmod +x /tmp/softroce && SR=/tmp/softroce
LMTU=$((MTU + 100)); [ "$MTU" -ge 4096 ] && LMTU=9000
log() { echo "lab-guest: $*" >&2; }

rxelab-dual up >&2 || true
ip netns add sa; ip netns add sb; ip netns add sc
ip link add vsa type veth peer name vsb
ip link set vsa netns sa; ip link set vsb netns sb
ip -n sa addr add 198.19.20.1/24 dev vsa; ip -n sb addr add 198.19.20.2/24 dev vsb
ip link add vsc type veth peer name vr
ip link set vsc netns sc
ip -n sc addr add 198.19.21.1/24 dev vsc; ip addr add 198.19.21.2/24 dev vr
for ns in sa sb sc; do ip -n $ns link set lo up; done
ip -n sa link set vsa mtu $LMTU up; ip -n sb link set vsb mtu $LMTU up
ip -n sc link set vsc mtu $LMTU up; ip link set vr mtu $LMTU up
for i in veth1 veth2; do ip link set $i mtu $LMTU; done
rdma link add rxe3 type rxe netdev vr 2>/dev/null || log "rdma link add rxe3 failed"
sleep 1
G1=$(rxelab-gid rxe1 198.19.0.1) G2=$(rxelab-gid rxe2 198.19.0.2) G3=$(rxelab-gid rxe3 198.19.21.2)
log "gids rxe1=$G1 rxe2=$G2 rxe3=$G3; $(nproc) CPUs; clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource); cmdline $(cat /proc/cmdline)"
for d in rxe1 rxe2 rxe3; do log "$d active_mtu $(ibv_devinfo -d $d | awk '/active_mtu/ {print $2}')"; done

# LAB_RPS=1: receive packet steering on every veth the pairings use (rxe's and softroce's
# alike): a frame for the server (CPU 1) is received on CPU 1, one for the client on CPU 0, so
# the receiving side's kernel work runs on the receiver's CPU, not in the sender's system call.
if [ "${LAB_RPS:-0}" = 1 ]; then
  echo 2 > /sys/class/net/veth2/queues/rx-0/rps_cpus; echo 1 > /sys/class/net/veth1/queues/rx-0/rps_cpus
  ip netns exec sb sh -c 'echo 2 > /sys/class/net/vsb/queues/rx-0/rps_cpus'
  ip netns exec sa sh -c 'echo 1 > /sys/class/net/vsa/queues/rx-0/rps_cpus'
  ip netns exec sc sh -c 'echo 1 > /sys/class/net/vsc/queues/rx-0/rps_cpus'
  echo 2 > /sys/class/net/vr/queues/rx-0/rps_cpus
  log "RPS: veth2 $(cat /sys/class/net/veth2/queues/rx-0/rps_cpus) veth1 $(cat /sys/class/net/veth1/queues/rx-0/rps_cpus)"
fi
# LAB_PIN=1: every server on CPU 1 and every client on CPU 0 (taskset; rxe and softroce alike),
# so the guest scheduler never puts both ends of a pairing on one vCPU.
PIN_SRV="" PIN_CLI=""
[ "${LAB_PIN:-0}" = 1 ] && PIN_SRV="taskset -c 1" PIN_CLI="taskset -c 0" && log "pinned: servers on CPU 1, clients on CPU 0"
# result line after the "#bytes" header
res() { awk '/#bytes/ {if ((getline) > 0) print; exit}'; }
PORT=19000
# pair NAME TEST(ib_write_bw|ib_write_lat) SIZE N SRV_CMD CLI_CMD
pair() {
  local name=$1 test=$2 size=$3 n=$4 srv=$5 cli=$6 out v
  PORT=$((PORT + 1))
  local f="-s $size -n $n -m $MTU -p $PORT -F"
  [ "${test%_bw}" != "$test" ] && f="$f --report_gbits"
  timeout 300 $PIN_SRV bash -c "$srv $f" > /tmp/srv.out 2>&1 &
  local sp=$!
  sleep 1.5
  out=$(timeout 300 $PIN_CLI bash -c "$cli $f" 2>/tmp/cli.err | res)
  wait $sp
  if [ "${test%_bw}" != "$test" ]; then v=$(echo "$out" | awk '{print $4}'); else v=$(echo "$out" | awk '{print $5}'); fi
  # write latency: perftest's client may abort on its CPU-clock check after a full run; the
  # server's report of the same run then stands
  case "$v" in [0-9]*) ;; *) [ "${test%_lat}" != "$test" ] && v=$(res < /tmp/srv.out | awk '{print $5}') ;; esac
  case "$v" in [0-9]*) ;; *) log "$name $test $size: no result"
    { echo "server:"; tail -8 /tmp/srv.out; echo "client:"; tail -8 /tmp/cli.err; ip -n sa -d link show vsa; ip -n sb -d link show vsb; } 2>&1 | sed "s/^/lab-guest: $name: /" >&2
    v=FAIL ;; esac
  # LAB_STATS=1: softroce's --stats phase lines (polled write latency) into the log
  grep -h "stats: polled" /tmp/srv.out /tmp/cli.err 2>/dev/null | sed "s/^/lab-guest: $name: /" >&2
  echo "ROW|$name|$test|$size|$MTU|$v"
}
RXE_SRV="ib_write_bw -d rxe2 -x $G2"; RXE_CLI="ib_write_bw -d rxe1 -x $G1 198.19.0.2"
# softroce runs with GOMAXPROCS=1 in the guest (SR_ENV): two Go processes with 2 Ps each on 2
# emulated CPUs spend their time in the runtime's spinning threads (each wakeup looks for work on
# the idle P), which TCG makes 20-50x slower; the "gmp2" rows show the default. The "bp" rows
# add --busy-poll (perftest's own behaviour: poll, never sleep; softroce's receive loop then
# polls its socket too, link.UDPOptions.BusyPoll).
SR_ENV=${SR_ENV:-GOMAXPROCS=1}
BP=--busy-poll
SR_SRV="ip netns exec sb env $SR_ENV $SR perf write -d 198.19.20.2 --timeout 120s --run-timeout 240s"
SR_CLI="ip netns exec sa env $SR_ENV $SR perf write -d 198.19.20.1 --timeout 120s --run-timeout 240s 198.19.20.2"
X_SRV="ib_write_bw -d rxe3 -x $G3"
X_CLI="ip netns exec sc env $SR_ENV $SR perf write -d 198.19.21.1 --timeout 120s --run-timeout 240s 198.19.21.2"
# The target rows (64 KiB write_bw, 8-byte write_lat) run ROUNDS times, interleaved (rxe,
# softroce, softroce --busy-poll, rxe, ...): the host's load moves during a session, and
# bench/lab.sh reports each pairing's best round (highest bandwidth, lowest latency) and lists
# all of them. The other rows run once.
ROUNDS=${ROUNDS:-3}
# LAB_ONLY=lat8: only the 8-byte write_lat rows (ROUNDS interleaved rounds, softroce<->rxe once)
# for a short session; /mnt/host/softroce-old (bench/lab.sh LAB_OLD_BIN=...), if present, adds
# "softroce-softroce-bp-old" and "softroce-softroce-xdp-old" pairings to each round: the same
# tests with an older build, for a before/after in one session.
OLD=""
[ -x /mnt/host/softroce-old ] && cp /mnt/host/softroce-old /tmp/softroce-old && chmod +x /tmp/softroce-old && OLD=/tmp/softroce-old
LAB_ONLY=${LAB_ONLY:-}
[ "$LAB_ONLY" = lat8 ] || for size in 65536 4096; do
  n=1; [ $size = 65536 ] && n=$ROUNDS
  for _ in $(seq 1 $n); do
    pair rxe-rxe ib_write_bw $size $NBW "$RXE_SRV" "$RXE_CLI"
    pair softroce-softroce ib_write_bw $size $NBW "$SR_SRV" "$SR_CLI"
    pair softroce-softroce-bp ib_write_bw $size $NBW "$SR_SRV $BP" "$SR_CLI $BP"
  done
  pair softroce-rxe ib_write_bw $size $NBW "$X_SRV" "$X_CLI"
  pair softroce-rxe-bp ib_write_bw $size $NBW "$X_SRV" "$X_CLI $BP"
done
[ "$LAB_ONLY" = lat8 ] || pair softroce-softroce-gmp2 ib_write_bw 65536 $NBW "${SR_SRV/env $SR_ENV/env GOMAXPROCS=2}" "${SR_CLI/env $SR_ENV/env GOMAXPROCS=2}"
RXE_SRV="ib_write_lat -d rxe2 -x $G2"; RXE_CLI="ib_write_lat -d rxe1 -x $G1 198.19.0.2"
SR_SRV="ip netns exec sb env $SR_ENV $SR perf write --lat -d 198.19.20.2 --timeout 120s --run-timeout 240s"
SR_CLI="ip netns exec sa env $SR_ENV $SR perf write --lat -d 198.19.20.1 --timeout 120s --run-timeout 240s 198.19.20.2"
X_SRV="ib_write_lat -d rxe3 -x $G3"
X_CLI="ip netns exec sc env $SR_ENV $SR perf write --lat -d 198.19.21.1 --timeout 120s --run-timeout 240s 198.19.21.2"
# The floor of any user-space stack here (LAB_PROBE=1 in bench/lab.sh copies bench/cprobe and
# bench/probe): half the median 8-byte UDP round trip between sa and sb, spinning (MSG_DONTWAIT),
# in C and in Go (GOMAXPROCS=1), pinned like the pairs, once per round: "udp-*-spin-half" rows.
CPP="" GPP=""
[ -x /mnt/host/pingpong ] && cp /mnt/host/pingpong /tmp/pingpong && CPP=/tmp/pingpong
[ -x /mnt/host/probe ] && cp /mnt/host/probe /tmp/probe && GPP=/tmp/probe
half() { sed -n 's/.*median=\([0-9.]*\).*/\1/p' | awk '{printf "%.2f", $1 / 2}'; }
floor() {
  local v
  if [ -n "$CPP" ]; then
    PORT=$((PORT + 1))
    timeout 60 $PIN_SRV ip netns exec sb $CPP server 198.19.20.2 $PORT spin > /dev/null 2>&1 &
    sleep 1
    v=$(timeout 60 $PIN_CLI ip netns exec sa $CPP client 198.19.20.2 $PORT 2000 spin 2>/dev/null | half)
    wait
    echo "ROW|udp-c-spin-half|ib_write_lat|8|$MTU|${v:-FAIL}"
  fi
  if [ -n "$GPP" ]; then
    PORT=$((PORT + 1))
    timeout 60 $PIN_SRV ip netns exec sb env GOMAXPROCS=1 $GPP server -mode spin 198.19.20.2 $PORT > /dev/null 2>&1 &
    sleep 1
    v=$(timeout 60 $PIN_CLI ip netns exec sa env GOMAXPROCS=1 $GPP client -mode spin 198.19.20.2 $PORT 2000 2>/dev/null | half)
    wait
    echo "ROW|udp-go-spin-half|ib_write_lat|8|$MTU|${v:-FAIL}"
  fi
  # LAB_LADDER=1: the same round trip through pkg/link, its options one at a time
  # (bench/probe/link.go): 40-byte datagrams (an 8-byte WRITE), then + GRO and entropy
  # socket (the device defaults), then the [40, 20] GSO pair polled mode sends
  [ -n "$GPP" ] && [ "${LAB_LADDER:-0}" = 1 ] && for rung in "plain:" "gro-ent:-gro -entropy" "pair:-gro -entropy -pair" "xdp:-entropy -xdp" "xdp-pair:-entropy -xdp -pair"; do
    PORT=$((PORT + 1))
    timeout 60 $PIN_SRV ip netns exec sb env GOMAXPROCS=1 $GPP lserver ${rung#*:} -port $PORT 198.19.20.2 198.19.20.1 > /dev/null 2>/tmp/lsrv.err &
    sleep 1
    v=$(timeout 60 $PIN_CLI ip netns exec sa env GOMAXPROCS=1 $GPP lclient ${rung#*:} -port $PORT 198.19.20.1 198.19.20.2 2000 2>/tmp/lcli.err | half)
    wait
    [ -n "$v" ] || cat /tmp/lsrv.err /tmp/lcli.err | sed "s/^/lab-guest: link-${rung%%:*}: /" >&2
    echo "ROW|link-${rung%%:*}-half|ib_write_lat|8|$MTU|${v:-FAIL}"
  done
}
LSTATS=""; [ "${LAB_STATS:-0}" = 1 ] && LSTATS=" --stats"
LSIZES="8 4096"; [ "$LAB_ONLY" = lat8 ] && LSIZES=8
for size in $LSIZES; do
  n=1; [ $size = 8 ] && n=$ROUNDS
  for _ in $(seq 1 $n); do
    pair rxe-rxe ib_write_lat $size $NLAT "$RXE_SRV" "$RXE_CLI"
    [ "$LAB_ONLY" = lat8 ] || pair softroce-softroce ib_write_lat $size $NLAT "$SR_SRV" "$SR_CLI"
    pair softroce-softroce-bp ib_write_lat $size $NLAT "$SR_SRV $BP$LSTATS" "$SR_CLI $BP$LSTATS"
    # the link's AF_XDP path (docs/link.md): its active MTU is at most 2048, so this row runs
    # at -m 2048 (an 8-byte message is one packet at any MTU)
    [ "${LAB_XDP:-1}" = 1 ] && MTU=2048 pair softroce-softroce-xdp ib_write_lat $size $NLAT "$SR_SRV $BP --xdp$LSTATS" "$SR_CLI $BP --xdp$LSTATS"
    # the buffers in device memory (--dm): the peer's XDP program executes and ACKs each small
    # WRITE in the sender's softirq, as kernel rxe does (docs/link.md "XDP write responder")
    [ "${LAB_XDP:-1}" = 1 ] && MTU=2048 pair softroce-softroce-xdp-dm ib_write_lat $size $NLAT "$SR_SRV $BP --xdp --dm$LSTATS" "$SR_CLI $BP --xdp --dm$LSTATS"
    [ $size = 8 ] && floor
    [ -n "$OLD" ] && [ $size = 8 ] && pair softroce-softroce-bp-old ib_write_lat $size $NLAT "${SR_SRV/ $SR / $OLD } $BP" "${SR_CLI/ $SR / $OLD } $BP"
    [ -n "$OLD" ] && [ $size = 8 ] && [ "${LAB_XDP:-1}" = 1 ] && MTU=2048 pair softroce-softroce-xdp-old ib_write_lat $size $NLAT "${SR_SRV/ $SR / $OLD } $BP --xdp" "${SR_CLI/ $SR / $OLD } $BP --xdp"
  done
  pair softroce-rxe ib_write_lat $size $NLAT "$X_SRV" "$X_CLI"
  pair softroce-rxe-bp ib_write_lat $size $NLAT "$X_SRV" "$X_CLI $BP"
  [ "${LAB_XDP:-1}" = 1 ] && MTU=2048 pair softroce-rxe-xdp ib_write_lat $size $NLAT "$X_SRV" "$X_CLI $BP --xdp"
  # kernel rxe's WRITEs into softroce's device memory, executed by softroce's XDP program
  [ "${LAB_XDP:-1}" = 1 ] && MTU=2048 pair softroce-rxe-xdp-dm ib_write_lat $size $NLAT "$X_SRV" "$X_CLI $BP --xdp --dm"
done
[ "$LAB_ONLY" = lat8 ] && exit 0
pair softroce-softroce-gmp2 ib_write_lat 8 $NLAT "${SR_SRV/env $SR_ENV/env GOMAXPROCS=2}" "${SR_CLI/env $SR_ENV/env GOMAXPROCS=2}"
# the fast path's counters on the softroce<->softroce pair (GSO sends, GRO reads, fallbacks)
ip netns exec sb env $SR_ENV $SR perf write -d 198.19.20.2 --timeout 60s -s 65536 -n 200 -m $MTU -p 19900 -F > /dev/null 2>&1 &
sleep 1.5
ip netns exec sa env $SR_ENV $SR perf write -d 198.19.20.1 --timeout 60s -s 65536 -n 200 -m $MTU -p 19900 -F 198.19.20.2 > /dev/null 2>&1
wait
ip -n sa -s link show vsa | sed 's/^/lab-guest: vsa /' >&2
ip netns exec sa ethtool -k vsa 2>/dev/null | grep -E "segmentation-offload|generic-receive|tx-checksumming|udp" | sed 's/^/lab-guest: vsa /' >&2
