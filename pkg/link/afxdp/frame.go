package afxdp

const (
	xdpChunk    = 4096 // UMEM chunk (one page: the largest Linux before 6.6 takes)
	xdpHeadroom = 256  // XDP_PACKET_HEADROOM: a copied frame starts this far into its chunk
	// MaxFrame is the largest Ethernet frame the AF_XDP path carries (one chunk less the
	// kernel's headroom): UDP payloads up to MaxFrame-42 bytes, enough for RoCE MTU 2048.
	MaxFrame   = xdpChunk - xdpHeadroom
	ethIPv4UDP = 14 + 20 + 8 // Ethernet, IPv4 without options, UDP
)
