module github.com/softroce/softroce

go 1.26.0

require (
	github.com/google/gopacket v1.1.19 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
