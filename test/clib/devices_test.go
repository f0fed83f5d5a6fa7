package clib

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDevices: ibv_devices and ibv_devinfo -v show the daemon's device as rdma-core's tools
// print a kernel device: its name and GUID, the port active on Ethernet with the daemon's MTU,
// and the GID table with the link-local and the IPv4-mapped address, RoCE v2.
func TestDevices(t *testing.T) {
	needDevice(t)
	d := startDaemon(t)
	out, err := runTool(t, tool{name: "ibv_devices", d: d}, 20*time.Second)
	if err != nil {
		t.Fatalf("ibv_devices: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^\s+softroce0\s+020000fffe000000$`).MatchString(out) {
		t.Errorf("ibv_devices does not list softroce0 with its GUID:\n%s", out)
	}
	out, err = runTool(t, tool{name: "ibv_devinfo", args: []string{"-v"}, d: d}, 20*time.Second)
	if err != nil {
		t.Fatalf("ibv_devinfo -v: %v\n%s", err, out)
	}
	for _, want := range []string{
		"hca_id:\tsoftroce0",
		"state:\t\t\tPORT_ACTIVE (4)",
		"active_mtu:\t\t4096 (5)",
		"link_layer:\t\tEthernet",
		"phys_port_cnt:\t\t\t1",
		// rxe's GUIDs on loopback: the EUI-64 of its all-zero MAC
		"node_guid:\t\t\t0200:00ff:fe00:0000",
		"sys_image_guid:\t\t\t0200:00ff:fe00:0000",
		"GID[  1]:\t\t::ffff:" + d.addr.String() + ", RoCE v2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`GID\[  0\]:\t\tfe80::[0-9a-f:]+, RoCE v2`).MatchString(out) {
		t.Errorf("ibv_devinfo -v lacks the link-local GID 0:\n%s", out)
	}
}

// TestNoDaemon: with no daemon on the socket the tools find no device and say so, as
// rdma-core does on a host without RDMA hardware.
func TestNoDaemon(t *testing.T) {
	d := daemon{sock: t.TempDir() + "/none.sock"}
	out, err := runTool(t, tool{name: "ibv_devinfo", d: d}, 20*time.Second)
	if err == nil || !strings.Contains(out, "No IB devices found") {
		t.Errorf("ibv_devinfo without a daemon: %v\n%s", err, out)
	}
}
