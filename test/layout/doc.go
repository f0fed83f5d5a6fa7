// Package layout holds the tests of the module's shape: the allowed import graph between
// its packages (layout_test.go, DEVELOPERS.md "Layers") and the public API's names
// (api_test.go: a program using a public package never needs an internal one).
package layout
