package afxdp

import (
	"encoding/binary"
	"golang.org/x/sys/unix"
	"hash/crc32"
)

// foldSum folds the 64-bit sum of 16- and 32-bit big-endian words in register r to its 16-bit
// ones' complement sum (RFC 1071; r5 clobbered).
func foldSum(a *bpfAsm, r uint8) {
	a.op(bMovX, 5, r, 0, 0)
	a.op(bRshK, 5, 0, 0, 32)
	a.op(bLshK, r, 0, 0, 32)
	a.op(bRshK, r, 0, 0, 32)
	a.op(bAddX, r, 5, 0, 0)
	for range 3 {
		a.op(bMovX, 5, r, 0, 0)
		a.op(bRshK, 5, 0, 0, 16)
		a.op(bAndK, r, 0, 0, 0xffff)
		a.op(bAddX, r, 5, 0, 0)
	}
}

// crcStep emits one byte of the reflected CRC-32: r4 = table[(r4 ^ r1) & 0xff] ^ (r4 >> 8),
// the table's pointer in r5, the byte in r1 (clobbered).
func crcStep(a *bpfAsm) {
	a.op(bXorX, 1, 4, 0, 0)
	a.op(bAndK, 1, 0, 0, 0xff)
	a.op(bLshK, 1, 0, 0, 2)
	a.op(bAddX, 1, 5, 0, 0)
	a.op(bLdxW, 1, 1, 0, 0)
	a.op(bRshK, 4, 0, 0, 8)
	a.op(bXorX, 4, 1, 0, 0)
}

// loadBE24 emits dst = the 24-bit big-endian number at frame offset off (r7: data), r1 scratch.
func loadBE24(a *bpfAsm, dst uint8, off int16) {
	a.op(bLdxB, dst, 7, off, 0)
	a.op(bLshK, dst, 0, 0, 16)
	a.op(bLdxB, 1, 7, off+1, 0)
	a.op(bLshK, 1, 0, 0, 8)
	a.op(bOrX, dst, 1, 0, 0)
	a.op(bLdxB, 1, 7, off+2, 0)
	a.op(bOrX, dst, 1, 0, 0)
}

// storeBE24 emits the low 24 bits of register src (clobbered) big-endian at frame offset off.
func storeBE24(a *bpfAsm, src uint8, off int16) {
	a.op(bStxB, 7, src, off+2, 0)
	a.op(bRshK, src, 0, 0, 8)
	a.op(bStxB, 7, src, off+1, 0)
	a.op(bRshK, src, 0, 0, 8)
	a.op(bStxB, 7, src, off, 0)
}

// program emits the responder after the program's framing checks (r6: ctx, the frame's
// length at wsFrameLen): it returns XDP_TX with the ACK, or XDP_DROP for a WRITE executed that
// asks for no ACK, or jumps to decline (the socket gets the frame, untouched).
func (w *xdpWrite) program(a *bpfAsm, decline string) {
	const xdpDrop, xdpTx = 1, 3
	ne := binary.NativeEndian
	pkeyC := int32(ne.Uint16([]byte{0x7f, 0xff})) // IBTA 10.9.3: the one P_Key, 0xFFFF (either membership)
	lookup := func(m int, onNil string) {         // r0 = &m[*(u32 *)(fp + wsKey)], nil: jump
		a.mapFD(1, m)
		a.op(bMovX, 2, 10, 0, 0)
		a.op(bAddK, 2, 0, 0, wsKey)
		a.op(bCall, 0, 0, 0, fnMapLookup)
		a.jmp(bJeqK, 0, 0, 0, onNil)
	}
	a.op(bLdxW, 7, 6, 0, 0) // r7 = data
	a.op(bLdxW, 8, 6, 4, 0) // r8 = data_end
	a.op(bMovX, 1, 7, 0, 0)
	a.op(bAddK, 1, 0, 0, fPayload+1+3+4) // the shortest WRITE it takes: 1 byte, 3 pad, ICRC
	a.jmp(bJgtX, 1, 8, 0, decline)
	a.op(bLdxB, 1, 7, fBTH, 0)
	a.jmp(bJneK, 1, 0, 0x0A, decline) // RC RDMA WRITE Only (IBTA 9.2: RC, opcode 01010)
	a.op(bLdxB, 1, 7, fBTH+1, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAndK, 2, 0, 0, 0x0f)
	a.jmp(bJneK, 2, 0, 0, decline) // TVer 0
	a.op(bRshK, 1, 0, 0, 4)
	a.op(bAndK, 1, 0, 0, 3) // r1 = PadCnt
	a.op(bLdxW, 2, 7, fRETH+12, 0)
	a.op(bToBE, 2, 0, 0, 32) // r2 = DMA length
	a.jmp(bJeqK, 2, 0, 0, decline)
	a.jmp(bJgtK, 2, 0, xdpWriteMax, decline)
	a.op(bMovK, 3, 0, 0, 0)
	a.op(bSubX, 3, 2, 0, 0)
	a.op(bAndK, 3, 0, 0, 3)
	a.jmp(bJneX, 3, 1, 0, decline) // the pad the length needs
	a.op(bStxDW, 10, 2, wsLen, 0)
	a.op(bAddX, 1, 2, 0, 0)
	a.op(bStxDW, 10, 1, wsN, 0) // payload and pad
	a.op(bAddK, 1, 0, 0, fPayload+4)
	a.op(bLdxDW, 2, 10, wsFrameLen, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // the payload is the DMA length: nothing after the ICRC
	a.op(bLdxH, 3, 7, 16, 0)
	a.op(bToBE, 3, 0, 0, 16)
	a.op(bAddK, 3, 0, 0, 14)
	a.jmp(bJneX, 3, 2, 0, decline) // the IPv4 total length is the frame's (as user space reads it)
	a.op(bLdxH, 3, 7, 38, 0)
	a.op(bToBE, 3, 0, 0, 16)
	a.op(bAddK, 3, 0, 0, 34)
	a.jmp(bJneX, 3, 2, 0, decline) // and the UDP length
	// the UDP checksum, as the kernel's UDP receive would have checked it (RFC 768): none (0,
	// kernel rxe's), the pseudo-header's sum a local sender leaves for checksum offload, or a
	// right one; udp4ChecksumOK is the same rule in Go (the ring's)
	a.op(bLdxH, 3, 7, 40, 0)
	a.jmp(bJeqK, 3, 0, 0, "udpsum")
	a.op(bToBE, 3, 0, 0, 16)
	a.op(bMovK, 4, 0, 0, unix.IPPROTO_UDP)
	for _, off := range []int16{26, 28, 30, 32, 38} { // the addresses and the UDP length
		a.op(bLdxH, 5, 7, off, 0)
		a.op(bToBE, 5, 0, 0, 16)
		a.op(bAddX, 4, 5, 0, 0)
	}
	a.op(bMovX, 2, 4, 0, 0)
	foldSum(a, 2)
	a.jmp(bJneX, 3, 2, 0, "udpfull")
	a.jmp(bJa, 0, 0, 0, "udpsum") // the pseudo-header's sum only
	a.label("udpfull")
	for off := int16(34); off < fPayload; off += 4 { // the UDP header, BTH and RETH
		a.op(bLdxW, 1, 7, off, 0)
		a.op(bToBE, 1, 0, 0, 32)
		a.op(bAddX, 4, 1, 0, 0)
	}
	a.op(bLdxDW, 3, 10, wsN, 0)
	a.op(bAddK, 3, 0, 0, 4) // payload, pad and ICRC: a multiple of 4 bytes
	for i := 0; i < xdpWriteMax+4; i += 4 {
		a.jmp(bJleK, 3, 0, int32(i), "udpsumdone")
		a.op(bMovX, 1, 7, 0, 0)
		a.op(bAddK, 1, 0, 0, int32(fPayload+i+4))
		a.jmp(bJgtX, 1, 8, 0, decline)
		a.op(bLdxW, 1, 7, int16(fPayload+i), 0)
		a.op(bToBE, 1, 0, 0, 32)
		a.op(bAddX, 4, 1, 0, 0)
	}
	a.label("udpsumdone")
	foldSum(a, 4)
	a.jmp(bJneK, 4, 0, 0xffff, decline) // a wrong checksum: user space drops it (and counts it)
	a.label("udpsum")
	loadBE24(a, 2, fBTH+5)
	a.op(bStxW, 10, 2, wsKey, 0)
	lookup(w.qps, decline) // the QP
	a.op(bMovX, 9, 0, 0, 0)
	a.op(bLdxW, 1, 7, 26, 0)
	a.op(bLdxW, 2, 9, qePeer, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // from the QP's peer (RC: the path's address)
	a.op(bLdxH, 1, 7, fBTH+2, 0)
	a.op(bAndK, 1, 0, 0, pkeyC)
	a.jmp(bJneK, 1, 0, pkeyC, decline)
	a.op(bLdxW, 1, 7, fRETH+8, 0) // R_Key, wire order: the MR table's key
	a.op(bStxW, 10, 1, wsKey, 0)
	lookup(w.mrs, decline)
	a.op(bLdxW, 1, 0, 0, 0)
	a.op(bLdxW, 2, 9, qePD, 0)
	a.jmp(bJneX, 1, 2, 0, decline) // the MR's protection domain is the QP's
	a.op(bLdxDW, 1, 7, fRETH, 0)
	a.op(bToBE, 1, 0, 0, 64) // r1 = VA
	a.op(bLdxDW, 2, 0, 8, 0)
	a.jmp(bJltX, 1, 2, 0, decline)
	a.op(bSubX, 1, 2, 0, 0) // r1 = offset in the MR
	a.op(bLdxDW, 2, 0, 16, 0)
	a.jmp(bJgtX, 1, 2, 0, decline)
	a.op(bSubX, 2, 1, 0, 0) // r2 = room after it
	a.op(bLdxDW, 3, 10, wsLen, 0)
	a.jmp(bJgtX, 3, 2, 0, decline) // bounds (IBTA C9-88)
	a.op(bLdxDW, 2, 0, 24, 0)
	a.op(bAddX, 1, 2, 0, 0) // r1 = offset in the device memory
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAndK, 2, 0, 0, xdpPage-1)
	a.jmp(bJgtK, 2, 0, xdpPage-xdpWriteMax, decline) // may cross a page: user space does it
	a.op(bStxDW, 10, 2, wsDst, 0)
	a.op(bRshK, 1, 0, 0, 12)
	a.op(bAddK, 1, 0, 0, 1) // page 0 is the QP slots
	a.op(bStxW, 10, 1, wsKey, 0)
	lookup(w.mem, decline)
	a.op(bLdxDW, 1, 10, wsDst, 0)
	a.jmp(bJgtK, 1, 0, xdpPage-xdpWriteMax, decline)
	a.op(bAddX, 0, 1, 0, 0)
	a.op(bStxDW, 10, 0, wsDst, 0)
	a.op(bStW, 10, 0, wsKey, 0)
	lookup(w.mem, decline) // page 0
	a.op(bLdxW, 1, 9, qeSlot, 0)
	a.jmp(bJgeK, 1, 0, xdpWriteSlots, decline)
	a.op(bLshK, 1, 0, 0, 4)
	a.op(bAddX, 0, 1, 0, 0)
	a.op(bStxDW, 10, 0, wsWord, 0)
	a.op(bStW, 10, 0, wsKey, 0)
	lookup(w.crc, decline)
	a.op(bStxDW, 10, 0, wsTable, 0)

	// the ICRC (IBTA A17.3.3): 8 bytes of ones for the absent LRH, then the frame from the
	// IPv4 header to the ICRC, masked fields as ones
	a.op(bMovX, 5, 0, 0, 0)
	a.op(bMovK, 4, 0, 0, 0)
	a.op(bXor32K, 4, 0, 0, int32(crcLRHState()))
	for off := 14; off < fPayload; off++ {
		if icrcMasked(off) {
			a.op(bMovK, 1, 0, 0, 0xff)
		} else {
			a.op(bLdxB, 1, 7, int16(off), 0)
		}
		crcStep(a)
	}
	a.op(bLdxDW, 3, 10, wsN, 0)
	a.jmp(bJgtK, 3, 0, xdpWriteMax+3, decline)
	for i := 0; i < xdpWriteMax+3; i++ {
		a.jmp(bJleK, 3, 0, int32(i), "w_crcdone")
		a.op(bMovX, 1, 7, 0, 0)
		a.op(bAddK, 1, 0, 0, int32(fPayload+i+1))
		a.jmp(bJgtX, 1, 8, 0, decline)
		a.op(bLdxB, 1, 7, int16(fPayload+i), 0)
		crcStep(a)
	}
	a.label("w_crcdone")
	a.op(bMovX, 1, 7, 0, 0)
	a.op(bAddX, 1, 3, 0, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAddK, 2, 0, 0, fPayload+4)
	a.jmp(bJgtX, 2, 8, 0, decline)
	a.op(bLdxW, 1, 1, fPayload, 0)
	a.op(bToLE, 1, 0, 0, 32) // stored little-endian
	a.op(bXor32K, 4, 0, 0, -1)
	a.jmp(bJneX, 1, 4, 0, decline) // a bad ICRC: user space drops it (and counts it)

	// claim the PSN: the word must be this PSN, not paused, not busy
	loadBE24(a, 3, fBTH+9)
	a.op(bStxDW, 10, 3, wsPSN, 0)
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bLdxDW, 0, 1, 0, 0)
	a.op(bMovX, 2, 0, 0, 0)
	a.op(bAndK, 2, 0, 0, wordPSN)
	a.jmp(bJneX, 2, 3, 0, decline) // not the expected PSN: a duplicate or a gap
	a.op(bMovX, 2, 0, 0, 0)
	a.op(bRshK, 2, 0, 0, 48)
	a.jmp(bJneK, 2, 0, 0, decline) // paused or busy
	a.op(bStxDW, 10, 0, wsOld, 0)
	a.op(bMovK, 2, 0, 0, 1)
	a.op(bLshK, 2, 0, 0, 49)
	a.op(bOrX, 2, 0, 0, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicCmpXchg)
	a.op(bLdxDW, 3, 10, wsOld, 0)
	a.jmp(bJneX, 0, 3, 0, decline) // changed meanwhile: user space paused it

	// the payload into the device memory
	a.op(bMovX, 1, 6, 0, 0)
	a.op(bMovK, 2, 0, 0, fPayload)
	a.op(bLdxDW, 3, 10, wsDst, 0)
	a.op(bLdxDW, 4, 10, wsLen, 0)
	a.jmp(bJgtK, 4, 0, xdpWriteMax, "w_unclaim")
	a.jmp(bJltK, 4, 0, 1, "w_unclaim") // (not == 0: the 6.1 verifier learns no lower bound from it)
	a.op(bCall, 0, 0, 0, fnXDPLoadBytes)
	a.jmp(bJneK, 0, 0, 0, "w_unclaim")

	// publish PSN+1, MSN+1 (flags clear), then count the WRITE
	a.op(bLdxDW, 1, 10, wsOld, 0)
	a.op(bMovX, 2, 1, 0, 0)
	a.op(bAddK, 2, 0, 0, 1)
	a.op(bAndK, 2, 0, 0, wordPSN)
	a.op(bRshK, 1, 0, 0, 24)
	a.op(bAddK, 1, 0, 0, 1)
	a.op(bAndK, 1, 0, 0, wordPSN)
	a.op(bStxDW, 10, 1, wsMSN, 0)
	a.op(bLshK, 1, 0, 0, 24)
	a.op(bOrX, 2, 1, 0, 0)
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicXchg)
	a.op(bMovK, 2, 0, 0, 1)
	a.op(bAtomicDW, 1, 2, 8, atomicAdd)

	// no AckReq: nothing to send (IBTA 9.7.5.1: the ACK may be coalesced)
	a.op(bLdxB, 1, 7, fBTH+8, 0)
	a.op(bAndK, 1, 0, 0, 0x80)
	a.jmp(bJneK, 1, 0, 0, "w_ack")
	a.op(bMovK, 0, 0, 0, xdpDrop)
	a.op(bExit, 0, 0, 0, 0)

	// the ACK in place: the MAC addresses swapped, the QP's headers, the PSN, the MSN, the ICRC
	a.label("w_ack")
	a.op(bLdxW, 3, 7, 6, 0) // to the request's source, from the link's MAC address
	a.op(bLdxH, 4, 7, 10, 0)
	a.op(bStxW, 7, 3, 0, 0)
	a.op(bStxH, 7, 4, 4, 0)
	a.op(bLdxW, 1, 9, qeMAC, 0)
	a.op(bLdxH, 2, 9, qeMAC+4, 0)
	a.op(bStxW, 7, 1, 6, 0)
	a.op(bStxH, 7, 2, 10, 0)
	for k := int16(0); k < 48; k += 8 {
		a.op(bLdxDW, 1, 9, qeTemplate+k, 0)
		a.op(bStxDW, 7, 1, 14+k, 0)
	}
	a.op(bLdxDW, 1, 10, wsPSN, 0)
	storeBE24(a, 1, fBTH+9)
	a.op(bLdxDW, 1, 10, wsMSN, 0)
	storeBE24(a, 1, fBTH+12+1)
	a.op(bLdxDW, 5, 10, wsTable, 0)
	a.op(bLdxW, 4, 9, qeACKCRC, 0)
	for off := int16(fBTH + 9); off < fBTH+16; off++ {
		a.op(bLdxB, 1, 7, off, 0)
		crcStep(a)
	}
	a.op(bXor32K, 4, 0, 0, -1)
	a.op(bToLE, 4, 0, 0, 32)
	a.op(bStxW, 7, 4, fBTH+16, 0)
	a.op(bMovX, 1, 6, 0, 0)
	a.op(bMovK, 2, 0, 0, ackFrame)
	a.op(bLdxDW, 3, 10, wsFrameLen, 0)
	a.op(bSubX, 2, 3, 0, 0)
	a.op(bCall, 0, 0, 0, fnAdjustTail) // cut to the ACK's length
	a.jmp(bJneK, 0, 0, 0, "w_drop")
	a.op(bMovK, 0, 0, 0, xdpTx)
	a.op(bExit, 0, 0, 0, 0)
	a.label("w_drop") // the WRITE is done; its ACK lost (the requester's retry gets one)
	a.op(bMovK, 0, 0, 0, xdpDrop)
	a.op(bExit, 0, 0, 0, 0)

	a.label("w_unclaim") // give the PSN back as it was, then decline
	a.op(bLdxDW, 1, 10, wsWord, 0)
	a.op(bLdxDW, 2, 10, wsOld, 0)
	a.op(bAtomicDW, 1, 2, 0, atomicXchg)
	a.jmp(bJa, 0, 0, 0, decline)
}

// crcLRHState is the CRC-32 state (not inverted) after the ICRC's 8 bytes of ones.
func crcLRHState() uint32 {
	return ^crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
}
