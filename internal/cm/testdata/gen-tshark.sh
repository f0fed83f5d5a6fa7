#!/usr/bin/env bash
# Regenerates tshark-<capture>.tsv: tshark's own decode of every CM MAD in the
# reference captures, one row per MAD, one column per dissector field. The Go
# test (capture_test.go) compares its parse against these columns. Run from
# this directory with tshark (4.0.x was used) installed.
set -euo pipefail
caps=../../../testdata/captures
fields=(
  frame.number
  infiniband.mad.baseversion infiniband.mad.mgmtclass infiniband.mad.classversion infiniband.mad.method
  infiniband.mad.status infiniband.mad.classspecific infiniband.mad.transactionid infiniband.mad.attributeid
  infiniband.mad.attributemodifier
  infiniband.cm.req infiniband.cm.req.serviceid infiniband.cm.req.localcaguid infiniband.cm.req.localqkey
  infiniband.cm.req.localqpn infiniband.cm.req.responderres infiniband.cm.req.localeecn infiniband.cm.req.initdepth
  infiniband.cm.req.remoteeecn infiniband.cm.req.remoteresptout infiniband.cm.req.transpsvctype
  infiniband.cm.req.e2eflowctrl infiniband.cm.req.startpsn infiniband.cm.req.localresptout infiniband.cm.req.retrcount
  infiniband.cm.req.pkey infiniband.cm.req.pppmtu infiniband.cm.req.rdcexist infiniband.cm.req.rnrretrcount
  infiniband.cm.req.maxcmretr infiniband.cm.req.srq infiniband.cm.req.ext_transport
  infiniband.cm.req.prim_locallid infiniband.cm.req.prim_remotelid
  infiniband.cm.req.prim_localgid_ipv4 infiniband.cm.req.prim_remotegid_ipv4
  infiniband.cm.req.prim_flowlabel infiniband.cm.req.prim_reserved0 infiniband.cm.req.prim_pktrate
  infiniband.cm.req.prim_tfcclass infiniband.cm.req.prim_hoplim infiniband.cm.req.prim_sl
  infiniband.cm.req.prim_subnetlocal infiniband.cm.req.prim_localacktout
  infiniband.cm.req.alt_locallid infiniband.cm.req.alt_remotelid infiniband.cm.req.alt_localgid
  infiniband.cm.req.alt_remotegid infiniband.cm.req.alt_localacktout
  infiniband.cm.req.ip_cm.majv infiniband.cm.req.ip_cm.minv infiniband.cm.req.ip_cm.ipv
  infiniband.cm.req.ip_cm.sport infiniband.cm.req.ip_cm.sip4 infiniband.cm.req.ip_cm.dip4
  infiniband.cm.req.ip_cm.private
  infiniband.cm.rep infiniband.cm.rep.remotecommid infiniband.cm.rep.localqkey infiniband.cm.rep.localqpn
  infiniband.cm.rep.localeecn infiniband.cm.rep.startpsn infiniband.cm.rep.respres infiniband.cm.rep.initdepth
  infiniband.cm.rep.tgtackdelay infiniband.cm.rep.failoveracc infiniband.cm.rep.e2eflowctrl
  infiniband.cm.rep.rnrretrcount infiniband.cm.rep.srq infiniband.cm.rep.localcaguid infiniband.cm.rep.private
  infiniband.cm.rtu.localcommid infiniband.cm.rtu.remotecommid infiniband.cm.rtu.private
  infiniband.cm.dreq.localcommid infiniband.cm.dreq.remotecommid infiniband.cm.req.remoteqpneecn
  infiniband.cm.dreq.private
  infiniband.cm.drsp.localcommid infiniband.cm.drsp.remotecommid infiniband.cm.drsp.private
  infiniband.mad.data
)
args=()
for f in "${fields[@]}"; do args+=(-e "$f"); done
for c in rping ucmatose udaddy; do
  {
    echo "# tshark -r testdata/captures/$c.pcap -Y infiniband.mad -T fields (see gen-tshark.sh); $(tshark --version | head -1)"
    tshark -r "$caps/$c.pcap" -Y infiniband.mad -T fields -E header=y -E separator=/t -E occurrence=f "${args[@]}" 2>/dev/null
  } > "tshark-$c.tsv"
done
