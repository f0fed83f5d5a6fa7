#!/bin/bash
# bench/congestion-guest.sh: runs INSIDE the rxe lab guest (bench/congestion.sh copies it and a
# static softroce binary into the share). A dumbbell of network namespaces with one ECN-marking
# bottleneck, N RC flows of 64 KiB RDMA WRITEs through it, and a sampler of what crossed it.
#
#   sender k (softroce): netns cs<k>, s<k> 198.19.(100+k).1 --+
#   sender k (kernel rxe): init_net, k<k> 198.19.(120+k).1 ----+-- netns sw (router)
#                                                                |  bn0 198.19.99.1: tbf RATE; RoCE through red ecn below it
#                                                                |     (the bottleneck: sw -> rt only)
#                                                 netns rt (router) bn1 198.19.99.2
#   receiver k (softroce, always): netns cr<k>, r<k> 198.19.(110+k).1 -- rt<k> in rt
#
# rdma_rxe 6.1 opens its UDP socket in init_net only, so the kernel rxe senders' veths stay in
# init_net (a route per receiver sends flow k out of k<k>); softroce receives every flow (the
# same responder for the three sender kinds). Flow k's delivered bytes are rt<k>'s tx_bytes:
# what left the bottleneck for receiver k.
#
# usage: congestion-guest.sh SOFTROCE up N RATE_MBIT
#        congestion-guest.sh SOFTROCE run NAME KIND N SECS [CC_SETTINGS]
#          KIND: softroce (senders `softroce perf write --cc CC_SETTINGS`), softroce-sr (the same
#          with --selective-repeat on both ends) or rxe (ib_write_bw)
# "run" prints, on stdout, lines the host keeps (bench/congestion reads them):
#   PHASE|name|kind|flows|secs|rate_mbit|cc settings
#   S|t|delivered bytes of flow 1..N|bottleneck tx bytes|red backlog bytes|marked|early|pdrop   (every 0.25 s)
#   FLOW|k|goodput Gbit/s (the tool's own average)|retransmissions|cnp handled|cnp ignored|
#        sent pkts|selective resends|sacks received|completer retries|seq NAKs received
#   RECV|k|ecn marked|cnp sent|sacks sent|duplicate requests|received pkts
#   TC|line of `tc -s qdisc show dev bn0` at the end
set -u
SR=$1 CMD=$2
shift 2
[ -x /tmp/softroce ] || { cp "$SR" /tmp/softroce && chmod +x /tmp/softroce; }
SR=/tmp/softroce
MTU=4096 LMTU=9000
log() { echo "congestion-guest: $*" >&2; }

up() {
  local n=$1 rate=$2 k
  modprobe veth; modprobe sch_tbf; modprobe sch_red; modprobe sch_prio; modprobe cls_u32
  ip netns add sw; ip netns add rt
  for ns in sw rt; do
    ip -n $ns link set lo up
    ip netns exec $ns sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  done
  ip link add bn0 netns sw type veth peer name bn1 netns rt
  ip -n sw addr add 198.19.99.1/24 dev bn0; ip -n rt addr add 198.19.99.2/24 dev bn1
  ip -n sw link set bn0 mtu $LMTU up; ip -n rt link set bn1 mtu $LMTU up
  sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  for k in $(seq 1 "$n"); do
    ip netns add cs$k; ip netns add cr$k
    ip -n cs$k link set lo up; ip -n cr$k link set lo up
    ip link add s$k netns cs$k type veth peer name sw$k netns sw
    ip -n cs$k addr add 198.19.$((100 + k)).1/24 dev s$k; ip -n sw addr add 198.19.$((100 + k)).254/24 dev sw$k
    ip -n cs$k link set s$k mtu $LMTU up; ip -n sw link set sw$k mtu $LMTU up
    ip -n cs$k route add default via 198.19.$((100 + k)).254
    ip link add r$k netns cr$k type veth peer name rt$k netns rt
    ip -n cr$k addr add 198.19.$((110 + k)).1/24 dev r$k; ip -n rt addr add 198.19.$((110 + k)).254/24 dev rt$k
    ip -n cr$k link set r$k mtu $LMTU up; ip -n rt link set rt$k mtu $LMTU up
    ip -n cr$k route add default via 198.19.$((110 + k)).254
    ip -n sw route add 198.19.$((110 + k)).0/24 via 198.19.99.2
    ip -n rt route add 198.19.$((100 + k)).0/24 via 198.19.99.1
    # kernel rxe sender k, in init_net
    ip link add k$k type veth peer name swk$k netns sw
    ip addr add 198.19.$((120 + k)).1/24 dev k$k; ip -n sw addr add 198.19.$((120 + k)).254/24 dev swk$k
    ip link set k$k mtu $LMTU up; ip -n sw link set swk$k mtu $LMTU up
    ip route add 198.19.$((110 + k)).0/24 via 198.19.$((120 + k)).254 dev k$k
    ip -n rt route add 198.19.$((120 + k)).0/24 via 198.19.99.1
    rdma link add rxeb$k type rxe netdev k$k || log "rdma link add rxeb$k failed"
  done
  bottleneck "$rate"
  sleep 1
  for k in $(seq 1 "$n"); do
    ip netns exec cs$k ping -c1 -W2 198.19.$((110 + k)).1 > /dev/null || log "ping cs$k -> cr$k failed"
    ping -c1 -W2 -I 198.19.$((120 + k)).1 198.19.$((110 + k)).1 > /dev/null || log "ping rxeb$k -> cr$k failed"
  done
  tc -n sw -s qdisc show dev bn0 | sed 's/^/congestion-guest: /' >&2
}

# bottleneck RATE: bn0's qdiscs. A tbf at RATE; below it, RoCE (UDP to port 4791) goes through
# RED, which marks ECN-capable packets (and drops non-ECT ones where it would mark). RED's
# thresholds are bytes of its average queue: marking starts at min (RED_MIN), every packet is
# marked above max, the hard limit (tail drop) is RED_LIMIT. Everything else, the tools' TCP
# connections (perftest's out-of-band exchange), has a band of its own ahead of RED, as control
# traffic has a class of its own in a RoCE network: through RED, a connection's SYN (never
# ECN-capable) was dropped when the flows already running filled the queue, and its flow started
# 1, 3 or 7 s late (TCP's SYN retries).
bottleneck() {
  local rate=$1
  tc -n sw qdisc add dev bn0 root handle 1: tbf rate "${rate}mbit" burst 20000 limit 1000000
  tc -n sw qdisc add dev bn0 parent 1:1 handle 2: prio bands 2 priomap 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
  tc -n sw qdisc add dev bn0 parent 2:1 handle 20: pfifo limit 1000
  tc -n sw qdisc add dev bn0 parent 2:2 handle 10: red limit "$RED_LIMIT" min "$RED_MIN" max "$RED_MAX" \
    avpkt 4200 burst "$RED_BURST" probability "$RED_P" bandwidth "${rate}mbit" ecn
  tc -n sw filter add dev bn0 parent 2: protocol ip prio 1 u32 match ip protocol 17 0xff \
    match ip dport 4791 0xffff flowid 2:2
}

# sample N SECS: every 0.25 s, the bytes each flow delivered past the bottleneck and the RED
# queue's state (the qdisc's counters are cumulative: the host takes differences).
sample() {
  local n=$1 secs=$2 k end line b m e p t tc
  end=$(( ${EPOCHREALTIME%.*} + secs ))
  while [ "${EPOCHREALTIME%.*}" -lt "$end" ]; do
    t=$EPOCHREALTIME
    line="S|$t"
    for k in $(seq 1 "$n"); do read -r b < /sys/class/net/rt$k/statistics/tx_bytes; line+="|$b"; done
    read -r b < /sys/class/net/bn1/statistics/rx_bytes; line+="|$b"
    tc=$(tc -n sw -s qdisc show dev bn0 parent 2:2)
    [[ $tc =~ backlog\ ([0-9]+)b ]] && b=${BASH_REMATCH[1]} || b=0
    [[ $tc =~ marked\ ([0-9]+)\ early\ ([0-9]+)\ pdrop\ ([0-9]+) ]] && { m=${BASH_REMATCH[1]} e=${BASH_REMATCH[2]} p=${BASH_REMATCH[3]}; } || { m=0 e=0 p=0; }
    echo "$line|$b|$m|$e|$p"
    sleep 0.25
  done
}

run() {
  local name=$1 kind=$2 n=$3 secs=$4 cc=${5:-on} k g rate
  rate=$(tc -n sw qdisc show dev bn0 | sed -n 's/.*tbf.* rate \([0-9]*\)Mbit.*/\1/p')
  # fresh counters: the qdiscs again (same parameters), the tools start from zero
  tc -n sw qdisc del dev bn0 root
  bottleneck "$rate"
  echo "PHASE|$name|$kind|$n|$secs|$rate|$cc|red min $RED_MIN max $RED_MAX limit $RED_LIMIT p $RED_P burst $RED_BURST"
  # -t 2: two 64 KiB WRITEs outstanding per flow (128 KiB, far above the bottleneck's
  # bandwidth-delay product), so the end of a phase does not wait for a deep send queue to drain
  local f="-s 65536 -m $MTU -t 2 -D $secs -F --report_gbits"
  local sro="--timeout 60s --run-timeout 120s --stats"
  # selective repeat is per QP and not negotiated without rdma_cm: both ends ask for it
  [ "$kind" = softroce-sr ] && sro+=" --selective-repeat"
  rm -rf /tmp/cg; mkdir -p /tmp/cg
  for k in $(seq 1 "$n"); do
    # the receivers: softroce with the notification point on (CNPs for CE-marked packets)
    ip netns exec cr$k env GOMAXPROCS=1 $SR perf write -d 198.19.$((110 + k)).1 $f $sro --cc on \
      > /tmp/cg/srv$k.out 2> /tmp/cg/srv$k.err &
  done
  sleep 2
  local -a rxeb=()
  for k in $(seq 1 "$n"); do
    if [ "$kind" = rxe ]; then
      g=$(rxelab-gid rxeb$k 198.19.$((120 + k)).1)
      cat /sys/class/infiniband/rxeb$k/ports/1/hw_counters/completer_retry_err > /tmp/cg/rxe$k.retry0
      timeout $((secs + 60)) ib_write_bw -d rxeb$k -x "$g" $f 198.19.$((110 + k)).1 > /tmp/cg/cli$k.out 2> /tmp/cg/cli$k.err &
    else
      ip netns exec cs$k env GOMAXPROCS=1 timeout $((secs + 60)) $SR perf write -d 198.19.$((100 + k)).1 $f $sro \
        --cc "$cc" 198.19.$((110 + k)).1 > /tmp/cg/cli$k.out 2> /tmp/cg/cli$k.err &
    fi
  done
  ip netns exec rt bash -c "$(declare -f sample); sample $n $((secs + 1))"
  wait
  for k in $(seq 1 "$n"); do
    g=$(awk '/#bytes/ {if ((getline) > 0) print $4; exit}' /tmp/cg/cli$k.out)
    [ -n "$g" ] || { g=FAIL; tail -5 /tmp/cg/cli$k.err /tmp/cg/srv$k.err | sed "s/^/congestion-guest: flow $k: /" >&2; }
    if [ "$kind" = rxe ]; then
      local r0 r1
      r0=$(cat /tmp/cg/rxe$k.retry0); r1=$(cat /sys/class/infiniband/rxeb$k/ports/1/hw_counters/completer_retry_err)
      echo "FLOW|$k|$g|$((r1 - r0))|0|0"
    else
      local c=/tmp/cg/cli$k.err
      echo "FLOW|$k|$g|$(st retransmitted_pkts $c)|$(st rp_cnp_handled $c)|$(st rp_cnp_ignored $c)|$(st sent_pkts $c)|$(st selective_retrans_pkts $c)|$(st rcvd_sack $c)|$(st completer_retry_err $c)|$(st rcvd_seq_err $c)"
    fi
    local v=/tmp/cg/srv$k.err
    echo "RECV|$k|$(st np_ecn_marked_roce_packets $v)|$(st np_cnp_sent $v)|$(st sent_sack $v)|$(st duplicate_request $v)|$(st rcvd_pkts $v)"
    # the tools' own words, for the log: counters, errors
    grep -hv '^ *$' /tmp/cg/cli$k.err /tmp/cg/srv$k.err | grep -iv warning | tail -40 | sed "s/^/LOG|$k|/"
  done
  tc -n sw -s qdisc show dev bn0 | sed 's/^/TC|/'
}
st() { sed -n "s/^stats: $1 \([0-9]*\)$/\1/p" "$2" | head -1; }

RED_MIN=${RED_MIN:-40000} RED_MAX=${RED_MAX:-160000} RED_LIMIT=${RED_LIMIT:-500000}
RED_P=${RED_P:-0.5} RED_BURST=${RED_BURST:-11}
case "$CMD" in
up) up "$@" ;;
run) run "$@" ;;
*) echo "usage: congestion-guest.sh SOFTROCE up N RATE | run NAME KIND N SECS [CC]" >&2; exit 2 ;;
esac
