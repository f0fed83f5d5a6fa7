#!/bin/bash
# bench/loss-guest.sh: runs INSIDE the rxe lab guest (bench/loss.sh copies it and a static
# softroce binary into the share). One RC stream of 64 KiB RDMA WRITEs through a bottleneck
# that loses packets at random (netem loss below a tbf), and the counters that say how many
# request packets the sender needed to get the data across.
#
#   softroce sender:  netns ls, ls0 198.19.101.1 ---+
#   kernel rxe sender: init_net lk1 198.19.121.1 ---+-- netns sw (router)
#                                                   |  bn0 198.19.99.1: tbf RATE, netem loss below it
#                                                   |     (the bottleneck: sw -> rt only; ACKs and NAKs
#                                                   |      come back over bn1 without loss)
#                                    netns rt (router) bn1 198.19.99.2
#   softroce receiver: netns lr, lr0 198.19.111.1 --+
#   kernel rxe receiver: init_net lk2 198.19.131.1 -+
#
# rdma_rxe 6.1 opens its UDP socket in init_net only, so both rxe devices (rxel1 on lk1, rxel2
# on lk2) live there; policy routing (as test/rxelab/guest/rxelab-dual does) sends what one
# addresses to the other out of its own veth, through sw, the bottleneck and rt, instead of the
# local shortcut. All links have MTU 9000 and every stack runs at RoCE MTU 4096.
#
# usage: loss-guest.sh SOFTROCE up RATE_MBIT
#        loss-guest.sh SOFTROCE run STACK LOSS_PCT ITERS DEPTH
#          STACK: softroce (go-back-N), softroce-sr (both ends --selective-repeat), rxe
# "run" prints, on stdout, lines the host keeps (bench/loss reads them):
#   RUN|stack|loss %|iterations|message bytes|mtu|tx depth|rate Mbit/s
#   GOODPUT|Gbit/s (the tool's own average) or FAIL
#   SEND|sent_pkts|retransmitted_pkts (-1: not counted, rxe)|completer_retry_err|rcvd_seq_err   (sender, deltas)
#   RECV|rcvd_pkts|duplicate_request|out_of_seq_request                                          (receiver, deltas)
#   NETEM|packets in|dropped|packets out|bytes out   (the netem qdisc's tc -s counters)
#   WALL|seconds the sender ran
#   TC|line of `tc -s qdisc show dev bn0` at the end
#   LOG|line of the tools' own output (errors, counters)
set -u
SR=$1 CMD=$2
shift 2
[ -x /tmp/softroce ] || { cp "$SR" /tmp/softroce && chmod +x /tmp/softroce; }
SR=/tmp/softroce
MTU=4096 LMTU=9000 SIZE=65536
S_IP=198.19.101.1 R_IP=198.19.111.1 K1_IP=198.19.121.1 K2_IP=198.19.131.1
log() { echo "loss-guest: $*" >&2; }

up() {
  local rate=$1
  modprobe veth; modprobe sch_tbf; modprobe sch_netem
  for ns in sw rt ls lr; do ip netns add $ns; ip -n $ns link set lo up; done
  for ns in sw rt; do
    ip netns exec $ns sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  done
  ip link add bn0 netns sw type veth peer name bn1 netns rt
  ip -n sw addr add 198.19.99.1/24 dev bn0; ip -n rt addr add 198.19.99.2/24 dev bn1
  ip -n sw link set bn0 mtu $LMTU up; ip -n rt link set bn1 mtu $LMTU up
  # softroce's ends, each in its own namespace
  ip link add ls0 netns ls type veth peer name sws netns sw
  ip -n ls addr add $S_IP/24 dev ls0; ip -n sw addr add 198.19.101.254/24 dev sws
  ip link add lr0 netns lr type veth peer name rtr netns rt
  ip -n lr addr add $R_IP/24 dev lr0; ip -n rt addr add 198.19.111.254/24 dev rtr
  ip -n ls link set ls0 mtu $LMTU up; ip -n sw link set sws mtu $LMTU up
  ip -n lr link set lr0 mtu $LMTU up; ip -n rt link set rtr mtu $LMTU up
  ip -n ls route add default via 198.19.101.254
  ip -n lr route add default via 198.19.111.254
  # kernel rxe's ends, both in init_net
  sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.accept_local=1
  ip link add lk1 type veth peer name swk netns sw
  ip link add lk2 type veth peer name rtk netns rt
  ip addr add $K1_IP/24 dev lk1; ip -n sw addr add 198.19.121.254/24 dev swk
  ip addr add $K2_IP/24 dev lk2; ip -n rt addr add 198.19.131.254/24 dev rtk
  for i in lk1 lk2; do
    sysctl -qw net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1 net.ipv6.conf.$i.disable_ipv6=1
    ip link set $i mtu $LMTU up
  done
  ip -n sw link set swk mtu $LMTU up; ip -n rt link set rtk mtu $LMTU up
  # What init_net sends to one rxe address from the other leaves by the sender's veth (tables
  # 121, 131; the local table moved behind them); the same routes in the main table for
  # lookups without "iif lo". Static neighbours: no ARP in the way of rxe's address resolution.
  ip route add $K2_IP/32 via 198.19.121.254 dev lk1 src $K1_IP table 121
  ip route add $K1_IP/32 via 198.19.131.254 dev lk2 src $K2_IP table 131
  ip route add $K2_IP/32 via 198.19.121.254 dev lk1 src $K1_IP
  ip route add $K1_IP/32 via 198.19.131.254 dev lk2 src $K2_IP
  ip rule add pref 10 iif lo to $K2_IP/32 lookup 121
  ip rule add pref 11 iif lo to $K1_IP/32 lookup 131
  ip rule add pref 100 lookup local
  ip rule del pref 0 lookup local
  ip neigh replace 198.19.121.254 lladdr "$(ip netns exec sw cat /sys/class/net/swk/address)" dev lk1 nud permanent
  ip neigh replace 198.19.131.254 lladdr "$(ip netns exec rt cat /sys/class/net/rtk/address)" dev lk2 nud permanent
  # routers
  ip -n sw route add 198.19.111.0/24 via 198.19.99.2; ip -n sw route add 198.19.131.0/24 via 198.19.99.2
  ip -n rt route add 198.19.101.0/24 via 198.19.99.1; ip -n rt route add 198.19.121.0/24 via 198.19.99.1
  rdma link add rxel1 type rxe netdev lk1 || log "rdma link add rxel1 failed"
  rdma link add rxel2 type rxe netdev lk2 || log "rdma link add rxel2 failed"
  qdiscs "$rate" 0
  local i=0
  until rxelab-gid rxel1 $K1_IP > /dev/null 2>&1 && rxelab-gid rxel2 $K2_IP > /dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 50 ] || { log "rxe IPv4 GIDs did not appear"; break; }
    sleep 0.2
  done
  ip netns exec ls ping -c1 -W2 $R_IP > /dev/null || log "ping softroce sender -> receiver failed"
  ping -c1 -W2 -I $K1_IP $K2_IP > /dev/null || log "ping rxel1 -> rxel2 failed"
  ip -n sw -s link show bn0 | sed 's/^/loss-guest: /' >&2
  ibv_devinfo -d rxel1 | grep -E 'active_mtu|state' | sed 's/^/loss-guest: rxel1 /' >&2
}

# qdiscs RATE LOSS: the bottleneck afresh (fresh counters): tbf at RATE with netem's random
# loss below it. The netem queue (1000 packets) is far deeper than the stream's window (DEPTH
# messages of 16 packets), so netem's loss is the only drop.
qdiscs() {
  tc -n sw qdisc del dev bn0 root 2> /dev/null
  tc -n sw qdisc add dev bn0 root handle 1: tbf rate "${1}mbit" burst 20000 limit 1000000
  tc -n sw qdisc add dev bn0 parent 1:1 handle 10: netem loss "${2}%" limit 1000
}

rxec() { cat /sys/class/infiniband/$1/ports/1/hw_counters/$2; }
st() { local v; v=$(sed -n "s/^stats: $1 \([0-9]*\)$/\1/p" "$2" | head -1); echo "${v:-0}"; }

run() {
  local stack=$1 loss=$2 iters=$3 depth=$4 rate t0 t1 g
  rate=$(tc -n sw qdisc show dev bn0 | sed -n 's/.*tbf.* rate \([0-9]*\)Mbit.*/\1/p')
  qdiscs "$rate" "$loss"
  echo "RUN|$stack|$loss|$iters|$SIZE|$MTU|$depth|$rate"
  local f="-s $SIZE -m $MTU -t $depth -n $iters -F --report_gbits"
  local sro="--timeout 60s --run-timeout 300s --stats" extra="" lim=$((iters + 120))
  [ "$stack" = softroce-sr ] && extra=--selective-repeat
  rm -rf /tmp/lb; mkdir -p /tmp/lb
  if [ "$stack" = rxe ]; then
    local g1 g2 c
    g1=$(rxelab-gid rxel1 $K1_IP) g2=$(rxelab-gid rxel2 $K2_IP)
    for c in sent_pkts completer_retry_err rcvd_seq_err; do rxec rxel1 $c > /tmp/lb/s0.$c; done
    for c in rcvd_pkts duplicate_request out_of_seq_request; do rxec rxel2 $c > /tmp/lb/r0.$c; done
    timeout $lim ib_write_bw -d rxel2 -x "$g2" $f > /tmp/lb/srv.out 2> /tmp/lb/srv.err &
    sleep 2
    t0=$EPOCHREALTIME
    timeout $lim ib_write_bw -d rxel1 -x "$g1" $f $K2_IP > /tmp/lb/cli.out 2> /tmp/lb/cli.err
    t1=$EPOCHREALTIME
    wait
    local d=()
    for c in sent_pkts completer_retry_err rcvd_seq_err; do d+=($(($(rxec rxel1 $c) - $(cat /tmp/lb/s0.$c)))); done
    echo "SEND|${d[0]}|-1|${d[1]}|${d[2]}"
    d=()
    for c in rcvd_pkts duplicate_request out_of_seq_request; do d+=($(($(rxec rxel2 $c) - $(cat /tmp/lb/r0.$c)))); done
    echo "RECV|${d[0]}|${d[1]}|${d[2]}"
  else
    ip netns exec lr env GOMAXPROCS=1 timeout $lim $SR perf write -d $R_IP $f $sro $extra \
      > /tmp/lb/srv.out 2> /tmp/lb/srv.err &
    sleep 2
    t0=$EPOCHREALTIME
    ip netns exec ls env GOMAXPROCS=1 timeout $lim $SR perf write -d $S_IP $f $sro $extra $R_IP \
      > /tmp/lb/cli.out 2> /tmp/lb/cli.err
    t1=$EPOCHREALTIME
    wait
    local c=/tmp/lb/cli.err s=/tmp/lb/srv.err
    echo "SEND|$(st sent_pkts $c)|$(st retransmitted_pkts $c)|$(st completer_retry_err $c)|$(st rcvd_seq_err $c)"
    echo "RECV|$(st rcvd_pkts $s)|$(st duplicate_request $s)|$(st out_of_seq_request $s)"
  fi
  g=$(awk '/#bytes/ {if ((getline) > 0) print $4; exit}' /tmp/lb/cli.out)
  [ -n "$g" ] || g=FAIL
  echo "GOODPUT|$g"
  echo "WALL|$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
  # netem: "Sent B bytes P pkt (dropped D, ...)"; what came in is sent + dropped + backlog
  local tcs
  tcs=$(tc -n sw -s qdisc show dev bn0 parent 1:1)
  if [[ $tcs =~ Sent\ ([0-9]+)\ bytes\ ([0-9]+)\ pkt\ \(dropped\ ([0-9]+) ]]; then
    local by=${BASH_REMATCH[1]} out=${BASH_REMATCH[2]} dr=${BASH_REMATCH[3]} bl=0
    [[ $tcs =~ backlog\ [0-9]+b\ ([0-9]+)p ]] && bl=${BASH_REMATCH[1]}
    echo "NETEM|$((out + dr + bl))|$dr|$out|$by"
  fi
  tc -n sw -s qdisc show dev bn0 | sed 's/^/TC|/'
  # the tools' own words, for the log: counters, errors
  grep -hv '^ *$' /tmp/lb/cli.out /tmp/lb/cli.err /tmp/lb/srv.err | grep -iv warning | tail -40 | sed 's/^/LOG|/'
}

case "$CMD" in
up) up "$@" ;;
run) run "$@" ;;
*) echo "usage: loss-guest.sh SOFTROCE up RATE | run STACK LOSS ITERS DEPTH" >&2; exit 2 ;;
esac
