package bth

// The opcode constants and the rows of the opcode table; opcode.go builds
// the [256]OpInfo array from opList.

// Opcode constants, named Op<Transport><Operation> (IBTA Vol 1 9.2.1 table 36).
const (
	// RC (IBTA 9.2.1 table 36; FLUSH and ATOMIC WRITE: IBTA 1.5 memory placement extensions).
	OpRCSendFirst      Opcode = 0x00 // RC Send First
	OpRCSendMiddle     Opcode = 0x01 // RC Send Middle
	OpRCSendLast       Opcode = 0x02 // RC Send Last
	OpRCSendLastImm    Opcode = 0x03 // RC Send Last Immediate
	OpRCSendOnly       Opcode = 0x04 // RC Send Only
	OpRCSendOnlyImm    Opcode = 0x05 // RC Send Only Immediate
	OpRCWriteFirst     Opcode = 0x06 // RC RDMA Write First
	OpRCWriteMiddle    Opcode = 0x07 // RC RDMA Write Middle
	OpRCWriteLast      Opcode = 0x08 // RC RDMA Write Last
	OpRCWriteLastImm   Opcode = 0x09 // RC RDMA Write Last Immediate
	OpRCWriteOnly      Opcode = 0x0A // RC RDMA Write Only
	OpRCWriteOnlyImm   Opcode = 0x0B // RC RDMA Write Only Immediate
	OpRCReadRequest    Opcode = 0x0C // RC RDMA Read Request
	OpRCReadRespFirst  Opcode = 0x0D // RC RDMA Read Response First
	OpRCReadRespMiddle Opcode = 0x0E // RC RDMA Read Response Middle
	OpRCReadRespLast   Opcode = 0x0F // RC RDMA Read Response Last
	OpRCReadRespOnly   Opcode = 0x10 // RC RDMA Read Response Only
	OpRCAck            Opcode = 0x11 // RC Acknowledge
	OpRCAtomicAck      Opcode = 0x12 // RC Atomic Acknowledge
	OpRCCmpSwap        Opcode = 0x13 // RC Compare Swap
	OpRCFetchAdd       Opcode = 0x14 // RC Fetch Add
	OpRCSendLastInv    Opcode = 0x16 // RC Send Last Invalidate
	OpRCSendOnlyInv    Opcode = 0x17 // RC Send Only Invalidate
	OpRCFlush          Opcode = 0x1C // RC Flush
	OpRCAtomicWrite    Opcode = 0x1D // RC Atomic Write

	// UC (IBTA 9.2.1 table 36: SEND and RDMA WRITE only).
	OpUCSendFirst    Opcode = 0x20 // UC Send First
	OpUCSendMiddle   Opcode = 0x21 // UC Send Middle
	OpUCSendLast     Opcode = 0x22 // UC Send Last
	OpUCSendLastImm  Opcode = 0x23 // UC Send Last Immediate
	OpUCSendOnly     Opcode = 0x24 // UC Send Only
	OpUCSendOnlyImm  Opcode = 0x25 // UC Send Only Immediate
	OpUCWriteFirst   Opcode = 0x26 // UC RDMA Write First
	OpUCWriteMiddle  Opcode = 0x27 // UC RDMA Write Middle
	OpUCWriteLast    Opcode = 0x28 // UC RDMA Write Last
	OpUCWriteLastImm Opcode = 0x29 // UC RDMA Write Last Immediate
	OpUCWriteOnly    Opcode = 0x2A // UC RDMA Write Only
	OpUCWriteOnlyImm Opcode = 0x2B // UC RDMA Write Only Immediate

	// RD (IBTA 9.2.1 table 36: requests carry RDETH+DETH, responses RDETH).
	OpRDSendFirst      Opcode = 0x40 // RD Send First
	OpRDSendMiddle     Opcode = 0x41 // RD Send Middle
	OpRDSendLast       Opcode = 0x42 // RD Send Last
	OpRDSendLastImm    Opcode = 0x43 // RD Send Last Immediate
	OpRDSendOnly       Opcode = 0x44 // RD Send Only
	OpRDSendOnlyImm    Opcode = 0x45 // RD Send Only Immediate
	OpRDWriteFirst     Opcode = 0x46 // RD RDMA Write First
	OpRDWriteMiddle    Opcode = 0x47 // RD RDMA Write Middle
	OpRDWriteLast      Opcode = 0x48 // RD RDMA Write Last
	OpRDWriteLastImm   Opcode = 0x49 // RD RDMA Write Last Immediate
	OpRDWriteOnly      Opcode = 0x4A // RD RDMA Write Only
	OpRDWriteOnlyImm   Opcode = 0x4B // RD RDMA Write Only Immediate
	OpRDReadRequest    Opcode = 0x4C // RD RDMA Read Request
	OpRDReadRespFirst  Opcode = 0x4D // RD RDMA Read Response First
	OpRDReadRespMiddle Opcode = 0x4E // RD RDMA Read Response Middle
	OpRDReadRespLast   Opcode = 0x4F // RD RDMA Read Response Last
	OpRDReadRespOnly   Opcode = 0x50 // RD RDMA Read Response Only
	OpRDAck            Opcode = 0x51 // RD Acknowledge
	OpRDAtomicAck      Opcode = 0x52 // RD Atomic Acknowledge
	OpRDCmpSwap        Opcode = 0x53 // RD Compare Swap
	OpRDFetchAdd       Opcode = 0x54 // RD Fetch Add
	OpRDResync         Opcode = 0x55 // RD RESYNC
	OpRDFlush          Opcode = 0x5C // RD Flush
	OpRDAtomicWrite    Opcode = 0x5D // RD Atomic Write

	// UD (IBTA 9.2.1 table 36: SEND Only with DETH).
	OpUDSendOnly    Opcode = 0x64 // UD Send Only
	OpUDSendOnlyImm Opcode = 0x65 // UD Send Only Immediate

	// XRC (IBTA Annex A14: as RC, requests carry XRCETH).
	OpXRCSendFirst      Opcode = 0xA0 // XRC Send First
	OpXRCSendMiddle     Opcode = 0xA1 // XRC Send Middle
	OpXRCSendLast       Opcode = 0xA2 // XRC Send Last
	OpXRCSendLastImm    Opcode = 0xA3 // XRC Send Last Immediate
	OpXRCSendOnly       Opcode = 0xA4 // XRC Send Only
	OpXRCSendOnlyImm    Opcode = 0xA5 // XRC Send Only Immediate
	OpXRCWriteFirst     Opcode = 0xA6 // XRC RDMA Write First
	OpXRCWriteMiddle    Opcode = 0xA7 // XRC RDMA Write Middle
	OpXRCWriteLast      Opcode = 0xA8 // XRC RDMA Write Last
	OpXRCWriteLastImm   Opcode = 0xA9 // XRC RDMA Write Last Immediate
	OpXRCWriteOnly      Opcode = 0xAA // XRC RDMA Write Only
	OpXRCWriteOnlyImm   Opcode = 0xAB // XRC RDMA Write Only Immediate
	OpXRCReadRequest    Opcode = 0xAC // XRC RDMA Read Request
	OpXRCReadRespFirst  Opcode = 0xAD // XRC RDMA Read Response First
	OpXRCReadRespMiddle Opcode = 0xAE // XRC RDMA Read Response Middle
	OpXRCReadRespLast   Opcode = 0xAF // XRC RDMA Read Response Last
	OpXRCReadRespOnly   Opcode = 0xB0 // XRC RDMA Read Response Only
	OpXRCAck            Opcode = 0xB1 // XRC Acknowledge
	OpXRCAtomicAck      Opcode = 0xB2 // XRC Atomic Acknowledge
	OpXRCCmpSwap        Opcode = 0xB3 // XRC Compare Swap
	OpXRCFetchAdd       Opcode = 0xB4 // XRC Fetch Add
	OpXRCSendLastInv    Opcode = 0xB6 // XRC Send Last Invalidate
	OpXRCSendOnlyInv    Opcode = 0xB7 // XRC Send Only Invalidate

	// OpCNP is the RoCEv2 Congestion Notification Packet (IBTA Annex A17.9.3).
	OpCNP Opcode = 0x81
)

// opList is the source of the opcode table: every defined opcode.
var opList = [...]opDef{
	{OpRCSendFirst, "RC Send First", TransportRC, KindSend, 0, true, 0, true, false, false, true},
	{OpRCSendMiddle, "RC Send Middle", TransportRC, KindSend, 0, true, 0, false, true, false, true},
	{OpRCSendLast, "RC Send Last", TransportRC, KindSend, 0, true, 0, false, false, true, true},
	{OpRCSendLastImm, "RC Send Last Immediate", TransportRC, KindSend, HdrImmDt, true, 0, false, false, true, true},
	{OpRCSendOnly, "RC Send Only", TransportRC, KindSend, 0, true, 0, true, false, true, true},
	{OpRCSendOnlyImm, "RC Send Only Immediate", TransportRC, KindSend, HdrImmDt, true, 0, true, false, true, true},
	{OpRCWriteFirst, "RC RDMA Write First", TransportRC, KindWrite, HdrRETH, true, 0, true, false, false, true},
	{OpRCWriteMiddle, "RC RDMA Write Middle", TransportRC, KindWrite, 0, true, 0, false, true, false, true},
	{OpRCWriteLast, "RC RDMA Write Last", TransportRC, KindWrite, 0, true, 0, false, false, true, true},
	{OpRCWriteLastImm, "RC RDMA Write Last Immediate", TransportRC, KindWrite, HdrImmDt, true, 0, false, false, true, true},
	{OpRCWriteOnly, "RC RDMA Write Only", TransportRC, KindWrite, HdrRETH, true, 0, true, false, true, true},
	{OpRCWriteOnlyImm, "RC RDMA Write Only Immediate", TransportRC, KindWrite, HdrRETH | HdrImmDt, true, 0, true, false, true, true},
	{OpRCReadRequest, "RC RDMA Read Request", TransportRC, KindReadReq, HdrRETH, false, 0, true, false, true, true},
	{OpRCReadRespFirst, "RC RDMA Read Response First", TransportRC, KindReadResp, HdrAETH, true, 0, true, false, false, false},
	{OpRCReadRespMiddle, "RC RDMA Read Response Middle", TransportRC, KindReadResp, 0, true, 0, false, true, false, false},
	{OpRCReadRespLast, "RC RDMA Read Response Last", TransportRC, KindReadResp, HdrAETH, true, 0, false, false, true, false},
	{OpRCReadRespOnly, "RC RDMA Read Response Only", TransportRC, KindReadResp, HdrAETH, true, 0, true, false, true, false},
	{OpRCAck, "RC Acknowledge", TransportRC, KindAck, HdrAETH, false, 0, true, false, true, false},
	{OpRCAtomicAck, "RC Atomic Acknowledge", TransportRC, KindAtomicAck, HdrAETH | HdrAtomicAckETH, false, 0, true, false, true, false},
	{OpRCCmpSwap, "RC Compare Swap", TransportRC, KindCmpSwap, HdrAtomicETH, false, 0, true, false, true, true},
	{OpRCFetchAdd, "RC Fetch Add", TransportRC, KindFetchAdd, HdrAtomicETH, false, 0, true, false, true, true},
	{OpRCSendLastInv, "RC Send Last Invalidate", TransportRC, KindSend, HdrIETH, true, 0, false, false, true, true},
	{OpRCSendOnlyInv, "RC Send Only Invalidate", TransportRC, KindSend, HdrIETH, true, 0, true, false, true, true},
	{OpRCFlush, "RC Flush", TransportRC, KindFlush, HdrFETH | HdrRETH, false, 0, true, false, true, true},
	{OpRCAtomicWrite, "RC Atomic Write", TransportRC, KindAtomicWrite, HdrRETH, true, 8, true, false, true, true},
	{OpUCSendFirst, "UC Send First", TransportUC, KindSend, 0, true, 0, true, false, false, true},
	{OpUCSendMiddle, "UC Send Middle", TransportUC, KindSend, 0, true, 0, false, true, false, true},
	{OpUCSendLast, "UC Send Last", TransportUC, KindSend, 0, true, 0, false, false, true, true},
	{OpUCSendLastImm, "UC Send Last Immediate", TransportUC, KindSend, HdrImmDt, true, 0, false, false, true, true},
	{OpUCSendOnly, "UC Send Only", TransportUC, KindSend, 0, true, 0, true, false, true, true},
	{OpUCSendOnlyImm, "UC Send Only Immediate", TransportUC, KindSend, HdrImmDt, true, 0, true, false, true, true},
	{OpUCWriteFirst, "UC RDMA Write First", TransportUC, KindWrite, HdrRETH, true, 0, true, false, false, true},
	{OpUCWriteMiddle, "UC RDMA Write Middle", TransportUC, KindWrite, 0, true, 0, false, true, false, true},
	{OpUCWriteLast, "UC RDMA Write Last", TransportUC, KindWrite, 0, true, 0, false, false, true, true},
	{OpUCWriteLastImm, "UC RDMA Write Last Immediate", TransportUC, KindWrite, HdrImmDt, true, 0, false, false, true, true},
	{OpUCWriteOnly, "UC RDMA Write Only", TransportUC, KindWrite, HdrRETH, true, 0, true, false, true, true},
	{OpUCWriteOnlyImm, "UC RDMA Write Only Immediate", TransportUC, KindWrite, HdrRETH | HdrImmDt, true, 0, true, false, true, true},
	{OpRDSendFirst, "RD Send First", TransportRD, KindSend, HdrRDETH | HdrDETH, true, 0, true, false, false, true},
	{OpRDSendMiddle, "RD Send Middle", TransportRD, KindSend, HdrRDETH | HdrDETH, true, 0, false, true, false, true},
	{OpRDSendLast, "RD Send Last", TransportRD, KindSend, HdrRDETH | HdrDETH, true, 0, false, false, true, true},
	{OpRDSendLastImm, "RD Send Last Immediate", TransportRD, KindSend, HdrRDETH | HdrDETH | HdrImmDt, true, 0, false, false, true, true},
	{OpRDSendOnly, "RD Send Only", TransportRD, KindSend, HdrRDETH | HdrDETH, true, 0, true, false, true, true},
	{OpRDSendOnlyImm, "RD Send Only Immediate", TransportRD, KindSend, HdrRDETH | HdrDETH | HdrImmDt, true, 0, true, false, true, true},
	{OpRDWriteFirst, "RD RDMA Write First", TransportRD, KindWrite, HdrRDETH | HdrDETH | HdrRETH, true, 0, true, false, false, true},
	{OpRDWriteMiddle, "RD RDMA Write Middle", TransportRD, KindWrite, HdrRDETH | HdrDETH, true, 0, false, true, false, true},
	{OpRDWriteLast, "RD RDMA Write Last", TransportRD, KindWrite, HdrRDETH | HdrDETH, true, 0, false, false, true, true},
	{OpRDWriteLastImm, "RD RDMA Write Last Immediate", TransportRD, KindWrite, HdrRDETH | HdrDETH | HdrImmDt, true, 0, false, false, true, true},
	{OpRDWriteOnly, "RD RDMA Write Only", TransportRD, KindWrite, HdrRDETH | HdrDETH | HdrRETH, true, 0, true, false, true, true},
	{OpRDWriteOnlyImm, "RD RDMA Write Only Immediate", TransportRD, KindWrite, HdrRDETH | HdrDETH | HdrRETH | HdrImmDt, true, 0, true, false, true, true},
	{OpRDReadRequest, "RD RDMA Read Request", TransportRD, KindReadReq, HdrRDETH | HdrDETH | HdrRETH, false, 0, true, false, true, true},
	{OpRDReadRespFirst, "RD RDMA Read Response First", TransportRD, KindReadResp, HdrRDETH | HdrAETH, true, 0, true, false, false, false},
	{OpRDReadRespMiddle, "RD RDMA Read Response Middle", TransportRD, KindReadResp, HdrRDETH, true, 0, false, true, false, false},
	{OpRDReadRespLast, "RD RDMA Read Response Last", TransportRD, KindReadResp, HdrRDETH | HdrAETH, true, 0, false, false, true, false},
	{OpRDReadRespOnly, "RD RDMA Read Response Only", TransportRD, KindReadResp, HdrRDETH | HdrAETH, true, 0, true, false, true, false},
	{OpRDAck, "RD Acknowledge", TransportRD, KindAck, HdrRDETH | HdrAETH, false, 0, true, false, true, false},
	{OpRDAtomicAck, "RD Atomic Acknowledge", TransportRD, KindAtomicAck, HdrRDETH | HdrAETH | HdrAtomicAckETH, false, 0, true, false, true, false},
	{OpRDCmpSwap, "RD Compare Swap", TransportRD, KindCmpSwap, HdrRDETH | HdrDETH | HdrAtomicETH, false, 0, true, false, true, true},
	{OpRDFetchAdd, "RD Fetch Add", TransportRD, KindFetchAdd, HdrRDETH | HdrDETH | HdrAtomicETH, false, 0, true, false, true, true},
	{OpRDResync, "RD RESYNC", TransportRD, KindResync, HdrRDETH | HdrDETH, false, 0, true, false, true, true},
	{OpRDFlush, "RD Flush", TransportRD, KindFlush, HdrRDETH | HdrDETH | HdrFETH | HdrRETH, false, 0, true, false, true, true},
	{OpRDAtomicWrite, "RD Atomic Write", TransportRD, KindAtomicWrite, HdrRDETH | HdrDETH | HdrRETH, true, 8, true, false, true, true},
	{OpUDSendOnly, "UD Send Only", TransportUD, KindSend, HdrDETH, true, 0, true, false, true, true},
	{OpUDSendOnlyImm, "UD Send Only Immediate", TransportUD, KindSend, HdrDETH | HdrImmDt, true, 0, true, false, true, true},
	{OpXRCSendFirst, "XRC Send First", TransportXRC, KindSend, HdrXRCETH, true, 0, true, false, false, true},
	{OpXRCSendMiddle, "XRC Send Middle", TransportXRC, KindSend, HdrXRCETH, true, 0, false, true, false, true},
	{OpXRCSendLast, "XRC Send Last", TransportXRC, KindSend, HdrXRCETH, true, 0, false, false, true, true},
	{OpXRCSendLastImm, "XRC Send Last Immediate", TransportXRC, KindSend, HdrXRCETH | HdrImmDt, true, 0, false, false, true, true},
	{OpXRCSendOnly, "XRC Send Only", TransportXRC, KindSend, HdrXRCETH, true, 0, true, false, true, true},
	{OpXRCSendOnlyImm, "XRC Send Only Immediate", TransportXRC, KindSend, HdrXRCETH | HdrImmDt, true, 0, true, false, true, true},
	{OpXRCWriteFirst, "XRC RDMA Write First", TransportXRC, KindWrite, HdrXRCETH | HdrRETH, true, 0, true, false, false, true},
	{OpXRCWriteMiddle, "XRC RDMA Write Middle", TransportXRC, KindWrite, HdrXRCETH, true, 0, false, true, false, true},
	{OpXRCWriteLast, "XRC RDMA Write Last", TransportXRC, KindWrite, HdrXRCETH, true, 0, false, false, true, true},
	{OpXRCWriteLastImm, "XRC RDMA Write Last Immediate", TransportXRC, KindWrite, HdrXRCETH | HdrImmDt, true, 0, false, false, true, true},
	{OpXRCWriteOnly, "XRC RDMA Write Only", TransportXRC, KindWrite, HdrXRCETH | HdrRETH, true, 0, true, false, true, true},
	{OpXRCWriteOnlyImm, "XRC RDMA Write Only Immediate", TransportXRC, KindWrite, HdrXRCETH | HdrRETH | HdrImmDt, true, 0, true, false, true, true},
	{OpXRCReadRequest, "XRC RDMA Read Request", TransportXRC, KindReadReq, HdrXRCETH | HdrRETH, false, 0, true, false, true, true},
	{OpXRCReadRespFirst, "XRC RDMA Read Response First", TransportXRC, KindReadResp, HdrAETH, true, 0, true, false, false, false},
	{OpXRCReadRespMiddle, "XRC RDMA Read Response Middle", TransportXRC, KindReadResp, 0, true, 0, false, true, false, false},
	{OpXRCReadRespLast, "XRC RDMA Read Response Last", TransportXRC, KindReadResp, HdrAETH, true, 0, false, false, true, false},
	{OpXRCReadRespOnly, "XRC RDMA Read Response Only", TransportXRC, KindReadResp, HdrAETH, true, 0, true, false, true, false},
	{OpXRCAck, "XRC Acknowledge", TransportXRC, KindAck, HdrAETH, false, 0, true, false, true, false},
	{OpXRCAtomicAck, "XRC Atomic Acknowledge", TransportXRC, KindAtomicAck, HdrAETH | HdrAtomicAckETH, false, 0, true, false, true, false},
	{OpXRCCmpSwap, "XRC Compare Swap", TransportXRC, KindCmpSwap, HdrXRCETH | HdrAtomicETH, false, 0, true, false, true, true},
	{OpXRCFetchAdd, "XRC Fetch Add", TransportXRC, KindFetchAdd, HdrXRCETH | HdrAtomicETH, false, 0, true, false, true, true},
	{OpXRCSendLastInv, "XRC Send Last Invalidate", TransportXRC, KindSend, HdrXRCETH | HdrIETH, true, 0, false, false, true, true},
	{OpXRCSendOnlyInv, "XRC Send Only Invalidate", TransportXRC, KindSend, HdrXRCETH | HdrIETH, true, 0, true, false, true, true},
	{OpCNP, "CNP", TransportCNP, KindCNP, 0, false, 0, true, false, true, false},
}
