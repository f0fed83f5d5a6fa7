package roce

// DeviceOf returns the device behind an embedded Verbs (Device.Verbs), or
// nil for any other Verbs (a daemon client): packages layered on Verbs
// (pkg/rdmacm) use it to reach the embedded device's CM directly.
func DeviceOf(v Verbs) *Device {
	if e, ok := v.(embedded); ok {
		return e.d
	}
	return nil
}
