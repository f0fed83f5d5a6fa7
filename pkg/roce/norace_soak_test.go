//go:build !race

package roce

const raceSoak = false
