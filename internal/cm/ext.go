package cm

// softroce's extension of the CM: two softroce QPs negotiate selective repeat (qp.Attr.
// SelectiveRepeat, docs/reliability.md "Selective repeat between softroce peers") in bits that
// IBTA reserves, so that every other CM ignores the offer and never accepts it. Not IBTA.
//
//   - The offer: the REQ's reserved 32 bits at byte 24 of the data area (IBTA 12.6.5, Table
//     106: between Local CA GUID and Local Q_Key; IBTA's reserved fields are sent as zero and
//     ignored by the receiver) hold ExtTag in the high 16 bits and
//     the offered extensions in the low 16; bit 0 offers selective repeat. The tag keeps a
//     stray bit from reading as an offer.
//   - The acceptance: the REP's reserved low 4 bits of byte 27 (IBTA 12.6.8, Table 110: after
//     RNR Retry Count and SRQ); bit 0 accepts selective repeat, and only in answer to an offer.
//
// Linux's CM (drivers/infiniband/core/cm.c, include/rdma/ibta_vol1_c12.h) names neither
// field: it reads the REQ and REP with IBA_GET of the named fields only (so kernel rxe's CM
// and every RNIC's under it ignore both), and builds its MADs in buffers ib_create_send_mad
// zero-fills (mad.c, kzalloc), setting only named fields: its REQ never offers and its REP
// never accepts. The ECE vendor fields (REQ byte 5, REP bytes 15/19/23 with the MAD's
// attribute modifier, IBTA 1.4) are not used: they need the vendor's IEEE OUI, which softroce
// has none of, and the kernel hands them to the application and its provider (librdmacm
// passes a peer's ECE to ibv_set_ece). The private data stays the application's.

// ExtTag marks the REQ's reserved word at byte 24 as softroce's extension word ("SR").
const ExtTag = 0x5352

// Extension bits: in the REQ word's low 16 bits (offered), in the REP's low nibble of byte 27
// (accepted).
const (
	ExtSelectiveRepeat = 1 << 0
)

// ExtOffer is the REQ's reserved word at byte 24 offering exts (REQFields.Resv24); 0 offers
// nothing.
func ExtOffer(exts uint16) uint32 {
	if exts == 0 {
		return 0
	}
	return ExtTag<<16 | uint32(exts)
}

// ExtOffered returns the extensions a REQ offers: none unless the word at byte 24 carries
// ExtTag.
func (r REQ) ExtOffered() uint16 {
	w := be.Uint32(r[reqResv24:])
	if w>>16 != ExtTag {
		return 0
	}
	return uint16(w)
}

// SelectiveRepeat reports whether the REQ offers selective repeat (softroce's extension).
func (r REQ) SelectiveRepeat() bool { return r.ExtOffered()&ExtSelectiveRepeat != 0 }

// ExtAccepted returns the extension bits of the REP (the reserved low nibble of byte 27);
// they mean something only in answer to a REQ that offered them.
func (r REP) ExtAccepted() uint8 { return bits(r[repByte27], 0, 4) }

// SelectiveRepeat reports whether the REP accepts selective repeat (softroce's extension).
func (r REP) SelectiveRepeat() bool { return r.ExtAccepted()&ExtSelectiveRepeat != 0 }
