package bth

// UDPPort is the RoCEv2 UDP destination port (IBTA Annex A17.2.3).
const UDPPort = 4791

// FlowLabel derives the 20-bit flow label from a QP number pair, as Linux
// rdma_calc_flow_label does: the product folded to 20 bits. It is symmetric,
// so both ends of a connection compute the same label.
func FlowLabel(lqpn, rqpn uint32) uint32 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v & 0xFFFFF)
}

// SourcePort returns the RoCEv2 UDP source port (the entropy port, IBTA
// Annex A17.3.2: 0xC000..0xFFFF) of an RC or UC connection without an
// explicit flow label, as kernel rxe computes it (rdma_get_udp_sport:
// rdma_flow_label_to_udp_sport(FlowLabel(lqpn, rqpn))): the low 14 bits of
// the label XOR its high 6 bits, with the top two bits set. Both ends of a
// connection use the same port.
func SourcePort(lqpn, rqpn uint32) uint16 { return FlowLabelToSourcePort(FlowLabel(lqpn, rqpn)) }

// FlowLabelToSourcePort folds a 20-bit flow label into a source port in
// 0xC000..0xFFFF (Linux rdma_flow_label_to_udp_sport).
func FlowLabelToSourcePort(fl uint32) uint16 {
	low := fl & 0x3FFF
	high := fl & 0xFC000
	low ^= high >> 14
	return uint16(low | 0xC000)
}

// UDSourcePort returns the source port kernel rxe uses for a UD QP (and for
// RC/UC QPs before a path is set): 0xC000 + hash_32(qpn, 14), Linux's
// multiplicative hash with GOLDEN_RATIO_32.
func UDSourcePort(qpn uint32) uint16 {
	const goldenRatio32 = 0x61C88647
	return uint16(0xC000 + (qpn*goldenRatio32)>>(32-14))
}

// CMFlowLabel returns the flow label the Linux rdma_cm gives a RoCEv2
// connection without an explicit IPv6 flow label
// (cma_get_roce_udp_flow_label): sport*31 + dport folded to 20 bits, where
// sport is the active side's rdma_cm port (the CMA header port of the CM
// REQ) and dport the service port. Its SourcePort is then
// FlowLabelToSourcePort(CMFlowLabel(sport, dport)); both ends use it.
func CMFlowLabel(sport, dport uint16) uint32 { return (uint32(sport)*31 + uint32(dport)) & 0xFFFFF }
