module github.com/softroce/softroce

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/gopacket/gopacket v1.7.7
	github.com/spf13/pflag v1.1.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/net v0.55.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
