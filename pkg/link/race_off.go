//go:build !race

package link

func raceSent()     {}
func raceReceived() {}
